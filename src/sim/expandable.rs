//! Expandable segments (reference §1.10): one reserved address range per (stream, pool),
//! mapped in 2 MiB / `large_segment_size` pages for the rounded request (`segment_map`),
//! and unmapped page-wise by `release_cached_blocks` (`segment_unmap`). A new range takes
//! the base the recording shows for it (rule 8 of §2.12).

use super::blocks::{Block, BlockId, PoolRef, Use, NONE};
use super::caching_allocator::{CachingAllocator, ExpandableSegment, Request};
use super::rounding::{page_size, round_up};
use crate::model::Action;

/// Device memory assumed for the address range of a segment when the capacity is unknown.
const DEFAULT_DEVICE_MEMORY: u64 = 1 << 40;

impl CachingAllocator {
    /// Links a new block into the segment right after `id` and returns its id.
    fn insert_after(&mut self, id: BlockId, mut block: Block) -> BlockId {
        block.prev = id;
        block.next = self.blocks[id].next;
        let new_id = self.blocks.insert(block);
        let next = self.blocks[new_id].next;
        if next != NONE {
            self.blocks[next].prev = new_id;
        }
        self.blocks[id].next = new_id;
        new_id
    }

    /// `try_allocate_expandable_block`: maps enough pages after a free block for the request.
    pub(super) fn try_allocate_expandable_block(&mut self, req: &Request) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(req)?;
        if !self.blocks[candidate].mapped {
            let size = self.blocks[candidate].size.min(req.size);
            if !self.map_block(candidate, size) {
                return None;
            }
        }
        while self.blocks[candidate].size < req.size {
            let remaining = req.size - self.blocks[candidate].size;
            let next = self.blocks[candidate].next;
            if next == NONE {
                return None;
            }
            let size = remaining.min(self.blocks[next].size);
            if !self.map_block(next, size) {
                return None;
            }
            candidate = next;
        }
        let key = self.blocks[candidate].key(candidate);
        self.pools[req.pool.index()].remove_free(&key);
        Some(candidate)
    }

    fn allocatable(&self, id: BlockId) -> bool {
        id != NONE && self.blocks[id].state == Use::Free
    }

    /// `find_expandable_block`: the lowest unmapped block of this stream (with the free block
    /// before it) that has room, else a new segment.
    fn find_expandable_block(&mut self, req: &Request) -> Option<BlockId> {
        let pi = req.pool.index();
        let found = self.pools[pi]
            .unmapped
            .range((req.stream, 0, 0)..)
            .take_while(|k| k.0 == req.stream)
            .map(|k| {
                let prev = self.blocks[k.2].prev;
                if self.allocatable(prev) {
                    prev
                } else {
                    k.2
                }
            })
            .find(|&c| self.has_room(c, req.size));
        if found.is_some() {
            return found;
        }
        let page = page_size(req.pool.kind, &self.config);
        let memory = self.driver.capacity.unwrap_or(DEFAULT_DEVICE_MEMORY);
        let size = round_up(memory.saturating_add(memory / 8), page);
        self.end_range_before_hinted_base();
        let (base, size) = self.driver.reserve_address_range(size, page);
        Some(self.add_expandable_segment(base, size, page, req.stream, req.pool))
    }

    /// The recorded base of a new range is what the driver chose; the extent of the ranges
    /// reserved before it is the model's inference (a snapshot does not hold it; without the
    /// capacity it is a guess). Where that base falls in the unmapped tail of another range,
    /// the other range ended there: it is cut back to its last whole page below the base, so
    /// the new range gets the recorded base instead of one the model would invent.
    fn end_range_before_hinted_base(&mut self) {
        let Some(addr) = self.driver.hinted_range_base() else {
            return;
        };
        let Some((index, seg)) = self.expandable.iter().enumerate().find_map(|(i, s)| {
            s.as_ref()
                .filter(|s| s.base < addr && addr - s.base < s.size)
                .map(|s| (i, s.clone()))
        }) else {
            return;
        };
        let end = seg.base + (addr - seg.base) / seg.page * seg.page;
        // The last block of that range (a scan: new ranges are rare).
        let Some((tail, _)) = self
            .blocks
            .iter()
            .find(|(_, b)| b.expandable == index as u32 && b.next == NONE)
        else {
            return;
        };
        let b = &self.blocks[tail];
        if b.mapped || b.state != Use::Free || b.addr > end || (b.addr == end && b.prev == NONE) {
            return;
        }
        if b.addr == end {
            // Mapped up to the cut: the unmapped tail goes.
            let (prev, key) = (b.prev, (b.stream, b.addr, tail));
            self.pools[b.pool.index()].unmapped.remove(&key);
            self.blocks[prev].next = NONE;
            self.blocks.remove(tail);
        } else {
            self.blocks[tail].size = end - b.addr;
        }
        if let Some(Some(s)) = self.expandable.get_mut(index) {
            s.size = end - seg.base;
        }
        self.driver.resize_range(seg.base, end - seg.base);
    }

    /// Creates an expandable segment whose whole range is one unmapped block.
    pub(super) fn add_expandable_segment(
        &mut self,
        base: u64,
        size: u64,
        page: u64,
        stream: u64,
        pool: PoolRef,
    ) -> BlockId {
        let index = self.expandable.len() as u32;
        self.expandable
            .push(Some(ExpandableSegment { base, size, page }));
        let mut block = Block::new(base, size, stream, pool);
        block.mapped = false;
        block.expandable = index;
        let id = self.blocks.insert(block);
        self.pools[pool.index()].unmapped.insert((stream, base, id));
        id
    }

    fn has_room(&self, mut id: BlockId, size: u64) -> bool {
        let mut bytes = 0u64;
        while bytes < size && self.allocatable(id) {
            bytes += self.blocks[id].size;
            id = self.blocks[id].next;
        }
        bytes >= size
    }

    /// `map_block`: maps the pages covering `[ptr, ptr + size)` of an unmapped block.
    pub(super) fn map_block(&mut self, id: BlockId, size: u64) -> bool {
        let b = &self.blocks[id];
        let Some(seg) = self
            .expandable
            .get(b.expandable as usize)
            .and_then(Option::as_ref)
        else {
            return false;
        };
        let end = seg.base + round_up(b.addr + size - seg.base, seg.page);
        let mapped = (end - b.addr).min(b.size);
        if !self.driver.map(mapped) {
            return false;
        }
        let (addr, stream, pool, total, expandable) =
            (b.addr, b.stream, b.pool, b.size, b.expandable);
        let pi = pool.index();
        self.pools[pi].unmapped.remove(&(stream, addr, id));
        self.blocks[id].mapped = true;
        if mapped < total {
            let mut rest = Block::new(addr + mapped, total - mapped, stream, pool);
            rest.mapped = false;
            rest.expandable = expandable;
            let rest_id = self.insert_after(id, rest);
            self.blocks[id].size = mapped;
            self.pools[pi]
                .unmapped
                .insert((stream, addr + mapped, rest_id));
        }
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_free(id);
        self.stats.num_device_alloc += 1;
        self.note_reserved();
        self.emit(Action::SegmentMap, addr, mapped, stream, pool);
        true
    }

    /// `unmap_block`: unmaps the whole pages inside a free mapped block; the partial pages
    /// at either end stay mapped as free blocks. Drops the segment when nothing is left.
    pub(super) fn unmap_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let Some(seg) = self
            .expandable
            .get(b.expandable as usize)
            .and_then(Option::as_ref)
        else {
            return;
        };
        let (base, page, seg_size) = (seg.base, seg.page, seg.size);
        let begin = base + round_up(b.addr - base, page);
        let end = base + (b.addr + b.size - base) / page * page;
        if begin >= end {
            return;
        }
        let (addr, size, stream, pool, expandable) =
            (b.addr, b.size, b.stream, b.pool, b.expandable);
        let pi = pool.index();
        let key = b.key(id);
        self.pools[pi].remove_free(&key);
        if begin > addr {
            let mut before = Block::new(addr, begin - addr, stream, pool);
            before.expandable = expandable;
            before.prev = self.blocks[id].prev;
            before.next = id;
            let before_id = self.blocks.insert(before);
            if self.blocks[before_id].prev != NONE {
                let p = self.blocks[before_id].prev;
                self.blocks[p].next = before_id;
            }
            self.blocks[id].prev = before_id;
            self.insert_free(before_id);
        }
        if end < addr + size {
            let mut after = Block::new(end, addr + size - end, stream, pool);
            after.expandable = expandable;
            let after_id = self.insert_after(id, after);
            self.insert_free(after_id);
        }
        let b = &mut self.blocks[id];
        b.addr = begin;
        b.size = end - begin;
        b.mapped = false;
        let (prev, next) = (b.prev, b.next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        let b = &self.blocks[id];
        let (whole, new_addr) = (!b.is_split() && b.size == seg_size, b.addr);
        self.pools[pi].unmapped.insert((stream, new_addr, id));
        self.driver.unmap(end - begin);
        self.stats.num_device_free += 1;
        self.emit(Action::SegmentUnmap, begin, end - begin, stream, pool);
        if whole {
            self.pools[pi].unmapped.remove(&(stream, new_addr, id));
            self.blocks.remove(id);
            self.expandable[expandable as usize] = None;
            self.driver.free_address_range(base);
        }
    }
}
