//! What `view` precomputes once per device so that each frame and each cursor move costs
//! little however long the trace: the memory series in fixed buckets (allocated low/high,
//! reserved high), replay checkpoints (the state at any entry is a short replay from the
//! nearest one), and the indices of the segment entries (the segments at any entry are the
//! final ones with the later segment entries undone).

use crate::model::{Action, Replay, Segment, Snapshot, StackId, TraceEntry};

/// At most this many buckets: the chart never reads more per frame.
const MAX_BUCKETS: usize = 1 << 16;
/// At most this many checkpoints (each holds a copy of the live allocations).
const MAX_CHECKPOINTS: usize = 32;
/// Checkpoints are at least this many entries apart.
const MIN_CHECKPOINT_SPACING: usize = 4096;
/// Cells of the occupancy map kept per cursor state; rendering groups them.
pub const MAP_CELLS: usize = 4096;
/// Largest live allocations kept per cursor state.
const LARGEST_KEPT: usize = 32;

/// Memory over a run of consecutive entries (after each of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Lowest allocated (live requested) bytes.
    pub low: u64,
    /// Highest allocated bytes.
    pub high: u64,
    /// Highest reserved bytes.
    pub reserved: u64,
}

impl Bucket {
    fn merge(self, other: Bucket) -> Bucket {
        Bucket {
            low: self.low.min(other.low),
            high: self.high.max(other.high),
            reserved: self.reserved.max(other.reserved),
        }
    }
}

/// One device's precomputed summary.
pub struct Summary<'a> {
    pub device: u32,
    entries: &'a [TraceEntry],
    final_segments: Vec<&'a Segment>,
    bucket_size: usize,
    buckets: Vec<Bucket>,
    spacing: usize,
    /// `checkpoints[k]` is the replay positioned before entry `k * spacing`.
    checkpoints: Vec<Replay<'a>>,
    segment_entries: Vec<usize>,
    /// Highest reserved (else allocated) bytes over the whole trace: the chart's full scale.
    pub scale: u64,
}

/// A live allocation at the cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub address: u64,
    pub size: u64,
    pub stack: Option<StackId>,
}

/// The memory state just after one entry (or the final state of a file without a trace).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorState {
    /// `None` for the final state of a file without a trace.
    pub index: Option<usize>,
    pub allocated: u64,
    pub reserved: u64,
    pub live_count: usize,
    pub segment_count: usize,
    /// Largest run of reserved bytes with no live allocation in it; `None` without segments.
    pub largest_free: Option<u64>,
    /// Runs of free bytes inside segments.
    pub free_runs: usize,
    /// Bytes each occupancy cell stands for (0 without segments).
    pub cell_bytes: u64,
    /// Live bytes in each cell of the segments laid end to end in address order.
    pub occupancy: Vec<u64>,
    /// The largest live allocations, largest first.
    pub largest: Vec<LiveBlock>,
}

/// A segment range at some entry (a `cudaMalloc`, or a mapped part of an expandable segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u64,
    size: u64,
    /// Part of an expandable segment: touching mapped parts are one range.
    expandable: bool,
}

