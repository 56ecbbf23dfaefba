//! The cause of each device's OOM and its allocator pressure, for `analyze` and `view`: the
//! classification alone (one replay with the recorded settings per device whose trace has an
//! `oom` entry or releases, no remedy replays), from the simulator for a snapshot and from the
//! driver calls for a recording.

use super::remedies::Recorded;
use super::{diagnose_device, diagnose_recording_device, pressure, Depth};
use crate::analysis::oom::Diagnosis;
use crate::analysis::pressure::Pressure;
use crate::analysis::same_devices::SameDevices;
use crate::analysis::version::VersionRange;
use crate::analysis::DeviceAnalysis;
use crate::model::{Action, ReplayStarts, Snapshot};
use crate::sim::replay::{self, DeviceTrace, Prepared, Replayed};
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

/// The pressure of a trace without releases or `oom` entries, not replayed: nothing hit the
/// limit, and only a capacity given bounds it. `attach` puts in the trace's peak of reserved
/// memory and the headroom it leaves.
fn quiet(capacity: Option<u64>) -> Pressure {
    Pressure {
        oom_retries: 0,
        empty_cache_bursts: 0,
        capacity_bytes_min: capacity,
        capacity_bytes_max: capacity,
        capacity_max_from: None,
        capacity_source: if capacity.is_some() {
            "given"
        } else {
            "unknown"
        },
        retry_before_oom: None,
        oom_entry_index: None,
        headroom_at_peak_bytes: None,
        peak_reserved_bytes: 0,
        retries: Vec::new(),
        empty_cache_sites: Vec::new(),
    }
}

/// A trace without releases or `oom` entries longer than this is not replayed through the
/// allocator model by `analyze` (its allocated peak is then not known; `memprof simulate`
/// replays it). The default `_record_memory_history(max_entries=100_000)` keeps traces well
/// below it.
pub const QUIET_REPLAY_MAX_ENTRIES: usize = 500_000;

/// What the allocator replay of one device found: its pressure, the model's figures at the
/// account's moments, and the cause of its OOM (without remedies).
#[derive(Clone, Debug, Default)]
pub struct DeviceReplay {
    pub device: u32,
    pub pressure: Option<Pressure>,
    pub replayed: Option<Replayed>,
    pub diagnosis: Option<Diagnosis>,
    /// The replay itself, kept when the caller asked (`diagnose`, whose remedies replay from
    /// it) for a device that ran out of memory or stalled on its cache; never for a twin.
    pub prepared: Option<Prepared>,
}

/// Fills `oom.diagnosis`, `oom.at_oom`, `pressure` and `replayed` of every device.
pub fn classify_ooms(
    snapshot: &Snapshot,
    origin: Origin<'_>,
    devices: Vec<DeviceAnalysis>,
) -> Vec<DeviceAnalysis> {
    let ids: Vec<u32> = devices.iter().map(|d| d.device).collect();
    let replays = replay_devices(&ReplayStarts::new(snapshot), origin, &ids, None, false);
    attach(devices, replays)
}

/// Puts each device's replay (`replay_devices`, in the same device order) into its analysis.
pub fn attach(mut devices: Vec<DeviceAnalysis>, replays: Vec<DeviceReplay>) -> Vec<DeviceAnalysis> {
    for (d, r) in devices.iter_mut().zip(replays) {
        debug_assert_eq!(d.device, r.device);
        if let Some(mut p) = r.pressure {
            if r.replayed.is_none() && d.oom.is_none() {
                // Not replayed (`quiet`): the trace's own peak of reserved memory.
                p.peak_reserved_bytes = d.trace.peak_reserved_bytes;
                p.headroom_at_peak_bytes = p
                    .capacity_bytes_max
                    .map(|c| c.saturating_sub(p.peak_reserved_bytes));
            }
            d.pressure = Some(p);
        }
        d.replayed = r.replayed;
        if let Some(oom) = d.oom.as_mut() {
            oom.at_oom = r.diagnosis.as_ref().map(|g| g.at_oom);
            oom.diagnosis = r.diagnosis;
        }
    }
    devices
}

