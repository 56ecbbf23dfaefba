//! Replays one device's recorded trace through the allocator model (reference §2.12).
//!
//! `prepare` rebuilds the state before the trace (`initial`), infers the capacity
//! (`capacity`) and runs the validating first pass (`plan`), which turns the trace into the
//! program's requests; where the first mismatch shows a block alive before the trace had an
//! unsplit remainder, it corrects the start state and replays again. `run` replays the same
//! requests under other settings (what-if).

use super::alloc_conf::AllocatorConfig;
use super::block_sizes::BlockSizes;
pub use super::capacity::UpperBound;
use super::capacity::{capacity_bracket, Bracket};
use super::early_free::{with_early_frees, EarlyFree};
use super::engine::{Engine, Op};
use super::initial::state_before;
use super::layout::LaterMap;
use super::plan::plan_and_validate;
use super::rounding::{MIN_BLOCK_SIZE, SMALL_SIZE};
use super::validation::same_layout;
pub use super::validation::{EntryView, Mismatch, Tally, Validation};
use crate::model::{
    Action, AllocatorSettings, BlockState, ReplayIssue, Segment, Snapshot, TraceEntry,
};
use rustc_hash::FxHashSet;
use serde::Serialize;

/// One device's recording: its trace, stream and pool tables and final segments.
#[derive(Clone, Debug)]
pub struct DeviceTrace<'a> {
    pub device: u32,
    pub entries: &'a [TraceEntry],
    /// `cudaStream_t` of each `StreamIndex` (the snapshot's table, shared by its devices).
    pub streams: &'a [u64],
    /// `pool_id` of each `PoolIndex` (empty when entries record none).
    pub pools: &'a [(i64, i64)],
    /// Segments at the end of the trace, in address order.
    pub segments: Vec<Segment>,
}

impl<'a> DeviceTrace<'a> {
    /// Every device of a snapshot that has a trace or segments.
    pub fn all(snapshot: &'a Snapshot) -> Vec<DeviceTrace<'a>> {
        snapshot
            .devices()
            .into_iter()
            .map(|device| DeviceTrace::of(snapshot, device))
            .collect()
    }

    /// The trace and final segments of one device.
    pub fn of(snapshot: &'a Snapshot, device: u32) -> DeviceTrace<'a> {
        let t = &snapshot.timeline;
        DeviceTrace {
            device,
            entries: t.device(device as usize),
            streams: t.streams(),
            pools: t.pools(),
            segments: snapshot.device_segments(device).cloned().collect(),
        }
    }

    pub(super) fn stream(&self, e: &TraceEntry) -> u64 {
        self.streams.get(e.stream.0 as usize).copied().unwrap_or(0)
    }

    /// The `pool_id` the entry records, if any.
    pub(super) fn pool(&self, e: &TraceEntry) -> Option<(i64, i64)> {
        e.pool()
            .map(|p| self.pools.get(p.0 as usize).copied().unwrap_or((0, 0)))
    }

    /// The pool of a `segment_map`: recorded, else that of the snapshot's segment it lies in,
    /// else the default pool.
    pub(super) fn map_pool(&self, e: &TraceEntry) -> (i64, i64) {
        self.pool(e)
            .or_else(|| self.segment_pool_at(e.addr()?))
            .unwrap_or((0, 0))
    }

    /// The pool of the snapshot's segment that holds `addr`, if one does (a search: the
    /// segments are in address order).
    pub(super) fn segment_pool_at(&self, addr: u64) -> Option<(i64, i64)> {
        let after = self.segments.partition_point(|s| s.address <= addr);
        let s = &self.segments[after.checked_sub(1)?];
        (addr - s.address < s.total_size).then_some(s.pool_id)
    }
}

/// The moment reserved memory peaked (its first), and the state then: what was allocated
/// and the fragmentation fields of `analyze`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FragmentationAtPeak {
    /// The trace entry whose request took reserved memory to its peak; `None` when the peak is
    /// the state before the first entry.
    pub entry_index: Option<usize>,
    /// Bytes in allocated blocks then.
    pub allocated_bytes: u64,
    /// Allocated minus requested bytes.
    pub internal_bytes: u64,
    /// Reserved bytes not in active blocks.
    pub external_bytes: u64,
    pub largest_free_block_bytes: u64,
}

/// The model's `memory_stats()` figures just after one trace entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StateAt {
    /// The trace entry; `None` for the state before the first entry.
    pub entry_index: Option<usize>,
    pub allocated_bytes: u64,
    pub active_bytes: u64,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
    pub largest_free_block_bytes: u64,
}

