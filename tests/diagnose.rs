//! `memprof diagnose`: the cause of each OOM fixture (snapshots and one log per PyTorch message
//! format), remedies replayed through the simulator, and the exit codes 0 / 1 / 2.

use crate::util::{fixture, memprof, stderr, stdout, Scratch, Within};
use serde_json::Value;

fn diagnose_json(args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["diagnose", "--json"];
    all.extend_from_slice(args);
    let out = memprof(&all);
    let doc = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
    (out.status.code(), doc)
}

fn one_diagnosis(args: &[&str]) -> Value {
    let (code, doc) = diagnose_json(args);
    assert_eq!(code, Some(0), "{args:?}");
    assert_eq!(doc["schema_version"], 1);
    let all = doc["diagnoses"].as_array().expect("diagnoses");
    assert_eq!(all.len(), 1, "{args:?}");
    all[0].clone()
}

fn path(rel: &str) -> String {
    fixture(rel).display().to_string()
}

#[test]
fn diagnose_demo_oom_is_fragmentation_and_expandable_segments_fixes_it() {
    let file = path("snapshots/demo_oom.pickle");
    let d = one_diagnosis(&[&file, "--capacity", "25386352640"]);
    assert_eq!(d["cause"], "fragmentation");
    assert_eq!(d["entry_index"], 1648);
    assert_eq!(d["request_bytes"], 4330947584u64);
    assert_eq!(d["largest_free_block_bytes"], 2573991936u64);
    assert_eq!(d["device_free_bytes"], 4160028672u64);
    let evidence = d["evidence"].as_str().expect("evidence");
    assert!(evidence.contains("2.40 GiB") && evidence.contains("4.03 GiB"));
    assert_eq!(d["sites"][0]["frame"], "/home/user/model.py:140:forward");
    let remedies = d["remedies"].as_array().expect("remedies");
    assert_eq!(remedies[0]["action"], "expandable_segments:True");
    assert_eq!(remedies[0]["verified"], true);
    assert_eq!(remedies[0]["oom_avoided"], true);
    assert!(remedies[0]["new_peak_reserved_bytes"].as_u64().is_some());
    let allocated = remedies[0]["new_peak_allocated_bytes"].as_u64();
    assert!(allocated.is_some_and(|a| a <= 25386352640), "{allocated:?}");
    // No site keeps tensors across the recorded iterations: nothing to free earlier.
    assert!(remedies.iter().all(|r| r.get("freed").is_none()));
    let text = stdout(&memprof(&["diagnose", &file]));
    assert!(
        text.contains("entry 1648 (request 4.03 GiB): fragmentation"),
        "{text}"
    );
    assert!(
        text.contains("1. expandable_segments:True: replayed"),
        "{text}"
    );
}

#[test]
fn diagnose_oom_fixture_is_exhaustion_at_the_growing_site() {
    let d = one_diagnosis(&[&path("snapshots/oom.pickle")]);
    assert_eq!(d["cause"], "exhaustion");
    assert_eq!(d["request_bytes"], 702546432u64);
    assert_eq!(d["sites"][0]["frame"], "/home/user/model.py:150:grow_cache");
    assert_eq!(d["sites"][1]["frame"], "/home/user/model.py:150:grow_cache");
    let remedies = d["remedies"].as_array().expect("remedies");
    assert!(remedies.iter().any(|r| r["verified"] == false
        && r["action"]
            .as_str()
            .is_some_and(|a| a.starts_with("plan: "))));
}

#[test]
fn diagnose_a_snapshot_without_oom_exits_1() {
    let (code, doc) = diagnose_json(&[&path("snapshots/expandable.pickle")]);
    assert_eq!(code, Some(1));
    assert_eq!(doc["diagnoses"], serde_json::json!([]));
}

