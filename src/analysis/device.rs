//! Everything `analyze` reports for one device of one snapshot.

use super::categories::{categorize, Categories, CategoryRules, Classifier, Lifetimes, Phase};
use super::layout::{layout_totals, LayoutTotals, SegmentUse};
use super::oom::{AtOom, Diagnosis};
use super::peak::{find_peak_followed, Endings, FollowReplay};
use super::pressure::Pressure;
use super::same_devices::SameDevices;
use super::sites::{top_sites, Site};
use super::trace_states::{TraceStates, TraceStatesFollower};
use crate::model::{Action, Replay, ReplayStarts, Snapshot, SnapshotFormat};
use serde::Serialize;
use std::collections::BTreeMap;

/// The trace part of a device report (docs/json/README.md).
#[derive(Clone, Debug, Serialize)]
pub struct TraceSummary {
    pub entries: usize,
    /// Highest total of live requested bytes over the trace.
    pub peak_active_bytes: u64,
    pub peak_entry_index: Option<usize>,
    pub peak_time_us: Option<i64>,
    /// Microseconds from the first entry to the peak, when the trace has times.
    pub peak_offset_us: Option<i64>,
    /// Site of the allocation that reached the peak.
    pub peak_site: Option<String>,
    /// Live requested bytes before the first entry (allocations older than the trace).
    pub before_trace_bytes: u64,
    /// The highest reserved total over the trace (`torch.cuda.max_memory_reserved()` for the
    /// window); the final reserved total when there is no trace.
    pub peak_reserved_bytes: u64,
    /// Entries per action.
    pub actions: BTreeMap<&'static str, usize>,
    /// Entries that contradict the state they apply to (free of an unknown address, ...).
    pub inconsistencies: usize,
    pub first_inconsistency: Option<String>,
}

/// The last `oom` entry of a trace, as recorded.
#[derive(Clone, Debug, Serialize)]
pub struct OomEntry {
    pub entry_index: usize,
    /// The rounded request that failed.
    pub request_bytes: u64,
    /// What the driver reported free at that moment.
    pub device_free_bytes: Option<u64>,
    pub time_us: Option<i64>,
    pub site: String,
    /// The state at this entry, replayed (filled with `diagnosis`).
    pub at_oom: Option<AtOom>,
    /// The cause and its evidence (`diagnose` without remedies); filled by the caller, which
    /// can replay the trace through the simulator.
    pub diagnosis: Option<Diagnosis>,
}

/// One device of one snapshot.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceAnalysis {
    pub device: u32,
    #[serde(flatten)]
    pub layout: LayoutTotals,
    pub trace: TraceSummary,
    pub top_sites: Vec<Site>,
    pub oom: Option<OomEntry>,
    /// Segments with at least half their bytes free, most free bytes first (at most 16).
    pub mostly_free_segments: Vec<SegmentUse>,
    pub mostly_free_segment_count: usize,
    /// OOM retries, `empty_cache()` calls, the capacity bracket and the headroom at the peak;
    /// `None` without a trace. Filled by the caller, which replays the trace.
    pub pressure: Option<Pressure>,
    /// The sites alive at the peak, more of them than `top_sites`, for comparing devices.
    #[serde(skip)]
    pub comparison_sites: Vec<Site>,
    /// Whether the blocks of the final layout carry call stacks (memory history was recorded,
    /// even where the trace was not kept).
    pub blocks_have_stacks: bool,
    /// What the live memory is at the peak, the OOM and the dump; filled by
    /// `analyze_snapshot_with_categories`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub categories: Option<Categories>,
    /// Named ranges of the trace with their peaks; filled by `analyze_snapshot_with_categories`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<Vec<Phase>>,
    /// The earlier device whose trace and segments this one's equal (its analysis is a copy).
    #[serde(skip)]
    pub twin_of: Option<u32>,
    /// Requested and reserved bytes at the entries an account speaks of.
    #[serde(skip)]
    pub trace_states: TraceStates,
    /// The allocator replay with the recorded settings, where one was made (filled by
    /// `diagnose::classify_ooms`).
    #[serde(skip)]
    pub replayed: Option<crate::sim::replay::Replayed>,
}