/// Where a run first ran out of memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomAt {
    pub entry_index: usize,
    /// The rounded request.
    pub request_bytes: u64,
    /// The segment it needed.
    pub alloc_size_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// The largest free cached block after the allocator's releases.
    pub largest_free_block_bytes: u64,
    /// Every figure of the model at the failed request, after its releases.
    pub state: StateAt,
}

/// What one replay produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunResult {
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    /// The state when allocated bytes first reached their peak.
    pub at_peak_allocated: StateAt,
    /// The state when requested bytes first reached their peak.
    pub at_peak_requested: StateAt,
    /// OOM retries that got their request: each released every cached block and synchronized
    /// the device.
    pub oom_retries: u64,
    /// `torch.cuda.empty_cache()` calls of the program (each a synchronize too).
    pub empty_cache_calls: u64,
    pub fragmentation_at_peak: FragmentationAtPeak,
    pub oom: Option<OomAt>,
    /// Requests that contradict the model's state (free of an unknown address, ...).
    pub issues: Vec<ReplayIssue>,
}

/// Where the device capacity used by a replay came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    Given,
    /// Bracketed by the trace's OOM retries and `oom` entries (rule 4).
    Inferred,
    Unlimited,
}

/// A device's trace turned into requests, validated with the recorded settings.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub device: u32,
    /// Trace entries of the device (every one is walked; 0: nothing was replayed).
    pub replayed_entries: usize,
    /// Of those, the requests (`alloc` and `oom` entries): 0 means no allocator decision was
    /// replayed, and every setting gives the same result.
    pub replayed_requests: usize,
    initial: Vec<Segment>,
    /// Every `segment_map` in the trace.
    mapped_later: Vec<LaterMap>,
    ops: Vec<Op>,
    pub capacity: Option<u64>,
    pub capacity_source: CapacitySource,
    /// Highest reserved total the record shows.
    pub recorded_peak_reserved_bytes: u64,
    /// The lowest device capacity the trace's OOM retries and `oom` entries allow (the
    /// capacity lies between `recorded_peak_reserved_bytes` and this); `None` without them.
    pub capacity_upper_bytes: Option<u64>,
    /// What gave `capacity_upper_bytes`.
    pub capacity_upper_from: Option<UpperBound>,
    /// Index of the first release of each burst of releases that was an `empty_cache()` call,
    /// not an OOM retry (rule 1), in trace order.
    pub empty_cache_bursts: Vec<usize>,
    pub validation: Validation,
    /// The replay with the recorded settings.
    pub recorded_run: RunResult,
    /// The block each allocation got in that replay.
    pub blocks: BlockSizes,
    /// Problems met while rebuilding the state before the trace.
    pub issues: Vec<ReplayIssue>,
}

/// What an account takes from the replay with the recorded settings: the model's figures at
/// its moments, and how far the replay can be trusted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub at_peak_allocated: StateAt,
    pub at_peak_requested: StateAt,
    /// The state at the first request the model could not serve.
    pub oom: Option<StateAt>,
    /// The first release of each `empty_cache()` call, in trace order.
    pub empty_cache_entries: Vec<usize>,
    /// The first entry where the model decided otherwise than the record (`None`: never); its
    /// figures are the allocator's own only before it.
    pub first_mismatch_entry: Option<usize>,
    /// The block each allocation got (the allocator's own where `trusted_at`).
    pub blocks: BlockSizes,
}

