//! Inputs whose size is in a dimension that once made memprof quadratic: 300k device trace
//! lists in a 600 KB pickle (every device has one OOM entry), read, analyzed and diagnosed as
//! `analyze` and `diagnose` do. The time is measured by `benches/snapshot_parse.rs`
//! (`many_device_lists`); here the results are checked.

use memprof::analysis::analyze_snapshot;
use memprof::analysis::version::VersionRange;
use memprof::diagnose::remedies::Recorded;
use memprof::diagnose::{classify_ooms, diagnose_device, Depth, Origin};
use memprof::sim::replay::{self, DeviceTrace};
use memprof::source::torch_snapshot;

use crate::scale_input::shared_oom_lists;

const LISTS: usize = 300_000;
const REQUEST: u64 = 1 << 30;

#[test]
fn three_hundred_thousand_device_lists_are_analyzed_and_diagnosed_device_by_device() {
    let bytes = shared_oom_lists(LISTS, REQUEST).expect("a pickle in memory");
    assert!(bytes.len() < 2 << 20, "a small file: {} bytes", bytes.len());
    let parsed = torch_snapshot::read(&bytes[..]).expect("readable");
    let snapshot = &parsed.snapshot;
    assert_eq!(snapshot.devices(), (0..LISTS as u32).collect::<Vec<_>>());

    // What `analyze` does: every device analyzed, its OOM classified by a replay.
    let devices = analyze_snapshot(snapshot, 10, None);
    let devices = classify_ooms(snapshot, Origin::TorchSnapshot, devices);
    assert_eq!(devices.len(), LISTS);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d.device, i as u32);
        assert_eq!(d.trace.entries, 1);
        assert_eq!(d.trace.peak_active_bytes, 0);
        let oom = d.oom.as_ref().expect("every device has its OOM");
        assert_eq!((oom.entry_index, oom.request_bytes), (0, REQUEST));
        assert_eq!(oom.device_free_bytes, Some(0));
        let diagnosis = oom.diagnosis.as_ref().expect("classified");
        assert_eq!(
            (diagnosis.device, diagnosis.request_bytes),
            (i as u32, REQUEST)
        );
        assert_eq!(diagnosis.reserved_bytes, 0);
    }

    // What `diagnose` does per device: a replay, the diagnosis with its remedies (on every
    // 300th device: the remedies' replays make this the slow part in a debug build).
    let (config, _) = replay::recorded_config(snapshot);
    let recorded = Recorded {
        config: &config,
        conf: snapshot.alloc_conf(),
        version: VersionRange::default(),
    };
    let traces = DeviceTrace::all(snapshot);
    assert_eq!(traces.len(), LISTS);
    for trace in traces.iter().step_by(300) {
        let prepared = replay::prepare(trace, &config, None);
        let d = diagnose_device(snapshot, &prepared, &recorded, None, Depth::WithRemedies)
            .expect("a diagnosis for each OOM");
        assert_eq!((d.device, d.request_bytes), (trace.device, REQUEST));
        assert!(!d.remedies.is_empty(), "device {}", trace.device);
    }
}
