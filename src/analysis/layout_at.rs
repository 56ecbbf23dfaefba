//! The segment layout at an earlier trace entry (the peak), rebuilt from the final layout and
//! the trace: segments by undoing the segment entries after it (`model::ranges_before`, shared
//! with the simulator's start state), their contents from the replay's live allocations then. Blocks are the live allocations at their requested sizes
//! (pending free when freed but not yet completed); the rest of each segment is free, rounding
//! included, since the trace does not say how the allocator split its blocks.

use crate::model::{
    ranges_before, replay_device, Action, Block, BlockState, PoolKind, RangeRules, Segment,
    Snapshot, TraceEntry,
};
use rustc_hash::FxHashSet;

/// A range of device memory that was a segment (or a mapped part of an expandable one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    start: u64,
    size: u64,
    stream: u64,
    pool: PoolKind,
    expandable: bool,
}

impl Range {
    fn end(self) -> u64 {
        self.start.saturating_add(self.size)
    }
}

/// The segments reserved just after entry `index`: the final ones with the segment entries
/// after it undone (`model::ranges_before`, as the simulator's start state does).
fn ranges_at(snapshot: &Snapshot, device: u32, index: usize) -> Vec<Range> {
    let last: Vec<Segment> = snapshot.device_segments(device).cloned().collect();
    let entries = snapshot.timeline.device(device as usize);
    let after = entries.get(index + 1..).unwrap_or(&[]);
    let stream_of = |e: &TraceEntry| snapshot.timeline.stream(e.stream);
    let rules = RangeRules {
        stream_of: &stream_of,
        pool_of: &|_| PoolKind::Large,
    };
    ranges_before(after, &last, &rules, &mut |_, _| {})
        .into_iter()
        .map(|(start, r)| Range {
            start,
            size: r.size,
            stream: r.stream,
            pool: r.pool,
            expandable: r.expandable,
        })
        .collect()
}

/// The layout of `device` just after entry `index`, rebuilt as described above.
pub fn layout_at(snapshot: &Snapshot, device: u32, index: usize) -> Vec<Segment> {
    let entries = snapshot.timeline.device(device as usize);
    let mut replay = replay_device(snapshot, device);
    replay.run_through(index);
    let mut pending: FxHashSet<u64> = FxHashSet::default();
    for e in entries.iter().take(index + 1) {
        let Some(addr) = e.addr() else { continue };
        match e.action() {
            Action::FreeRequested => {
                pending.insert(addr);
            }
            Action::FreeCompleted | Action::Alloc => {
                pending.remove(&addr);
            }
            _ => {}
        }
    }
    let ranges = ranges_at(snapshot, device, index);
    let mut contents: Vec<Vec<(u64, u64, BlockState)>> = vec![Vec::new(); ranges.len()];
    for (addr, live) in replay.live().iter() {
        let i = ranges.partition_point(|r| r.start <= addr);
        let Some(r) = i.checked_sub(1).map(|i| (i, ranges[i])) else {
            continue;
        };
        if addr < r.1.end() {
            let state = if pending.contains(&addr) {
                BlockState::ActivePendingFree
            } else {
                BlockState::ActiveAllocated
            };
            contents[r.0].push((addr, live.size, state));
        }
    }
    ranges
        .iter()
        .zip(contents)
        .map(|(r, mut blocks)| {
            blocks.sort_unstable_by_key(|b| b.0);
            Segment {
                device,
                address: r.start,
                total_size: r.size,
                stream: r.stream,
                pool: r.pool,
                pool_id: (0, 0),
                is_expandable: r.expandable,
                stack: None,
                blocks: tile(*r, &blocks),
            }
        })
        .collect()
}

