//! The block each allocation of a trace got in the allocator replay with the recorded settings,
//! so that what is alive at a moment can be counted as the allocator counts it
//! (`allocated_bytes`: block sizes of blocks not freed by the program). A block is the rounded
//! request (`rounding::round_size`) except where the allocator handed out more (a cached block
//! whose remainder was too small to split, an oversize block under `max_split_size_mb`): only
//! those are kept, with the blocks alive before the trace and the frees that waited on other
//! streams (freed by the program, so no longer allocated, but alive in the trace until their
//! `free_completed`).

use super::alloc_conf::{AllocatorConfig, ROUNDUP_INTERVALS};
use super::rounding::round_size_by;
use crate::model::{BlockState, Live, Segment};
use rustc_hash::FxHashMap;

/// The block sizes of one replay.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BlockSizes {
    /// `roundup_power2_divisions` of the settings replayed: the rounding of a request.
    divisions: [u64; ROUNDUP_INTERVALS],
    /// The block of each `alloc` entry (by index) where it is not the rounded request.
    made: FxHashMap<usize, u64>,
    /// The blocks alive before the trace, by address: the size of an allocated one, `None` for
    /// one already freed by the program and waiting on another stream.
    before: FxHashMap<u64, Option<u64>>,
    /// The `free_requested` entries whose `free_completed` came later, by address, in trace
    /// order.
    deferred: FxHashMap<u64, Vec<usize>>,
}

impl BlockSizes {
    /// Block sizes under `config`, starting from the state before the trace (`initial`).
    pub(super) fn new(config: &AllocatorConfig, initial: &[Segment]) -> BlockSizes {
        let before = initial
            .iter()
            .flat_map(|s| &s.blocks)
            .filter_map(|b| match b.state {
                BlockState::ActiveAllocated => Some((b.address, Some(b.size))),
                BlockState::ActivePendingFree => Some((b.address, None)),
                BlockState::Inactive => None,
            })
            .collect();
        BlockSizes {
            divisions: config.roundup_power2_divisions,
            made: FxHashMap::default(),
            before,
            deferred: FxHashMap::default(),
        }
    }

    /// The `alloc` entry `entry` got a block of `block` bytes, not its rounded request (the
    /// allocator's `round_size`, which `round_size_by` computes from the same settings).
    pub(super) fn note_larger(&mut self, entry: usize, block: u64) {
        self.made.insert(entry, block);
    }

    /// The `free_requested` entry `entry` freed the block at `addr`, completed later.
    pub(super) fn note_deferred_free(&mut self, entry: usize, addr: u64) {
        self.deferred.entry(addr).or_default().push(entry);
    }

    /// The block of the allocation `live` (alive at `addr` in the trace) just after entry `at`
    /// (`None`: before the first entry): its size, or `None` when the program had freed it
    /// by then and it waits on another stream (allocated bytes no longer count it).
    #[inline]
    pub fn allocated(&self, addr: u64, live: &Live, at: Option<usize>) -> Option<u64> {
        let size = match live.born() {
            Some(born) => self.made.get(&born).copied(),
            // Freed before the trace, waiting on another stream when it began.
            None if self.before.get(&addr) == Some(&None) => return None,
            None => self.before.get(&addr).copied().flatten(),
        };
        if !self.deferred.is_empty() {
            let after_birth = |f: &&usize| live.born().is_none_or(|b| **f > b);
            let freed = self.deferred.get(&addr).is_some_and(|frees| {
                frees
                    .iter()
                    .filter(after_birth)
                    .any(|&f| at.is_some_and(|p| f <= p))
            });
            if freed {
                return None;
            }
        }
        Some(size.unwrap_or_else(|| round_size_by(live.size, &self.divisions)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, StreamIndex, TraceEntry};

    const MIB: u64 = 1 << 20;

    fn alloc(size: u64, index: usize) -> Live {
        let e = TraceEntry::new(Action::Alloc, Some(0x1000), size, StreamIndex(0));
        Live::from_alloc(&e, index)
    }

    #[test]
    fn a_block_is_the_rounded_request_unless_noted() {
        let mut b = BlockSizes::new(&AllocatorConfig::default(), &[]);
        b.note_larger(1, 4 * MIB);
        assert_eq!(b.allocated(0x1000, &alloc(1000, 0), Some(5)), Some(1024));
        assert_eq!(
            b.allocated(0x1000, &alloc(3 * MIB - 5, 1), Some(5)),
            Some(4 * MIB)
        );
        let by_two = AllocatorConfig {
            roundup_power2_divisions: [2; ROUNDUP_INTERVALS],
            ..AllocatorConfig::default()
        };
        let b = BlockSizes::new(&by_two, &[]);
        assert_eq!(
            b.allocated(0x1000, &alloc(5 * MIB, 0), None),
            Some(6 * MIB),
            "rounded as the recorded settings round"
        );
    }

    /// The allocator replay keeps exactly the blocks that are not the rounded request: a
    /// cached block whose remainder is too small to split is handed out whole.
    #[test]
    fn the_replay_notes_an_unsplit_block() {
        use crate::sim::engine::{Engine, Op};
        let config = AllocatorConfig::default();
        let mut issues = Vec::new();
        let mut engine = Engine::new(&config, None, &[], &[], &mut issues);
        engine.keep_block_sizes(&[]);
        let malloc = |entry, size, recorded| Op::Malloc {
            entry,
            size,
            stream: 0,
            pool: (0, 0),
            recorded: Some(recorded),
            hint: None,
        };
        // 4 MiB in a 20 MiB segment, freed; 3.5 MiB takes the cached 20 MiB block and splits
        // it (16.5 MiB left); 16 MiB takes the rest whole (0.5 MiB would be left over).
        engine.apply(&malloc(0, 4 * MIB, 0xa));
        engine.apply(&Op::Free {
            entry: 1,
            addr: 0xa,
        });
        engine.apply(&malloc(2, 7 * MIB / 2, 0xb));
        engine.apply(&malloc(3, 16 * MIB, 0xc));
        let b = engine.blocks.take().expect("kept");
        assert_eq!(b.made.len(), 1, "{b:?}");
        assert_eq!(b.made.get(&3), Some(&(33 * MIB / 2)), "{b:?}");
    }

    #[test]
    fn a_deferred_free_stops_counting_at_its_free_requested() {
        let mut b = BlockSizes::new(&AllocatorConfig::default(), &[]);
        b.note_deferred_free(4, 0x1000);
        let live = alloc(600, 2);
        assert_eq!(b.allocated(0x1000, &live, Some(3)), Some(1024));
        assert_eq!(b.allocated(0x1000, &live, Some(4)), None);
        // A later allocation at the same address is not the one freed.
        assert_eq!(b.allocated(0x1000, &alloc(600, 6), Some(7)), Some(1024));
    }
}
