//! Replays one device's recorded trace through the allocator model (reference §2.12).
//!
//! A first pass with the recorded settings turns the trace into the program's requests
//! (`Op`s): it tells OOM retries from `empty_cache()` bursts by asking the model whether
//! best fit would have served the next request (rule 1), leaves the releases of a retry and
//! the completions inside it to the model (rules 2-3), and offers each new segment the
//! address the driver returned (rule 8). It compares every decision with the record. What-if
//! runs replay the same requests under other settings.

use super::alloc_conf::AllocatorConfig;
use super::caching_allocator::CachingAllocator;
use super::driver::Driver;
use super::initial::state_before;
use super::rounding::{allocation_size, round_size, MIN_BLOCK_SIZE, SMALL_SIZE};
use crate::model::{
    Action, AllocatorSettings, BlockState, ReplayIssue, Segment, Snapshot, StreamIndex, TraceEntry,
};
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

/// A stream that is never an allocation stream: marks deferred (cross-stream) frees.
const OTHER_STREAM: u64 = u64::MAX;

/// One device's recording: its trace, stream table and final segments.
#[derive(Clone, Debug)]
pub struct DeviceTrace<'a> {
    pub device: u32,
    pub entries: &'a [TraceEntry],
    /// `cudaStream_t` of each `StreamIndex`.
    pub streams: Vec<u64>,
    /// Segments at the end of the trace.
    pub segments: Vec<Segment>,
}

impl<'a> DeviceTrace<'a> {
    /// Every device of a snapshot that has a trace or segments.
    pub fn all(snapshot: &'a Snapshot) -> Vec<DeviceTrace<'a>> {
        let t = &snapshot.timeline;
        let streams: Vec<u64> = (0..t.stream_count())
            .map(|i| t.stream(StreamIndex(i as u16)))
            .collect();
        snapshot
            .devices()
            .into_iter()
            .map(|device| DeviceTrace {
                device,
                entries: t.device(device as usize),
                streams: streams.clone(),
                segments: snapshot.device_segments(device).cloned().collect(),
            })
            .collect()
    }

    fn stream(&self, e: &TraceEntry) -> u64 {
        self.streams.get(e.stream.0 as usize).copied().unwrap_or(0)
    }
}

/// A request of the program, in trace order.
#[derive(Clone, Copy, Debug)]
enum Op {
    /// `alloc` (recorded address) or `oom` (none): a malloc of `size` on `stream`.
    Malloc {
        entry: usize,
        size: u64,
        stream: u64,
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

/// Entries compared, and how many the model reproduced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub events: u64,
    pub matches: u64,
}

/// An entry as the mismatch report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EntryView {
    pub action: Action,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addr: Option<u64>,
    pub size: u64,
}

impl EntryView {
    fn of(e: &TraceEntry) -> EntryView {
        EntryView {
            action: e.action,
            addr: e.addr(),
            size: e.size,
        }
    }
}

/// The first entry the model did not reproduce.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    pub entry_index: usize,
    /// The recorded entry; `None` when the model made an entry the record lacks.
    pub expected: Option<EntryView>,
    /// The model's entry; `None` when it made none.
    pub got: Option<EntryView>,
    /// Why, in words.
    pub reason: String,
}

/// How the model's decisions compare with the recorded ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validation {
    pub alloc: Tally,
    pub segment_alloc: Tally,
    pub segment_free: Tally,
    pub segment_map: Tally,
    pub segment_unmap: Tally,
    pub oom: Tally,
    pub first_mismatch: Option<Mismatch>,
    /// The model's segments and blocks at the end equal the snapshot's (addresses, sizes,
    /// states).
    pub final_layout_matches: bool,
}

impl Validation {
    fn tally(&mut self, action: Action) -> Option<&mut Tally> {
        match action {
            Action::Alloc => Some(&mut self.alloc),
            Action::SegmentAlloc => Some(&mut self.segment_alloc),
            Action::SegmentFree => Some(&mut self.segment_free),
            Action::SegmentMap => Some(&mut self.segment_map),
            Action::SegmentUnmap => Some(&mut self.segment_unmap),
            Action::Oom => Some(&mut self.oom),
            _ => None,
        }
    }

    fn mismatch(&mut self, m: Mismatch) {
        if self
            .first_mismatch
            .as_ref()
            .is_none_or(|f| m.entry_index < f.entry_index)
        {
            self.first_mismatch = Some(m);
        }
    }

