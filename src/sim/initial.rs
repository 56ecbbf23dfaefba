//! The allocator state before a trace's first entry, rebuilt from the final segments by
//! undoing the trace newest to oldest (reference §2.11, §2.12 rule 5): segments and live
//! blocks at their addresses; sizes of blocks freed in the window are inferred. The segment
//! ranges come from `model::ranges_before`, which `analysis::layout_at` shares.

use super::alloc_conf::AllocatorConfig;
use super::rounding::{round_size, SMALL_BUFFER, SMALL_SIZE};
use crate::model::{
    fits_address_space, ranges_before, Action, Block, BlockState, PoolKind, RangeRules,
    ReplayIssue, Segment, SegmentRange, TraceEntry,
};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
struct Live {
    requested: u64,
    /// Known exactly when the block is in the final snapshot.
    size: Option<u64>,
    state: BlockState,
}

/// Rebuilds the segments alive before `entries[0]` from the `last` segments of one device.
/// `stream_of` turns an entry's stream index into the `cudaStream_t` value, `pool_id_of`
/// into the `pool_id` it records (if any). Also returns the addresses of large blocks whose size
/// stayed ambiguous (assumed without remainder before more than 1 MiB of free space).
pub fn state_before(
    entries: &[TraceEntry],
    stream_of: &dyn Fn(&TraceEntry) -> u64,
    pool_id_of: &dyn Fn(&TraceEntry) -> Option<(i64, i64)>,
    last: &[Segment],
    config: &AllocatorConfig,
    issues: &mut Vec<ReplayIssue>,
) -> (Vec<Segment>, FxHashSet<u64>) {
    let mut ambiguous = FxHashSet::default();
    let device = last.first().map_or(0, |s| s.device);
    let mut live: FxHashMap<u64, Live> = FxHashMap::default();
    let fits = fits_address_space;
    for s in last.iter().filter(|s| fits(s.address, s.total_size)) {
        for b in s.blocks.iter().filter(|b| b.state.is_active()) {
            live.insert(
                b.address,
                Live {
                    requested: b.requested_size,
                    size: Some(b.size),
                    state: b.state,
                },
            );
        }
    }
    let mut issue = |entry_index: usize, message: String| {
        issues.push(ReplayIssue {
            entry_index,
            message,
        })
    };
    let pool_of = |e: &TraceEntry| match e.action() {
        Action::SegmentFree if e.size == SMALL_BUFFER => PoolKind::Small,
        Action::SegmentUnmap if !e.size.is_multiple_of(config.large_segment_size) => {
            PoolKind::Small
        }
        _ => PoolKind::Large,
    };
    let rules = RangeRules {
        stream_of,
        pool_of: &pool_of,
    };
    let ranges = ranges_before(entries, last, &rules, &mut issue);
    for (i, e) in entries.iter().enumerate().rev() {
        let Some(addr) = e.addr() else { continue };
        if !fits(addr, e.size) {
            issue(
                i,
                format!(
                    "{} of {} bytes at 0x{addr:x} runs past the address space",
                    e.action(),
                    e.size
                ),
            );
            continue;
        }
        match e.action() {
            Action::Alloc => {
                if live.remove(&addr).is_none() {
                    issue(
                        i,
                        format!("alloc at 0x{addr:x}, but nothing is there afterwards"),
                    );
                }
            }
            Action::FreeRequested => match live.get_mut(&addr) {
                Some(l) => l.state = BlockState::ActiveAllocated,
                None => {
                    live.insert(
                        addr,
                        Live {
                            requested: e.size,
                            size: None,
                            state: BlockState::ActiveAllocated,
                        },
                    );
                }
            },
            Action::FreeCompleted => {
                let freed = Live {
                    requested: e.size,
                    size: None,
                    state: BlockState::ActivePendingFree,
                };
                if live.insert(addr, freed).is_some() {
                    issue(
                        i,
                        format!("free_completed at 0x{addr:x}, which is allocated again later without an alloc"),
                    );
                }
            }
            Action::SegmentAlloc
            | Action::SegmentFree
            | Action::SegmentMap
            | Action::SegmentUnmap
            | Action::Snapshot
            | Action::Oom => {}
        }
    }
    let slivers = slivers_found_later(entries, &live, config);
    let pools = pools_named_by_entries(entries, &ranges, pool_id_of);
    let mut sorted: Vec<(u64, Live)> = live.into_iter().collect();
    sorted.sort_unstable_by_key(|&(a, _)| a);
    let mut next_live = sorted.into_iter().peekable();
    let mut out = Vec::with_capacity(ranges.len());
    for (&base, r) in &ranges {
        let end = base + r.size;
        while let Some((a, _)) = next_live.next_if(|&(a, _)| a < base) {
            issue(
                0,
                format!("block at 0x{a:x} lies outside every segment before the trace"),
            );
        }
        let mut inside = Vec::new();
        while let Some(l) = next_live.next_if(|&(a, _)| a < end) {
            inside.push(l);
        }
        let mut blocks = Vec::with_capacity(inside.len() * 2 + 1);
        let mut at = base;
        for (k, &(a, l)) in inside.iter().enumerate() {
            let next = inside.get(k + 1).map_or(end, |n| n.0);
            let rounded = round_size(l.requested, config);
            let absorbs = r.pool == PoolKind::Large && !r.expandable && !config.expandable_segments;
            let size = match (l.size, slivers.get(&a)) {
                (Some(s), _) => s,
                (None, _)
                    if absorbs && next.saturating_sub(a.saturating_add(rounded)) <= SMALL_SIZE =>
                {
                    next - a
                }
                // Oversize blocks are never split: the block is all the space it was taken
                // from, which was less than the request plus max_non_split_rounding.
                (None, _)
                    if absorbs
                        && config.max_split_size.is_some_and(|m| rounded >= m)
                        && next.saturating_sub(a.saturating_add(rounded))
                            < config.max_non_split_rounding =>
                {
                    next - a
                }
                (None, Some(&s)) if absorbs && a.saturating_add(s) <= next => s,
                (None, _) => {
                    if absorbs {
                        ambiguous.insert(a);
                    }
                    rounded
                }
            };
            if a < at || a.saturating_add(size) > next {
                issue(
                    0,
                    format!("block at 0x{a:x} overlaps its neighbour before the trace"),
                );
                continue;
            }
            if a > at {
                blocks.push(free_block(at, a - at));
            }
            blocks.push(Block {
                address: a,
                size,
                requested_size: l.requested,
                state: l.state,
                stack: None,
            });
            at = a + size;
        }
        if at < end {
            blocks.push(free_block(at, end - at));
        }
        // The pool of a segment that is still there at the end, else the one the first entry
        // in it names, else the default pool.
        let pool_id = last
            .iter()
            .find(|s| s.address < end && base < s.address.saturating_add(s.total_size))
            .map(|s| s.pool_id)
            .or_else(|| pools.get(&base).copied())
            .unwrap_or((0, 0));
        out.push(Segment {
            device,
            address: base,
            total_size: r.size,
            stream: r.stream,
            pool: r.pool,
            pool_id,
            is_expandable: r.expandable,
            stack: None,
            blocks,
        });
    }
    for (a, _) in next_live {
        issue(
            0,
            format!("block at 0x{a:x} lies outside every segment before the trace"),
        );
    }
    (out, ambiguous)
}