/// Blocks that tile a range: the given ones (clipped, overlaps dropped) and free gaps.
fn tile(range: Range, used: &[(u64, u64, BlockState)]) -> Vec<Block> {
    let mut blocks = Vec::with_capacity(used.len() * 2 + 1);
    let free = |address: u64, size: u64| Block {
        address,
        size,
        requested_size: 0,
        state: BlockState::Inactive,
        stack: None,
    };
    let mut cursor = range.start;
    for &(addr, size, state) in used {
        if addr < cursor {
            continue;
        }
        if addr > cursor {
            blocks.push(free(cursor, addr - cursor));
        }
        let size = size.min(range.end() - addr);
        blocks.push(Block {
            address: addr,
            size,
            requested_size: size,
            state,
            stack: None,
        });
        cursor = addr + size;
    }
    if cursor < range.end() {
        blocks.push(free(cursor, range.end() - cursor));
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Snapshot, SnapshotFormat};
    use crate::model::{StackTable, StreamIndex, Timeline, TraceEntry};

    fn e(action: Action, addr: u64, size: u64) -> TraceEntry {
        TraceEntry::new(action, Some(addr), size, StreamIndex(0))
    }

    #[test]
    fn rebuilds_segments_and_blocks_at_an_earlier_entry() {
        // Segment A (0x1000, 0x1000) lives throughout; B (0x8000, 0x800) is created after
        // the peak; C (0x10000, 0x400) is released after it.
        let entries = vec![
            e(Action::SegmentAlloc, 0x1000, 0x1000),
            e(Action::Alloc, 0x1000, 0x100),
            e(Action::Alloc, 0x1400, 0x200),
            e(Action::Alloc, 0x10000, 0x400),
            e(Action::FreeRequested, 0x1000, 0x100),
            // peak side: index 4
            e(Action::FreeCompleted, 0x1000, 0x100),
            e(Action::FreeRequested, 0x10000, 0x400),
            e(Action::FreeCompleted, 0x10000, 0x400),
            e(Action::SegmentFree, 0x10000, 0x400),
            e(Action::SegmentAlloc, 0x8000, 0x800),
        ];
        let seg = |address, total_size, blocks| Segment {
            device: 0,
            address,
            total_size,
            stream: 0,
            pool: PoolKind::Large,
            pool_id: (0, 0),
            is_expandable: false,
            stack: None,
            blocks,
        };
        let block = |address, size, state| Block {
            address,
            size,
            requested_size: size,
            state,
            stack: None,
        };
        let n = entries.len();
        let snap = Snapshot {
            format: SnapshotFormat::Modern,
            segments: vec![
                seg(
                    0x1000,
                    0x1000,
                    vec![
                        block(0x1000, 0x400, BlockState::Inactive),
                        block(0x1400, 0x200, BlockState::ActiveAllocated),
                        block(0x1600, 0xa00, BlockState::Inactive),
                    ],
                ),
                seg(
                    0x8000,
                    0x800,
                    vec![block(0x8000, 0x800, BlockState::Inactive)],
                ),
            ],
            timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        };
        let at = layout_at(&snap, 0, 4);
        type Shape = (u64, u64, Vec<(u64, u64, BlockState)>);
        let shape: Vec<Shape> = at
            .iter()
            .map(|s| {
                let blocks = s.blocks.iter().map(|b| (b.address, b.size, b.state));
                (s.address, s.total_size, blocks.collect())
            })
            .collect();
        use BlockState::*;
        assert_eq!(
            shape,
            [
                (
                    0x1000,
                    0x1000,
                    vec![
                        (0x1000, 0x100, ActivePendingFree),
                        (0x1100, 0x300, Inactive),
                        (0x1400, 0x200, ActiveAllocated),
                        (0x1600, 0xa00, Inactive),
                    ]
                ),
                (0x10000, 0x400, vec![(0x10000, 0x400, ActiveAllocated)]),
            ]
        );
    }

    #[test]
    fn undoes_mappings_of_expandable_segments() {
        let r = |start, size| Range {
            start,
            size,
            stream: 0,
            pool: PoolKind::Large,
            expandable: true,
        };
        let mut snap_entries = vec![e(Action::SegmentMap, 0x2000, 0x1000)];
        snap_entries.insert(0, e(Action::Alloc, 0x1000, 0x10));
        let n = snap_entries.len();
        let snap = Snapshot {
            format: SnapshotFormat::Modern,
            segments: vec![Segment {
                device: 0,
                address: 0x1000,
                total_size: 0x3000,
                stream: 0,
                pool: PoolKind::Large,
                pool_id: (0, 0),
                is_expandable: true,
                stack: None,
                blocks: Vec::new(),
            }],
            timeline: Timeline::new(snap_entries, std::iter::once(0..n).collect()),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        };
        assert_eq!(
            ranges_at(&snap, 0, 0),
            [r(0x1000, 0x1000), r(0x3000, 0x1000)]
        );
    }
}
