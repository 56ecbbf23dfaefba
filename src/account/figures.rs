//! The figures of one moment, one definition per word, named as `torch.cuda.memory_stats()`
//! names them (docs/json/account.md): every output that prints "allocated" or "cached free"
//! prints one of these.

use crate::model::{BlockState, Segment};
use serde::{Deserialize, Serialize};

/// The memory state at one moment. `None` is "not known": the input cannot tell that figure at
/// that moment (a trace tells requested and reserved bytes exactly, block sizes only through
/// the allocator replay).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    /// Block sizes of live (allocated) blocks: `allocated_bytes` of `memory_stats()`, what
    /// `torch.cuda.memory_allocated()` reports.
    pub allocated_bytes: Option<u64>,
    /// The sizes the program asked for (`requested_bytes`): allocated minus rounding.
    pub requested_bytes: Option<u64>,
    /// Allocated plus pending-free blocks (`active_bytes`): freed by the program, not yet
    /// reusable because another stream still uses them.
    pub active_bytes: Option<u64>,
    /// Segment bytes the allocator holds from the driver (`reserved_bytes`).
    pub reserved_bytes: Option<u64>,
    /// Reserved minus active: free blocks the allocator keeps cached, in every pool.
    pub cached_free_bytes: Option<u64>,
    /// The largest free cached block, in any pool.
    pub largest_free_block_bytes: Option<u64>,
}

impl Figures {
    /// The figures of a segment layout (the dump, or one pool of it), exact. Sums saturate: a
    /// damaged file gives a wrong number, never a crash.
    pub fn of_layout<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> Figures {
        let (mut reserved, mut allocated, mut requested, mut active) = (0u64, 0u64, 0u64, 0u64);
        let (mut free, mut largest) = (0u64, 0u64);
        for s in segments {
            reserved = reserved.saturating_add(s.total_size);
            for b in &s.blocks {
                match b.state {
                    BlockState::ActiveAllocated => {
                        allocated = allocated.saturating_add(b.size);
                        requested = requested.saturating_add(b.requested_size);
                        active = active.saturating_add(b.size);
                    }
                    BlockState::ActivePendingFree => active = active.saturating_add(b.size),
                    BlockState::Inactive => {
                        free = free.saturating_add(b.size);
                        largest = largest.max(b.size);
                    }
                }
            }
        }
        Figures {
            allocated_bytes: Some(allocated),
            requested_bytes: Some(requested),
            active_bytes: Some(active),
            reserved_bytes: Some(reserved),
            cached_free_bytes: Some(free),
            largest_free_block_bytes: Some(largest),
        }
    }

    /// Each figure of `self`, else of `other`.
    pub fn or(&self, other: &Figures) -> Figures {
        Figures {
            allocated_bytes: self.allocated_bytes.or(other.allocated_bytes),
            requested_bytes: self.requested_bytes.or(other.requested_bytes),
            active_bytes: self.active_bytes.or(other.active_bytes),
            reserved_bytes: self.reserved_bytes.or(other.reserved_bytes),
            cached_free_bytes: self.cached_free_bytes.or(other.cached_free_bytes),
            largest_free_block_bytes: self
                .largest_free_block_bytes
                .or(other.largest_free_block_bytes),
        }
    }

    /// The share of reserved memory that is cached free, when both are known and reserved is
    /// not zero.
    pub fn cached_free_share(&self) -> Option<f64> {
        let reserved = self.reserved_bytes.filter(|&r| r > 0)?;
        Some(self.cached_free_bytes? as f64 / reserved as f64)
    }
}