/// Sizes of large blocks alive before the trace, learned from the trace: a block never
/// splits off a remainder of 1 MiB or less, so an `alloc` within 1 MiB after the rounded end
/// of a still-live block shows where the free space after it starts.
fn slivers_found_later(
    entries: &[TraceEntry],
    live: &FxHashMap<u64, Live>,
    config: &AllocatorConfig,
) -> FxHashMap<u64, u64> {
    let mut open: BTreeMap<u64, u64> = live
        .iter()
        .filter(|(_, l)| l.size.is_none())
        .map(|(&a, l)| (a, round_size(l.requested, config)))
        .filter(|&(_, r)| r > SMALL_SIZE)
        .map(|(a, r)| (a.saturating_add(r), a))
        .collect();
    let mut ends: FxHashMap<u64, u64> = open.iter().map(|(&end, &a)| (a, end)).collect();
    let mut found = FxHashMap::default();
    for e in entries {
        if open.is_empty() {
            break;
        }
        let Some(addr) = e.addr() else { continue };
        match e.action() {
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(end) = ends.remove(&addr) {
                    open.remove(&end);
                }
            }
            Action::Alloc => {
                let hit = open
                    .range(..=addr)
                    .next_back()
                    .map(|(&end, &a)| (end, a))
                    .filter(|&(end, _)| addr - end <= SMALL_SIZE);
                if let Some((end, a)) = hit {
                    open.remove(&end);
                    ends.remove(&a);
                    if addr > end {
                        found.insert(a, addr - a);
                    }
                }
            }
            _ => {}
        }
    }
    found
}

/// The `pool_id` the first entry inside each range before the trace names (newer PyTorch
/// writes one on every entry): until the range's release, entries in it are its own. By base.
fn pools_named_by_entries(
    entries: &[TraceEntry],
    ranges: &BTreeMap<u64, SegmentRange>,
    pool_id_of: &dyn Fn(&TraceEntry) -> Option<(i64, i64)>,
) -> FxHashMap<u64, (i64, i64)> {
    let mut found = FxHashMap::default();
    if entries.iter().all(|e| e.pool().is_none()) {
        return found;
    }
    for e in entries {
        let (Some(addr), Some(pool)) = (e.addr(), pool_id_of(e)) else {
            continue;
        };
        if let Some((&base, r)) = ranges.range(..=addr).next_back() {
            if addr - base < r.size {
                found.entry(base).or_insert(pool);
            }
        }
    }
    found
}

fn free_block(address: u64, size: u64) -> Block {
    Block {
        address,
        size,
        requested_size: 0,
        state: BlockState::Inactive,
        stack: None,
    }
}
