//! PyTorch's native CUDA caching allocator for one device (reference §1.5-1.8, §1.14):
//! `malloc` with its exact retry order, best fit with the oversize rules, splitting, free and
//! merge, cross-stream (pending) frees, private pools kept apart from the default one. Releasing memory lives in `release.rs`, expandable segments
//! in `expandable.rs`. Every decision is emitted as a model `TraceEntry`, in the order
//! PyTorch records it.

use super::alloc_conf::AllocatorConfig;
use super::blocks::{Block, BlockId, Pool, PoolRef, Slab, Use, NONE};
use super::driver::Driver;
use super::rounding::{
    allocation_size, page_size, pool_for, round_size, round_up, MIN_BLOCK_SIZE, SMALL_SIZE,
};
use crate::model::{Action, Bytes, PoolIndex, PoolKind, StreamIndex, TraceEntry};
use rustc_hash::FxHashMap;

/// Counters of `torch.cuda.memory_stats` that the model keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sum of allocated block sizes.
    pub allocated_bytes: u64,
    /// Sum of allocated and pending-free block sizes.
    pub active_bytes: u64,
    /// Sum of the requests of allocated and pending-free blocks.
    pub requested_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub num_sync_all_streams: u64,
}

/// A request the model could not satisfy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of memory: tried to allocate {} with {} reserved",
    Bytes(*alloc_size),
    Bytes(*reserved)
)]
pub struct OutOfMemory {
    /// The rounded request.
    pub size: u64,
    /// The segment it needed (what PyTorch's message says it tried to allocate).
    pub alloc_size: u64,
    pub reserved: u64,
    pub allocated: u64,
}

/// A free the state contradicts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FreeError {
    #[error("free of 0x{0:x}, which is not an allocated block")]
    NotAllocated(u64),
    #[error("free of 0x{0:x}, which was already freed")]
    AlreadyFreed(u64),
    #[error("free_completed of 0x{0:x}, which has no pending free")]
    NotPending(u64),
}

/// The request being served.
#[derive(Clone, Copy, Debug)]
pub(super) struct Request {
    pub orig: u64,
    pub size: u64,
    pub alloc_size: u64,
    pub stream: u64,
    pub pool: PoolRef,
}

/// One expandable segment: a reserved address range mapped page by page.
#[derive(Clone, Debug)]
pub(super) struct ExpandableSegment {
    pub base: u64,
    pub size: u64,
    pub page: u64,
}

/// The caching allocator of one device.
#[derive(Clone, Debug)]
pub struct CachingAllocator {
    pub(super) config: AllocatorConfig,
    pub(super) driver: Driver,
    pub(super) blocks: Slab,
    /// Small and large pool of the default pool, then of each private pool (`PoolRef::index`).
    pub(super) pools: Vec<Pool>,
    /// `pool_id` of private pool k + 1.
    private_pools: Vec<(i64, i64)>,
    /// Allocated and pending-free blocks by address.
    pub(super) active: FxHashMap<u64, BlockId>,
    /// Pending frees, oldest first.
    pub(super) pending: Vec<BlockId>,
    pub(super) expandable: Vec<Option<ExpandableSegment>>,
    pub(super) stats: Stats,
    events: Vec<TraceEntry>,
    recording: bool,
    streams: Vec<u64>,
    /// The rounded request and the block of the last allocation made.
    last_alloc: (u64, u64),
}

impl CachingAllocator {
    pub fn new(config: AllocatorConfig, driver: Driver) -> CachingAllocator {
        CachingAllocator {
            config,
            driver,
            blocks: Slab::default(),
            pools: vec![Pool::default(), Pool::default()],
            private_pools: Vec::new(),
            active: FxHashMap::default(),
            pending: Vec::new(),
            expandable: Vec::new(),
            stats: Stats::default(),
            events: Vec::new(),
            recording: true,
            streams: vec![0],
            last_alloc: (0, 0),
        }
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Bytes reserved from the driver now.
    pub fn reserved(&self) -> u64 {
        self.driver.reserved
    }

    /// Offers the address the next new segment should get (see `Driver::set_hint`).
    pub fn set_address_hint(&mut self, hint: Option<(u64, Option<u64>)>) {
        self.driver.set_hint(hint);
    }

    /// Turns the recording of trace entries on or off (off: only the state is kept).
    pub fn set_recording(&mut self, on: bool) {
        self.recording = on;
    }

    /// Entries recorded since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<TraceEntry> {
        std::mem::take(&mut self.events)
    }