impl Replayed {
    pub fn of(prepared: &Prepared) -> Replayed {
        let run = &prepared.recorded_run;
        Replayed {
            at_peak_allocated: run.at_peak_allocated,
            at_peak_requested: run.at_peak_requested,
            oom: run.oom.as_ref().map(|o| o.state),
            empty_cache_entries: prepared.empty_cache_bursts.clone(),
            first_mismatch_entry: prepared
                .validation
                .first_mismatch
                .as_ref()
                .map(|m| m.entry_index),
            blocks: prepared.blocks.clone(),
        }
    }

    /// Whether the model's figures just after `entry` are the allocator's: the replay had
    /// reproduced every decision up to it.
    pub fn trusted_at(&self, entry: Option<usize>) -> bool {
        match (entry, self.first_mismatch_entry) {
            (_, None) => true,
            (None, Some(_)) => true,
            (Some(e), Some(m)) => e < m,
        }
    }
}

/// The settings a snapshot's allocator ran with: the recorded ones, else the defaults with
/// expandable segments when the file shows them. A recorded settings string this parser
/// refuses is set aside (the structured values PyTorch wrote still apply), with a warning.
pub fn recorded_config(snapshot: &Snapshot) -> (AllocatorConfig, Option<String>) {
    let mut warning = None;
    let mut config = match &snapshot.settings {
        Some(s) => AllocatorConfig::from_settings(s).unwrap_or_else(|e| {
            warning = Some(format!("recorded PYTORCH_CUDA_ALLOC_CONF set aside: {e}"));
            let structured = AllocatorSettings {
                alloc_conf: None,
                ..s.clone()
            };
            AllocatorConfig::from_settings(&structured).unwrap_or_default()
        }),
        None => AllocatorConfig::default(),
    };
    if snapshot
        .settings
        .as_ref()
        .and_then(|s| s.expandable_segments)
        .is_none()
    {
        let mut entries =
            (0..snapshot.timeline.device_count()).flat_map(|d| snapshot.timeline.device(d).iter());
        config.expandable_segments = snapshot.segments.iter().any(|s| s.is_expandable)
            || entries.any(|e| matches!(e.action(), Action::SegmentMap | Action::SegmentUnmap));
    }
    (config, warning)
}