/// Replays each of `devices` (in order) through the allocator model with the recorded
/// settings, once per distinct device (a twin's replay is a copy of its first twin's): a
/// snapshot's every traced device, a recording's devices with a failed allocation (the driver
/// calls alone, no model) of the snapshot whose replays start from `starts`. Reads the
/// snapshot only, so it can run beside the analysis. `capacity` is the device's total memory
/// when the user gave it (it bounds the capacity bracket); `keep` keeps the replays of the
/// devices that ran out of memory or stalled.
pub fn replay_devices(
    starts: &ReplayStarts<'_>,
    origin: Origin<'_>,
    devices: &[u32],
    capacity: Option<u64>,
    keep: bool,
) -> Vec<DeviceReplay> {
    let snapshot = starts.snapshot();
    let has_oom = |device: u32| {
        snapshot
            .timeline
            .device(device as usize)
            .iter()
            .any(|e| e.action() == Action::Oom)
    };
    let blank = |device| DeviceReplay {
        device,
        ..DeviceReplay::default()
    };
    if let Origin::Recording { device_totals } = origin {
        return devices
            .iter()
            .map(|&device| DeviceReplay {
                diagnosis: has_oom(device)
                    .then(|| {
                        let total = device_totals.get(&device).copied();
                        diagnose_recording_device(starts, device, total, false)
                    })
                    .flatten(),
                ..blank(device)
            })
            .collect();
    }
    let (config, _) = replay::recorded_config(snapshot);
    // The asynchronous allocator (cudaMallocAsync) is not modelled.
    if config.backend == Backend::CudaMallocAsync {
        return devices.iter().map(|&d| blank(d)).collect();
    }
    let recorded = Recorded {
        config: &config,
        conf: snapshot.alloc_conf(),
        version: VersionRange::default(),
    };
    let twins = SameDevices::find(snapshot, devices);
    // A twin comes earlier in `devices`, so its replay is done when a device needs it.
    let index: FxHashMap<u32, usize> = devices.iter().enumerate().map(|(i, &d)| (d, i)).collect();
    let mut done: Vec<DeviceReplay> = Vec::with_capacity(devices.len());
    for &device in devices {
        if let Some(&first) = twins.twin_of(device).and_then(|t| index.get(&t)) {
            let copy = &done[first];
            done.push(DeviceReplay {
                device,
                pressure: copy.pressure.clone(),
                replayed: copy.replayed.clone(),
                diagnosis: copy.diagnosis.clone().map(|g| Diagnosis { device, ..g }),
                prepared: None,
            });
            continue;
        }
        let trace = DeviceTrace::of(snapshot, device);
        if trace.entries.is_empty() {
            done.push(blank(device));
            continue;
        }
        let releases = trace.entries.iter().any(|e| {
            matches!(
                e.action(),
                Action::Oom | Action::SegmentFree | Action::SegmentUnmap
            )
        });
        if !releases && trace.entries.len() > QUIET_REPLAY_MAX_ENTRIES {
            // Nothing hit the limit; only the block sizes (the allocated peak) would come of a
            // replay, which would double the time of `analyze` on such a trace.
            done.push(DeviceReplay {
                pressure: Some(quiet(capacity)),
                ..blank(device)
            });
            continue;
        }
        let prepared = replay::prepare(&trace, &config, None);
        let diagnosis = if has_oom(device) {
            diagnose_device(snapshot, &prepared, &recorded, None, Depth::Classify)
        } else {
            None
        };
        let pressure = pressure(snapshot, &prepared, capacity);
        let stalled = pressure.oom_retries > 0 || pressure.empty_cache_bursts > 0;
        let replayed = Some(Replayed::of(&prepared));
        done.push(DeviceReplay {
            device,
            pressure: Some(pressure),
            replayed,
            diagnosis,
            prepared: (keep && (has_oom(device) || stalled)).then_some(prepared),
        });
    }
    done
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
