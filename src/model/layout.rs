//! The allocator's segment layout at one instant: segments and the blocks that tile them.

use serde::Serialize;

use super::event::StackId;

/// A block's state, as PyTorch's snapshot names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to the program.
    ActiveAllocated,
    /// Freed by the program, waiting for events on other streams before it can be reused.
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

impl BlockState {
    pub fn from_torch_name(name: &str) -> Option<BlockState> {
        match name {
            "active_allocated" => Some(BlockState::ActiveAllocated),
            "active_pending_free" | "active_awaiting_free" => Some(BlockState::ActivePendingFree),
            "inactive" => Some(BlockState::Inactive),
            _ => None,
        }
    }

    /// Allocated or pending free: the memory is not available for reuse.
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// The request of the block's last allocation (stale for inactive blocks).
    pub requested_size: u64,
    pub state: BlockState,
    /// Stack of the block's last allocation, when recorded.
    pub stack: Option<StackId>,
}

/// Which pool a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Requests up to 1 MiB, 2 MiB segments.
    Small,
    Large,
}

/// One segment: a `cudaMalloc` range, or one contiguous mapped range of an expandable segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub device: u32,
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub pool: PoolKind,
    /// Private pool id (CUDA graphs, MemPool); `(0, 0)` is the default pool.
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    /// Stack at segment creation, when recorded.
    pub stack: Option<StackId>,
    /// Blocks in address order, tiling the segment.
    pub blocks: Vec<Block>,
}
