//! The replay engine: the program's requests (`Op`s) applied to the allocator model, with
//! recorded addresses mapped to the model's, the peak (the moment reserved memory was highest,
//! with what was allocated and cached then) and the first OOM tracked as they happen.

use super::alloc_conf::AllocatorConfig;
use super::block_sizes::BlockSizes;
use super::caching_allocator::CachingAllocator;
use super::driver::Driver;
use super::layout::LaterMap;
use super::replay::{FragmentationAtPeak, OomAt, RunResult, StateAt};
use crate::model::{ReplayIssue, Segment};
use rustc_hash::{FxHashMap, FxHashSet};

/// A stream that is never an allocation stream: marks deferred (cross-stream) frees.
pub(super) const OTHER_STREAM: u64 = u64::MAX;

/// A request of the program, in trace order.
#[derive(Clone, Copy, Debug)]
pub(super) enum Op {
    /// `alloc` (recorded address) or `oom` (none): a malloc of `size` on `stream` in the pool
    /// `pool_id` names ((0, 0): the default pool).
    Malloc {
        entry: usize,
        size: u64,
        stream: u64,
        pool: (i64, i64),
        recorded: Option<u64>,
        hint: Option<(u64, Option<u64>)>,
    },
    /// `free_requested` directly followed by its `free_completed`.
    Free { entry: usize, addr: u64 },
    /// A `free_requested` whose completion comes later (other streams used the block).
    FreeRequested { entry: usize, addr: u64 },
    /// The completion of a deferred free.
    FreeCompleted { entry: usize, addr: u64 },
    /// A completion the allocator makes itself while synchronizing (an OOM retry or
    /// `empty_cache()`): the block leaves the recorded-address map before the request...
    Detach { addr: u64 },
    /// ...and, if the model's own synchronization did not complete it, is completed after.
    CompleteDetached,
    /// `torch.cuda.empty_cache()`.
    EmptyCache,
}

impl Op {
    /// The trace entry the request comes from; `None` for the steps a synchronization or
    /// `empty_cache()` makes.
    pub(super) fn entry(&self) -> Option<usize> {
        match *self {
            Op::Malloc { entry, .. }
            | Op::Free { entry, .. }
            | Op::FreeRequested { entry, .. }
            | Op::FreeCompleted { entry, .. } => Some(entry),
            Op::Detach { .. } | Op::CompleteDetached | Op::EmptyCache => None,
        }
    }
}

/// The requests of a trace and the model's state while replaying them.
pub(super) struct Engine {
    pub(super) model: CachingAllocator,
    /// Recorded address of each live allocation -> the model's address.
    pub(super) addresses: FxHashMap<u64, u64>,
    /// Recorded allocations the model could not make (their frees are skipped).
    pub(super) failed: FxHashSet<u64>,
    /// Model addresses of detached blocks.
    pub(super) detached: Vec<u64>,
    pub(super) peak_reserved: u64,
    pub(super) fragmentation: FragmentationAtPeak,
    /// The trace entry of the last request applied (`None`: none yet).
    at: Option<usize>,
    pub(super) oom: Option<OomAt>,
    pub(super) issues: Vec<ReplayIssue>,
    at_peak_allocated: StateAt,
    at_peak_requested: StateAt,
    /// `empty_cache()` calls replayed.
    empty_cache_calls: u64,
    /// The block of each allocation, where this replay keeps them (`keep_block_sizes`).
    pub(super) blocks: Option<BlockSizes>,
}

