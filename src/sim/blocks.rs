//! Blocks and pools of the allocator model: a slab of blocks linked to their neighbours
//! inside a segment, and per pool (small and large, of the default pool and of each private
//! pool) the free set ordered by (stream, size, address) and the unmapped expandable blocks
//! ordered by (stream, address).

use crate::model::PoolKind;
use std::collections::BTreeSet;

/// Index of a block in the slab.
pub type BlockId = u32;
/// "No block" in `prev` / `next` / `expandable`.
pub const NONE: u32 = u32::MAX;

/// Where a block is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Cached (in its pool's free set, or unmapped).
    Free,
    /// Handed out.
    Allocated,
    /// Freed by the program, waiting for other streams (`active_pending_free`).
    Pending,
}

/// One block: a range of a segment.
#[derive(Clone, Debug)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// Request of the last allocation (stale once free, as in PyTorch).
    pub requested: u64,
    /// The allocation stream (`cudaStream_t`).
    pub stream: u64,
    pub prev: BlockId,
    pub next: BlockId,
    pub pool: PoolRef,
    pub state: Use,
    /// Used by other streams (`record_stream`): its free waits for them.
    pub cross_stream: bool,
    /// False for the unmapped part of an expandable segment.
    pub mapped: bool,
    /// Index of the expandable segment, or `NONE`.
    pub expandable: u32,
    /// The pool's best-fit call count when the block became free (GC age).
    pub gc_count_base: u64,
    live: bool,
}

impl Block {
    pub fn new(addr: u64, size: u64, stream: u64, pool: PoolRef) -> Block {
        Block {
            addr,
            size,
            requested: 0,
            stream,
            prev: NONE,
            next: NONE,
            pool,
            state: Use::Free,
            cross_stream: false,
            mapped: true,
            expandable: NONE,
            gc_count_base: 0,
            live: true,
        }
    }

    pub fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }

    pub fn is_expandable(&self) -> bool {
        self.expandable != NONE
    }

    /// The free-set key.
    pub fn key(&self, id: BlockId) -> FreeKey {
        (self.stream, self.size, self.addr, id)
    }
}

/// (stream, size, address, id): PyTorch's `BlockComparatorSize` order.
pub type FreeKey = (u64, u64, u64, BlockId);
/// (stream, address, id): the order of unmapped expandable blocks.
pub type UnmappedKey = (u64, u64, BlockId);

/// One pool (small or large).
#[derive(Clone, Debug, Default)]
pub struct Pool {
    pub free: BTreeSet<FreeKey>,
    /// The free blocks `release_cached_blocks` can give back (whole segments, and expandable
    /// blocks that span a whole page), a subset of `free` kept beside it so that an OOM's
    /// release visits only them: the others stay cached however often it runs, and visiting
    /// them at every OOM made a trace of many OOMs quadratic.
    pub releasable: BTreeSet<FreeKey>,
    pub unmapped: BTreeSet<UnmappedKey>,
    /// Best-fit calls so far (the GC's clock).
    pub get_free_blocks_call_count: u64,
}

impl Pool {
    /// Takes a block out of the free set.
    pub fn remove_free(&mut self, key: &FreeKey) {
        self.free.remove(key);
        self.releasable.remove(key);
    }
}

/// All blocks of a device, by id; ids of removed blocks are reused.
#[derive(Clone, Debug, Default)]
pub struct Slab {
    blocks: Vec<Block>,
    vacant: Vec<BlockId>,
}

impl Slab {
    pub fn insert(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.vacant.pop() {
            self.blocks[id as usize] = block;
            id
        } else {
            self.blocks.push(block);
            (self.blocks.len() - 1) as BlockId
        }
    }

    pub fn remove(&mut self, id: BlockId) {
        self.blocks[id as usize].live = false;
        self.vacant.push(id);
    }

    /// Live blocks with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> + '_ {
        self.blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.live)
            .map(|(i, b)| (i as BlockId, b))
    }
}

impl std::ops::Index<BlockId> for Slab {
    type Output = Block;
    fn index(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }
}

impl std::ops::IndexMut<BlockId> for Slab {
    fn index_mut(&mut self, id: BlockId) -> &mut Block {
        &mut self.blocks[id as usize]
    }
}

/// One block pool: small or large, of the default pool (`private` 0) or of a private pool
/// (CUDA graph, `torch.cuda.MemPool`; `private` k is the k-th the allocator met). Blocks of one
/// pool are never handed to requests of another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolRef {
    pub kind: PoolKind,
    pub private: u16,
}

impl PoolRef {
    /// The default pool of this kind.
    pub fn default_of(kind: PoolKind) -> PoolRef {
        PoolRef { kind, private: 0 }
    }

    /// Index of the pool in the allocator's list: small then large, default pool first.
    pub fn index(self) -> usize {
        let kind = match self.kind {
            PoolKind::Small => 0,
            PoolKind::Large => 1,
        };
        self.private as usize * 2 + kind
    }
}
