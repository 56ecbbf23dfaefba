//! The device capacity a replay uses when none is given (rule 4): bracketed from below by
//! the highest reserved total after a successful allocation, and from above by each OOM
//! retry (reserved before its releases plus the segment it then got) and each `oom` entry.

use super::alloc_conf::AllocatorConfig;
use super::plan::is_burst;
use super::rounding::{allocation_size, round_size};
use crate::model::{Action, TraceEntry};
use rustc_hash::FxHashSet;

/// The recorded peak reserved and the device capacity bracket of rule 4.
pub(super) struct Bracket {
    pub(super) peak_reserved: u64,
    pub(super) capacity: Option<u64>,
    /// The lowest upper bound the retries and `oom` entries give, when one is above
    /// `peak_reserved`.
    pub(super) upper: Option<u64>,
}

/// The releases at the indices in `empty_cache_releases` were `empty_cache()` calls, not
/// retries.
pub(super) fn capacity_bracket(
    entries: &[TraceEntry],
    initial: u64,
    config: &AllocatorConfig,
    empty_cache_releases: &FxHashSet<usize>,
) -> Bracket {
    let mut reserved = initial;
    let mut lower = initial;
    let mut uppers = Vec::new();
    let mut burst_from: Option<u64> = None;
    for (i, e) in entries.iter().enumerate() {
        if is_burst(e.action) && empty_cache_releases.contains(&i) {
            burst_from = None;
            reserved = reserved.saturating_sub(e.size);
            continue;
        }
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                if let Some(before) = burst_from.take() {
                    uppers.push(before.saturating_add(e.size));
                }
                reserved = reserved.saturating_add(e.size);
                lower = lower.max(reserved);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                burst_from.get_or_insert(reserved);
                reserved = reserved.saturating_sub(e.size);
            }
            Action::Oom => {
                burst_from = None;
                let need = allocation_size(round_size(e.size, config), config);
                uppers.push(reserved.saturating_add(need));
            }
            Action::FreeCompleted => {}
            _ => burst_from = None,
        }
    }
    // A burst that cannot have been a retry under one capacity was an empty_cache() call.
    let upper = uppers.into_iter().filter(|&u| u > lower).min();
    Bracket {
        peak_reserved: lower,
        capacity: upper.map(|_| lower),
        upper,
    }
}