    /// Every compared entry matched.
    pub fn all_match(&self) -> bool {
        self.first_mismatch.is_none()
    }
}

/// Fragmentation when reserved memory peaked (the fields of `analyze`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FragmentationAtPeak {
    /// Allocated minus requested bytes.
    pub internal_bytes: u64,
    /// Reserved bytes not in active blocks.
    pub external_bytes: u64,
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
}

/// What one replay produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunResult {
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
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
    initial: Vec<Segment>,
    /// (stream, address, size) of every `segment_map` in the trace.
    mapped_later: Vec<(u64, u64, u64)>,
    ops: Vec<Op>,
    pub capacity: Option<u64>,
    pub capacity_source: CapacitySource,
    /// Highest reserved total the record shows.
    pub recorded_peak_reserved_bytes: u64,
    pub validation: Validation,
    /// The replay with the recorded settings.
    pub recorded_run: RunResult,
    /// Problems met while rebuilding the state before the trace.
    pub issues: Vec<ReplayIssue>,
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
            || entries.any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap));
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
    let (mut initial, ambiguous) = state_before(
        trace.entries,
        &stream_of,
        &trace.segments,
        recorded,
        &mut issues,
    );
    let mapped_later: Vec<(u64, u64, u64)> = trace
        .entries
        .iter()
        .filter(|e| e.action == Action::SegmentMap)
        .filter_map(|e| Some((trace.stream(e), e.addr()?, e.size)))
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
        engine,
        mut validation,
        ops,
        load_issues,
    } = attempt;
    issues.extend(load_issues);
    validation.final_layout_matches =
        same_layout(&engine.model.layout(trace.device), &trace.segments);
    if trace.segments.iter().any(|s| s.pool_id != (0, 0)) {
        if let Some(m) = validation.first_mismatch.as_mut() {
            m.reason.push_str(
                "; this device has private-pool segments (CUDA graphs, MemPool), and trace \
                 entries do not say which pool they used",
            );
        }
    }
    Prepared {
        device: trace.device,
        initial,
        mapped_later,
        ops,
        capacity,
        capacity_source,
        recorded_peak_reserved_bytes: bracket.peak_reserved,
        validation,
        recorded_run: engine.finish(),
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
        mapped_later: &[(u64, u64, u64)],
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
    let mut issues = Vec::new();
    let mut engine = Engine::new(
        config,
        capacity,
        &prepared.initial,
        &prepared.mapped_later,
        &mut issues,
    );
    engine.model.set_recording(false);
    for op in &prepared.ops {
        engine.apply(op);
    }
    let mut result = engine.finish();
    result.issues.splice(0..0, issues);
    result
}

/// The requests of a trace and the model's state while replaying them.
struct Engine {
    model: CachingAllocator,
    /// Recorded address of each live allocation -> the model's address.
    addresses: FxHashMap<u64, u64>,
    /// Recorded allocations the model could not make (their frees are skipped).
    failed: FxHashSet<u64>,
    /// Model addresses of detached blocks.
    detached: Vec<u64>,
    peak_reserved: u64,
    fragmentation: FragmentationAtPeak,
    oom: Option<OomAt>,
    issues: Vec<ReplayIssue>,
}