/// Rebuilds the state before the trace, infers the capacity unless `capacity` is given,
/// and replays with the `recorded` settings, comparing every decision with the record.
pub fn prepare(
    trace: &DeviceTrace<'_>,
    recorded: &AllocatorConfig,
    capacity: Option<u64>,
) -> Prepared {
    let mut issues = Vec::new();
    let stream_of = |e: &TraceEntry| trace.stream(e);
    let pool_of = |e: &TraceEntry| trace.pool(e);
    let (mut initial, ambiguous) = state_before(
        trace.entries,
        &stream_of,
        &pool_of,
        &trace.segments,
        recorded,
        &mut issues,
    );
    let mapped_later: Vec<LaterMap> = trace
        .entries
        .iter()
        .filter(|e| e.action() == Action::SegmentMap)
        .filter_map(|e| {
            Some(LaterMap {
                stream: trace.stream(e),
                addr: e.addr()?,
                size: e.size,
                pool_id: trace.map_pool(e),
            })
        })
        .collect();
    let mut attempt = Attempt::run(trace, recorded, capacity, &initial, &mapped_later);
    // Rule 5's "absorb a sliver found later": where the first mismatch shows that a block
    // alive before the trace had an unsplit remainder, give it one and replay again.
    for _ in 0..MAX_SLIVER_REPAIRS {
        let Some(m) = &attempt.validation.first_mismatch else {
            break;
        };
        let Some(repaired) = absorb_sliver(&initial, &ambiguous, m) else {
            break;
        };
        let again = Attempt::run(trace, recorded, capacity, &repaired, &mapped_later);
        let better = again
            .validation
            .first_mismatch
            .as_ref()
            .is_none_or(|n| n.entry_index > m.entry_index);
        if !better {
            break;
        }
        initial = repaired;
        attempt = again;
    }
    let Attempt {
        bracket,
        capacity,
        capacity_source,
        empty_cache_bursts,
        mut engine,
        mut validation,
        ops,
        load_issues,
    } = attempt;
    let blocks = engine.blocks.take().unwrap_or_default();
    issues.extend(load_issues);
    validation.final_layout_matches =
        same_layout(&engine.model.layout(trace.device), &trace.segments);
    if let Some(m) = validation.first_mismatch.as_mut() {
        let unmapped_before = initial.iter().any(|s| s.is_expandable)
            && [&m.expected, &m.got].into_iter().flatten().any(|v| {
                matches!(
                    v.action,
                    Action::SegmentMap | Action::SegmentUnmap | Action::Oom
                )
            });
        if unmapped_before {
            m.reason.push_str(
                "; the trace starts after expandable segments were in use, and a snapshot \
                 holds only their mapped pages: the part of each reserved address range that \
                 was unmapped before the first entry is inferred (from the capacity and the \
                 ranges around it) and may be missing or misplaced",
            );
        }
    }
    let pools_unrecorded = trace.entries.iter().all(|e| e.pool().is_none());
    if pools_unrecorded && trace.segments.iter().any(|s| s.pool_id != (0, 0)) {
        if let Some(m) = validation.first_mismatch.as_mut() {
            m.reason.push_str(
                "; this device has private-pool segments (CUDA graphs, MemPool), and its trace \
                 entries do not say which pool they used (the replay takes the pool of the \
                 segment each recorded address lies in)",
            );
        }
    }
    Prepared {
        device: trace.device,
        replayed_entries: trace.entries.len(),
        replayed_requests: trace
            .entries
            .iter()
            .filter(|e| matches!(e.action(), Action::Alloc | Action::Oom))
            .count(),
        initial,
        mapped_later,
        ops,
        capacity,
        capacity_source,
        recorded_peak_reserved_bytes: bracket.peak_reserved,
        capacity_upper_bytes: bracket.upper.map(|(u, _)| u),
        capacity_upper_from: bracket.upper.map(|(_, from)| from),
        empty_cache_bursts: {
            let mut starts: Vec<usize> = empty_cache_bursts.into_iter().collect();
            starts.sort_unstable();
            starts
        },
        validation,
        recorded_run: engine.finish(),
        blocks,
        issues,
    }
}

/// How many blocks of the rebuilt state a replay may correct.
const MAX_SLIVER_REPAIRS: usize = 16;

/// One validating replay from a given start state.
struct Attempt {
    bracket: Bracket,
    capacity: Option<u64>,
    capacity_source: CapacitySource,
    /// The bursts this replay took for `empty_cache()` calls.
    empty_cache_bursts: FxHashSet<usize>,
    engine: Engine,
    validation: Validation,
    ops: Vec<Op>,
    load_issues: Vec<ReplayIssue>,
}

impl Attempt {
    /// The bracket counts the bursts that were OOM retries, which the replay tells apart
    /// from empty_cache() calls; a second replay runs when that changes the capacity.
    fn run(
        trace: &DeviceTrace<'_>,
        recorded: &AllocatorConfig,
        capacity: Option<u64>,
        initial: &[Segment],
        mapped_later: &[LaterMap],
    ) -> Attempt {
        let initial_reserved: u64 = initial.iter().map(|s| s.total_size).sum();
        let mut empty_cache_bursts = FxHashSet::default();
        let mut first = true;
        loop {
            let bracket = capacity_bracket(
                trace.entries,
                initial_reserved,
                recorded,
                &empty_cache_bursts,
            );
            let (capacity, capacity_source) = match (capacity, bracket.capacity) {
                (Some(c), _) => (Some(c), CapacitySource::Given),
                (None, Some(c)) => (Some(c), CapacitySource::Inferred),
                (None, None) => (None, CapacitySource::Unlimited),
            };
            let mut load_issues = Vec::new();
            let mut engine =
                Engine::new(recorded, capacity, initial, mapped_later, &mut load_issues);
            engine.keep_block_sizes(initial);
            let mut validation = Validation::default();
            let (ops, empties) = plan_and_validate(trace, &mut engine, &mut validation);
            let again = capacity_source == CapacitySource::Inferred
                && first
                && empties != empty_cache_bursts
                && capacity_bracket(trace.entries, initial_reserved, recorded, &empties).capacity
                    != capacity;
            if !again {
                return Attempt {
                    bracket,
                    capacity,
                    capacity_source,
                    empty_cache_bursts: empties,
                    engine,
                    validation,
                    ops,
                    load_issues,
                };
            }
            first = false;
            empty_cache_bursts = empties;
        }
    }
}

