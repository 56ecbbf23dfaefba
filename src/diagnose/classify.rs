//! The cause of each device's OOM and its allocator pressure, for `analyze` and `view`: the
//! classification alone (one replay with the recorded settings per device whose trace has an
//! `oom` entry or releases, no remedy replays), from the simulator for a snapshot and from the
//! driver calls for a recording.

use super::remedies::Recorded;
use super::{diagnose_device, diagnose_recording_device, pressure, Depth};
use crate::analysis::oom::Diagnosis;
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
        capacity_max_from: None,
        capacity_source: "unknown",
        retry_before_oom: None,
        oom_entry_index: None,
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
    let recorded = Recorded {
        config: &config,
        conf: snapshot.alloc_conf(),
        version: VersionRange::default(),
    };
    let ids: Vec<u32> = devices.iter().map(|d| d.device).collect();
    // A twin (`analysis::same_devices`, found by the analysis) comes earlier in `ids`, so its
    // classification is done when a device needs it.
    let index: FxHashMap<u32, usize> = ids.iter().enumerate().map(|(i, &d)| (d, i)).collect();
    for (i, &device) in ids.iter().enumerate() {
        let twin = devices[i].twin_of.and_then(|t| index.get(&t).copied());
        if let Some(first) = twin {
            let pressure = devices[first].pressure.clone();
            let from = devices[first].oom.as_ref();
            let at_oom = from.and_then(|o| o.at_oom);
            let diagnosis = from.and_then(|o| o.diagnosis.clone());
            let d = &mut devices[i];
            d.pressure = pressure;
            if let Some(oom) = d.oom.as_mut() {
                oom.at_oom = at_oom;
                oom.diagnosis = diagnosis.map(|g| Diagnosis { device, ..g });
            }
            continue;
        }
        let trace = DeviceTrace::of(snapshot, device);
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
        d.pressure = Some(pressure(snapshot, &prepared, None));
        if let Some(oom) = d.oom.as_mut() {
            oom.diagnosis = diagnose_device(snapshot, &prepared, &recorded, None, Depth::Classify);
            oom.at_oom = oom.diagnosis.as_ref().map(|g| g.at_oom);
        }
    }
    devices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{analyze_device, oom::Cause};
    use crate::report::export::pickle::PickleWriter;
    use crate::source::torch_snapshot;
    use std::io;
    use std::time::{Duration, Instant};

    const LISTS: usize = 300_000;
    /// Every `OWN`th device has a list of its own; the others share one list object.
    const OWN: usize = 100;
    const ADDR: i128 = 0x7f00_0000_0000;

    /// A trace entry; an `oom` one says the device had nothing free.
    fn entry(
        w: &mut PickleWriter<Vec<u8>>,
        action: &str,
        size: i128,
        stream: i128,
    ) -> io::Result<()> {
        let oom = action == "oom";
        w.begin_dict(4 + usize::from(oom))?;
        w.key("action")?;
        w.str(action)?;
        w.key("addr")?;
        w.int(ADDR)?;
        w.key("size")?;
        w.int(size)?;
        w.key("stream")?;
        w.int(stream)?;
        if oom {
            w.key("device_free")?;
            w.int(0)?;
        }
        w.end()
    }

    /// A snapshot of `LISTS` device trace lists, as a 200 KB pickle of 100k lists that made
    /// `analyze` take 21 s was: most lists are one list object (a memo reference each time),
    /// holding one allocation. Every `OWN`th device has its own list, stream and segment, and
    /// the last device's list ends with an OOM.
    fn many_devices() -> io::Result<Vec<u8>> {
        let mut w = PickleWriter::new(Vec::new())?;
        w.begin_dict(2)?;
        w.key("segments")?;
        w.begin_list(LISTS / OWN)?;
        for d in (0..LISTS).step_by(OWN) {
            w.item()?;
            w.begin_dict(6)?;
            w.key("device")?;
            w.int(d as i128)?;
            w.key("address")?;
            w.int(ADDR)?;
            w.key("total_size")?;
            w.int(2 << 20)?;
            w.key("stream")?;
            w.int(d as i128 + 1)?;
            w.key("segment_type")?;
            w.str("small")?;
            w.key("blocks")?;
            w.begin_list(1)?;
            w.item()?;
            w.begin_dict(4)?;
            w.key("address")?;
            w.int(ADDR)?;
            w.key("size")?;
            w.int(512)?;
            w.key("requested_size")?;
            w.int(512)?;
            w.key("state")?;
            w.str("active_allocated")?;
            w.end()?;
            w.end()?;
            w.end()?;
        }
        w.end()?;
        w.key("device_traces")?;
        w.begin_list(LISTS)?;
        let mut shared = None;
        for d in 0..LISTS {
            w.item()?;
            match shared {
                Some(index) if d % OWN != 0 && d != LISTS - 1 => w.get(index)?,
                _ => {
                    let last = d == LISTS - 1;
                    let index = w.begin_list(1 + usize::from(last))?;
                    w.item()?;
                    entry(&mut w, "alloc", 512, d as i128 + 1)?;
                    if last {
                        w.item()?;
                        entry(&mut w, "oom", 1 << 40, 0)?;
                    }
                    w.end()?;
                    if d == 1 {
                        shared = Some(index);
                    }
                }
            }
        }
        w.end()?;
        w.end()?;
        w.finish()
    }

    /// 300k device trace lists: reading and classifying stays linear in the number of lists
    /// (it was quadratic in the device lookup, the runs of each list, the segments of each
    /// device, and the stream table copied per device). The bound is far above the linear time
    /// in a debug build and far below the quadratic one.
    #[test]
    fn three_hundred_thousand_device_lists_are_classified_in_linear_time() {
        let bytes = many_devices().expect("pickles");
        let (done, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let start = Instant::now();
            let snapshot = torch_snapshot::read(&bytes[..]).expect("reads").snapshot;
            // Devices that share the list have the same analysis: one is made, and copied
            // (analyzing each is linear too, but slow in a debug build).
            let shared = analyze_device(&snapshot, 1, 1);
            let analyses = snapshot
                .devices()
                .into_iter()
                .map(|d| match d as usize {
                    d if d % OWN != 0 && d != LISTS - 1 => DeviceAnalysis {
                        device: d as u32,
                        ..shared.clone()
                    },
                    d => analyze_device(&snapshot, d as u32, 1),
                })
                .collect();
            let classified = classify_ooms(&snapshot, Origin::TorchSnapshot, analyses);
            // The receiver is gone only when the test already failed.
            let _ = done.send((snapshot, classified, start.elapsed()));
        });
        let (snapshot, devices, took) = got
            .recv_timeout(Duration::from_secs(30))
            .expect("300k device lists are read and classified within 30 s");
        eprintln!("300k device lists: read and classified in {took:?}");
        assert_eq!(snapshot.timeline.device_count(), LISTS);
        // Stream 0, one per own list and the last device's, and the shared list's.
        assert_eq!(snapshot.timeline.streams().len(), LISTS / OWN + 3);
        assert_eq!(devices.len(), LISTS);
        assert!(devices
            .iter()
            .enumerate()
            .all(|(i, d)| d.device == i as u32));
        for d in [0, 1, 2, 100, 101, LISTS - 2, LISTS - 1] {
            let entries = snapshot.timeline.device(d);
            assert_eq!(entries.len(), 1 + usize::from(d == LISTS - 1), "device {d}");
            let own = d % OWN == 0 || d == LISTS - 1;
            let stream = if own { d as u64 + 1 } else { 2 };
            assert_eq!(
                snapshot.timeline.stream(entries[0].stream),
                stream,
                "device {d}"
            );
            assert_eq!(
                devices[d].layout.segments,
                usize::from(d % OWN == 0),
                "device {d}"
            );
        }
        let with_oom: Vec<&DeviceAnalysis> = devices.iter().filter(|d| d.oom.is_some()).collect();
        assert_eq!(with_oom.len(), 1);
        assert_eq!(with_oom[0].device, LISTS as u32 - 1);
        let diagnosis = with_oom[0]
            .oom
            .as_ref()
            .and_then(|o| o.diagnosis.as_ref())
            .expect("the last device's OOM is classified");
        assert_eq!(diagnosis.request_bytes, 1 << 40);
        assert_eq!(diagnosis.cause, Cause::OversizedRequest);
    }
}