impl Engine {
    pub(super) fn new(
        config: &AllocatorConfig,
        capacity: Option<u64>,
        initial: &[Segment],
        mapped_later: &[LaterMap],
        issues: &mut Vec<ReplayIssue>,
    ) -> Engine {
        let mut model = CachingAllocator::new(config.clone(), Driver::new(capacity));
        if let Err(e) = model.load_layout(initial, mapped_later) {
            issues.push(ReplayIssue {
                entry_index: 0,
                message: format!("the state before the trace cannot be loaded: {e}"),
            });
        }
        let addresses = initial
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, b.address))
            .collect();
        let mut engine = Engine {
            model,
            addresses,
            failed: FxHashSet::default(),
            detached: Vec::new(),
            peak_reserved: 0,
            fragmentation: FragmentationAtPeak::default(),
            at: None,
            oom: None,
            issues: Vec::new(),
            at_peak_allocated: StateAt::default(),
            at_peak_requested: StateAt::default(),
            empty_cache_calls: 0,
            blocks: None,
        };
        engine.note_peak();
        engine.at_peak_allocated = engine.state_at();
        engine.at_peak_requested = engine.at_peak_allocated;
        engine
    }

    /// Keeps the block each recorded allocation gets from here on, from the state before the
    /// trace `initial` (which the engine was made with).
    pub(super) fn keep_block_sizes(&mut self, initial: &[Segment]) {
        self.blocks = Some(BlockSizes::new(&self.model.config, initial));
    }

    fn issue(&mut self, entry_index: usize, message: String) {
        self.issues.push(ReplayIssue {
            entry_index,
            message,
        });
    }

    /// The model's figures now.
    fn state_at(&self) -> StateAt {
        let s = self.model.stats();
        StateAt {
            entry_index: self.at,
            allocated_bytes: s.allocated_bytes,
            active_bytes: s.active_bytes,
            requested_bytes: s.requested_bytes,
            reserved_bytes: self.model.reserved(),
            largest_free_block_bytes: self.model.largest_free_block(),
        }
    }

    /// Keeps the state at the first moment allocated, and requested, bytes reach a new high.
    fn note_moments(&mut self) {
        let s = self.model.stats();
        let (allocated, requested) = (s.allocated_bytes, s.requested_bytes);
        if allocated > self.at_peak_allocated.allocated_bytes {
            self.at_peak_allocated = self.state_at();
        }
        if requested > self.at_peak_requested.requested_bytes {
            self.at_peak_requested = self.state_at();
        }
    }

    fn note_peak(&mut self) {
        let reserved = self.model.reserved();
        if reserved > self.peak_reserved || (reserved == 0 && self.peak_reserved == 0) {
            self.peak_reserved = reserved;
            let s = self.model.stats();
            self.fragmentation = FragmentationAtPeak {
                entry_index: self.at,
                allocated_bytes: s.allocated_bytes,
                internal_bytes: s.allocated_bytes.saturating_sub(s.requested_bytes),
                external_bytes: reserved.saturating_sub(s.active_bytes),
                largest_free_block_bytes: self.model.largest_free_block(),
            };
        }
    }

    /// The model address of a recorded one; `None` (with an issue unless the allocation
    /// failed in this run) when unknown.
    fn model_address(&mut self, entry: usize, addr: u64, remove: bool) -> Option<u64> {
        let found = if remove {
            self.addresses.remove(&addr)
        } else {
            self.addresses.get(&addr).copied()
        };
        if found.is_none() {
            let failed = if remove {
                self.failed.remove(&addr)
            } else {
                self.failed.contains(&addr)
            };
            if !failed {
                self.issue(
                    entry,
                    format!("free of 0x{addr:x}, which is not allocated at that point"),
                );
            }
        }
        found
    }

    pub(super) fn apply(&mut self, op: &Op) {
        if let Some(entry) = op.entry() {
            self.at = Some(entry);
        }
        match *op {
            Op::Malloc {
                entry,
                size,
                stream,
                pool,
                recorded,
                hint,
            } => {
                self.model.set_address_hint(hint);
                match self.model.malloc_in(size, stream, pool) {
                    Ok(addr) => match recorded {
                        Some(r) => {
                            if let Some(blocks) = self.blocks.as_mut() {
                                let (rounded, block) = self.model.last_alloc();
                                if block != rounded {
                                    blocks.note_larger(entry, block);
                                }
                            }
                            if self.addresses.insert(r, addr).is_some() {
                                self.issue(
                                    entry,
                                    format!("alloc at 0x{r:x}, which is already allocated"),
                                );
                            }
                        }
                        // The recorded request failed; here it did not. The program never
                        // got the memory, so give it back.
                        None => {
                            let _ = self.model.free(addr);
                        }
                    },
                    Err(oom) => {
                        if let Some(r) = recorded {
                            self.failed.insert(r);
                        }
                        if self.oom.is_none() {
                            self.oom = Some(OomAt {
                                entry_index: entry,
                                request_bytes: oom.size,
                                alloc_size_bytes: oom.alloc_size,
                                reserved_bytes: oom.reserved,
                                allocated_bytes: oom.allocated,
                                largest_free_block_bytes: self.model.largest_free_block(),
                                state: self.state_at(),
                            });
                        }
                    }
                }
            }
            Op::Free { entry, addr } => {
                if let Some(a) = self.model_address(entry, addr, true) {
                    if let Err(e) = self.model.free(a) {
                        self.issue(entry, e.to_string());
                    }
                }
            }
            Op::FreeRequested { entry, addr } => {
                if let Some(blocks) = self.blocks.as_mut() {
                    blocks.note_deferred_free(entry, addr);
                }
                if let Some(a) = self.model_address(entry, addr, false) {
                    let done = self
                        .model
                        .record_stream(a, OTHER_STREAM)
                        .and_then(|()| self.model.free(a));
                    if let Err(e) = done {
                        self.issue(entry, e.to_string());
                    }
                }
            }
            Op::FreeCompleted { entry, addr } => {
                if let Some(a) = self.model_address(entry, addr, true) {
                    if let Err(e) = self.model.free_completed(a) {
                        self.issue(entry, e.to_string());
                    }
                }
            }
            Op::Detach { addr } => {
                if let Some(a) = self.addresses.remove(&addr) {
                    self.detached.push(a);
                }
            }
            Op::CompleteDetached => {
                for a in std::mem::take(&mut self.detached) {
                    if self.model.is_pending(a) {
                        let _ = self.model.free_completed(a);
                    }
                }
            }
            Op::EmptyCache => {
                self.empty_cache_calls += 1;
                self.model.empty_cache();
            }
        }
        self.note_peak();
        self.note_moments();
    }

    pub(super) fn finish(self) -> RunResult {
        let stats = self.model.stats();
        RunResult {
            peak_reserved_bytes: self.peak_reserved,
            at_peak_allocated: self.at_peak_allocated,
            at_peak_requested: self.at_peak_requested,
            peak_allocated_bytes: stats.peak_allocated_bytes,
            // Every failed request went through the last retry too.
            oom_retries: stats.num_alloc_retries.saturating_sub(stats.num_ooms),
            empty_cache_calls: self.empty_cache_calls,
            fragmentation_at_peak: self.fragmentation,
            oom: self.oom,
            issues: self.issues,
        }
    }
}
