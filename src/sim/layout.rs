//! The allocator model's state as model `Segment`s, both ways: load a layout (the state
//! rebuilt before a trace) and export one (what a snapshot would show), plus the invariant
//! check the tests use.

use super::blocks::{Block, BlockId, PoolRef, Use, NONE};
use super::caching_allocator::CachingAllocator;
use super::rounding::{page_size, round_up};
use crate::model::{BlockState, PoolKind, Segment};
use std::collections::BTreeMap;

/// Address range of an expandable segment when the device memory is unknown and nothing
/// else bounds it.
const EXPANDABLE_HEADROOM: u64 = 1 << 40;

/// A `segment_map` of the trace, made after the state a layout describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaterMap {
    /// `cudaStream_t`.
    pub stream: u64,
    pub addr: u64,
    pub size: u64,
    /// The pool of the range it maps into (recorded, or of the snapshot's segment there).
    pub pool_id: (i64, i64),
}

/// Why a layout could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("segment at 0x{0:x} overlaps another segment")]
    Overlap(u64),
    #[error("the blocks of segment 0x{0:x} do not tile it")]
    Tiling(u64),
}

impl CachingAllocator {
    /// Loads a device's segments (non-expandable ones and mapped expandable ranges).
    /// `mapped_later` lists the pages mapped after this state. The
    /// address range each expandable segment reserved is not in a snapshot; it is inferred:
    /// it starts at the lowest of its later maps below its first mapped byte, above the
    /// segments and other segments' later maps below it; it ends before the next segment,
    /// other segment's later map or (placed highest first) expandable range above it; and,
    /// with the capacity known, it has PyTorch's size, extending below the pages shown when
    /// the range above leaves too little room (pages unmapped before the trace).
    pub fn load_layout(
        &mut self,
        segments: &[Segment],
        mapped_later: &[LaterMap],
    ) -> Result<(), LayoutError> {
        let mut starts: Vec<u64> = segments.iter().map(|s| s.address).collect();
        starts.sort_unstable();
        let mut groups: BTreeMap<(u64, usize), Vec<&Segment>> = BTreeMap::new();
        for s in segments {
            let pool = self.pool_ref(s.pool, s.pool_id);
            if s.is_expandable {
                groups.entry((s.stream, pool.index())).or_default().push(s);
                continue;
            }
            if !self.driver.adopt(s.address, s.total_size) {
                return Err(LayoutError::Overlap(s.address));
            }
            self.driver.reserved += s.total_size;
            self.load_blocks(s, pool, None)?;
        }
        // Highest first, so each reservation ends at most where the one above it begins (PyTorch
        // reserves them one after another, each of the same size).
        let mut groups: Vec<((u64, usize), Vec<&Segment>)> = groups.into_iter().collect();
        for (_, ranges) in &mut groups {
            ranges.sort_by_key(|s| s.address);
        }
        groups.sort_by_key(|(_, ranges)| std::cmp::Reverse(ranges.first().map(|s| s.address)));
        for ((stream, _), ranges) in groups {
            let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
                continue;
            };
            let pool = self.pool_ref(first.pool, first.pool_id);
            let page = page_size(pool.kind, &self.config);
            // Maps of this pool: page multiples of this stream and pool id. Maps of other
            // segments in the trace bound this one's address range as segments do, below and
            // above.
            let pool_id = first.pool_id;
            let ours = |m: &LaterMap| {
                m.stream == stream
                    && m.pool_id == pool_id
                    && m.size.is_multiple_of(page)
                    && (pool.kind == PoolKind::Large
                        || !m.size.is_multiple_of(self.config.large_segment_size))
            };
            let others = || mapped_later.iter().filter(|m| !ours(m));
            let floor = segments
                .iter()
                .map(|s| (s.address, s.total_size))
                .chain(others().map(|m| (m.addr, m.size)))
                .map(|(a, size)| a + size)
                .filter(|&end| end <= first.address)
                .max()
                .unwrap_or(0);
            let mut base = mapped_later
                .iter()
                .filter(|m| {
                    ours(m)
                        && m.addr >= floor
                        && m.addr < first.address
                        && (first.address - m.addr) % page == 0
                })
                .map(|m| m.addr)
                .min()
                .unwrap_or(first.address);
            let last_end = last.address + last.total_size;
            let limit = starts
                .iter()
                .copied()
                .chain(others().map(|m| m.addr))
                .filter(|&a| a >= last_end)
                .chain(self.driver.start_from(last_end))
                .min()
                .unwrap_or(u64::MAX);
            // PyTorch reserves 1 1/8 of the device memory per segment.
            let reserve = self.driver.capacity.map_or(EXPANDABLE_HEADROOM, |c| {
                round_up(c.saturating_add(c / 8), page)
            });
            // With the capacity known the reservation's size is known; where the range above
            // leaves less than that from the lowest page the trace shows, the rest lies below
            // it (pages mapped and unmapped before the window), down to the range below.
            if self.driver.capacity.is_some() && limit.saturating_sub(base) < reserve {
                let lowest = limit.saturating_sub(reserve).max(floor);
                base -= base.saturating_sub(lowest) / page * page;
            }
            let mapped = round_up(last_end - base, page);
            let end = base
                + reserve
                    .max(mapped)
                    .min(limit.saturating_sub(base) / page * page)
                    .max(mapped);
            if !self.driver.adopt(base, end - base) {
                return Err(LayoutError::Overlap(base));
            }
            let index = self.expandable.len() as u32;
            let head = self.add_expandable_segment(base, end - base, page, stream, pool);
            // Carve the mapped ranges out of the one unmapped block, lowest first.
            let mut unmapped = head;
            for r in ranges {
                let u = &self.blocks[unmapped];
                if r.address < u.addr || r.address + r.total_size > u.addr + u.size {
                    return Err(LayoutError::Overlap(r.address));
                }
                let (u_addr, u_size) = (u.addr, u.size);
                self.pools[pool.index()]
                    .unmapped
                    .remove(&(stream, u_addr, unmapped));
                let tail = u_addr + u_size - (r.address + r.total_size);
                // [u_addr, r.address) stays unmapped; then the mapped blocks; then the tail.
                let mut prev = self.blocks[unmapped].prev;
                if r.address > u_addr {
                    self.blocks[unmapped].size = r.address - u_addr;
                    self.pools[pool.index()]
                        .unmapped
                        .insert((stream, u_addr, unmapped));
                    prev = unmapped;
                } else {
                    if prev != NONE {
                        self.blocks[prev].next = NONE;
                    }
                    self.blocks.remove(unmapped);
                }
                self.driver.reserved += r.total_size;
                let last_block = self.load_blocks(r, pool, Some((index, prev)))?;
                if tail == 0 {
                    break;
                }
                let mut rest = Block::new(r.address + r.total_size, tail, stream, pool);
                rest.mapped = false;
                rest.expandable = index;
                rest.prev = last_block;
                let rest_id = self.blocks.insert(rest);
                self.blocks[last_block].next = rest_id;
                self.pools[pool.index()].unmapped.insert((
                    stream,
                    r.address + r.total_size,
                    rest_id,
                ));
                unmapped = rest_id;
            }
        }
        self.note_reserved();
        Ok(())
    }

    /// Adds a segment's blocks to `pool`, linked after `prev` of expandable segment
    /// `expandable`. Returns the last block.
    fn load_blocks(
        &mut self,
        s: &Segment,
        pool: PoolRef,
        expandable: Option<(u32, BlockId)>,
    ) -> Result<BlockId, LayoutError> {
        let mut prev = expandable.map_or(NONE, |(_, p)| p);
        let mut at = s.address;
        for b in &s.blocks {
            if b.address != at || b.size == 0 {
                return Err(LayoutError::Tiling(s.address));
            }
            at += b.size;
            let mut block = Block::new(b.address, b.size, s.stream, pool);
            block.requested = b.requested_size;
            block.prev = prev;
            block.expandable = expandable.map_or(NONE, |(e, _)| e);
            block.state = match b.state {
                BlockState::ActiveAllocated => Use::Allocated,
                BlockState::ActivePendingFree => Use::Pending,
                BlockState::Inactive => Use::Free,
            };
            let id = self.blocks.insert(block);
            if prev != NONE {
                self.blocks[prev].next = id;
            }
            prev = id;
            match b.state {
                BlockState::Inactive => self.insert_free(id),
                state => {
                    self.active.insert(b.address, id);
                    self.stats.active_bytes += b.size;
                    self.stats.requested_bytes += b.requested_size;
                    if state == BlockState::ActiveAllocated {
                        self.stats.allocated_bytes += b.size;
                    } else {
                        self.blocks[id].cross_stream = true;
                        self.pending.push(id);
                    }
                }
            }
        }
        if at != s.address + s.total_size || prev == NONE {
            return Err(LayoutError::Tiling(s.address));
        }
        self.stats.peak_allocated_bytes = self.stats.allocated_bytes;
        Ok(prev)
    }

    /// The state as snapshot segments (one per cudaMalloc, one per contiguous mapped range of
    /// an expandable segment), in address order.
    pub fn layout(&self, device: u32) -> Vec<Segment> {
        let mut out = Vec::new();
        for (id, head) in self.blocks.iter() {
            if head.prev != NONE {
                continue;
            }
            let mut current: Option<Segment> = None;
            let mut at = id;
            while at != NONE {
                let b = &self.blocks[at];
                if b.mapped {
                    let seg = current.get_or_insert_with(|| Segment {
                        device,
                        address: b.addr,
                        total_size: 0,
                        stream: b.stream,
                        pool: b.pool.kind,
                        pool_id: self.pool_id(b.pool),
                        is_expandable: b.is_expandable(),
                        stack: None,
                        blocks: Vec::new(),
                    });
                    seg.total_size += b.size;
                    seg.blocks.push(crate::model::Block {
                        address: b.addr,
                        size: b.size,
                        requested_size: b.requested,
                        state: match b.state {
                            Use::Allocated => BlockState::ActiveAllocated,
                            Use::Pending => BlockState::ActivePendingFree,
                            Use::Free => BlockState::Inactive,
                        },
                        stack: None,
                    });
                } else if let Some(seg) = current.take() {
                    out.push(seg);
                }
                at = b.next;
            }
            out.extend(current);
        }
        out.sort_by_key(|s| s.address);
        out
    }

    /// Checks the model's invariants: blocks tile their segments, no overlap, no two
    /// adjacent free blocks, the free sets hold exactly the free blocks, stats equal sums.
    pub fn check_invariants(&self) -> Result<(), String> {
        let (mut allocated, mut active, mut requested, mut reserved) = (0u64, 0u64, 0u64, 0u64);
        let (mut free_count, mut unmapped_count) = (0usize, 0usize);
        let mut ranges = Vec::new();
        for (id, b) in self.blocks.iter() {
            if b.next != NONE {
                let n = &self.blocks[b.next];
                if n.prev != id || b.addr + b.size != n.addr {
                    return Err(format!("block 0x{:x} and its next do not tile", b.addr));
                }
                if b.state == Use::Free && n.state == Use::Free && b.mapped == n.mapped {
                    return Err(format!("adjacent free blocks at 0x{:x}", b.addr));
                }
            }
            if b.prev == NONE {
                let (mut end, mut at) = (b.addr, id);
                while at != NONE {
                    end = self.blocks[at].addr + self.blocks[at].size;
                    at = self.blocks[at].next;
                }
                ranges.push((b.addr, end));
            }
            if b.mapped {
                reserved += b.size;
            }
            let pool = &self.pools[b.pool.index()];
            match (b.state, b.mapped) {
                (Use::Free, true) => {
                    free_count += 1;
                    if !pool.free.contains(&b.key(id)) {
                        return Err(format!("free block 0x{:x} is not in its pool", b.addr));
                    }
                }
                (Use::Free, false) => {
                    unmapped_count += 1;
                    if !pool.unmapped.contains(&(b.stream, b.addr, id)) {
                        return Err(format!("unmapped block 0x{:x} is not listed", b.addr));
                    }
                }
                (state, _) => {
                    active += b.size;
                    requested += b.requested;
                    if state == Use::Allocated {
                        allocated += b.size;
                    }
                    if self.active.get(&b.addr) != Some(&id) {
                        return Err(format!("active block 0x{:x} is not indexed", b.addr));
                    }
                }
            }
        }
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
            return Err("segments overlap".into());
        }
        let listed: usize = self.pools.iter().map(|p| p.free.len()).sum();
        let listed_unmapped: usize = self.pools.iter().map(|p| p.unmapped.len()).sum();
        if listed != free_count || listed_unmapped != unmapped_count {
            return Err("pool sets list blocks that are not free".into());
        }
        let s = &self.stats;
        if (allocated, active, requested, reserved)
            != (
                s.allocated_bytes,
                s.active_bytes,
                s.requested_bytes,
                self.driver.reserved,
            )
        {
            return Err(format!(
                "stats {:?} differ from the sums {:?}",
                (
                    s.allocated_bytes,
                    s.active_bytes,
                    s.requested_bytes,
                    self.driver.reserved
                ),
                (allocated, active, requested, reserved)
            ));
        }
        Ok(())
    }

    /// Largest free cached block (any pool, any stream): the last key of each stream.
    pub fn largest_free_block(&self) -> u64 {
        let mut largest = 0;
        for pool in &self.pools {
            let mut upper = pool.free.iter().next_back().copied();
            while let Some(k) = upper {
                largest = largest.max(k.1);
                upper = pool.free.range(..(k.0, 0, 0, 0)).next_back().copied();
            }
        }
        largest
    }
}
