//! What the categories keep from a replay of a device's trace (the one `find_peak` makes, or
//! one of their own): when each allocation ended, the live total after each entry, the
//! allocations alive before the trace, and the runs of one part of the step (phase) that the
//! trace falls into.

use super::context::{Context, ContextCache};
use crate::analysis::ended_at::{alive_after, EndedAt, NEVER};
use crate::analysis::live_totals::{LiveTotals, Totals};
use crate::analysis::peak::{Endings, FollowReplay};
use crate::model::{Action, Live, LiveSet, Replay, Segment, StackId, StackTable, TraceEntry};
use rustc_hash::{FxHashMap, FxHashSet};
use std::ops::Range;

/// An older allocation an optimizer step freed: the entry that freed it, and which one it was
/// (an `Older`, its kind in the top bit). Kept small (8 bytes): a long step frees hundreds of
/// thousands.
#[derive(Clone, Copy)]
struct Freed {
    at: u32,
    which: u32,
}

/// `Freed::which`'s top bit: the allocation was alive before the trace.
const BEFORE_BIT: u32 = 1 << 31;

impl Freed {
    /// `None` past 2 billion entries or allocations.
    fn new(at: usize, which: Older) -> Option<Freed> {
        let which = match which {
            Older::Born(born) => born,
            Older::Before(place) => place | BEFORE_BIT,
        };
        Some(Freed {
            at: u32::try_from(at).ok()?,
            which,
        })
    }

    fn older(self) -> Older {
        if self.which & BEFORE_BIT == 0 {
            Older::Born(self.which)
        } else {
            Older::Before(self.which & !BEFORE_BIT)
        }
    }
}

/// An allocation older than the optimizer run that freed it.
#[derive(Clone, Copy)]
enum Older {
    /// Made by the `alloc` entry at this index (below 2^31).
    Born(u32),
    /// Alive before the trace: its place in `before` (below 2^31).
    Before(u32),
}

/// The lifetimes and phases of one device's trace.
pub struct Lifetimes<'a> {
    pub entries: &'a [TraceEntry],
    /// For each `alloc` entry, the entry that ended it (`NEVER` while alive).
    ended_at: EndedAt,
    /// Allocations alive before the trace, with the entry that ended each (`NEVER`).
    before: Vec<(u64, Live, u32)>,
    /// The live total after each entry.
    totals: LiveTotals,
    pub before_total: u64,
    /// Runs of one phase: where each starts and its phase (the last phase an `alloc` named,
    /// `Unknown` before any), in order; the first starts at 0.
    runs: Vec<(usize, Context)>,
    /// For each optimizer run, the entry after its last (`steps_before` counts them).
    step_ends: Vec<usize>,
    /// The allocations alive after the last entry, by address.
    pub final_live: LiveSet,
    contexts: ContextCache,
    /// For an allocation an optimizer step made and kept, the older allocation of the same
    /// size that the step freed (a parameter or state replaced rather than updated in place).
    replaces: FxHashMap<usize, (u64, Live)>,
}

/// What `Lifetimes` gathers while it follows a replay.
pub struct LifetimesBuilder<'a> {
    entries: &'a [TraceEntry],
    stacks: &'a StackTable,
    before: Vec<(u64, Live, u32)>,
    before_total: u64,
    totals: LiveTotals,
    runs: Vec<(usize, Context)>,
    contexts: ContextCache,
    current: Context,
    run_start: usize,
    /// Older allocations each optimizer run freed, by (run start, size), in entry order; not
    /// gradients (see `build`).
    freed_in_step: FxHashMap<(usize, u64), Vec<Freed>>,
    final_live: LiveSet,
}

impl<'a> FollowReplay<'a> for LifetimesBuilder<'a> {
    #[inline]
    fn step(&mut self, i: usize, replay: &Replay<'a>) {
        let e = &self.entries[i];
        if e.action() == Action::Alloc {
            if let Some(id) = e.stack {
                let c = self.contexts.get(self.stacks, id);
                let next = c.phase().unwrap_or(self.current);
                if next != self.current {
                    self.run_start = i;
                    match self.runs.last_mut() {
                        Some(last) if last.0 == i => last.1 = next,
                        _ => self.runs.push((i, next)),
                    }
                }
                self.current = next;
            }
        }
        if let Some((addr, ended)) = replay.ended() {
            if self.current == Context::Optimizer
                && ended.born().is_none_or(|b| b < self.run_start)
                && !matches!(
                    ended.stack.map(|id| self.contexts.get(self.stacks, id)),
                    Some(Context::Backward | Context::AccumulateGrad)
                )
            {
                if let Some(freed) = self.freed(i, addr, ended) {
                    self.freed_in_step
                        .entry((self.run_start, ended.size))
                        .or_default()
                        .push(freed);
                }
            }
        }
        debug_assert_eq!(
            i,
            self.totals.len(),
            "a replay steps through every entry in order"
        );
        self.totals.push(e.size, replay.live().total());
    }

    fn finish(&mut self, replay: &Replay<'a>) {
        self.final_live = replay.live().clone();
    }
}

