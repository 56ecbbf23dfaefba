//! The optimizer step's own temporaries at their most (what a foreach optimizer's
//! `_multi_tensor_*` kernels or a hand-written step allocate and free within the step), and the
//! live allocations whose stack was not recorded.

use super::context::Context;
use super::{Classifier, StepTemporaries, Unrecorded, OPTIMIZER_TEMPORARY};
use crate::model::{Live, StackId};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

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
        // The temporaries alive, by the entry that ends each (the earliest first), and their
        // total; the most is reached just after some temporary's `alloc` (once everything that
        // ended at or before that entry is gone), so the total is looked at there only.
        let mut ending: BinaryHeap<Reverse<(usize, u64)>> = BinaryHeap::new();
        let (mut sum, mut best) = (0i128, (0i128, 0usize));
        // Only the built-in rules' optimizer context, a `--category` rule or an entry's
        // `user_metadata` can name an allocation a step temporary: the others are not
        // classified at all (most of a trace).
        let named_otherwise = self.rule_index.contains(&OPTIMIZER_TEMPORARY);
        let mut run = 0;
        let mut next = self.lifetimes.next_alloc(0);
        while let Some(i) = next {
            next = self.lifetimes.next_alloc(i + 1);
            let e = &entries[i];
            let Some(addr) = e.addr() else { continue };
            if !named_otherwise
                && !e.has_extra()
                && self.lifetimes.context(self.stacks, e.stack) != Context::Optimizer
            {
                continue;
            }
            let live = Live::from_alloc(e, i);
            let end = self.lifetimes.end_of(addr, &live);
            // Without a pool, rule or metadata that could claim it first, what the built-in
            // rules say of an optimizer allocation: a temporary when freed within its run, else
            // what the allocation it replaced was (`builtin`'s reading, its lookups shared).
            let temporary = if self.rules.is_empty() && !e.has_extra() && self.pools.is_empty() {
                if !self.lifetimes.outlived_run_from(&mut run, i, end) {
                    true
                } else {
                    match self.lifetimes.replaced_by(i) {
                        Some((older_addr, older)) => {
                            self.builtin(older_addr, &older) == OPTIMIZER_TEMPORARY
                        }
                        None => false,
                    }
                }
            } else {
                self.category(addr, &live) == OPTIMIZER_TEMPORARY
            };
            if !temporary {
                continue;
            }
            while let Some(&Reverse((ended, size))) = ending.peek() {
                if ended > i {
                    break;
                }
                ending.pop();
                sum -= i128::from(size);
            }
            sum += i128::from(e.size);
            if sum > best.0 {
                best = (sum, i);
            }
            if end < n {
                ending.push(Reverse((end, e.size)));
            }
            made.push((i, end, e.size, e.stack));
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
