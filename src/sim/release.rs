//! Giving memory back (reference §1.9): `release_block`, `release_available_cached_blocks`
//! (with `max_split_size`), `release_cached_blocks` (`empty_cache()` and the last OOM retry:
//! synchronize, then large pool before small, each in (stream, size, address) order; private
//! pools are left alone, as PyTorch does while a graph or `MemPool` still holds them), and the
//! garbage collector.

use super::blocks::{Block, BlockId, PoolRef};
use super::caching_allocator::{CachingAllocator, Request};
use crate::model::{Action, PoolKind};

impl CachingAllocator {
    /// `release_block`: gives a whole free segment back to the driver.
    fn release_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (addr, size, stream, pool) = (b.addr, b.size, b.stream, b.pool);
        let (pi, key) = (pool.index(), b.key(id));
        self.emit(Action::SegmentFree, addr, size, stream, pool);
        self.driver.free(addr, size);
        self.stats.num_device_free += 1;
        self.pools[pi].remove_free(&key);
        self.blocks.remove(id);
    }

    /// `release_available_cached_blocks` (only with `max_split_size`): frees one cached
    /// oversize segment at least as large as the request, or the largest ones until enough.
    pub(super) fn release_available_cached_blocks(&mut self, req: &Request) -> bool {
        let Some(max_split) = self.config.max_split_size else {
            return false;
        };
        let pi = req.pool.index();
        let target = req.size.max(max_split);
        let key = (req.stream, target, 0, 0);
        let single = self.pools[pi]
            .free
            .range(key..)
            .next()
            .filter(|k| k.0 == req.stream && !self.blocks[k.3].is_expandable())
            .map(|k| k.3);
        if let Some(id) = single {
            if self.blocks[id].is_split() {
                return false;
            }
            self.release_block(id);
            return true;
        }
        let candidates: Vec<BlockId> = self.pools[pi]
            .free
            .range(..key)
            .rev()
            .take_while(|k| k.0 == req.stream && k.1 >= max_split)
            .map(|k| k.3)
            .collect();
        let mut released = 0u64;
        for id in candidates {
            if released >= target {
                break;
            }
            let b = &self.blocks[id];
            if !b.is_expandable() && !b.is_split() {
                released += b.size;
                self.release_block(id);
            }
        }
        released >= target
    }

    /// Completes every pending free (`synchronize_and_free_events`).
    fn synchronize_and_free_events(&mut self) {
        self.stats.num_sync_all_streams += 1;
        for id in std::mem::take(&mut self.pending) {
            self.free_block(id);
        }
    }

    /// `release_cached_blocks` (what `torch.cuda.empty_cache()` does): completes pending
    /// frees, then frees every cached whole segment and unmaps free expandable pages of the
    /// default pool, large pool first, each pool in (stream, size, address) order. Private
    /// pools are released only once no graph or `MemPool` uses them, which a trace does not
    /// show: they stay.
    pub fn release_cached_blocks(&mut self) {
        self.synchronize_and_free_events();
        for kind in [PoolKind::Large, PoolKind::Small] {
            self.release_blocks(PoolRef::default_of(kind));
        }
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.release_cached_blocks();
    }

    fn release_blocks(&mut self, pool: PoolRef) {
        let pi = pool.index();
        let ids: Vec<BlockId> = self.pools[pi].releasable.iter().map(|k| k.3).collect();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = &self.blocks[id];
            if b.is_expandable() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            self.unmap_block(id);
        }
    }

    /// `garbage_collect_cached_blocks`: with a memory fraction and a threshold, frees old
    /// whole large-pool segments until reserved is back under the threshold.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let (Some(threshold), Some(max)) = (
            self.config.garbage_collection_threshold,
            self.allowed_maximum(),
        ) else {
            return;
        };
        let gc_threshold = (threshold * max as f64) as u64;
        if self.driver.reserved <= gc_threshold {
            return;
        }
        let target = self.driver.reserved - gc_threshold;
        let pi = PoolRef::default_of(PoolKind::Large).index();
        let clock = self.pools[pi].get_free_blocks_call_count;
        let age = |b: &Block| clock.saturating_sub(b.gc_count_base);
        let (mut total_age, mut count) = (0u64, 0u64);
        for k in &self.pools[pi].free {
            let b = &self.blocks[k.3];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed_one = true;
        while reclaimed < target && freed_one && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed_one = false;
            let ids: Vec<BlockId> = self.pools[pi].free.iter().map(|k| k.3).collect();
            for id in ids {
                let b = &self.blocks[id];
                if !b.is_split() && !b.is_expandable() && age(b) as f64 >= threshold_age {
                    freed_one = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    count -= 1;
                    self.release_block(id);
                }
            }
        }
    }
}