#[test]
fn diagnose_every_log_format() {
    let cases = [
        ("logs/torch2_0_fragmentation.log", "fragmentation", 0),
        (
            "logs/torch2_1_outside_allocator.log",
            "outside_allocator",
            0,
        ),
        ("logs/torch2_2_exhaustion.log", "exhaustion", 1),
        (
            "logs/torch2_5_private_pools_oversized.log",
            "oversized_request",
            3,
        ),
        ("logs/torch2_11_fragmentation.log", "fragmentation", 0),
    ];
    for (log, cause, device) in cases {
        let d = one_diagnosis(&["--log", &path(log)]);
        assert_eq!(d["cause"], cause, "{log}");
        assert_eq!(d["device"], device, "{log}");
        assert_eq!(d["entry_index"], Value::Null, "{log}");
        assert!(d["remedies"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["verified"] == false)));
    }
    let d = one_diagnosis(&["--log", &path("logs/torch2_5_private_pools_oversized.log")]);
    // 18.50 GiB allocated (private pools included) + 200.00 MiB unallocated.
    assert_eq!(
        d["reserved_bytes"],
        (18.5 * 1073741824.0) as u64 + 200 * 1048576
    );
    let text = stdout(&memprof(&[
        "diagnose",
        "--log",
        &path("logs/torch2_1_outside_allocator.log"),
    ]));
    assert!(
        text.contains("6.52 GiB held outside the allocator"),
        "{text}"
    );
}

#[test]
fn diagnose_exit_codes() {
    let out = memprof(&["diagnose", "--log", &path("logs/no_oom.log")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("no out-of-memory error found"));
    let out = memprof(&["diagnose", &path("snapshots/v2_1_basic.pickle")]);
    assert_eq!(out.status.code(), Some(1));
    let errors: [&[&str]; 6] = [
        &["diagnose", "x.pickle", "--capacity", "lots"],
        &["diagnose"],
        &["diagnose", "missing.pickle"],
        &["diagnose", "--log", "missing.log"],
        &["diagnose", "x.pickle", "--log", "y.log"],
        &["diagnose", "--log", "y.log", "--capacity", "80GiB"],
    ];
    for args in errors {
        let out = memprof(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&out).is_empty(), "{args:?}");
    }
    let out = memprof(&["diagnose", &path("invalid/random.bin")]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn analyze_reports_the_diagnosis_without_remedies() {
    let out = memprof(&["analyze", "--json", &path("snapshots/demo_oom.pickle")]);
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("json");
    let oom = &doc["inputs"][0]["devices"][0]["oom"];
    assert_eq!(oom["entry_index"], 1648);
    assert_eq!(oom["diagnosis"]["cause"], "fragmentation");
    assert_eq!(oom["diagnosis"]["remedies"], serde_json::json!([]));
}

/// The accumulating-list program of `fixtures/README.md` ("Generated OOM snapshots"), driven
/// through memprof's allocator model with 100 MiB, written as a snapshot pickle into a
/// temporary directory (never committed). No iteration markers: the loop is found from the
/// repeating allocations.
fn accumulating_snapshot_file() -> Within {
    use memprof::model::{Snapshot, SnapshotFormat, StackTable, Timeline};
    use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
    const MIB: u64 = 1 << 20;
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(Some(100 * MIB)));
    for _ in 0..7 {
        let t = a.malloc(20 * MIB, 0).expect("the temporary fits");
        if a.malloc(12 * MIB, 0).is_err() {
            break;
        }
        a.free(t).expect("allocated");
    }
    let entries = a.take_events();
    let n = entries.len();
    let snapshot = Snapshot {
        format: SnapshotFormat::Modern,
        segments: a.layout(0),
        timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
        stacks: StackTable::default(),
        settings: None,
        annotations: Vec::new(),
    };
    let dir = Scratch::new("diagnose");
    let path = dir.join("accumulating.pickle");
    let file = std::fs::File::create(&path).expect("writable");
    memprof::report::export::torch_snapshot::write(&snapshot, std::io::BufWriter::new(file))
        .expect("written");
    Within::new(dir, path)
}

#[test]
fn diagnose_growth_and_free_the_accumulated_tensors_earlier() {
    let file = accumulating_snapshot_file();
    let file = file.display().to_string();
    let d = one_diagnosis(&[&file]);
    assert_eq!(d["cause"], "growth", "{}", d["evidence"]);
    let remedies = d["remedies"].as_array().expect("remedies");
    let first = &remedies[0];
    assert!(first["action"]
        .as_str()
        .is_some_and(|a| a.starts_with("free the 6 tensors (72.00 MiB)")));
    assert_eq!(first["verified"], true);
    assert_eq!(first["oom_avoided"], true);
    assert_eq!(first["new_peak_allocated_bytes"], 32u64 << 20);
    assert_eq!(first["freed"][0]["bytes"], 72u64 << 20);
    let text = stdout(&memprof(&["diagnose", &file]));
    assert!(text.contains("): growth"), "{text}");
    assert!(text.contains("frees    72.00 MiB"), "{text}");
}