impl<'a> Summary<'a> {
    /// Replays the device's trace once and keeps the summaries.
    pub fn build(snapshot: &'a Snapshot, device: u32) -> Summary<'a> {
        let entries = snapshot.timeline.device(device as usize);
        let final_segments: Vec<&Segment> = snapshot.device_segments(device).collect();
        let n = entries.len();
        let bucket_size = n.div_ceil(MAX_BUCKETS).max(1);
        let spacing = n.div_ceil(MAX_CHECKPOINTS).max(MIN_CHECKPOINT_SPACING);
        let mut replay = Replay::new(entries, final_segments.iter().copied());
        let mut buckets = Vec::with_capacity(n.div_ceil(bucket_size));
        let mut checkpoints = Vec::new();
        let mut segment_entries = Vec::new();
        let mut scale = 0u64;
        for (i, e) in entries.iter().enumerate() {
            if i.is_multiple_of(spacing) {
                checkpoints.push(replay.clone());
            }
            if matches!(
                e.action(),
                Action::SegmentAlloc
                    | Action::SegmentFree
                    | Action::SegmentMap
                    | Action::SegmentUnmap
            ) {
                segment_entries.push(i);
            }
            replay.step();
            let now = Bucket {
                low: replay.live().total(),
                high: replay.live().total(),
                reserved: replay.reserved(),
            };
            scale = scale.max(now.reserved).max(now.high);
            match buckets.last_mut() {
                Some(b) if !i.is_multiple_of(bucket_size) => *b = now.merge(*b),
                _ => buckets.push(now),
            }
        }
        if n == 0 {
            scale = final_segments
                .iter()
                .fold(0u64, |sum, s| sum.saturating_add(s.total_size));
        }
        Summary {
            device,
            entries,
            final_segments,
            bucket_size,
            buckets,
            spacing,
            checkpoints,
            segment_entries,
            scale,
        }
    }

    /// Entries in the device's trace.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries per bucket: the finest the chart can resolve.
    pub fn bucket_size(&self) -> usize {
        self.bucket_size
    }

    /// Microseconds from the first entry to entry `index`, when the trace has times.
    pub fn offset_us(&self, index: usize) -> Option<i64> {
        let (at, first) = (self.entries.get(index)?, self.entries.first()?);
        at.time_us()?.checked_sub(first.time_us()?)
    }

    /// Memory over entries `[from, to)`, from the buckets that cover them; `None` when empty.
    pub fn span(&self, from: usize, to: usize) -> Option<Bucket> {
        let to = to.min(self.entries.len());
        if from >= to {
            return None;
        }
        let first = from / self.bucket_size;
        let last = (to - 1) / self.bucket_size;
        self.buckets
            .get(first..=last)?
            .iter()
            .copied()
            .reduce(Bucket::merge)
    }

    /// The state just after entry `index` (clamped to the trace), or the final state of a
    /// file without a trace.
    pub fn state_at(&self, index: usize) -> CursorState {
        if self.entries.is_empty() {
            return self.final_state();
        }
        let index = index.min(self.entries.len() - 1);
        let k = (index / self.spacing).min(self.checkpoints.len().saturating_sub(1));
        let mut replay = match self.checkpoints.get(k) {
            Some(c) => c.clone(),
            None => Replay::new(self.entries, self.final_segments.iter().copied()),
        };
        replay.run_through(index);
        let live: Vec<LiveBlock> = replay
            .live()
            .iter()
            .map(|(address, l)| LiveBlock {
                address,
                size: l.size,
                stack: l.stack,
            })
            .collect();
        let ranges = self.ranges_at(index);
        describe(
            Some(index),
            live,
            &ranges,
            replay.live().total(),
            replay.reserved(),
        )
    }

    /// The final layout, for a file without a trace.
    fn final_state(&self) -> CursorState {
        let live: Vec<LiveBlock> = self
            .final_segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active())
            .map(|b| LiveBlock {
                address: b.address,
                size: b.requested_size,
                stack: b.stack,
            })
            .collect();
        let ranges = self.final_ranges();
        let allocated = live.iter().map(|b| b.size).sum();
        describe(None, live, &ranges, allocated, self.scale)
    }

    /// The segment ranges at the end of the trace.
    fn final_ranges(&self) -> Vec<Range> {
        self.final_segments
            .iter()
            .map(|s| Range {
                start: s.address,
                size: s.total_size,
                expandable: s.is_expandable,
            })
            .collect()
    }

