//! Totals of a segment layout: reserved, allocated, active, requested, fragmentation, and
//! which segments are mostly free.

use crate::model::{BlockState, PoolKind, Segment};
use serde::Serialize;

/// Fragmentation of a layout (docs/json/README.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Fragmentation {
    /// allocated - requested: rounding and unsplit remainders inside allocated blocks.
    pub internal_bytes: u64,
    /// Sum of inactive (free, cached) blocks.
    pub external_bytes: u64,
    /// The largest inactive block, 0 when none.
    pub largest_free_block_bytes: u64,
}

/// How full one segment is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SegmentUse {
    pub address: u64,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub pool: PoolKind,
    pub is_expandable: bool,
}

/// Totals over a device's segments (the layout fields of DEVICE in docs/json/analyze.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LayoutTotals {
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    pub segments: usize,
    pub blocks: usize,
    pub fragmentation: Fragmentation,
    /// Segments with at least half their bytes free, most free bytes first.
    #[serde(skip)]
    pub mostly_free: Vec<SegmentUse>,
}

/// Sums a device's segments. Sums saturate: sizes come from files, and a damaged file must
/// give a wrong number, never a crash.
pub fn layout_totals<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> LayoutTotals {
    let mut t = LayoutTotals::default();
    for s in segments {
        t.reserved_bytes = t.reserved_bytes.saturating_add(s.total_size);
        t.segments += 1;
        let mut free = 0u64;
        for b in &s.blocks {
            t.blocks += 1;
            match b.state {
                BlockState::ActiveAllocated => {
                    t.allocated_bytes = t.allocated_bytes.saturating_add(b.size);
                    t.active_bytes = t.active_bytes.saturating_add(b.size);
                    t.requested_bytes = t.requested_bytes.saturating_add(b.requested_size);
                }
                BlockState::ActivePendingFree => {
                    t.active_bytes = t.active_bytes.saturating_add(b.size)
                }
                BlockState::Inactive => {
                    free = free.saturating_add(b.size);
                    let f = &mut t.fragmentation;
                    f.external_bytes = f.external_bytes.saturating_add(b.size);
                    f.largest_free_block_bytes = f.largest_free_block_bytes.max(b.size);
                }
            }
        }
        if free.saturating_mul(2) >= s.total_size && s.total_size > 0 {
            t.mostly_free.push(SegmentUse {
                address: s.address,
                total_bytes: s.total_size,
                free_bytes: free,
                pool: s.pool,
                is_expandable: s.is_expandable,
            });
        }
    }
    t.fragmentation.internal_bytes = t.allocated_bytes.saturating_sub(t.requested_bytes);
    t.mostly_free.sort_by(|a, b| {
        b.free_bytes
            .cmp(&a.free_bytes)
            .then(a.address.cmp(&b.address))
    });
    t
}