impl DeviceAnalysis {
    /// The block each allocation got in the allocator replay, where one was made.
    pub fn block_sizes(&self) -> Option<&crate::sim::block_sizes::BlockSizes> {
        self.replayed.as_ref().map(|r| &r.blocks)
    }
}

const MOSTLY_FREE_SHOWN: usize = 16;

/// Sites kept for comparing devices.
const COMPARISON_SITES: usize = 64;

/// Analyzes one device; `top` limits the number of sites.
pub fn analyze_device(snapshot: &Snapshot, device: u32, top: usize) -> DeviceAnalysis {
    let replay = Replay::new(
        snapshot.timeline.device(device as usize),
        snapshot.device_segments(device),
    );
    analyze_device_followed(snapshot, replay, device, top, |_| ()).0
}

/// `analyze_device`, then the categories and phases, from the same replay of the trace; with
/// the classifier that found them.
fn analyze_device_with_categories<'a>(
    starts: &ReplayStarts<'a>,
    device: u32,
    top: usize,
    rules: &CategoryRules,
) -> (DeviceAnalysis, Classifier<'a>) {
    let snapshot = starts.snapshot();
    let entries = snapshot.timeline.device(device as usize);
    let replay = starts.replay(device);
    let (mut d, lifetimes, endings) =
        analyze_device_followed(snapshot, replay, device, top, |replay| {
            Lifetimes::follow(entries, &snapshot.stacks, replay)
        });
    let (categories, phases, classifier) = categorize(
        snapshot,
        device,
        lifetimes.build(endings),
        d.trace.peak_entry_index,
        d.oom.as_ref().map(|o| o.entry_index),
        rules,
    );
    d.categories = Some(categories);
    d.phases = Some(phases);
    (d, classifier)
}