    /// The segment ranges just after entry `index`: the final ones with every later segment
    /// entry undone, newest first.
    fn ranges_at(&self, index: usize) -> Vec<Range> {
        let mut ranges = self.final_ranges();
        let later = self.segment_entries.partition_point(|&i| i <= index);
        for &i in self.segment_entries[later..].iter().rev() {
            let e = &self.entries[i];
            let Some(start) = e.addr() else { continue };
            let range = Range {
                start,
                size: e.size,
                expandable: matches!(e.action(), Action::SegmentMap | Action::SegmentUnmap),
            };
            match e.action() {
                Action::SegmentAlloc => ranges.retain(|r| r.start != start),
                Action::SegmentFree => ranges.push(range),
                Action::SegmentUnmap => {
                    ranges.push(range);
                    join_expandable(&mut ranges);
                }
                Action::SegmentMap => unmap(&mut ranges, range),
                _ => {}
            }
        }
        ranges.sort_unstable_by_key(|r| r.start);
        ranges
    }
}

/// Joins touching ranges of expandable segments into one, as a snapshot shows them.
fn join_expandable(ranges: &mut Vec<Range>) {
    ranges.sort_unstable_by_key(|r| r.start);
    let mut joined: Vec<Range> = Vec::with_capacity(ranges.len());
    for r in ranges.drain(..) {
        match joined.last_mut() {
            Some(last)
                if last.expandable
                    && r.expandable
                    && last.start.saturating_add(last.size) == r.start =>
            {
                last.size = last.size.saturating_add(r.size);
            }
            _ => joined.push(r),
        }
    }
    *ranges = joined;
}

/// Removes `gone` from the range that contains it, keeping what is left on either side.
fn unmap(ranges: &mut Vec<Range>, gone: Range) {
    let end = gone.start.saturating_add(gone.size);
    let Some(i) = ranges
        .iter()
        .position(|r| r.start <= gone.start && end <= r.start.saturating_add(r.size))
    else {
        return;
    };
    let r = ranges.swap_remove(i);
    let left = Range {
        size: gone.start - r.start,
        ..r
    };
    let right = Range {
        start: end,
        size: r.start.saturating_add(r.size) - end,
        ..r
    };
    ranges.extend([left, right].into_iter().filter(|p| p.size > 0));
}

/// Fragmentation figures, the occupancy map and the largest blocks of a live set laid over
/// segment ranges (sorted by start).
fn describe(
    index: Option<usize>,
    mut live: Vec<LiveBlock>,
    ranges: &[Range],
    allocated: u64,
    reserved: u64,
) -> CursorState {
    live.sort_unstable_by_key(|b| b.address);
    // Sizes come from the file: saturate rather than overflow on absurd ones.
    let total = ranges
        .iter()
        .fold(0u64, |sum, r| sum.saturating_add(r.size));
    let cell_bytes = total.div_ceil(MAP_CELLS as u64);
    let mut occupancy = vec![0u64; if cell_bytes == 0 { 0 } else { MAP_CELLS }];
    let mut largest_free = None;
    let mut free_runs = 0;
    let mut offset = 0u64;
    let mut next = 0;
    for r in ranges {
        let end = r.start.saturating_add(r.size);
        let mut cursor = r.start;
        while next < live.len() && live[next].address < r.start {
            next += 1;
        }
        let mut note_free = |from: u64, to: u64| {
            if to > from {
                free_runs += 1;
                largest_free = Some(largest_free.unwrap_or(0).max(to - from));
            }
        };
        while let Some(b) = live.get(next).filter(|b| b.address < end) {
            let b_end = b.address.saturating_add(b.size).min(end);
            if b.address >= cursor {
                note_free(cursor, b.address);
            }
            fill(
                &mut occupancy,
                cell_bytes,
                offset.saturating_add(b.address.max(cursor) - r.start),
                offset.saturating_add(b_end.max(cursor) - r.start),
            );
            cursor = cursor.max(b_end);
            next += 1;
        }
        note_free(cursor, end);
        if largest_free.is_none() {
            largest_free = Some(0);
        }
        offset = offset.saturating_add(r.size);
    }
    let live_count = live.len();
    live.sort_unstable_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    live.truncate(LARGEST_KEPT);
    CursorState {
        index,
        allocated,
        reserved,
        live_count,
        segment_count: ranges.len(),
        largest_free,
        free_runs,
        cell_bytes,
        occupancy,
        largest: live,
    }
}