/// For an `alloc` the model placed at X where the record shows Y: if a block alive before
/// the trace, of inferred size and followed by free space, ends at X, or Y lies within
/// 1 MiB after its end, that block had an unsplit remainder. Returns the state with it.
fn absorb_sliver(
    initial: &[Segment],
    ambiguous: &FxHashSet<u64>,
    m: &Mismatch,
) -> Option<Vec<Segment>> {
    let (Some(want), Some(got)) = (&m.expected, &m.got) else {
        return None;
    };
    if want.action != Action::Alloc || got.action != Action::Alloc {
        return None;
    }
    let (y, x) = (want.addr?, got.addr?);
    let mut out = initial.to_vec();
    for seg in &mut out {
        for k in 0..seg.blocks.len().saturating_sub(1) {
            let (b, f) = (&seg.blocks[k], &seg.blocks[k + 1]);
            if !ambiguous.contains(&b.address) || f.state != BlockState::Inactive {
                continue;
            }
            let end = b.address + b.size;
            let grow = if y > end && y - end <= SMALL_SIZE {
                y - end
            } else if x == end && f.size > SMALL_SIZE + MIN_BLOCK_SIZE {
                (f.size - SMALL_SIZE - MIN_BLOCK_SIZE).min(SMALL_SIZE) / MIN_BLOCK_SIZE
                    * MIN_BLOCK_SIZE
            } else {
                continue;
            };
            if grow == 0 || grow >= f.size {
                continue;
            }
            seg.blocks[k].size += grow;
            seg.blocks[k + 1].address += grow;
            seg.blocks[k + 1].size -= grow;
            return Some(out);
        }
    }
    None
}

/// Replays the prepared requests under `config` with device `capacity`.
pub fn run(prepared: &Prepared, config: &AllocatorConfig, capacity: Option<u64>) -> RunResult {
    run_ops(prepared, config, capacity, &prepared.ops)
}

/// Replays the prepared requests with `frees` made earlier than recorded (what-if: the
/// program lets go of those tensors sooner).
pub fn run_freeing_early(
    prepared: &Prepared,
    config: &AllocatorConfig,
    capacity: Option<u64>,
    frees: &[EarlyFree],
) -> RunResult {
    let ops = with_early_frees(&prepared.ops, frees);
    run_ops(prepared, config, capacity, &ops)
}

/// Replays the prepared requests with the size of each multiplied by `factor` of its entry
/// (what-if: a larger or smaller batch scales what the batch allocates).
pub fn run_scaled(
    prepared: &Prepared,
    config: &AllocatorConfig,
    capacity: Option<u64>,
    factor: impl Fn(usize) -> f64,
) -> RunResult {
    let ops: Vec<Op> = prepared
        .ops
        .iter()
        .map(|op| match *op {
            Op::Malloc {
                entry,
                size,
                stream,
                pool,
                recorded,
                hint,
            } => Op::Malloc {
                entry,
                size: ((size as f64 * factor(entry)).ceil() as u64).max(1),
                stream,
                pool,
                recorded,
                hint,
            },
            other => other,
        })
        .collect();
    run_ops(prepared, config, capacity, &ops)
}

fn run_ops(
    prepared: &Prepared,
    config: &AllocatorConfig,
    capacity: Option<u64>,
    ops: &[Op],
) -> RunResult {
    let mut issues = Vec::new();
    let mut engine = Engine::new(
        config,
        capacity,
        &prepared.initial,
        &prepared.mapped_later,
        &mut issues,
    );
    engine.model.set_recording(false);
    for op in ops {
        engine.apply(op);
    }
    let mut result = engine.finish();
    result.issues.splice(0..0, issues);
    result
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
