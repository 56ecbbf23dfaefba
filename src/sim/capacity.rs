//! The device capacity a replay uses when none is given (rule 4): bracketed from below by
//! the highest reserved total after a successful allocation, and from above by each OOM
//! retry (reserved before its releases plus the segment it then got) and each `oom` entry
//! (reserved then plus the segment it could not get, and reserved then plus the free memory
//! the device reported).

use super::alloc_conf::AllocatorConfig;
use super::plan::is_burst;
use super::rounding::{allocation_size, round_size};
use crate::model::{Action, TraceEntry};
use rustc_hash::FxHashSet;
use serde::Serialize;

/// What gave the least upper bound of the capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UpperBound {
    /// An OOM retry: reserved before its releases plus the segment it then got (exclusive).
    Retry,
    /// An `oom` entry: reserved then plus the segment it could not get (exclusive).
    OomRequest,
    /// An `oom` entry: reserved then plus the free memory the device reported then.
    OomDeviceFree,
    /// The device's total memory, given by the user.
    GivenTotal,
}

/// The recorded peak reserved and the device capacity bracket of rule 4.
pub(super) struct Bracket {
    pub(super) peak_reserved: u64,
    pub(super) capacity: Option<u64>,
    /// The lowest upper bound the retries and `oom` entries give, when one is above
    /// `peak_reserved` (the device's free memory at an `oom` entry: when one is not below
    /// it), and what gave it.
    pub(super) upper: Option<(u64, UpperBound)>,
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
    let mut uppers: Vec<(u64, UpperBound)> = Vec::new();
    let mut burst_from: Option<u64> = None;
    for (i, e) in entries.iter().enumerate() {
        if is_burst(e.action()) && empty_cache_releases.contains(&i) {
            burst_from = None;
            reserved = reserved.saturating_sub(e.size);
            continue;
        }
        match e.action() {
            Action::SegmentAlloc | Action::SegmentMap => {
                if let Some(before) = burst_from.take() {
                    uppers.push((before.saturating_add(e.size), UpperBound::Retry));
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
                uppers.push((reserved.saturating_add(need), UpperBound::OomRequest));
                if let Some(free) = e.device_free() {
                    uppers.push((reserved.saturating_add(free), UpperBound::OomDeviceFree));
                }
            }
            Action::FreeCompleted => {}
            _ => burst_from = None,
        }
    }
    // A burst that cannot have been a retry under one capacity was an empty_cache() call.
    // The device's free memory is an inclusive bound: the allocator may have had it all.
    let upper = uppers
        .into_iter()
        .filter(|&(u, kind)| u > lower || (kind == UpperBound::OomDeviceFree && u == lower))
        .min_by_key(|&(u, _)| u);
    Bracket {
        peak_reserved: lower,
        capacity: upper.map(|_| lower),
        upper,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StreamIndex;

    fn entry(action: Action, size: u64) -> TraceEntry {
        TraceEntry::new(action, Some(0x1000), size, StreamIndex(0))
    }

    /// The device's free memory at the `oom` entry bounds the capacity tighter than the
    /// segment the request needed.
    #[test]
    fn the_device_free_memory_at_the_oom_is_the_tightest_bound() {
        const MIB: u64 = 1 << 20;
        let entries = [
            entry(Action::SegmentAlloc, 100 * MIB),
            entry(Action::Alloc, 100 * MIB),
            TraceEntry::oom(40 * MIB, Some(3 * MIB), StreamIndex(0)),
        ];
        let b = capacity_bracket(
            &entries,
            0,
            &AllocatorConfig::default(),
            &FxHashSet::default(),
        );
        assert_eq!(b.peak_reserved, 100 * MIB);
        assert_eq!(b.upper, Some((103 * MIB, UpperBound::OomDeviceFree)));
        let no_free = [
            entries[0],
            entries[1],
            TraceEntry::oom(40 * MIB, None, StreamIndex(0)),
        ];
        let b = capacity_bracket(
            &no_free,
            0,
            &AllocatorConfig::default(),
            &FxHashSet::default(),
        );
        assert_eq!(b.upper, Some((140 * MIB, UpperBound::OomRequest)));
    }
}