impl Engine {
    fn new(
        config: &AllocatorConfig,
        capacity: Option<u64>,
        initial: &[Segment],
        mapped_later: &[(u64, u64, u64)],
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
            oom: None,
            issues: Vec::new(),
        };
        engine.note_peak();
        engine
    }

    fn issue(&mut self, entry_index: usize, message: String) {
        self.issues.push(ReplayIssue {
            entry_index,
            message,
        });
    }

    fn note_peak(&mut self) {
        let reserved = self.model.reserved();
        if reserved > self.peak_reserved || (reserved == 0 && self.peak_reserved == 0) {
            self.peak_reserved = reserved;
            let s = self.model.stats();
            self.fragmentation = FragmentationAtPeak {
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

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Malloc {
                entry,
                size,
                stream,
                recorded,
                hint,
            } => {
                self.model.set_address_hint(hint);
                match self.model.malloc(size, stream) {
                    Ok(addr) => match recorded {
                        Some(r) => {
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
                        self.oom.get_or_insert(OomAt {
                            entry_index: entry,
                            request_bytes: oom.size,
                            alloc_size_bytes: oom.alloc_size,
                            reserved_bytes: oom.reserved,
                            allocated_bytes: oom.allocated,
                        });
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
            Op::EmptyCache => self.model.empty_cache(),
        }
        self.note_peak();
    }

    fn finish(self) -> RunResult {
        RunResult {
            peak_reserved_bytes: self.peak_reserved,
            peak_allocated_bytes: self.model.stats().peak_allocated_bytes,
            fragmentation_at_peak: self.fragmentation,
            oom: self.oom,
            issues: self.issues,
        }
    }
}

fn is_burst(a: Action) -> bool {
    matches!(a, Action::SegmentFree | Action::SegmentUnmap)
}

fn is_growth(a: Action) -> bool {
    matches!(a, Action::SegmentAlloc | Action::SegmentMap)
}

/// Walks the trace, turning it into requests, applying each to the model and comparing the
/// model's entries with the recorded ones.
/// Also returns the index of the first release of every burst it took for `empty_cache()`.
fn plan_and_validate(
    trace: &DeviceTrace<'_>,
    engine: &mut Engine,
    validation: &mut Validation,
) -> (Vec<Op>, FxHashSet<usize>) {
    let mut empty_cache_bursts = FxHashSet::default();
    let entries = trace.entries;
    let n = entries.len();
    let mut ops = Vec::with_capacity(n);
    let mut group_start = 0;
    let mut detached = false;
    let mut hint: Option<(u64, Option<u64>)> = None;
    let mut i = 0;
    // Applies an op; the model's entries for it stay in `engine.model.events()`.
    let step = |op: Op, engine: &mut Engine, ops: &mut Vec<Op>| {
        engine.model.clear_events();
        engine.apply(&op);
        ops.push(op);
    };
    while i < n {
        let e = &entries[i];
        let addr = e.addr().unwrap_or(0);
        match e.action {
            Action::Alloc | Action::Oom => {
                let op = Op::Malloc {
                    entry: i,
                    size: e.size,
                    stream: trace.stream(e),
                    recorded: (e.action == Action::Alloc).then_some(addr),
                    hint: hint.take(),
                };
                step(op, engine, &mut ops);
                compare(
                    entries,
                    group_start,
                    i + 1,
                    engine.model.events(),
                    validation,
                );
                if std::mem::take(&mut detached) {
                    step(Op::CompleteDetached, engine, &mut ops);
                }
                i += 1;
                group_start = i;
            }
            Action::SegmentAlloc => {
                hint = Some((addr, Some(e.size)));
                i += 1;
            }
            Action::SegmentMap => {
                hint = hint.or(Some((addr, None)));
                i += 1;
            }
            Action::FreeRequested => {
                let paired = entries
                    .get(i + 1)
                    .is_some_and(|n| n.action == Action::FreeCompleted && n.addr() == Some(addr))
                    && !completed_by_retry(engine, trace, i);
                let (op, used) = if paired {
                    (Op::Free { entry: i, addr }, 2)
                } else {
                    (Op::FreeRequested { entry: i, addr }, 1)
                };
                step(op, engine, &mut ops);
                compare(
                    entries,
                    group_start,
                    i + used,
                    engine.model.events(),
                    validation,
                );
                i += used;
                group_start = i;
            }
            Action::FreeCompleted | Action::SegmentFree | Action::SegmentUnmap => {
                let lone_end = (i..n)
                    .find(|&j| entries[j].action != Action::FreeCompleted)
                    .unwrap_or(n);
                // The releases, with the completions of a synchronization between them
                // (release_available_cached_blocks releases before release_cached_blocks
                // synchronizes).
                let run_end = (lone_end..n)
                    .find(|&j| {
                        !(is_burst(entries[j].action) || entries[j].action == Action::FreeCompleted)
                    })
                    .unwrap_or(n);
                let burst_end = if (lone_end..run_end).any(|j| is_burst(entries[j].action)) {
                    run_end
                } else {
                    lone_end
                };
                let completions: Vec<(usize, u64)> = (i..burst_end)
                    .filter(|&j| entries[j].action == Action::FreeCompleted)
                    .map(|j| (j, entries[j].addr().unwrap_or(0)))
                    .collect();
                let has_burst = burst_end != lone_end;
                let request = (burst_end..n)
                    .find(|&j| !is_growth(entries[j].action))
                    .map(|j| (j, &entries[j]))
                    .filter(|(_, r)| matches!(r.action, Action::Alloc | Action::Oom));
                // Rule 1: an OOM retry only if best fit fails before the burst and, with the
                // capacity known, the device had no room without it. Then the model's own
                // retry, run on a copy, must make exactly the recorded releases and growth;
                // otherwise the burst was an empty_cache() call (and completions before an
                // `oom` came first).
                let retry = request.is_some_and(|(j, r)| {
                    let candidate = r.action == Action::Oom
                        || (has_burst && engine.model.would_release(r.size, trace.stream(r)));
                    candidate && retry_reproduces(&engine.model, trace, lone_end, j)
                });
                if !has_burst && !retry {
                    for (j, addr) in completions {
                        step(Op::FreeCompleted { entry: j, addr }, engine, &mut ops);
                        compare(
                            entries,
                            group_start,
                            j + 1,
                            engine.model.events(),
                            validation,
                        );
                        group_start = j + 1;
                    }
                    i = lone_end;
                    continue;
                }
                for &(_, addr) in &completions {
                    step(Op::Detach { addr }, engine, &mut ops);
                }
                if retry {
                    // The model's own retry releases and completes; compare at the request.
                    detached = true;
                    i = burst_end;
                    continue;
                }
                empty_cache_bursts.insert(lone_end);
                step(Op::EmptyCache, engine, &mut ops);
                compare(
                    entries,
                    group_start,
                    burst_end,
                    engine.model.events(),
                    validation,
                );
                step(Op::CompleteDetached, engine, &mut ops);
                i = burst_end;
                group_start = i;
            }
            Action::Snapshot => i += 1,
        }
    }
    compare(entries, group_start, n, &[], validation);
    (ops, empty_cache_bursts)
}

/// Segments and blocks equal in address, size and state (what a replay can know).
fn same_layout(model: &[Segment], recorded: &[Segment]) -> bool {
    let key = |s: &Segment| {
        (
            s.address,
            s.total_size,
            s.is_expandable,
            s.blocks
                .iter()
                .map(|b| (b.address, b.size, b.state))
                .collect::<Vec<_>>(),
        )
    };
    let mut recorded: Vec<_> = recorded.iter().map(key).collect();
    recorded.sort_by_key(|k| k.0);
    model.iter().map(key).eq(recorded)
}

/// Whether the free_requested / free_completed pair at `entries[i]` is a cross-stream free
/// whose completion came from the OOM retry right after it (rule 3's exception): the retry
/// the record shows (releases then growth and `alloc`, or an `oom`) is reproduced with the
/// block pending during the search, and not with it freed first.
fn completed_by_retry(engine: &Engine, trace: &DeviceTrace<'_>, i: usize) -> bool {
    let entries = trace.entries;
    let n = entries.len();
    let burst = i + 2;
    let burst_end = (burst..n)
        .find(|&j| !(is_burst(entries[j].action) || entries[j].action == Action::FreeCompleted))
        .unwrap_or(n);
    let released = (burst..burst_end).any(|j| is_burst(entries[j].action));
    let Some(request) = (burst_end..n)
        .find(|&j| !is_growth(entries[j].action))
        .filter(|&j| match entries[j].action {
            Action::Oom => true,
            Action::Alloc => released,
            _ => false,
        })
    else {
        return false;
    };
    let Some(&addr) = entries[i].addr().and_then(|a| engine.addresses.get(&a)) else {
        return false;
    };
    let mut freed = engine.model.clone();
    let mut pending = engine.model.clone();
    if freed.free(addr).is_err()
        || pending.record_stream(addr, OTHER_STREAM).is_err()
        || pending.free(addr).is_err()
    {
        return false;
    }
    !retry_reproduces(&freed, trace, burst, request)
        && retry_reproduces(&pending, trace, burst, request)
}

/// Whether the model's malloc for the request at `entries[request]`, run on a copy of its
/// state, makes exactly the recorded releases and growth of `entries[from..=request]`.
fn retry_reproduces(
    model: &CachingAllocator,
    trace: &DeviceTrace<'_>,
    from: usize,
    request: usize,
) -> bool {
    let entries = &trace.entries[from..=request];
    let r = &trace.entries[request];
    let mut copy = model.clone();
    copy.clear_events();
    copy.set_recording(true);
    let hint = entries.iter().find(|e| is_growth(e.action)).and_then(|e| {
        Some((
            e.addr()?,
            (e.action == Action::SegmentAlloc).then_some(e.size),
        ))
    });
    copy.set_address_hint(hint);
    let _ = copy.malloc(r.size, trace.stream(r));
    let decision = |e: &&TraceEntry| {
        is_burst(e.action) || is_growth(e.action) || matches!(e.action, Action::Alloc | Action::Oom)
    };
    let view = |e: &TraceEntry| (e.action, e.addr(), e.size);
    entries
        .iter()
        .filter(decision)
        .map(view)
        .eq(copy.events().iter().filter(decision).map(view))
}

/// Compares the recorded decisions in `entries[from..to]` with the model's, action by
/// action, in order.
fn compare(
    entries: &[TraceEntry],
    from: usize,
    to: usize,
    got: &[TraceEntry],
    validation: &mut Validation,
) {
    let compared = |e: &TraceEntry| {
        !matches!(
            e.action,
            Action::FreeRequested | Action::FreeCompleted | Action::Snapshot
        )
    };
    let recorded = &entries[from..to];
    if !recorded.iter().any(compared) && !got.iter().any(compared) {
        return;
    }
    if let ([want], [have]) = (recorded, got) {
        if want.action == Action::Alloc && have.action == Action::Alloc {
            validation.alloc.events += 1;
            if have.addr() == want.addr() && have.size == want.size {
                validation.alloc.matches += 1;
                return;
            }
            validation.alloc.events -= 1;
        }
    }
    const COMPARED: [Action; 6] = [
        Action::SegmentFree,
        Action::SegmentUnmap,
        Action::SegmentAlloc,
        Action::SegmentMap,
        Action::Alloc,
        Action::Oom,
    ];
    for action in COMPARED {
        let mut model = got.iter().filter(|e| e.action == action);
        let mut last_index = from;
        for (index, want) in entries[from..to]
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == action)
        {
            let index = from + index;
            last_index = index;
            let have = model.next();
            let same = have.is_some_and(|h| {
                h.size == want.size && (action == Action::Oom || h.addr() == want.addr())
            });
            if let Some(t) = validation.tally(action) {
                t.events += 1;
                t.matches += u64::from(same);
            }
            if !same {
                let reason = match have {
                    None => format!("the model made no {action} here"),
                    Some(h) if h.size != want.size => {
                        format!("the model's {action} has another size")
                    }
                    Some(_) => format!("the model's {action} is at another address"),
                };
                validation.mismatch(Mismatch {
                    entry_index: index,
                    expected: Some(EntryView::of(want)),
                    got: have.map(EntryView::of),
                    reason,
                });
            }
        }
        if let Some(extra) = model.next() {
            validation.mismatch(Mismatch {
                entry_index: last_index.min(to.saturating_sub(1)),
                expected: None,
                got: Some(EntryView::of(extra)),
                reason: format!("the model made a {action} the record does not have"),
            });
        }
    }
}

/// The recorded peak reserved and the device capacity bracket of rule 4.
struct Bracket {
    peak_reserved: u64,
    capacity: Option<u64>,
}

/// Bursts starting at an index of `empty_cache_bursts` were not retries.
fn capacity_bracket(
    entries: &[TraceEntry],
    initial: u64,
    config: &AllocatorConfig,
    empty_cache_bursts: &FxHashSet<usize>,
) -> Bracket {
    let mut reserved = initial;
    let mut lower = initial;
    let mut uppers = Vec::new();
    let mut burst_from: Option<u64> = None;
    let (mut in_burst, mut skipping) = (false, false);
    for (i, e) in entries.iter().enumerate() {
        if is_burst(e.action) && !in_burst {
            skipping = empty_cache_bursts.contains(&i);
        }
        in_burst = is_burst(e.action);
        if in_burst && skipping {
            burst_from = None;
            reserved = reserved.saturating_sub(e.size);
            continue;
        }
        match e.action {
            Action::SegmentAlloc | Action::SegmentMap => {
                if let Some(before) = burst_from.take() {
                    uppers.push(before.saturating_add(e.size));
                }
                reserved = reserved.saturating_add(e.size);
                lower = lower.max(reserved);
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                burst_from.get_or_insert(reserved);
                reserved = reserved.saturating_sub(e.size);
            }
            Action::Oom => {
                burst_from = None;
                let need = allocation_size(round_size(e.size, config), config);
                uppers.push(reserved.saturating_add(need));
            }
            Action::FreeCompleted => {}
            _ => burst_from = None,
        }
    }
    // A burst that cannot have been a retry under one capacity was an empty_cache() call.
    let upper = uppers.into_iter().filter(|&u| u > lower).min();
    Bracket {
        peak_reserved: lower,
        capacity: upper.map(|_| lower),
    }
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
