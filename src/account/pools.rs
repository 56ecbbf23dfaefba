//! The allocator's pools at the dump (`segment_pool_id`: the default pool, CUDA-graph pools,
//! `torch.cuda.MemPool`s), each with its own figures, and its owner where the stacks of its
//! blocks name one. A private pool's free blocks serve only that pool's requests, so they are
//! counted in that pool's cached free and never in the default pool's.

use super::figures::Figures;
use crate::analysis::pool_owner::owner_of;
use crate::model::{Segment, StackTable};
use serde::{Deserialize, Serialize};

/// One pool of one device at the dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// PyTorch's `segment_pool_id`; `[0, 0]` is the default pool.
    pub id: (i64, i64),
    /// Who made the pool, as its blocks' stacks tell (`vLLM KV cache`, `CUDA graphs`...);
    /// `None` for the default pool and where the stacks do not say.
    pub owner: Option<String>,
    pub segments: usize,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub cached_free_bytes: u64,
    pub largest_free_block_bytes: u64,
}

impl Pool {
    pub fn is_default(&self) -> bool {
        self.id == (0, 0)
    }

    /// `(0,2)`, as the text names a pool.
    pub fn name(&self) -> String {
        if self.is_default() {
            "the default pool".to_string()
        } else {
            format!("pool ({},{})", self.id.0, self.id.1)
        }
    }
}

/// The pools of a device's segments (in address order), the default pool first, then by id.
/// A device whose every segment is in the default pool has one pool.
pub fn pools_of(segments: &[&Segment], stacks: &StackTable) -> Vec<Pool> {
    let mut ids: Vec<(i64, i64)> = segments.iter().map(|s| s.pool_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut pools: Vec<Pool> = ids
        .into_iter()
        .map(|id| {
            let members: Vec<&Segment> = segments
                .iter()
                .copied()
                .filter(|s| s.pool_id == id)
                .collect();
            let figures = Figures::of_layout(members.iter().copied());
            Pool {
                id,
                owner: (id != (0, 0)).then(|| owner_of(&members, stacks)).flatten(),
                segments: members.len(),
                reserved_bytes: figures.reserved_bytes.unwrap_or(0),
                allocated_bytes: figures.allocated_bytes.unwrap_or(0),
                cached_free_bytes: figures.cached_free_bytes.unwrap_or(0),
                largest_free_block_bytes: figures.largest_free_block_bytes.unwrap_or(0),
            }
        })
        .collect();
    pools.sort_by_key(|p| (!p.is_default(), p.id));
    pools
}