impl<'a> Lifetimes<'a> {
    /// The first `alloc` entry at or after entry `from` (a walk over the allocations that
    /// reads no other entry).
    #[inline]
    pub fn next_alloc(&self, from: usize) -> Option<usize> {
        self.ended_at.next_alloc(from)
    }

    /// Replays the trace on its own (see `follow` to share a replay).
    pub fn new(entries: &'a [TraceEntry], segments: &[&Segment], stacks: &'a StackTable) -> Self {
        let mut replay = Replay::new(entries, segments.iter().copied());
        let mut builder = Lifetimes::follow(entries, stacks, &replay);
        let mut endings = Endings::new(entries);
        while let Some(i) = replay.step() {
            endings.note(i, &replay);
            builder.step(i, &replay);
        }
        builder.finish(&replay);
        builder.build(endings)
    }

    /// Starts gathering from a replay before its first entry; `FollowReplay` feeds the rest,
    /// and `build` takes when each allocation ended, noted over the same replay.
    pub fn follow(
        entries: &'a [TraceEntry],
        stacks: &'a StackTable,
        replay: &Replay<'a>,
    ) -> LifetimesBuilder<'a> {
        let mut before: Vec<(u64, Live, u32)> =
            replay.live().iter().map(|(a, l)| (a, *l, NEVER)).collect();
        before.sort_unstable_by_key(|b| b.0);
        LifetimesBuilder {
            entries,
            stacks,
            before,
            before_total: replay.live().total(),
            totals: LiveTotals::new(replay.live().total()),
            runs: vec![(0, Context::Unknown)],
            contexts: ContextCache::default(),
            current: Context::Unknown,
            run_start: 0,
            freed_in_step: FxHashMap::default(),
            final_live: LiveSet::default(),
        }
    }
}

impl<'a> LifetimesBuilder<'a> {
    /// `ended`, at `addr`, freed by entry `at`, as the builder keeps it: the replay made it
    /// from its `alloc` entry or had it alive before the trace (in `before`), so it is found
    /// again from there. `None` only past 2 billion entries.
    fn freed(&self, at: usize, addr: u64, ended: Live) -> Option<Freed> {
        let below_bit = |i: usize| u32::try_from(i).ok().filter(|&i| i < BEFORE_BIT);
        let which = match ended.born() {
            Some(born) => Older::Born(below_bit(born)?),
            None => {
                let place = self.before.binary_search_by_key(&addr, |b| b.0).ok()?;
                Older::Before(below_bit(place)?)
            }
        };
        Freed::new(at, which)
    }

    /// The lifetimes, once the replay has finished, with when each allocation ended in it.
    pub fn build(self, endings: Endings) -> Lifetimes<'a> {
        let Endings {
            ended_at,
            before_ended,
        } = endings;
        let LifetimesBuilder {
            entries,
            mut before,
            before_total,
            totals,
            runs,
            contexts,
            mut freed_in_step,
            final_live,
            ..
        } = self;
        for b in &mut before {
            b.2 = before_ended.get(&b.0).copied().unwrap_or(NEVER);
        }
        let n = entries.len();
        let run_ends: Vec<usize> = runs.iter().skip(1).map(|r| r.0).chain([n]).collect();
        let step_ends = runs
            .iter()
            .zip(&run_ends)
            .filter(|(r, _)| r.1 == Context::Optimizer)
            .map(|(_, &end)| end)
            .collect();
        // An allocation an optimizer run makes and keeps takes the place of the older one of
        // its size, freed in the same run, nearest to it (`p.data = ...` frees the old tensor
        // just before or just after making the new one). A gradient is never replaced: frees
        // of gradients are `zero_grad`'s clean-up.
        let mut replaces = FxHashMap::default();
        // Only a run that freed an older allocation can have made one that replaced it.
        let freed_runs: FxHashSet<usize> = freed_in_step.keys().map(|&(start, _)| start).collect();
        for (&(start, phase), &end) in runs.iter().zip(&run_ends) {
            if phase != Context::Optimizer || !freed_runs.contains(&start) {
                continue;
            }
            for (j, ended) in ended_at.alloc_ends(start..end) {
                if !alive_after(ended, end - 1) {
                    continue;
                }
                let Some(older) = freed_in_step.get_mut(&(start, entries[j].size)) else {
                    continue;
                };
                // The nearest by entry (the earlier of two as near): one of the two around `j`.
                let after = older.partition_point(|o| (o.at as usize) < j);
                let found = (after.saturating_sub(1)..(after + 1).min(older.len()))
                    .min_by_key(|&f| (older[f].at as usize).abs_diff(j));
                if let Some(f) = found {
                    let replaced = match older.remove(f).older() {
                        Older::Born(born) => {
                            let made = &entries[born as usize];
                            (
                                made.addr().unwrap_or(0),
                                Live::from_alloc(made, born as usize),
                            )
                        }
                        Older::Before(place) => {
                            let (addr, live, _) = before[place as usize];
                            (addr, live)
                        }
                    };
                    replaces.insert(j, replaced);
                }
            }
        }
        Lifetimes {
            entries,
            ended_at,
            before,
            totals: totals.finish(),
            before_total,
            runs,
            step_ends,
            final_live,
            contexts,
            replaces,
        }
    }
}

