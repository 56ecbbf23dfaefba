//! The optimizer step's own temporaries at their most (what a foreach optimizer's
//! `_multi_tensor_*` kernels or a hand-written step allocate and free within the step), and the
//! live allocations whose stack was not recorded.

use super::context::Context;
use super::{Classifier, StepTemporaries, Unrecorded, OPTIMIZER_TEMPORARY};
use crate::model::{Action, Live, StackId};
use rustc_hash::FxHashMap;

/// The implementation a frame name says: PyTorch's multi-tensor or fused optimizer function
/// (`_multi_tensor_adam`), else the `_foreach_*` operator a compiled frame runs.
fn implementation(name: &str, python: bool) -> Option<String> {
    if python {
        return (name.starts_with("_multi_tensor_") || name.starts_with("_fused_"))
            .then(|| name.to_string());
    }
    let at = name.find("_foreach_")?;
    let op: String = name[at..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    Some(op)
}

impl Classifier<'_> {
    /// The most optimizer-step temporaries alive at once over the trace, with what made them.
    pub(super) fn step_temporaries(&mut self) -> Option<StepTemporaries> {
        let entries = self.lifetimes.entries;
        let n = entries.len();
        // (born, end, size, stack) of every temporary.
        let mut made: Vec<(usize, usize, u64, Option<StackId>)> = Vec::new();
        // Where each temporary starts and stops being alive (+size at its `alloc`, -size at
        // its end), in trace order: a list of the temporaries alone, not one slot per entry.
        let mut changes: Vec<(usize, i128)> = Vec::new();
        // Only the built-in rules' optimizer context, a `--category` rule or an entry's
        // `user_metadata` can name an allocation a step temporary: the others are not
        // classified at all (most of a trace).
        let named_otherwise = self.rule_index.contains(&OPTIMIZER_TEMPORARY);
        for (i, e) in entries.iter().enumerate() {
            if e.action != Action::Alloc {
                continue;
            }
            let Some(addr) = e.addr() else { continue };
            if !named_otherwise
                && e.extra.is_none()
                && self.lifetimes.context(self.stacks, e.stack) != Context::Optimizer
            {
                continue;
            }
            let live = Live::from_alloc(e, i);
            if self.category(addr, &live) != OPTIMIZER_TEMPORARY {
                continue;
            }
            let end = self.lifetimes.end_of(addr, &live);
            changes.push((i, i128::from(e.size)));
            if end < n {
                changes.push((end, -i128::from(e.size)));
            }
            made.push((i, end, e.size, e.stack));
        }
        // Frees before allocations at one entry, as the live total after the entry counts them.
        changes.sort_unstable();
        let (mut sum, mut best) = (0i128, (0i128, 0usize));
        for (k, &(i, d)) in changes.iter().enumerate() {
            sum += d;
            // The total after entry `i`: once every change at `i` is counted.
            let last_at_i = changes.get(k + 1).is_none_or(|next| next.0 != i);
            if last_at_i && sum > best.0 {
                best = (sum, i);
            }
        }
        let (bytes, at) = best;
        if bytes <= 0 {
            return None;
        }
        // What is alive right after `at`, by stack.
        let mut by_stack: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
        let mut count = 0;
        for &(born, end, size, stack) in &made {
            if born <= at && at < end {
                *by_stack.entry(stack).or_default() += size;
                count += 1;
            }
        }
        let mut stacks: Vec<(Option<StackId>, u64)> = by_stack.into_iter().collect();
        stacks.sort_by_key(|&(s, b)| (std::cmp::Reverse(b), s.map(|s| s.0.get())));
        let top = stacks.first().and_then(|s| s.0);
        let named = |python: bool| {
            stacks.iter().find_map(|&(s, _)| {
                self.stacks
                    .frames(s?)
                    .find_map(|f| implementation(&f.name, python))
            })
        };
        let implementation = named(true).or_else(|| named(false));
        Some(StepTemporaries {
            peak_bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
            peak_entry_index: at,
            count,
            implementation,
            site: crate::analysis::site_of(self.stacks, top),
        })
    }
}

/// The allocations of `live` without a stack, by when they were made.
pub(super) fn unrecorded(live: &[(u64, Live)]) -> Unrecorded {
    let mut u = Unrecorded::default();
    for (_, l) in live.iter().filter(|(_, l)| l.stack.is_none()) {
        if l.born().is_some() {
            u.in_trace_bytes = u.in_trace_bytes.saturating_add(l.size);
            u.in_trace_count += 1;
        } else {
            u.before_trace_bytes = u.before_trace_bytes.saturating_add(l.size);
            u.before_trace_count += 1;
        }
    }
    u
}