    /// Drops the recorded entries (for callers that only want the state).
    pub fn clear_events(&mut self) {
        self.events.clear();
    }

    /// Entries recorded since the last `take_events` / `clear_events`.
    pub fn events(&self) -> &[TraceEntry] {
        &self.events
    }

    /// The stream handles behind the `StreamIndex`es of emitted entries.
    pub fn streams(&self) -> &[u64] {
        &self.streams
    }

    /// The `pool_id`s behind the `PoolIndex`es of emitted entries (entries of the default pool
    /// carry none).
    pub fn pools(&self) -> &[(i64, i64)] {
        &self.private_pools
    }

    /// The pool of `kind` that `pool_id` names, registered when new.
    pub(super) fn pool_ref(&mut self, kind: PoolKind, pool_id: (i64, i64)) -> PoolRef {
        if pool_id == (0, 0) {
            return PoolRef::default_of(kind);
        }
        let k = match self.private_pools.iter().position(|&p| p == pool_id) {
            Some(k) => k,
            None => {
                self.private_pools.push(pool_id);
                self.pools.extend([Pool::default(), Pool::default()]);
                self.private_pools.len() - 1
            }
        };
        PoolRef {
            kind,
            private: u16::try_from(k + 1).unwrap_or(u16::MAX),
        }
    }

    /// The `pool_id` of a pool.
    pub(super) fn pool_id(&self, pool: PoolRef) -> (i64, i64) {
        match pool.private {
            0 => (0, 0),
            k => self
                .private_pools
                .get(k as usize - 1)
                .copied()
                .unwrap_or((0, 0)),
        }
    }

    /// The `pool_id` of the block that holds `addr`, if any: mapped blocks only, or also the
    /// unmapped part of expandable ranges. A scan: only replays of traces with private pools
    /// ask.
    pub fn pool_id_at(&self, addr: u64, mapped_only: bool) -> Option<(i64, i64)> {
        self.blocks
            .iter()
            .find(|(_, b)| (b.mapped || !mapped_only) && b.addr <= addr && addr - b.addr < b.size)
            .map(|(_, b)| self.pool_id(b.pool))
    }

    /// Whether any private pool was met.
    pub fn has_private_pools(&self) -> bool {
        !self.private_pools.is_empty()
    }

    pub(super) fn emit(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: u64,
        pool: PoolRef,
    ) {
        if !self.recording {
            return;
        }
        let index = match self.streams.iter().position(|&s| s == stream) {
            Some(i) => i,
            None => {
                self.streams.push(stream);
                self.streams.len() - 1
            }
        };
        let stream = StreamIndex(u16::try_from(index).unwrap_or(u16::MAX));
        let entry = TraceEntry::new(action, Some(addr), size, stream)
            .with_pool(pool.private.checked_sub(1).map(PoolIndex));
        self.events.push(entry);
    }

    pub(super) fn request(&mut self, orig: u64, stream: u64, pool_id: (i64, i64)) -> Request {
        let size = round_size(orig, &self.config);
        Request {
            orig,
            size,
            alloc_size: allocation_size(size, &self.config),
            stream,
            pool: self.pool_ref(pool_for(size), pool_id),
        }
    }

    /// The memory-fraction limit, when a fraction and the capacity are known.
    pub(super) fn allowed_maximum(&self) -> Option<u64> {
        let fraction = self.config.per_process_memory_fraction?;
        Some((fraction * self.driver.capacity? as f64) as u64)
    }

    fn gc_enabled(&self) -> bool {
        self.config.garbage_collection_threshold.is_some() && self.allowed_maximum().is_some()
    }

    /// `malloc` in the default pool.
    pub fn malloc(&mut self, orig: u64, stream: u64) -> Result<u64, OutOfMemory> {
        self.malloc_in(orig, stream, (0, 0))
    }