impl<'a> Lifetimes<'a> {
    /// The live total after entry `i` (`i` below the number of entries).
    pub fn total_after(&self, i: usize) -> u64 {
        self.totals.get(self.entries, i)
    }

    /// The live totals after entries `start..`, in order.
    pub fn totals_from(&self, start: usize) -> Totals<'_> {
        self.totals.walk_from(self.entries, start)
    }

    /// The older allocation that the one made at `born` replaced in an optimizer step.
    pub fn replaced_by(&self, born: usize) -> Option<(u64, Live)> {
        self.replaces.get(&born).copied()
    }

    /// The context of a stack (cached).
    pub fn context(&mut self, stacks: &StackTable, stack: Option<StackId>) -> Context {
        match stack {
            Some(id) => self.contexts.get(stacks, id),
            None => Context::Unknown,
        }
    }

    /// When an allocation ended: the entry index, or `entries.len()` when it did not.
    pub fn end_of(&self, addr: u64, live: &Live) -> usize {
        let end = match live.born() {
            Some(born) => self.ended_at.get(born),
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

    /// The runs of one phase: start, end (the entry after the last) and phase, in order.
    pub fn runs(&self) -> impl Iterator<Item = (usize, usize, Context)> + '_ {
        let n = self.entries.len();
        self.runs
            .iter()
            .enumerate()
            .map(move |(k, &(start, phase))| {
                (start, self.runs.get(k + 1).map_or(n, |r| r.0), phase)
            })
    }

    /// Index in `runs` of the run holding entry `i`.
    fn run_of(&self, i: usize) -> usize {
        self.runs.partition_point(|r| r.0 <= i).saturating_sub(1)
    }

    /// Whether an allocation made at `born` outlived the phase run it was made in.
    pub fn outlived_run(&self, born: usize, end: usize) -> bool {
        let next = self.runs.get(self.run_of(born) + 1);
        end >= next.map_or(self.entries.len(), |r| r.0)
    }

    /// `outlived_run` for allocations taken in the order they were made: `cursor` (0 at
    /// first) keeps the run of the last one, so no run is looked at twice.
    pub fn outlived_run_from(&self, cursor: &mut usize, born: usize, end: usize) -> bool {
        while self.runs.get(*cursor + 1).is_some_and(|r| r.0 <= born) {
            *cursor += 1;
        }
        end >= self
            .runs
            .get(*cursor + 1)
            .map_or(self.entries.len(), |r| r.0)
    }

    /// Optimizer runs finished before entry `i` (all of them for `i >= len`).
    pub fn steps_before(&self, i: usize) -> u32 {
        let i = i.min(self.entries.len());
        self.step_ends.partition_point(|&e| e <= i) as u32
    }

    /// The phase in effect at entry `i` (`Unknown` past the end).
    pub fn phase_at(&self, i: usize) -> Context {
        if i >= self.entries.len() {
            return Context::Unknown;
        }
        self.runs[self.run_of(i)].1
    }

    /// The allocations alive at some of the moments `after` (sorted; 0 is before the first
    /// entry, `i + 1` right after entry `i`), each with the range of `after` it is alive at.
    /// An allocation alive at none of them is never looked at twice.
    pub fn alive_at_any(&self, after: &[usize]) -> Vec<(u64, Live, Range<usize>)> {
        let Some(&last) = after.last() else {
            return Vec::new();
        };
        let n = self.entries.len();
        let end_of = |end: u32| if end == NEVER { n } else { end as usize };
        // Alive right after entry `p` when made at or before it and ended after it.
        let mut out: Vec<_> = self
            .before
            .iter()
            .map(|&(addr, live, end)| {
                let end = end_of(end);
                (addr, live, 0..after.partition_point(|&p| p <= end))
            })
            .filter(|(_, _, slots)| !slots.is_empty())
            .collect();
        let mut first = 0;
        for (j, end) in self.ended_at.alloc_ends(0..last.min(n)) {
            while after[first] <= j {
                first += 1;
            }
            let end = end_of(end);
            if after[first] > end {
                continue;
            }
            let slots = first..first + after[first..].partition_point(|&p| p <= end);
            // At the address the replay keeps it under (0 for an entry without one).
            let e = &self.entries[j];
            out.push((e.addr().unwrap_or(0), Live::from_alloc(e, j), slots));
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
        let made = self.ended_at.alive_after_entry(self.entries, p);
        older.chain(made).collect()
    }
}
