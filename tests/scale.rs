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

/// The commands a user runs on such a file: the text says each group of devices alike once, the
/// JSON keeps every device in full.
#[test]
fn devices_alike_are_one_line_of_text_and_every_device_in_json() {
    const DEVICES: usize = 1000;
    let scratch = crate::util::Scratch::new("scale-twins");
    let path = scratch.join("twins.pickle");
    let bytes = shared_oom_lists(DEVICES, REQUEST).expect("a pickle in memory");
    std::fs::write(&path, bytes).expect("written");
    let file = path.to_str().expect("a UTF-8 path");
    let said = "devices 1 to 999: the same trace and segments as device 0, so the same";
    for command in ["analyze", "diagnose"] {
        let out = crate::util::memprof(&[command, file]);
        let text = crate::util::stdout(&out);
        assert!(text.contains(said), "{command}:\n{text}");
        assert_eq!(
            text.matches("OUT OF MEMORY").count(),
            1,
            "{command}:\n{text}"
        );
        assert!(text.lines().count() < 40, "{command}:\n{text}");
    }
    let doc = crate::util::analyze_json(std::slice::from_ref(&path));
    let devices = crate::util::devices(&doc);
    assert_eq!(devices.len(), DEVICES);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["device"], i);
        assert_eq!(d["oom"]["diagnosis"]["device"], i);
        assert_eq!(d["oom"]["diagnosis"]["cause"], "oversized_request");
    }
    let out = crate::util::memprof(&["diagnose", "--json", file]);
    let doc: serde_json::Value = serde_json::from_str(&crate::util::stdout(&out)).expect("JSON");
    let diagnoses = doc["diagnoses"].as_array().expect("diagnoses");
    assert_eq!(diagnoses.len(), DEVICES);
    assert!(diagnoses.iter().enumerate().all(|(i, d)| d["device"] == i));
}

/// 16,000 `oom` entries in one trace (a 576 KB file): `diagnose` and `simulate --sweep` replay
/// every one of them under each setting they try. Each release at an OOM once visited every
/// block cached so far, which made them quadratic; the results are checked here, the time by
/// `benches/` and by this test finishing.
#[test]
fn sixteen_thousand_ooms_in_one_trace_are_diagnosed_and_swept() {
    const OOMS: usize = 16_000;
    let dir = crate::util::Scratch::new("many_ooms");
    let file = dir.join("ooms.pickle");
    std::fs::write(
        &file,
        crate::scale_input::many_ooms(OOMS, REQUEST).expect("written"),
    )
    .expect("written");
    let path = file.to_str().expect("a UTF-8 path");

    let out = crate::util::memprof(&["diagnose", "--json", path]);
    assert!(
        out.status.code() == Some(1) || out.status.success(),
        "{}",
        crate::util::stderr(&out)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let diagnoses = doc["diagnoses"].as_array().expect("diagnoses");
    assert_eq!(diagnoses.len(), 1, "{doc}");
    let last = REQUEST + 512 * (OOMS as u64 - 1);
    assert_eq!(diagnoses[0]["entry_index"], OOMS - 1);
    assert_eq!(diagnoses[0]["request_bytes"], last);
    assert_eq!(diagnoses[0]["cause"], "oversized_request");
    assert!(!diagnoses[0]["tried"].as_array().expect("tried").is_empty());

    let out = crate::util::memprof(&["simulate", "--sweep", "--json", path]);
    assert!(out.status.success(), "{}", crate::util::stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let runs = doc["runs"].as_array().expect("runs");
    assert!(runs.len() > 1, "the sweep ran settings: {doc}");
    for run in runs {
        let device = &run["devices"][0];
        assert_eq!(device["replayed_requests"], OOMS, "{}", run["alloc_conf"]);
        assert_eq!(device["oom"]["entry_index"], 0, "{}", run["alloc_conf"]);
        assert_eq!(
            device["oom"]["request_bytes"], REQUEST,
            "{}",
            run["alloc_conf"]
        );
    }
}