    /// `malloc` in the pool `pool_id` names ((0, 0): the default pool; else a private pool, as
    /// during CUDA graph capture or inside `torch.cuda.use_mem_pool`): returns the block
    /// address, or the OOM after every retry failed.
    pub fn malloc_in(
        &mut self,
        orig: u64,
        stream: u64,
        pool_id: (i64, i64),
    ) -> Result<u64, OutOfMemory> {
        let req = self.request(orig, stream, pool_id);
        let mut found = self.get_free_block(&req);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks();
            }
            found = self.alloc_block(&req, false);
        }
        if found.is_none() && self.release_available_cached_blocks(&req) {
            found = self.alloc_block(&req, false);
        }
        if found.is_none() {
            self.release_cached_blocks();
            found = self.alloc_block(&req, true);
        }
        let Some(block) = found else {
            self.stats.num_ooms += 1;
            let device_free = self
                .driver
                .capacity
                .map(|c| c.saturating_sub(self.driver.reserved));
            let index = self.streams.iter().position(|&s| s == stream).unwrap_or(0);
            if self.recording {
                let entry = TraceEntry::oom(
                    req.size,
                    device_free,
                    StreamIndex(u16::try_from(index).unwrap_or(u16::MAX)),
                )
                .with_pool(req.pool.private.checked_sub(1).map(PoolIndex));
                self.events.push(entry);
            }
            return Err(OutOfMemory {
                size: req.size,
                alloc_size: req.alloc_size,
                reserved: self.driver.reserved,
                allocated: self.stats.allocated_bytes,
            });
        };
        Ok(self.alloc_found_block(block, &req))
    }

    /// Whether `malloc` would release cached memory itself now (no side effects): best fit
    /// fails, and either the garbage collector would run or the driver has no room for a
    /// new segment, so an OOM retry follows.
    pub fn would_release(&self, orig: u64, stream: u64, pool_id: (i64, i64)) -> bool {
        let size = round_size(orig, &self.config);
        let kind = pool_for(size);
        // A private pool not met yet has no free block.
        let known = if pool_id == (0, 0) {
            Some(PoolRef::default_of(kind))
        } else {
            self.private_pools
                .iter()
                .position(|&p| p == pool_id)
                .map(|k| PoolRef {
                    kind,
                    private: u16::try_from(k + 1).unwrap_or(u16::MAX),
                })
        };
        let req = Request {
            orig,
            size,
            alloc_size: allocation_size(size, &self.config),
            stream,
            pool: known.unwrap_or(PoolRef::default_of(kind)),
        };
        if known.is_some() && self.best_fit(&req).is_some() {
            return false;
        }
        if let (Some(t), Some(max)) = (
            self.config.garbage_collection_threshold,
            self.allowed_maximum(),
        ) {
            if self.driver.reserved > (t * max as f64) as u64 {
                return true;
            }
        }
        let fraction_ok = self
            .allowed_maximum()
            .is_none_or(|m| self.driver.reserved.saturating_add(req.alloc_size) <= m);
        let need = if self.config.expandable_segments {
            round_up(req.size, page_size(req.pool.kind, &self.config))
        } else {
            req.alloc_size
        };
        !(fraction_ok && self.driver.fits(need))
    }

    /// `get_free_block`: the single best-fit candidate, removed from the pool.
    fn get_free_block(&mut self, req: &Request) -> Option<BlockId> {
        if self.gc_enabled() {
            self.pools[req.pool.index()].get_free_blocks_call_count += 1;
        }
        let id = self.best_fit(req)?;
        let key = self.blocks[id].key(id);
        self.pools[req.pool.index()].remove_free(&key);
        Some(id)
    }

    fn best_fit(&self, req: &Request) -> Option<BlockId> {
        let pool = &self.pools[req.pool.index()];
        let mut it = pool
            .free
            .range((req.stream, req.size, 0, 0)..)
            .take_while(|k| k.0 == req.stream);
        let mut id = it.next()?.3;
        if self.blocks[id].is_expandable() {
            if self.config.expandable_segments {
                // Best fit counts the unmapped space after a block as part of it.
                for next in it {
                    let next = next.3;
                    if !self.blocks[id].is_expandable()
                        || self.expandable_size(next) >= self.expandable_size(id)
                    {
                        break;
                    }
                    id = next;
                }
            } else {
                id = it.find(|k| !self.blocks[k.3].is_expandable())?.3;
            }
        }
        let block_size = self.blocks[id].size;
        if let Some(max_split) = self.config.max_split_size {
            if req.size < max_split && block_size >= max_split {
                return None;
            }
            if req.size >= max_split
                && block_size >= req.size.saturating_add(self.config.max_non_split_rounding)
            {
                return None;
            }
        }
        Some(id)
    }

    fn expandable_size(&self, id: BlockId) -> u64 {
        let b = &self.blocks[id];
        match b.next {
            NONE => b.size,
            next if !self.blocks[next].mapped => b.size + self.blocks[next].size,
            _ => b.size,
        }
    }

    /// `alloc_block`: a new segment (or mapped pages) for the request.
    fn alloc_block(&mut self, req: &Request, retry: bool) -> Option<BlockId> {
        if retry {
            self.stats.num_alloc_retries += 1;
        }
        if let Some(max) = self.allowed_maximum() {
            if self.driver.reserved.saturating_add(req.alloc_size) > max {
                return None;
            }
        }
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(req);
        }
        let addr = self.driver.malloc(req.alloc_size)?;
        self.stats.num_device_alloc += 1;
        self.note_reserved();
        self.emit(
            Action::SegmentAlloc,
            addr,
            req.alloc_size,
            req.stream,
            req.pool,
        );
        Some(
            self.blocks
                .insert(Block::new(addr, req.alloc_size, req.stream, req.pool)),
        )
    }

    pub(super) fn note_reserved(&mut self) {
        let r = self.driver.reserved;
        if r > self.stats.peak_reserved_bytes {
            self.stats.peak_reserved_bytes = r;
        }
    }

    fn should_split(&self, id: BlockId, size: u64) -> bool {
        let b = &self.blocks[id];
        let remaining = b.size - size;
        if b.pool.kind == PoolKind::Small || self.config.expandable_segments {
            remaining >= MIN_BLOCK_SIZE
        } else {
            self.config.max_split_size.is_none_or(|m| size < m) && remaining > SMALL_SIZE
        }
    }

    /// `alloc_found_block`: splits off the low part for the request, the rest stays cached.
    fn alloc_found_block(&mut self, mut id: BlockId, req: &Request) -> u64 {
        if self.should_split(id, req.size) {
            let rest = id;
            let b = &self.blocks[rest];
            let mut front = Block::new(b.addr, req.size, b.stream, b.pool);
            front.expandable = b.expandable;
            front.prev = b.prev;
            front.next = rest;
            id = self.blocks.insert(front);
            let prev = self.blocks[id].prev;
            if prev != NONE {
                self.blocks[prev].next = id;
            }
            let r = &mut self.blocks[rest];
            r.prev = id;
            r.addr += req.size;
            r.size -= req.size;
            self.insert_free(rest);
        }
        let b = &mut self.blocks[id];
        b.state = Use::Allocated;
        b.requested = req.orig;
        let (addr, size, stream, pool) = (b.addr, b.size, b.stream, b.pool);
        self.last_alloc = (req.size, size);
        self.stats.allocated_bytes += size;
        self.stats.active_bytes += size;
        self.stats.requested_bytes += req.orig;
        if self.stats.allocated_bytes > self.stats.peak_allocated_bytes {
            self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
        }
        self.active.insert(addr, id);
        self.emit(Action::Alloc, addr, req.orig, stream, pool);
        addr
    }

    /// Puts a block into its pool's free set (`insert_into_blocks`).
    pub(super) fn insert_free(&mut self, id: BlockId) {
        let pi = self.blocks[id].pool.index();
        self.blocks[id].gc_count_base = self.pools[pi].get_free_blocks_call_count;
        let key = self.blocks[id].key(id);
        self.pools[pi].free.insert(key);
        if self.can_release(id) {
            self.pools[pi].releasable.insert(key);
        }
    }

    /// Whether `release_cached_blocks` gives a free block back: a whole segment, or an
    /// expandable block with a whole page inside (`unmap_block` unmaps only whole pages).
    fn can_release(&self, id: BlockId) -> bool {
        let b = &self.blocks[id];
        if !b.is_expandable() {
            return !b.is_split();
        }
        let Some(seg) = self
            .expandable
            .get(b.expandable as usize)
            .and_then(Option::as_ref)
        else {
            return false;
        };
        let begin = seg.base + round_up(b.addr - seg.base, seg.page);
        let end = seg.base + (b.addr + b.size - seg.base) / seg.page * seg.page;
        begin < end
    }

    /// Marks an allocated block as used by another stream (`record_stream`): its free then
    /// waits until `free_completed` or a synchronizing release.
    pub fn record_stream(&mut self, addr: u64, stream: u64) -> Result<(), FreeError> {
        let &id = self
            .active
            .get(&addr)
            .ok_or(FreeError::NotAllocated(addr))?;
        if self.blocks[id].stream != stream {
            self.blocks[id].cross_stream = true;
        }
        Ok(())
    }

    /// `free`: the program frees the block at `addr`. Without other-stream uses it goes back
    /// to the cache at once; with them it stays pending.
    pub fn free(&mut self, addr: u64) -> Result<(), FreeError> {
        let &id = self
            .active
            .get(&addr)
            .ok_or(FreeError::NotAllocated(addr))?;
        let b = &mut self.blocks[id];
        if b.state != Use::Allocated {
            return Err(FreeError::AlreadyFreed(addr));
        }
        b.state = Use::Pending;
        let (size, requested, stream, cross, pool) =
            (b.size, b.requested, b.stream, b.cross_stream, b.pool);
        self.stats.allocated_bytes -= size;
        self.emit(Action::FreeRequested, addr, requested, stream, pool);
        if cross {
            self.pending.push(id);
        } else {
            self.free_block(id);
        }
        Ok(())
    }

    /// Completes a pending free (its streams' events finished).
    pub fn free_completed(&mut self, addr: u64) -> Result<(), FreeError> {
        let &id = self
            .active
            .get(&addr)
            .ok_or(FreeError::NotAllocated(addr))?;
        if self.blocks[id].state != Use::Pending {
            return Err(FreeError::NotPending(addr));
        }
        self.pending.retain(|&p| p != id);
        self.free_block(id);
        Ok(())
    }

    /// The rounded request (`round_size`) and the block size of the last allocation made.
    pub fn last_alloc(&self) -> (u64, u64) {
        self.last_alloc
    }

    /// Whether the block at `addr` waits for a pending free.
    pub fn is_pending(&self, addr: u64) -> bool {
        self.active
            .get(&addr)
            .is_some_and(|&id| self.blocks[id].state == Use::Pending)
    }

    /// `free_block`: back to the cache, merged with free neighbours.
    pub(super) fn free_block(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.state = Use::Free;
        b.cross_stream = false;
        let (addr, size, requested, stream, pool) = (b.addr, b.size, b.requested, b.stream, b.pool);
        self.emit(Action::FreeCompleted, addr, requested, stream, pool);
        self.active.remove(&addr);
        self.stats.active_bytes -= size;
        self.stats.requested_bytes -= requested;
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_free(id);
    }

    /// Merges the free neighbour `src` into `dst` (never across segments or mapping state).
    /// `dst` must not be in a pool set.
    pub(super) fn try_merge_blocks(&mut self, dst: BlockId, src: BlockId) -> u64 {
        if src == NONE {
            return 0;
        }
        let s = &self.blocks[src];
        if s.state != Use::Free || s.mapped != self.blocks[dst].mapped {
            return 0;
        }
        let (s_addr, s_size, s_prev, s_next, s_mapped) = (s.addr, s.size, s.prev, s.next, s.mapped);
        let pi = s.pool.index();
        if s_mapped {
            let key = s.key(src);
            self.pools[pi].remove_free(&key);
        } else {
            self.pools[pi].unmapped.remove(&(s.stream, s_addr, src));
        }
        if self.blocks[dst].prev == src {
            self.blocks[dst].addr = s_addr;
            self.blocks[dst].prev = s_prev;
            if s_prev != NONE {
                self.blocks[s_prev].next = dst;
            }
        } else {
            self.blocks[dst].next = s_next;
            if s_next != NONE {
                self.blocks[s_next].prev = dst;
            }
        }
        self.blocks[dst].size += s_size;
        self.blocks.remove(src);
        s_size
    }
}

#[cfg(test)]
#[path = "caching_allocator_tests.rs"]
mod tests;
