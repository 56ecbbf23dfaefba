//! Segment address ranges at an earlier point of a trace: the segments at the end with the
//! segment entries after that point undone, newest first (`segment_alloc` / `segment_free`
//! ranges, and the mapped ranges of expandable segments, split and joined as pages were
//! mapped and unmapped).

use super::event::{Action, TraceEntry};
use super::layout::{PoolKind, Segment};
use std::collections::BTreeMap;

/// Addresses at or above this (2^56) are taken for damage: device addresses are 48-bit.
pub const ADDRESS_LIMIT: u64 = 1 << 56;

/// Whether `[addr, addr + size)` lies in the address space.
pub fn fits_address_space(addr: u64, size: u64) -> bool {
    addr.checked_add(size).is_some_and(|e| e < ADDRESS_LIMIT)
}

/// A reserved range (or the mapped part of an expandable segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentRange {
    pub size: u64,
    /// `cudaStream_t`.
    pub stream: u64,
    pub pool: PoolKind,
    pub expandable: bool,
}

/// What the entries do not say, as the caller knows it.
pub struct RangeRules<'a> {
    /// The `cudaStream_t` of an entry. Mapped ranges join only within one stream.
    pub stream_of: &'a dyn Fn(&TraceEntry) -> u64,
    /// The pool of the range a `segment_free`, or a `segment_unmap` no neighbour explains,
    /// brings back.
    pub pool_of: &'a dyn Fn(&TraceEntry) -> PoolKind,
}

/// The ranges, by base address, before `undone` (the entries after the point, oldest first)
/// given the segments `last` at the end. Contradictions go to `issue` with the index in
/// `undone`; entries past the address space are skipped.
pub fn ranges_before(
    undone: &[TraceEntry],
    last: &[Segment],
    rules: &RangeRules<'_>,
    issue: &mut dyn FnMut(usize, String),
) -> BTreeMap<u64, SegmentRange> {
    let mut ranges: BTreeMap<u64, SegmentRange> = last
        .iter()
        .filter(|s| fits_address_space(s.address, s.total_size))
        .map(|s| {
            let range = SegmentRange {
                size: s.total_size,
                stream: s.stream,
                pool: s.pool,
                expandable: s.is_expandable,
            };
            (s.address, range)
        })
        .collect();
    for (i, e) in undone.iter().enumerate().rev() {
        let Some(addr) = e.addr().filter(|&a| fits_address_space(a, e.size)) else {
            continue;
        };
        match e.action() {
            Action::SegmentAlloc => {
                if ranges.remove(&addr).is_none() {
                    issue(
                        i,
                        format!("segment_alloc at 0x{addr:x}, but no such segment afterwards"),
                    );
                }
            }
            Action::SegmentFree => {
                let range = SegmentRange {
                    size: e.size,
                    stream: (rules.stream_of)(e),
                    pool: (rules.pool_of)(e),
                    expandable: false,
                };
                ranges.insert(addr, range);
            }
            Action::SegmentMap => {
                if !unmap_range(&mut ranges, addr, e.size) {
                    issue(
                        i,
                        format!(
                            "segment_map at 0x{addr:x}, but that range is not mapped afterwards"
                        ),
                    );
                }
            }
            Action::SegmentUnmap => map_range(&mut ranges, addr, e, rules),
            Action::Alloc
            | Action::FreeRequested
            | Action::FreeCompleted
            | Action::Snapshot
            | Action::Oom => {}
        }
    }
    ranges
}

/// Undoes a `segment_map`: takes `[addr, addr + size)` out of the mapped range holding it.
fn unmap_range(ranges: &mut BTreeMap<u64, SegmentRange>, addr: u64, size: u64) -> bool {
    let found = ranges
        .range(..=addr)
        .next_back()
        .filter(|(&b, r)| r.expandable && addr + size <= b + r.size)
        .map(|(&b, &r)| (b, r));
    let Some((base, r)) = found else {
        return false;
    };
    ranges.remove(&base);
    if addr > base {
        let below = SegmentRange {
            size: addr - base,
            ..r
        };
        ranges.insert(base, below);
    }
    let end = base + r.size;
    if addr + size < end {
        let above = SegmentRange {
            size: end - addr - size,
            ..r
        };
        ranges.insert(addr + size, above);
    }
    true
}

/// Undoes a `segment_unmap`: the range is mapped again, joined with the mapped ranges of the
/// same stream that touch it.
fn map_range(
    ranges: &mut BTreeMap<u64, SegmentRange>,
    addr: u64,
    e: &TraceEntry,
    rules: &RangeRules<'_>,
) {
    let (mut base, mut size) = (addr, e.size);
    let stream = (rules.stream_of)(e);
    let mut pool = None;
    let below = ranges
        .range(..addr)
        .next_back()
        .map(|(&b, &r)| (b, r))
        .filter(|(b, r)| r.expandable && r.stream == stream && b + r.size == addr);
    if let Some((b, r)) = below {
        ranges.remove(&b);
        base = b;
        size += r.size;
        pool = Some(r.pool);
    }
    if let Some(r) = ranges
        .get(&(addr + e.size))
        .copied()
        .filter(|r| r.expandable && r.stream == stream)
    {
        ranges.remove(&(addr + e.size));
        size += r.size;
        pool = pool.or(Some(r.pool));
    }
    let range = SegmentRange {
        size,
        stream,
        pool: pool.unwrap_or_else(|| (rules.pool_of)(e)),
        expandable: true,
    };
    ranges.insert(base, range);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::StreamIndex;

    fn expandable(address: u64, size: u64, stream: u64) -> Segment {
        Segment {
            device: 0,
            address,
            total_size: size,
            stream,
            pool: PoolKind::Large,
            pool_id: (0, 0),
            is_expandable: true,
            stack: None,
            blocks: Vec::new(),
        }
    }

    #[test]
    fn undone_unmaps_join_their_own_stream_only_and_maps_split() {
        // Streams 0 ([0x1000, 0x2000)) and 1 ([0x3000, 0x4000)); the trace unmapped
        // [0x2000, 0x3000) of stream 0, then mapped [0x1000, 0x1400) of stream 0 again.
        let unmap = TraceEntry::new(Action::SegmentUnmap, Some(0x2000), 0x1000, StreamIndex(0));
        let map = TraceEntry::new(Action::SegmentMap, Some(0x1000), 0x400, StreamIndex(0));
        let last = [expandable(0x1000, 0x1000, 0), expandable(0x3000, 0x1000, 1)];
        let rules = RangeRules {
            stream_of: &|e| u64::from(e.stream.0),
            pool_of: &|_| PoolKind::Small,
        };
        let mut issues = Vec::new();
        let ranges = ranges_before(&[unmap, map], &last, &rules, &mut |i, m| {
            issues.push((i, m))
        });
        let shape: Vec<(u64, u64, u64)> =
            ranges.iter().map(|(&a, r)| (a, r.size, r.stream)).collect();
        // Before the map: [0x1400, 0x2000); before the unmap, joined with [0x2000, 0x3000)
        // into one range of its neighbour's pool; stream 1's range, touching it, stays apart.
        assert_eq!(shape, [(0x1400, 0x1c00, 0), (0x3000, 0x1000, 1)]);
        assert_eq!(ranges[&0x1400].pool, PoolKind::Large);
        assert!(issues.is_empty());
        // A map the end state does not hold is reported with its index.
        let stray = TraceEntry::new(Action::SegmentMap, Some(0x9000), 0x800, StreamIndex(0));
        ranges_before(&[stray], &last, &rules, &mut |i, m| issues.push((i, m)));
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].0, 0);
    }
}
