//! The one place that applies trace entries to a memory state: which allocations are alive,
//! their total, and the reserved total, entry by entry.
//!
//! A trace is the tail of a ring buffer, so a replay starts from the allocations alive before
//! its first entry: live blocks at the end that no `alloc` in the trace created, and addresses
//! freed in the trace before any `alloc` of them, each with the size its first event or block
//! gives (the definition in docs/json/analyze.md).

use super::event::{Action, StackId, TraceEntry};
use super::layout::Segment;
use rustc_hash::{FxHashMap, FxHashSet};

/// An allocation alive at some instant of a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Live {
    /// The requested size.
    pub size: u64,
    pub stack: Option<StackId>,
    /// Index of the `alloc` entry that made it; `BEFORE_TRACE` when it was alive before.
    born: u32,
}

const BEFORE_TRACE: u32 = u32::MAX;

impl Live {
    /// A live allocation made by the `alloc` entry at `index`.
    pub fn from_alloc(entry: &TraceEntry, index: usize) -> Live {
        Live {
            size: entry.size,
            stack: entry.stack,
            born: u32::try_from(index).unwrap_or(BEFORE_TRACE - 1),
        }
    }

    /// An allocation alive before the trace (a block of the final layout that no `alloc` in
    /// the trace made).
    pub fn before_trace(size: u64, stack: Option<StackId>) -> Live {
        Live {
            size,
            stack,
            born: BEFORE_TRACE,
        }
    }

    /// The same allocation with another size (a block's own record of it).
    pub fn with_size(self, size: u64) -> Live {
        Live { size, ..self }
    }

    /// Index of the `alloc` entry that made it; `None` when it was alive before the trace.
    pub fn born(&self) -> Option<usize> {
        (self.born != BEFORE_TRACE).then_some(self.born as usize)
    }
}

/// The live allocations of one device at one instant.
#[derive(Clone, Debug, Default)]
pub struct LiveSet {
    live: FxHashMap<u64, Live>,
    total: u64,
}

impl LiveSet {
    /// Sum of the requested sizes of live allocations.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// The allocation alive at an address, if any.
    pub fn get(&self, addr: u64) -> Option<&Live> {
        self.live.get(&addr)
    }

    /// Live allocations by address, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Live)> + '_ {
        self.live.iter().map(|(&a, l)| (a, l))
    }

    // The total wraps rather than panics on absurd sizes from a damaged file; inserts and
    // removes stay exact inverses either way.
    fn insert(&mut self, addr: u64, live: Live) -> Option<Live> {
        self.total = self.total.wrapping_add(live.size);
        let old = self.live.insert(addr, live);
        if let Some(old) = old {
            self.total = self.total.wrapping_sub(old.size);
        }
        old
    }

    fn remove(&mut self, addr: u64) -> Option<Live> {
        let old = self.live.remove(&addr);
        if let Some(old) = old {
            self.total = self.total.wrapping_sub(old.size);
        }
        old
    }
}

impl FromIterator<(u64, Live)> for LiveSet {
    fn from_iter<I: IntoIterator<Item = (u64, Live)>>(items: I) -> LiveSet {
        let mut set = LiveSet::default();
        for (addr, live) in items {
            set.insert(addr, live);
        }
        set
    }
}

/// A trace entry that contradicts the state it was applied to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayIssue {
    pub entry_index: usize,
    pub message: String,
}

/// Replays one device's trace entry by entry.
#[derive(Clone)]
pub struct Replay<'a> {
    entries: &'a [TraceEntry],
    next: usize,
    live: LiveSet,
    reserved: u64,
    /// What the last step ended, see `ended`.
    ended: Option<(u64, Live)>,
    first_issue: Option<ReplayIssue>,
    issue_count: usize,
}

/// What a replay of one device's trace starts from: the allocations alive before its first
/// entry and the bytes reserved then, worked out from the segments at the end of the trace.
/// Working it out walks the whole trace, so replays of one trace can share it
/// (`model::ReplayStarts`).
#[derive(Clone, Debug)]
pub struct ReplayStart {
    live: LiveSet,
    /// `None` when the trace frees more segment memory than the segments hold.
    reserved: Option<u64>,
}