/// Adds the bytes `[from, to)` of the concatenated segments to the cells they fall in.
fn fill(cells: &mut [u64], cell_bytes: u64, from: u64, to: u64) {
    if cell_bytes == 0 {
        return;
    }
    // Past the last cell there is nothing to fill (and a bogus size could make that far).
    let to = to.min((cells.len() as u64).saturating_mul(cell_bytes));
    let mut at = from;
    while at < to {
        let cell = (at / cell_bytes) as usize;
        let cell_end = (cell as u64 + 1).saturating_mul(cell_bytes);
        let upto = to.min(cell_end);
        if let Some(c) = cells.get_mut(cell) {
            *c = c.saturating_add(upto - at);
        }
        at = upto;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::layout_at;
    use crate::model::BlockState;
    use crate::source::torch_snapshot;

    fn load(name: &str) -> Snapshot {
        let path = format!(
            "{}/fixtures/snapshots/{name}.pickle",
            env!("CARGO_MANIFEST_DIR")
        );
        let file = std::fs::File::open(path).expect("fixture");
        torch_snapshot::read(file).expect("parses").snapshot
    }

    /// Entries to check: both ends, the middle, and around every checkpoint.
    fn probes(summary: &Summary) -> Vec<usize> {
        let n = summary.len();
        let mut at = vec![0, n / 2, n - 1];
        for k in 0..summary.checkpoints.len() {
            let c = k * summary.spacing;
            at.extend(
                [c.saturating_sub(1), c, c + 1]
                    .into_iter()
                    .filter(|&i| i < n),
            );
        }
        at
    }

    /// Sizes near 2^63 from a damaged or hostile file: building the summary and the state at
    /// any entry neither overflows nor spins over cells that do not exist.
    #[test]
    fn absurd_sizes_neither_overflow_nor_hang() {
        use memprof_wire::{FileHeader, Kind, ProcessInfo, Record};
        let mut bytes = FileHeader {
            pid: 1,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        let process = ProcessInfo {
            wall_start_ns: None,
            host: None,
            args: Vec::new(),
        };
        bytes.extend_from_slice(&process.encode());
        for (ptr, size) in [
            (0x1000, 1u64 << 63),
            ((1 << 63) + 0x2000, (1 << 63) + (1 << 24)),
        ] {
            let mut r = Record::new(Kind::Alloc);
            (r.ptr, r.size) = (ptr, size);
            bytes.extend_from_slice(&r.encode());
        }
        let read = crate::source::recording::read(&bytes).expect("a valid recording");
        let snapshot = &read.parsed.snapshot;
        let summary = Summary::build(snapshot, 0);
        assert_eq!(summary.len(), 4, "two segment_alloc + alloc pairs");
        for index in 0..summary.len() {
            let state = summary.state_at(index);
            assert!(state.occupancy.len() <= MAP_CELLS);
        }
    }

    #[test]
    fn the_state_at_any_entry_matches_a_full_replay_and_the_rebuilt_layout() {
        for name in [
            "demo_oom",
            "v2_11_full",
            "expandable",
            "multi_device",
            "pending_free",
        ] {
            let snapshot = load(name);
            for device in snapshot.devices() {
                let summary = Summary::build(&snapshot, device);
                if summary.is_empty() {
                    continue;
                }
                for index in probes(&summary) {
                    let got = summary.state_at(index);
                    let entries = snapshot.timeline.device(device as usize);
                    let mut replay = Replay::new(entries, snapshot.device_segments(device));
                    replay.run_through(index);
                    let what = format!("{name} device {device} entry {index}");
                    assert_eq!(got.index, Some(index), "{what}");
                    assert_eq!(got.allocated, replay.live().total(), "{what}");
                    assert_eq!(got.reserved, replay.reserved(), "{what}");
                    assert_eq!(got.live_count, replay.live().len(), "{what}");
                    let layout = layout_at(&snapshot, device, index);
                    let ranges = summary.ranges_at(index);
                    let bytes = |sizes: &mut dyn Iterator<Item = u64>| sizes.sum::<u64>();
                    assert_eq!(
                        bytes(&mut ranges.iter().map(|r| r.size)),
                        bytes(&mut layout.iter().map(|s| s.total_size)),
                        "{what}: segment bytes"
                    );
                    let free = layout
                        .iter()
                        .flat_map(|s| &s.blocks)
                        .filter(|b| b.state == BlockState::Inactive)
                        .map(|b| b.size)
                        .max();
                    assert_eq!(got.largest_free.filter(|&f| f > 0), free, "{what}");
                    let runs = layout
                        .iter()
                        .flat_map(|s| &s.blocks)
                        .filter(|b| b.state == BlockState::Inactive)
                        .count();
                    assert_eq!(got.free_runs, runs, "{what}: free runs");
                    let mapped: u64 = got.occupancy.iter().sum();
                    assert!(mapped <= got.allocated, "{what}: map holds live bytes only");
                    assert!(got.largest.windows(2).all(|w| w[0].size >= w[1].size));
                }
            }
        }
    }

    #[test]
    fn spans_are_the_extremes_of_the_entries_they_cover() {
        let snapshot = load("demo_oom");
        let summary = Summary::build(&snapshot, 0);
        assert_eq!(summary.bucket_size(), 1, "a small trace keeps every entry");
        let entries = snapshot.timeline.device(0);
        let mut replay = Replay::new(entries, snapshot.device_segments(0));
        let mut after = Vec::new();
        while replay.step().is_some() {
            after.push((replay.live().total(), replay.reserved()));
        }
        for (from, to) in [(0, 1), (0, entries.len()), (100, 917), (940, 945)] {
            let want = &after[from..to];
            let got = summary.span(from, to).expect("non-empty");
            assert_eq!(got.high, want.iter().map(|a| a.0).max().unwrap_or(0));
            assert_eq!(got.low, want.iter().map(|a| a.0).min().unwrap_or(0));
            assert_eq!(got.reserved, want.iter().map(|a| a.1).max().unwrap_or(0));
        }
        assert_eq!(summary.span(5, 5), None);
        assert_eq!(summary.span(entries.len(), entries.len() + 3), None);
    }

    #[test]
    fn buckets_stay_bounded_on_long_traces() {
        use crate::model::{SnapshotFormat, StackTable, StreamIndex, Timeline};
        let n = 3 * MAX_BUCKETS + 5;
        let entries: Vec<TraceEntry> = (0..n)
            .map(|i| {
                let addr = Some(0x1000 * (i as u64 / 2));
                let action = if i % 2 == 0 {
                    Action::Alloc
                } else {
                    Action::FreeCompleted
                };
                TraceEntry::new(action, addr, 1 + (i as u64 % 7), StreamIndex(0))
            })
            .collect();
        let snapshot = Snapshot {
            format: SnapshotFormat::Modern,
            segments: Vec::new(),
            timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        };
        let summary = Summary::build(&snapshot, 0);
        assert_eq!(summary.bucket_size(), 4);
        assert!(summary.buckets.len() <= MAX_BUCKETS);
        assert!(summary.checkpoints.len() <= MAX_CHECKPOINTS);
        let whole = summary.span(0, n).expect("non-empty");
        assert_eq!((whole.low, whole.high), (0, 7));
        assert_eq!(
            summary.state_at(n - 1).live_count,
            1,
            "the last alloc is alive"
        );
        assert_eq!(summary.state_at(n + 100).index, Some(n - 1));
    }
}
