//! One replay of a device's trace that keeps what the categories need: when each allocation
//! ended, the live total after each entry, the allocations alive before the trace, and the
//! part of the step (phase) each entry falls in, with where each phase's run ends.

use super::context::{context_of, Context};
use crate::model::{Action, Live, LiveSet, Replay, Segment, StackId, StackTable, TraceEntry};
use rustc_hash::FxHashMap;

/// `ended_at` of an allocation alive at the end.
const NEVER: u32 = u32::MAX;

/// An older allocation an optimizer step freed: the entry that freed it, its address, itself.
type Freed = (usize, u64, Live);

/// The lifetimes and phases of one device's trace.
pub struct Lifetimes<'a> {
    pub entries: &'a [TraceEntry],
    /// For each `alloc` entry, the entry that ended it (`NEVER` while alive).
    ended_at: Vec<u32>,
    /// Allocations alive before the trace, with the entry that ended each (`NEVER`).
    before: Vec<(u64, Live, u32)>,
    /// The live total after each entry.
    pub totals: Vec<u64>,
    pub before_total: u64,
    /// The phase after each entry (the last phase an `alloc` named, `Unknown` before any).
    pub phase: Vec<Context>,
    /// For each entry, the first later entry in another phase (`entries.len()` when none).
    run_end: Vec<u32>,
    /// Optimizer runs finished before entry `i` (`steps_done[len]` is all of them).
    steps_done: Vec<u32>,
    /// The allocations alive after the last entry, by address.
    pub final_live: LiveSet,
    contexts: FxHashMap<StackId, Context>,
    /// The replay before the first entry, for rebuilding many states in one pass.
    initial: Replay<'a>,
    /// For an allocation an optimizer step made and kept, the older allocation of the same
    /// size that the step freed (a parameter or state replaced rather than updated in place).
    replaces: FxHashMap<usize, (u64, Live)>,
}

impl<'a> Lifetimes<'a> {
    pub fn new(entries: &'a [TraceEntry], segments: &[&Segment], stacks: &StackTable) -> Self {
        let mut replay = Replay::new(entries, segments.iter().copied());
        let initial = replay.clone();
        let mut before: Vec<(u64, Live, u32)> =
            replay.live().iter().map(|(a, l)| (a, *l, NEVER)).collect();
        before.sort_unstable_by_key(|b| b.0);
        let before_total = replay.live().total();
        let mut before_ended: FxHashMap<u64, u32> = FxHashMap::default();
        let mut ended_at = vec![NEVER; entries.len()];
        let mut totals = Vec::with_capacity(entries.len());
        let mut phase = Vec::with_capacity(entries.len());
        let mut contexts: FxHashMap<StackId, Context> = FxHashMap::default();
        let mut current = Context::Unknown;
        let mut run_start = 0;
        // Older allocations each optimizer run freed, by (run start, size).
        let mut freed_in_step: FxHashMap<(usize, u64), Vec<Freed>> = FxHashMap::default();
        while let Some(i) = replay.step() {
            let e = &entries[i];
            if e.action == Action::Alloc {
                if let Some(id) = e.stack {
                    let c = *contexts.entry(id).or_insert_with(|| context_of(stacks, id));
                    let next = c.phase().unwrap_or(current);
                    if next != current {
                        run_start = i;
                    }
                    current = next;
                }
            }
            if let Some((addr, ended)) = replay.ended() {
                let at = u32::try_from(i).unwrap_or(NEVER);
                match ended.born() {
                    Some(born) => ended_at[born] = at,
                    None => {
                        before_ended.entry(addr).or_insert(at);
                    }
                }
                if current == Context::Optimizer && ended.born().is_none_or(|b| b < run_start) {
                    freed_in_step
                        .entry((run_start, ended.size))
                        .or_default()
                        .push((i, addr, ended));
                }
            }
            totals.push(replay.live().total());
            phase.push(current);
        }
        for b in &mut before {
            b.2 = before_ended.get(&b.0).copied().unwrap_or(NEVER);
        }
        let n = entries.len();
        let mut run_end = vec![n as u32; n];
        for i in (0..n.saturating_sub(1)).rev() {
            run_end[i] = if phase[i + 1] != phase[i] {
                (i + 1) as u32
            } else {
                run_end[i + 1]
            };
        }
        let mut steps_done = Vec::with_capacity(n + 1);
        let mut done = 0u32;
        for i in 0..n {
            steps_done.push(done);
            if phase[i] == Context::Optimizer && phase.get(i + 1) != Some(&Context::Optimizer) {
                done += 1;
            }
        }
        steps_done.push(done);
        // A free after the run's last allocation is a clean-up (`zero_grad`), not a
        // replacement: only frees before it count.
        let mut last_alloc: FxHashMap<usize, usize> = FxHashMap::default();
        let mut start = 0;
        for (j, e) in entries.iter().enumerate() {
            if j > 0 && phase[j] != phase[j - 1] {
                start = j;
            }
            if e.action == Action::Alloc && phase[j] == Context::Optimizer {
                last_alloc.insert(start, j);
            }
        }
        for ((run, _), older) in freed_in_step.iter_mut() {
            let last = last_alloc.get(run).copied().unwrap_or(0);
            older.retain(|o| o.0 < last);
        }
        let mut replaces = FxHashMap::default();
        let mut start = 0;
        for (j, e) in entries.iter().enumerate() {
            if j > 0 && phase[j] != phase[j - 1] {
                start = j;
            }
            if e.action != Action::Alloc
                || phase[j] != Context::Optimizer
                || (ended_at[j] != NEVER && ended_at[j] < run_end[j])
            {
                continue;
            }
            if let Some(older) = freed_in_step.get_mut(&(start, e.size)) {
                if !older.is_empty() {
                    let (_, addr, live) = older.remove(0);
                    replaces.insert(j, (addr, live));
                }
            }
        }
        Lifetimes {
            entries,
            ended_at,
            before,
            totals,
            before_total,
            phase,
            run_end,
            steps_done,
            final_live: replay.live().clone(),
            contexts,
            initial,
            replaces,
        }
    }