impl ReplayStart {
    /// The state before the first of `entries`, given the device's segments at their end.
    pub fn of<'s>(
        entries: &[TraceEntry],
        segments: impl IntoIterator<Item = &'s Segment>,
    ) -> ReplayStart {
        let segments: Vec<&Segment> = segments.into_iter().collect();
        let (alive, net_growth) = walk_before(entries, &segments);
        let mut live = LiveSet::default();
        for (addr, l) in alive {
            live.insert(addr, l);
        }
        ReplayStart::with_live(live, net_growth, &segments)
    }

    /// The state before the first of `entries` of a trace before which nothing was alive
    /// (`Timeline::starts_empty`): `of` without the walk that looks for older allocations.
    pub fn of_empty<'s>(
        entries: &[TraceEntry],
        segments: impl IntoIterator<Item = &'s Segment>,
    ) -> ReplayStart {
        let segments: Vec<&Segment> = segments.into_iter().collect();
        debug_assert!(
            walk_before(entries, &segments).0.is_empty(),
            "a trace said to start empty frees or holds memory it did not allocate"
        );
        let net_growth = entries.iter().map(segment_growth).sum();
        ReplayStart::with_live(LiveSet::default(), net_growth, &segments)
    }

    /// The start with `live` alive before the trace, whose segment entries added `net_growth`
    /// bytes to what was reserved before it.
    fn with_live(live: LiveSet, net_growth: i128, segments: &[&Segment]) -> ReplayStart {
        let final_reserved: i128 = segments.iter().map(|s| s.total_size as i128).sum();
        ReplayStart {
            live,
            reserved: u64::try_from(final_reserved - net_growth).ok(),
        }
    }
}

impl<'a> Replay<'a> {
    /// A replay of `entries` from the state before the first one, given the device's segments
    /// at the end of the trace.
    pub fn new<'s>(
        entries: &'a [TraceEntry],
        segments: impl IntoIterator<Item = &'s Segment>,
    ) -> Replay<'a> {
        Replay::from_start(entries, &ReplayStart::of(entries, segments))
    }

    /// A replay of `entries` from `start`, which must be `ReplayStart::of` the same entries.
    pub fn from_start(entries: &'a [TraceEntry], start: &ReplayStart) -> Replay<'a> {
        let mut replay = Replay {
            entries,
            next: 0,
            live: start.live.clone(),
            reserved: 0,
            ended: None,
            first_issue: None,
            issue_count: 0,
        };
        match start.reserved {
            Some(r) => replay.reserved = r,
            None => replay.issue(
                0,
                "the trace frees more segment memory than the snapshot reserves".into(),
            ),
        }
        replay
    }

    /// The entries replayed.
    pub fn entries(&self) -> &'a [TraceEntry] {
        self.entries
    }

    /// Applies the next entry and returns its index, or `None` at the end.
    #[inline]
    pub fn step(&mut self) -> Option<usize> {
        let index = self.next;
        let entry = *self.entries.get(index)?;
        prefetch(self.entries, index + PREFETCH_AHEAD);
        self.next += 1;
        self.ended = None;
        let addr = entry.addr().unwrap_or(0);
        match entry.action() {
            Action::Alloc => {
                self.ended = self
                    .live
                    .insert(addr, Live::from_alloc(&entry, index))
                    .map(|l| (addr, l));
                if self.ended.is_some() {
                    self.issue(
                        index,
                        format!("alloc at 0x{addr:x}, which is already allocated"),
                    );
                }
            }
            Action::FreeCompleted => {
                self.ended = self.live.remove(addr).map(|l| (addr, l));
                if self.ended.is_none() {
                    self.issue(
                        index,
                        format!("free_completed at 0x{addr:x}, which is not allocated"),
                    );
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                self.reserved = self.reserved.saturating_add(entry.size)
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                match self.reserved.checked_sub(entry.size) {
                    Some(r) => self.reserved = r,
                    None => {
                        self.issue(
                            index,
                            format!("{} of more than is reserved", entry.action()),
                        );
                        self.reserved = 0;
                    }
                }
            }
            Action::FreeRequested | Action::Snapshot | Action::Oom => {}
        }
        Some(index)
    }

    /// Applies entries up to and including `index`.
    pub fn run_through(&mut self, index: usize) {
        while self.next <= index && self.step().is_some() {}
    }

    /// Index of the next entry to apply.
    pub fn position(&self) -> usize {
        self.next
    }

    pub fn live(&self) -> &LiveSet {
        &self.live
    }

    /// The allocation the last step ended (freed, or replaced by an `alloc` at its address),
    /// with its address.
    pub fn ended(&self) -> Option<(u64, Live)> {
        self.ended
    }

    /// Bytes reserved from the driver (segment totals) at this point.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The first contradiction met so far, and how many there were.
    pub fn issues(&self) -> (Option<&ReplayIssue>, usize) {
        (self.first_issue.as_ref(), self.issue_count)
    }

    fn issue(&mut self, entry_index: usize, message: String) {
        self.issue_count += 1;
        self.first_issue.get_or_insert(ReplayIssue {
            entry_index,
            message,
        });
    }
}

/// The bytes a segment entry adds to what is reserved (negative for a release).
#[inline]
fn segment_growth(e: &TraceEntry) -> i128 {
    match e.action() {
        Action::SegmentAlloc | Action::SegmentMap => e.size as i128,
        Action::SegmentFree | Action::SegmentUnmap => -(e.size as i128),
        _ => 0,
    }
}

