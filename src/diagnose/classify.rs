//! The cause of each device's OOM and its allocator pressure, for `analyze` and `view`: the
//! classification alone (one replay with the recorded settings per device whose trace has an
//! `oom` entry or releases, no remedy replays), from the simulator for a snapshot and from the
//! driver calls for a recording.

use super::remedies::Recorded;
use super::{diagnose_device, diagnose_recording_device, pressure, Depth};
use crate::analysis::pressure::Pressure;
use crate::analysis::version::VersionRange;
use crate::analysis::DeviceAnalysis;
use crate::model::{Action, Snapshot};
use crate::sim::replay::{self, DeviceTrace};
use crate::sim::Backend;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Where the snapshot came from, for the diagnosis.
#[derive(Clone, Copy, Debug)]
pub enum Origin<'a> {
    /// A PyTorch snapshot: its trace is replayed through the simulator.
    TorchSnapshot,
    /// A memprof recording, with each device's total memory where `cuMemGetInfo` told it.
    Recording {
        device_totals: &'a BTreeMap<u32, u64>,
    },
}

/// Pressure of a trace without releases or `oom` entries: nothing hit the limit, and
/// nothing bounds the capacity.
fn quiet(peak_reserved_bytes: u64) -> Pressure {
    Pressure {
        oom_retries: 0,
        empty_cache_bursts: 0,
        capacity_bytes_min: None,
        capacity_bytes_max: None,
        capacity_source: "unknown",
        headroom_at_peak_bytes: None,
        peak_reserved_bytes,
        retries: Vec::new(),
        empty_cache_sites: Vec::new(),
    }
}

/// Fills `oom.diagnosis`, `oom.at_oom` and `pressure` of every device.
pub fn classify_ooms(
    snapshot: &Snapshot,
    origin: Origin<'_>,
    mut devices: Vec<DeviceAnalysis>,
) -> Vec<DeviceAnalysis> {
    if let Origin::Recording { device_totals } = origin {
        for d in &mut devices {
            if let Some(oom) = d.oom.as_mut() {
                let total = device_totals.get(&d.device).copied();
                oom.diagnosis = diagnose_recording_device(snapshot, d.device, total, false);
                oom.at_oom = oom.diagnosis.as_ref().map(|g| g.at_oom);
            }
        }
        return devices;
    }
    let (config, _) = replay::recorded_config(snapshot);
    // The asynchronous allocator (cudaMallocAsync) is not modelled.
    if config.backend == Backend::CudaMallocAsync {
        return devices;
    }
    let conf = snapshot
        .settings
        .as_ref()
        .and_then(|s| s.alloc_conf.as_deref())
        .unwrap_or("");
    let recorded = Recorded {
        config: &config,
        conf,
        version: VersionRange::default(),
    };
    let by_device: FxHashMap<u32, usize> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| (d.device, i))
        .collect();
    for trace in DeviceTrace::all(snapshot) {
        let Some(&i) = by_device.get(&trace.device) else {
            continue;
        };
        let d = &mut devices[i];
        if trace.entries.is_empty() {
            continue;
        }
        let replayed = trace.entries.iter().any(|e| {
            matches!(
                e.action,
                Action::Oom | Action::SegmentFree | Action::SegmentUnmap
            )
        });
        if !replayed {
            d.pressure = Some(quiet(d.trace.peak_reserved_bytes));
            continue;
        }
        let prepared = replay::prepare(&trace, &config, None);
        d.pressure = Some(pressure(snapshot, &prepared));
        if let Some(oom) = d.oom.as_mut() {
            oom.diagnosis = diagnose_device(snapshot, &prepared, &recorded, None, Depth::Classify);
            oom.at_oom = oom.diagnosis.as_ref().map(|g| g.at_oom);
        }
    }
    devices
}
