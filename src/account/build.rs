//! Builds the account of an input: the analysis's replay of each device's trace, and the
//! allocator replays with the anomalies' walk of each trace, run side by side (two cores), then
//! each device's account from both.

use super::anomalies::{trace_pass, TracePass};
use super::{account_of, DeviceAccount, DeviceInput, MomentKind, TimeAxis};
use crate::analysis::categories::{CategoryRules, Classifier};
use crate::analysis::{analyze_snapshot_with_categories, DeviceAnalysis};
use crate::diagnose::classify::{attach, replay_devices};
use crate::diagnose::Origin;
use crate::model::{ReplayStarts, Snapshot};
use crate::sim::replay::Prepared;
use serde::Serialize;
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

/// What an account is built with.
pub struct Options<'a> {
    /// How many allocation sites each device lists.
    pub top: usize,
    /// Only this device, when given.
    pub only: Option<u32>,
    pub rules: &'a CategoryRules,
    pub origin: Origin<'a>,
    /// The device's total memory, when the user gave it (`diagnose --capacity`).
    pub capacity: Option<u64>,
    /// Keep the allocator replay of each device that ran out of memory or stalled on its
    /// cache (`InputAccount::replays`), for remedies replayed from it (`diagnose`).
    pub keep_replays: bool,
}

impl<'a> Options<'a> {
    /// Every device, without a capacity given or replays kept: what every command but
    /// `diagnose` builds (set the other fields with `..Options::new(..)`).
    pub fn new(top: usize, rules: &'a CategoryRules, origin: Origin<'a>) -> Options<'a> {
        Options {
            top,
            only: None,
            rules,
            origin,
            capacity: None,
            keep_replays: false,
        }
    }
}

/// One device: its analysis (the figures the JSON reference has always had) and its account.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceReport {
    #[serde(flatten)]
    pub analysis: DeviceAnalysis,
    #[serde(flatten)]
    pub account: DeviceAccount,
}

impl Deref for DeviceReport {
    type Target = DeviceAnalysis;
    fn deref(&self) -> &DeviceAnalysis {
        &self.analysis
    }
}

impl DerefMut for DeviceReport {
    fn deref_mut(&mut self) -> &mut DeviceAnalysis {
        &mut self.analysis
    }
}

/// The account of one input.
#[derive(Clone, Debug)]
pub struct InputAccount {
    pub axis: TimeAxis,
    pub devices: Vec<DeviceReport>,
    /// The allocator replays kept by `Options::keep_replays`, by device.
    pub replays: BTreeMap<u32, Prepared>,
}

/// Builds the account of `snapshot`'s devices.
pub fn build(snapshot: &Snapshot, options: &Options<'_>) -> InputAccount {
    build_with(snapshot, options, false).0
}

/// `build`, keeping the classifier that sorted each device's allocations into categories
/// (`None` for a device whose analysis is a copy of its twin's), in the order of the
/// account's devices: `view` classifies the allocations at its cursor with them.
pub fn build_keeping_classifiers<'a>(
    snapshot: &'a Snapshot,
    options: &Options<'_>,
) -> (InputAccount, Vec<Option<Classifier<'a>>>) {
    build_with(snapshot, options, true)
}

fn build_with<'a>(
    snapshot: &'a Snapshot,
    options: &Options<'_>,
    keep_classifiers: bool,
) -> (InputAccount, Vec<Option<Classifier<'a>>>) {
    let ids: Vec<u32> = snapshot
        .devices()
        .into_iter()
        .filter(|d| options.only.is_none_or(|o| o == *d))
        .collect();
    // Every replay of a device's trace starts from the state worked out once.
    let starts = ReplayStarts::new(snapshot);
    // The second thread replays the allocator and walks each trace for its anomalies, which
    // need nothing from the analysis.
    let ((analyses, classifiers), (replays, mut walked)) = std::thread::scope(|scope| {
        let second = scope.spawn(|| {
            let replays = replay_devices(
                &starts,
                options.origin,
                &ids,
                options.capacity,
                options.keep_replays,
            );
            let walked: BTreeMap<u32, TracePass> = ids
                .iter()
                .map(|&d| {
                    let entries = snapshot.timeline.device(d as usize);
                    (d, trace_pass(entries, &snapshot.timeline, &snapshot.stacks))
                })
                .collect();
            (replays, walked)
        });
        let analyses = analyze_snapshot_with_categories(
            &starts,
            options.top,
            options.only,
            options.rules,
            keep_classifiers,
        );
        // A panic there is a bug: raise it here, as if it had run on this thread.
        let second = second
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (analyses, second)
    });
    let mut replays = replays;
    let kept: BTreeMap<u32, Prepared> = replays
        .iter_mut()
        .filter_map(|r| Some((r.device, r.prepared.take()?)))
        .collect();
    let analyses = attach(analyses, replays);
    let axis = TimeAxis::of(snapshot);
    let mut devices: Vec<DeviceReport> = analyses
        .into_iter()
        .map(|mut analysis| {
            let segments: Vec<_> = snapshot.device_segments(analysis.device).collect();
            let entries = snapshot.timeline.device(analysis.device as usize);
            let trace = walked
                .remove(&analysis.device)
                .unwrap_or_else(|| trace_pass(entries, &snapshot.timeline, &snapshot.stacks));
            let account = account_of(
                &DeviceInput {
                    analysis: &analysis,
                    segments: &segments,
                    entries,
                    snapshot,
                    axis,
                },
                trace,
            );
            // The categories at the peak and the OOM in block bytes, where the account knows
            // the allocated bytes there.
            let peak = account.moment(MomentKind::PeakRequested);
            let oom = analysis.oom.as_ref().map(|o| o.entry_index);
            let blocks = analysis.replayed.as_ref().map(|r| &r.blocks);
            if let Some(c) = analysis.categories.as_mut() {
                c.add_allocated(
                    blocks,
                    peak.and_then(|m| account.figures_of(m).allocated_bytes),
                    oom.and_then(|i| account.figures_at(Some(i))?.allocated_bytes),
                );
            }
            DeviceReport { analysis, account }
        })
        .collect();
    super::ranks::add_imbalance(&starts, axis, &mut devices);
    let account = InputAccount {
        axis,
        devices,
        replays: kept,
    };
    (account, classifiers)
}
