//! The cause of each device's OOM for `analyze` and `view`: the classification alone (one
//! replay with the recorded settings per device with an `oom` entry, no remedy replays), from
//! the simulator for a snapshot and from the driver calls for a recording.

use super::{diagnose_device, diagnose_recording_device, Depth};
use crate::analysis::DeviceAnalysis;
use crate::model::Snapshot;
use crate::sim::replay::{self, DeviceTrace};
use crate::sim::Backend;
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

/// Fills `oom.diagnosis` of every device that has an OOM entry.
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
            }
        }
        return devices;
    }
    let (recorded, _) = replay::recorded_config(snapshot);
    // The asynchronous allocator (cudaMallocAsync) is not modelled.
    if recorded.backend == Backend::CudaMallocAsync {
        return devices;
    }
    for trace in DeviceTrace::all(snapshot) {
        let Some(oom) = devices
            .iter_mut()
            .find(|d| d.device == trace.device)
            .and_then(|d| d.oom.as_mut())
        else {
            continue;
        };
        let prepared = replay::prepare(&trace, &recorded, None);
        oom.diagnosis = diagnose_device(snapshot, &prepared, &recorded, None, Depth::Classify);
    }
    devices
}