    /// The older allocation that the one made at `born` replaced in an optimizer step.
    pub fn replaced_by(&self, born: usize) -> Option<(u64, Live)> {
        self.replaces.get(&born).copied()
    }

    /// The context of a stack (cached).
    pub fn context(&mut self, stacks: &StackTable, stack: Option<StackId>) -> Context {
        match stack {
            Some(id) => *self
                .contexts
                .entry(id)
                .or_insert_with(|| context_of(stacks, id)),
            None => Context::Unknown,
        }
    }

    /// When an allocation ended: the entry index, or `entries.len()` when it did not.
    pub fn end_of(&self, addr: u64, live: &Live) -> usize {
        let end = match live.born() {
            Some(born) => self.ended_at[born],
            None => self
                .before
                .binary_search_by_key(&addr, |b| b.0)
                .map_or(NEVER, |i| self.before[i].2),
        };
        if end == NEVER {
            self.entries.len()
        } else {
            end as usize
        }
    }

    /// Whether an allocation made at `born` outlived the phase run it was made in.
    pub fn outlived_run(&self, born: usize, end: usize) -> bool {
        end >= self.run_end[born] as usize
    }

    /// Optimizer runs finished before entry `i` (all of them for `i >= len`).
    pub fn steps_before(&self, i: usize) -> u32 {
        self.steps_done[i.min(self.entries.len())]
    }

    /// The phase in effect at entry `i` (`Unknown` past the end).
    pub fn phase_at(&self, i: usize) -> Context {
        self.phase.get(i).copied().unwrap_or(Context::Unknown)
    }

    /// The allocations alive right after each of `indices` (before the first entry for
    /// `None`), in one replay of the trace up to the last of them.
    pub fn live_at_many(&self, indices: &[Option<usize>]) -> Vec<Vec<(u64, Live)>> {
        let mut order: Vec<usize> = (0..indices.len()).collect();
        order.sort_by_key(|&k| indices[k]);
        let mut out = vec![Vec::new(); indices.len()];
        let mut replay = self.initial.clone();
        for k in order {
            if let Some(i) = indices[k] {
                replay.run_through(i);
            }
            out[k] = replay.live().iter().map(|(a, l)| (a, *l)).collect();
        }
        out
    }

    /// The allocations alive right after entry `index` (before the first entry for `None`),
    /// rebuilt from the lifetimes.
    pub fn live_at(&self, index: Option<usize>) -> Vec<(u64, Live)> {
        let Some(p) = index else {
            return self.before.iter().map(|&(a, l, _)| (a, l)).collect();
        };
        let older = self
            .before
            .iter()
            .filter(|b| b.2 == NEVER || b.2 as usize > p)
            .map(|&(a, l, _)| (a, l));
        let made = self.entries[..=p.min(self.entries.len().saturating_sub(1))]
            .iter()
            .enumerate()
            .filter(|&(j, e)| {
                e.action == Action::Alloc
                    && (self.ended_at[j] == NEVER || self.ended_at[j] as usize > p)
            })
            .filter_map(|(j, e)| Some((e.addr()?, Live::from_alloc(e, j))));
        older.chain(made).collect()
    }
}
