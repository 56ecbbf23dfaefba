//! `analyze --json` on every committed snapshot fixture against the values
//! `fixtures/gen/expected_stats.py` computed in Python from the same file (an independent
//! implementation of the definitions in `design/CLI.md`).

use crate::util::{analyze_json, assert_devices_match, devices, fixture};
use serde_json::Value;

fn check(name: &str) {
    let pickle = fixture(&format!("snapshots/{name}.pickle"));
    let expected: Value = serde_json::from_slice(
        &std::fs::read(fixture(&format!("snapshots/{name}.expected.json"))).expect("expected file"),
    )
    .expect("expected JSON");
    let doc = analyze_json(&[pickle]);
    let want = expected["devices"].as_array().expect("expected devices");
    assert_devices_match(name, devices(&doc), want);
}

macro_rules! fixture_tests {
    ($($name:ident),*) => {$(
        #[test]
        fn $name() {
            check(stringify!($name));
        }
    )*};
}

fixture_tests!(
    v2_0_history,
    v2_1_basic,
    expandable,
    oom,
    multi_device,
    private_pool,
    pending_free,
    v2_11_full,
    segments_only,
    protocol2,
    protocol5,
    demo_oom
);

#[test]
fn every_fixture_has_a_test() {
    let mut on_disk: Vec<String> = std::fs::read_dir(fixture("snapshots"))
        .expect("fixtures dir")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".pickle")
                .map(str::to_string)
        })
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = crate::util::FIXTURES
        .iter()
        .map(|s| s.to_string())
        .collect();
    listed.sort();
    assert_eq!(on_disk, listed);
}

#[test]
fn formats_are_recognised() {
    let format = |name: &str| {
        let doc = analyze_json(&[fixture(&format!("snapshots/{name}.pickle"))]);
        doc["inputs"][0]["format"].as_str().map(str::to_string)
    };
    assert_eq!(format("v2_0_history").as_deref(), Some("history"));
    assert_eq!(format("v2_1_basic").as_deref(), Some("modern"));
    assert_eq!(format("segments_only").as_deref(), Some("segments_only"));
}

#[test]
fn oom_entry_is_reported_with_device_free() {
    let doc = analyze_json(&[fixture("snapshots/oom.pickle")]);
    let oom = &devices(&doc)[0]["oom"];
    assert!(oom.is_object(), "oom reported: {oom}");
    assert!(oom["request_bytes"].as_u64().is_some_and(|b| b > 0));
    assert!(oom["device_free_bytes"].as_u64().is_some());
    let clean = analyze_json(&[fixture("snapshots/v2_1_basic.pickle")]);
    assert!(devices(&clean)[0]["oom"].is_null());
}

#[test]
fn device_filter_and_top_limit() {
    let path = fixture("snapshots/multi_device.pickle")
        .display()
        .to_string();
    let out = crate::util::memprof(&["analyze", "--json", "--device", "2", "--top", "1", &path]);
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    let devs = devices(&doc);
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0]["device"], 2);
    assert!(devs[0]["top_sites"]
        .as_array()
        .is_some_and(|s| s.len() <= 1));
    let missing = crate::util::memprof(&["analyze", "--device", "1", &path]);
    assert_eq!(
        missing.status.code(),
        Some(2),
        "device 1 has no segments and no trace"
    );
}
