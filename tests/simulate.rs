//! `memprof simulate`: validation on the real snapshots (every decision reproduced), the
//! published deterministic cases through the CLI, bad settings strings, and traces that
//! contradict themselves.

use crate::util::{fixture, memprof, real_fixtures, stderr, stdout};
use serde_json::{json, Value};
use std::path::PathBuf;

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn run_json(args: &[&str]) -> Value {
    let out = memprof(args);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

#[test]
fn every_decision_of_the_real_snapshots_is_reproduced() {
    let Some(dir) = real_fixtures() else {
        return;
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("lists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    for path in files {
        let shown = path.display().to_string();
        let doc = run_json(&["simulate", &shown, "--validate", "--json"]);
        assert_eq!(doc["schema_version"], 1);
        let devices = doc["validate"]["devices"].as_array().expect("devices");
        assert!(!devices.is_empty(), "{shown}");
        for d in devices {
            assert!(d["alloc_events"].as_u64() > Some(0), "{shown}");
            for kind in [
                "segment_alloc",
                "segment_free",
                "segment_map",
                "segment_unmap",
            ] {
                assert_eq!(
                    d[format!("{kind}_events")],
                    d[format!("{kind}_matches")],
                    "{shown} {kind}"
                );
            }
            assert_eq!(d["alloc_events"], d["alloc_address_matches"], "{shown}");
            assert_eq!(d["first_mismatch"], Value::Null, "{shown}");
            assert_eq!(d["final_layout_matches"], true, "{shown}");
            assert_eq!(
                d["recorded_peak_reserved_bytes"], d["simulated_peak_reserved_bytes"],
                "{shown}"
            );
        }
        // With the recorded settings the simulated peak reserved is the recorded one.
        let runs = run_json(&["simulate", &shown, "--json"]);
        let run = &runs["runs"][0];
        assert_eq!(run["source"], "recorded");
        for (r, v) in run["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .zip(devices)
        {
            assert_eq!(
                r["peak_reserved_bytes"], v["recorded_peak_reserved_bytes"],
                "{shown}"
            );
        }
    }
}

/// A snapshot pickle with the given trace (device 0, stream 0) and final segments.
fn snapshot_file(name: &str, trace: Vec<Value>, segments: Vec<Value>) -> PathBuf {
    let doc = json!({ "segments": segments, "device_traces": [trace] });
    let bytes = serde_pickle::to_vec(&doc, serde_pickle::SerOptions::new()).expect("pickles");
    let path =
        std::env::temp_dir().join(format!("memprof-sim-{}-{name}.pickle", std::process::id()));
    std::fs::write(&path, bytes).expect("writes");
    path
}

fn entry(action: &str, addr: u64, size: u64) -> Value {
    json!({"action": action, "addr": addr, "size": size, "stream": 0})
}

fn segment(address: u64, size: u64, requested: u64, allocated: bool) -> Value {
    let state = if allocated {
        "active_allocated"
    } else {
        "inactive"
    };
    json!({
        "device": 0, "address": address, "total_size": size,
        "allocated_size": if allocated { size } else { 0 },
        "active_size": if allocated { size } else { 0 },
        "requested_size": if allocated { requested } else { 0 },
        "stream": 0, "segment_type": "large", "is_expandable": false, "frames": [],
        "blocks": [{"address": address, "size": size, "requested_size": requested,
                    "state": state, "frames": []}]
    })
}

/// The published case as PyTorch records it with default settings: 8 x 16 MiB allocated
/// and freed, then 4 x 32 MiB.
fn published_case() -> PathBuf {
    let mut trace = Vec::new();
    let mut segments = Vec::new();
    for k in 0..8 {
        let a = BASE + k * 64 * MIB;
        trace.push(entry("segment_alloc", a, 16 * MIB));
        trace.push(entry("alloc", a, 16 * MIB));
        segments.push(segment(a, 16 * MIB, 16 * MIB, false));
    }
    for k in 0..8 {
        let a = BASE + k * 64 * MIB;
        trace.push(entry("free_requested", a, 16 * MIB));
        trace.push(entry("free_completed", a, 16 * MIB));
    }
    for k in 0..4 {
        let a = BASE + (8 + k) * 64 * MIB;
        trace.push(entry("segment_alloc", a, 32 * MIB));
        trace.push(entry("alloc", a, 32 * MIB));
        segments.push(segment(a, 32 * MIB, 32 * MIB, true));
    }
    snapshot_file("published", trace, segments)
}

#[test]
fn published_cases_through_the_cli() {
    let path = published_case();
    let shown = path.display().to_string();
    let v = run_json(&["simulate", &shown, "--validate", "--json"]);
    let d = &v["validate"]["devices"][0];
    assert_eq!(d["alloc_address_matches"], 12);
    assert_eq!(d["segment_alloc_matches"], 12);
    assert_eq!(d["first_mismatch"], Value::Null);
    let doc = run_json(&[
        "simulate",
        &shown,
        "--alloc-conf",
        "expandable_segments:True",
        "--json",
    ]);
    std::fs::remove_file(&path).ok();
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs[0]["alloc_conf"], "expandable_segments:True");
    assert_eq!(runs[0]["source"], "given");
    // Expandable: seven 20 MiB pages for the 8 x 16 MiB; the 4 x 32 MiB map nothing new.
    assert_eq!(runs[0]["devices"][0]["peak_reserved_bytes"], 140 * MIB);
    // Default settings: 128 MiB cached that the 32 MiB requests cannot use, 256 MiB in all.
    assert_eq!(runs[1]["source"], "recorded");
    assert_eq!(runs[1]["devices"][0]["peak_reserved_bytes"], 256 * MIB);
    assert_eq!(runs[1]["devices"][0]["oom"], Value::Null);
}

#[test]
fn capacity_makes_the_model_run_out_of_memory() {
    let path = published_case();
    let shown = path.display().to_string();
    let doc = run_json(&["simulate", &shown, "--capacity", "200MiB", "--json"]);
    std::fs::remove_file(&path).ok();
    let device = &doc["runs"][0]["devices"][0];
    // The third 32 MiB request does not fit; its OOM retry frees the cached 16 MiB
    // segments, so everything fits in 200 MiB.
    assert_eq!(device["oom"], Value::Null);
    assert_eq!(device["peak_reserved_bytes"], 128 * MIB + 64 * MIB);
    assert_eq!(device["capacity_bytes"], 200 * MIB);
}

#[test]
fn sweep_ranks_settings_and_names_the_saving() {
    let path = published_case();
    let shown = path.display().to_string();
    let out = memprof(&["simulate", &shown, "--sweep"]);
    let doc = run_json(&["simulate", &shown, "--sweep", "--json"]);
    std::fs::remove_file(&path).ok();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("best: expandable_segments:True") && last.contains("saves 116.00 MiB"),
        "{last}"
    );
    let runs = doc["runs"].as_array().expect("runs");
    assert!(runs.len() > 10);
    let peaks: Vec<u64> = runs[1..]
        .iter()
        .map(|r| r["devices"][0]["peak_reserved_bytes"].as_u64().unwrap_or(0))
        .collect();
    assert!(peaks.windows(2).all(|w| w[0] <= w[1]), "{peaks:?}");
}

#[test]
fn bad_settings_strings_exit_2_with_one_line() {
    let file = fixture("snapshots/v2_1_basic.pickle").display().to_string();
    for (conf, says) in [
        ("foo:1", "unknown allocator setting \"foo\""),
        ("max_split_size_mb:10", "at least 20"),
        ("expandable_segments:maybe", "True or False"),
        ("garbage_collection_threshold:2", "between 0 and 1"),
        ("roundup_power2_divisions:[64:8", "unclosed"),
        ("backend:cudaMallocAsync", "no caching rules"),
    ] {
        let out = memprof(&["simulate", &file, "--alloc-conf", conf]);
        assert_eq!(out.status.code(), Some(2), "{conf}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{conf}: {err}");
        assert!(err.contains(says), "{conf}: {err}");
    }
    let out = memprof(&["simulate", &file, "--validate", "--sweep"]);
    assert_eq!(out.status.code(), Some(2));
    let out = memprof(&["simulate", &file, "--capacity", "lots"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn contradicting_traces_warn_with_the_entry_index() {
    let a = BASE;
    let trace = vec![
        entry("segment_alloc", a, 20 * MIB),
        entry("alloc", a, 2 * MIB),
        entry("free_requested", a, 2 * MIB),
        entry("free_completed", a, 2 * MIB),
        entry("free_requested", a, 2 * MIB),
        entry("free_completed", a, 2 * MIB),
        entry("free_requested", a + 64 * MIB, 512),
        entry("free_completed", a + 64 * MIB, 512),
    ];
    let path = snapshot_file("contradiction", trace, vec![segment(a, 20 * MIB, 0, false)]);
    let shown = path.display().to_string();
    for args in [
        vec!["simulate", &shown],
        vec!["simulate", &shown, "--validate"],
    ] {
        let out = memprof(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("warning") && err.contains("entry "), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn synthetic_fixtures_with_retries_ooms_and_expandable_segments_validate() {
    for name in [
        "oom",
        "demo_oom",
        "expandable",
        "pending_free",
        "v2_11_full",
    ] {
        let file = fixture(&format!("snapshots/{name}.pickle"))
            .display()
            .to_string();
        let doc = run_json(&["simulate", &file, "--validate", "--json"]);
        for d in doc["validate"]["devices"].as_array().expect("devices") {
            assert_eq!(d["first_mismatch"], Value::Null, "{name}");
        }
    }
}