/// `analyze_device` from `replay` (of `device`'s trace, not yet stepped), with a follower of
/// it, and when each allocation ended in it.
fn analyze_device_followed<'a, F: FollowReplay<'a>>(
    snapshot: &'a Snapshot,
    replay: Replay<'a>,
    device: u32,
    top: usize,
    follow: impl FnOnce(&Replay<'a>) -> F,
) -> (DeviceAnalysis, F, Endings) {
    let segments: Vec<_> = snapshot.device_segments(device).collect();
    let mut totals = layout_totals(segments.iter().copied());
    let entries = snapshot.timeline.device(device as usize);
    let (peak, (follower, (states, tally)), endings) = find_peak_followed(replay, |replay| {
        let bursts = snapshot.format != SnapshotFormat::Recording;
        (
            follow(replay),
            (
                TraceStatesFollower::new(entries, replay, bursts),
                ActionTally::default(),
            ),
        )
    });
    let actions: BTreeMap<&'static str, usize> = Action::ALL
        .iter()
        .zip(tally.counts)
        .filter(|&(_, n)| n > 0)
        .map(|(a, n)| (a.torch_name(), n))
        .collect();
    let oom = tally
        .last_oom
        .map(|i| (i, &entries[i]))
        .map(|(i, e)| OomEntry {
            entry_index: i,
            request_bytes: e.size,
            device_free_bytes: e.device_free(),
            time_us: e.time_us(),
            site: super::sites::site_of(&snapshot.stacks, e.stack),
            at_oom: None,
            diagnosis: None,
        });
    let comparison_sites = top_sites(&snapshot.stacks, &peak.live, COMPARISON_SITES.max(top));
    let mut mostly_free_segments = std::mem::take(&mut totals.mostly_free);
    let mostly_free_segment_count = mostly_free_segments.len();
    mostly_free_segments.truncate(MOSTLY_FREE_SHOWN);
    let analysis = DeviceAnalysis {
        device,
        layout: totals,
        trace: TraceSummary {
            entries: entries.len(),
            peak_active_bytes: peak.bytes,
            peak_entry_index: peak.entry_index,
            peak_time_us: peak.entry_index.and_then(|i| entries[i].time_us()),
            peak_offset_us: peak
                .entry_index
                .and_then(|i| Some(entries[i].time_us()? - snapshot.timeline.time_origin_us()?)),
            peak_site: peak
                .entry_index
                .map(|i| super::sites::site_of(&snapshot.stacks, entries[i].stack)),
            before_trace_bytes: peak.before_trace_bytes,
            peak_reserved_bytes: peak.reserved_bytes,
            actions,
            inconsistencies: peak.issue_count,
            first_inconsistency: peak
                .first_issue
                .map(|i| format!("entry {}: {}", i.entry_index, i.message)),
        },
        // The top K are the first K of the longer list kept for comparing devices.
        top_sites: comparison_sites.iter().take(top).cloned().collect(),
        comparison_sites,
        oom,
        mostly_free_segments,
        mostly_free_segment_count,
        pressure: None,
        blocks_have_stacks: segments
            .iter()
            .any(|s| s.blocks.iter().any(|b| b.stack.is_some())),
        categories: None,
        phases: None,
        twin_of: None,
        trace_states: states.build(),
        replayed: None,
    };
    (analysis, follower, endings)
}

/// How many entries of each action a trace has, and its last `oom` entry, counted as the
/// analysis's replay passes each entry rather than in walks of their own (each walk over a
/// long trace reads all its entries from memory again).
#[derive(Default)]
struct ActionTally {
    counts: [usize; Action::ALL.len()],
    last_oom: Option<usize>,
}

impl<'a> FollowReplay<'a> for ActionTally {
    #[inline]
    fn step(&mut self, i: usize, replay: &Replay<'a>) {
        let action = replay.entries()[i].action();
        self.counts[action as usize] += 1;
        if action == Action::Oom {
            self.last_oom = Some(i);
        }
    }

    fn finish(&mut self, _: &Replay<'a>) {}
}

/// Analyzes every device that has a segment or a non-empty trace, or only `only` when given.
pub fn analyze_snapshot(snapshot: &Snapshot, top: usize, only: Option<u32>) -> Vec<DeviceAnalysis> {
    analyze_each(snapshot, only, |d| {
        (analyze_device(snapshot, d, top), None::<()>)
    })
    .0
}

/// `analyze_snapshot` with the categories and phases of each device (`rules` first), of the
/// snapshot whose replays start from `starts`; with `keep_classifiers`, also the classifier
/// of each device analysed (`None` for a twin, whose analysis is a copy), else each goes as
/// soon as its device is done.
pub fn analyze_snapshot_with_categories<'a>(
    starts: &ReplayStarts<'a>,
    top: usize,
    only: Option<u32>,
    rules: &CategoryRules,
    keep_classifiers: bool,
) -> (Vec<DeviceAnalysis>, Vec<Option<Classifier<'a>>>) {
    analyze_each(starts.snapshot(), only, |d| {
        let (analysis, classifier) = analyze_device_with_categories(starts, d, top, rules);
        (analysis, keep_classifiers.then_some(classifier))
    })
}

/// `analyze` on every device (or only `only`), once per distinct device: a twin's analysis is
/// a copy of its first twin's (and its `T` is `None`).
fn analyze_each<T>(
    snapshot: &Snapshot,
    only: Option<u32>,
    analyze: impl Fn(u32) -> (DeviceAnalysis, Option<T>),
) -> (Vec<DeviceAnalysis>, Vec<Option<T>>) {
    let devices: Vec<u32> = snapshot
        .devices()
        .into_iter()
        .filter(|d| only.is_none_or(|o| o == *d))
        .collect();
    let twins = SameDevices::find(snapshot, &devices);
    let mut done: Vec<DeviceAnalysis> = Vec::with_capacity(devices.len());
    let mut kept = Vec::with_capacity(devices.len());
    // Devices are in order and a twin comes first: its analysis is found by a search.
    for &d in &devices {
        let (analysis, keep) = match twins.twin_of(d) {
            Some(twin) => {
                let i = done.partition_point(|a| a.device < twin);
                let copy = DeviceAnalysis {
                    device: d,
                    twin_of: Some(twin),
                    ..done[i].clone()
                };
                (copy, None)
            }
            None => analyze(d),
        };
        done.push(analysis);
        kept.push(keep);
    }
    (done, kept)
}