/// One walk of the trace for the state before it: the allocations alive before the first
/// entry, by address, and the bytes the segment entries added to what was reserved.
fn walk_before(entries: &[TraceEntry], segments: &[&Segment]) -> (Vec<(u64, Live)>, i128) {
    let mut alive: FxHashMap<u64, Live> = FxHashMap::default();
    let mut allocated_in_window: FxHashSet<u64> = FxHashSet::default();
    let mut net_growth = 0i128;
    for (i, e) in entries.iter().enumerate() {
        prefetch(entries, i + PREFETCH_AHEAD);
        net_growth += segment_growth(e);
        let Some(addr) = e.addr() else { continue };
        match e.action() {
            Action::Alloc => {
                allocated_in_window.insert(addr);
            }
            Action::FreeRequested | Action::FreeCompleted
                if !allocated_in_window.contains(&addr) =>
            {
                alive.entry(addr).or_insert(Live {
                    size: e.size,
                    stack: e.stack,
                    born: BEFORE_TRACE,
                });
            }
            _ => {}
        }
    }
    for block in segments.iter().flat_map(|s| &s.blocks) {
        if block.state.is_active() && !allocated_in_window.contains(&block.address) {
            alive.entry(block.address).or_insert(Live {
                size: block.requested_size,
                stack: block.stack,
                born: BEFORE_TRACE,
            });
        }
    }
    let mut sorted: Vec<(u64, Live)> = alive.into_iter().collect();
    sorted.sort_unstable_by_key(|&(a, _)| a);
    (sorted, net_growth)
}

/// How many entries ahead of the one applied a replay asks the processor to load.
const PREFETCH_AHEAD: usize = 64;

/// Asks the processor to start loading `entries[i]` (nothing past the end).
#[inline(always)]
fn prefetch(entries: &[TraceEntry], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(e) = entries.get(i) {
        // SAFETY: a prefetch only hints the cache; it reads nothing the program sees, and the
        // pointer is of a live element.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (e as *const TraceEntry).cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (entries, i);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Block, BlockState, PoolKind, StreamIndex};

    fn e(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, Some(addr), size, StreamIndex(0))
    }

    fn segment(blocks: Vec<Block>, total: u64) -> Segment {
        Segment {
            device: 0,
            address: 0x1000,
            total_size: total,
            stream: 0,
            pool: PoolKind::Large,
            pool_id: (0, 0),
            is_expandable: false,
            stack: None,
            blocks,
        }
    }

    fn block(address: u64, size: u64, requested: u64, state: BlockState) -> Block {
        Block {
            address,
            size,
            requested_size: requested,
            state,
            stack: None,
        }
    }

    #[test]
    fn counts_allocations_alive_before_the_window() {
        // 0x1000 was allocated before the trace and freed in it; 0x3000 is live at the end
        // and no alloc made it; 0x2000 is allocated and freed in the window.
        let entries = [
            e(Action::FreeRequested, 0x1000, 100),
            e(Action::FreeCompleted, 0x1000, 100),
            e(Action::Alloc, 0x2000, 50),
            e(Action::FreeRequested, 0x2000, 50),
            e(Action::FreeCompleted, 0x2000, 50),
        ];
        let seg = segment(
            vec![
                block(0x1000, 0x2000, 100, BlockState::Inactive),
                block(0x3000, 0x1000, 70, BlockState::ActiveAllocated),
            ],
            0x3000,
        );
        let mut replay = Replay::new(&entries, [&seg]);
        assert_eq!(replay.live().total(), 170);
        assert_eq!(replay.reserved(), 0x3000);
        let mut totals = Vec::new();
        while replay.step().is_some() {
            totals.push(replay.live().total());
        }
        assert_eq!(totals, [170, 70, 120, 120, 70]);
        assert_eq!(replay.issues().1, 0);
    }

    #[test]
    fn reports_contradictions_with_the_entry_index() {
        let entries = [
            e(Action::Alloc, 0x10, 8),
            e(Action::FreeCompleted, 0x10, 8),
            e(Action::FreeCompleted, 0x10, 8),
        ];
        let mut replay = Replay::new(&entries, []);
        replay.run_through(2);
        let (first, count) = replay.issues();
        assert_eq!(count, 1);
        assert_eq!(first.map(|i| i.entry_index), Some(2));
    }

    #[test]
    fn tracks_reserved_backwards_from_the_final_segments() {
        let entries = [
            e(Action::SegmentAlloc, 0x1000, 0x2000),
            e(Action::SegmentFree, 0x9000, 0x800),
        ];
        let seg = segment(vec![block(0x1000, 0x2000, 0, BlockState::Inactive)], 0x2000);
        let mut replay = Replay::new(&entries, [&seg]);
        assert_eq!(replay.reserved(), 0x800);
        replay.step();
        assert_eq!(replay.reserved(), 0x2800);
        replay.step();
        assert_eq!(replay.reserved(), 0x2000);
    }
}
