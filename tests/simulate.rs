//! `memprof simulate`: validation on the real snapshots (every decision reproduced), the
//! published deterministic cases through the CLI, bad settings strings, traces that
//! contradict themselves, private pools named by trace entries, traces with nothing to
//! replay, the peak figures' moment, and sweeps where every setting runs out of memory.

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

/// Every snapshot in `../shared/fixtures/real/` and its `more/` folder (`.pickle` and `.pkl`).
fn real_snapshot_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [dir.to_path_buf(), dir.join("more")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl"))
        .collect();
    files.sort();
    files
}

/// A fixture its authors derived from a real dump, cutting its trace: its final layout does
/// not follow from the trace (`more/PROVENANCE.md`).
const CUT_BY_ITS_AUTHORS: &str = "drisspg__transformer_nuggets__mini_snapshot.pickle";

#[test]
fn every_decision_of_the_real_snapshots_is_reproduced() {
    let Some(dir) = real_fixtures() else {
        return;
    };
    let files = real_snapshot_files(&dir);
    let (mut traced, mut untraced) = (0, 0);
    for path in &files {
        let shown = path.display().to_string();
        let out = memprof(&["simulate", &shown, "--validate", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{shown}: {}", stderr(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(doc["schema_version"], 2);
        let devices = doc["validate"]["devices"].as_array().expect("devices");
        for d in devices {
            for kind in [
                "segment_alloc",
                "segment_free",
                "segment_map",
                "segment_unmap",
                "oom",
            ] {
                assert_eq!(
                    d[format!("{kind}_events")],
                    d[format!("{kind}_matches")],
                    "{shown} {kind}"
                );
            }
            assert_eq!(d["alloc_events"], d["alloc_address_matches"], "{shown}");
            assert_eq!(d["first_mismatch"], Value::Null, "{shown}");
            assert_eq!(
                d["recorded_peak_reserved_bytes"], d["simulated_peak_reserved_bytes"],
                "{shown}"
            );
            let cut = shown.ends_with(CUT_BY_ITS_AUTHORS);
            assert_eq!(d["final_layout_matches"], !cut, "{shown}");
            if cut {
                assert!(d["warnings"].as_array().is_some_and(|w| !w.is_empty()));
            }
            if d["replayed_requests"].as_u64() > Some(0) {
                assert!(d["alloc_events"].as_u64() > Some(0), "{shown}");
                traced += 1;
            } else {
                untraced += 1;
            }
        }
        // With the recorded settings the simulated peak reserved is the recorded one.
        let runs = run_json(&["simulate", &shown, "--json"]);
        let run = &runs["runs"][0];
        assert_eq!(run["source"], "recorded");
        let run_devices = run["devices"].as_array().expect("devices");
        assert_eq!(run_devices.len(), devices.len(), "{shown}");
        for (r, v) in run_devices.iter().zip(devices) {
            assert_eq!(
                r["peak_reserved_bytes"], v["recorded_peak_reserved_bytes"],
                "{shown}"
            );
            assert_eq!(r["replayed_entries"], v["replayed_entries"], "{shown}");
        }
    }
    eprintln!(
        "{} real snapshots: {traced} devices with allocations replayed, {untraced} without",
        files.len()
    );
    assert!(traced > 0);
}

#[test]
fn real_snapshots_without_a_trace_say_nothing_was_replayed() {
    let Some(dir) = real_fixtures() else {
        return;
    };
    let empty = dir.join("more/Charran78__DocuBox__dump_snapshot.pickle");
    let no_device =
        dir.join("more/SunnySood80__unsupervised_finetune_resnet50__dump_snapshot.pickle");
    if !empty.exists() || !no_device.exists() {
        crate::util::skip(
            "the trace-less real snapshots: not among the real snapshots here, see \
             fixtures/README.md",
        );
        return;
    }
    let shown = empty.display().to_string();
    let out = memprof(&["simulate", &shown, "--validate"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "device 0: nothing to validate: its trace is empty (the file kept no trace entry; \
         `analyze` says why); reserved 104.00 MiB as the snapshot shows\n"
    );
    let out = memprof(&["simulate", &no_device.display().to_string(), "--sweep"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "nothing to replay: the snapshot has no segments and no trace entries on any device\n"
    );
}

/// A snapshot pickle with the given trace (device 0, stream 0) and final segments, in a file
/// of its own (tests that build the same case run at once, and each removes its file).
fn snapshot_file(name: &str, trace: Vec<Value>, segments: Vec<Value>) -> PathBuf {
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let doc = json!({ "segments": segments, "device_traces": [trace] });
    let bytes = serde_pickle::to_vec(&doc, serde_pickle::SerOptions::new()).expect("pickles");
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "memprof-sim-{}-{n}-{name}.pickle",
        std::process::id()
    ));
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
    // The recorded settings, then expandable segments, four split sizes and the rounding
    // (no garbage collector: without a capacity it never runs).
    assert_eq!(runs.len(), 7);
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
        // PyTorch takes only True and False, and this 2.1 file's PyTorch has no fraction key.
        (
            "expandable_segments:true",
            "allocator setting expandable_segments: expected True or False, spelled so: \
             PyTorch refuses any other spelling (got \"true\")",
        ),
        (
            "per_process_memory_fraction:0.5",
            "allocator setting \"per_process_memory_fraction\" is not accepted by PyTorch 2.1, \
             which this file shows: PyTorch accepts it from 2.9 on",
        ),
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
    let out = memprof(&["simulate", &file, "--capacity", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--capacity: a device of 0 bytes"), "{err}");
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

fn with_pool(mut e: Value, pool: [i64; 2]) -> Value {
    e["pool_id"] = json!(pool);
    e
}

/// The default pool keeps a 20 MiB free block its split segment cannot release; a graph's
/// private pool (1, 2) fills the rest of a 100 MiB device, and a 15 MiB request of the graph
/// runs out of memory. `pool_ids`: the entries say which pool they used (newer PyTorch).
fn private_pool_oom(pool_ids: bool) -> PathBuf {
    let (d, g) = (BASE, BASE + 64 * MIB);
    let graph = |e: Value| if pool_ids { with_pool(e, [1, 2]) } else { e };
    let trace = vec![
        entry("segment_alloc", d, 40 * MIB),
        entry("alloc", d, 40 * MIB),
        entry("free_requested", d, 40 * MIB),
        entry("free_completed", d, 40 * MIB),
        entry("alloc", d, 20 * MIB),
        graph(entry("segment_alloc", g, 60 * MIB)),
        graph(entry("alloc", g, 60 * MIB)),
        graph(json!({"action": "oom", "device_free": 0, "size": 15 * MIB, "stream": 0})),
    ];
    let mut default = segment(d, 40 * MIB, 20 * MIB, true);
    default["blocks"] = json!([
        {"address": d, "size": 20 * MIB, "requested_size": 20 * MIB,
         "state": "active_allocated", "frames": []},
        {"address": d + 20 * MIB, "size": 20 * MIB, "requested_size": 0,
         "state": "inactive", "frames": []},
    ]);
    let mut private = segment(g, 60 * MIB, 60 * MIB, true);
    private["segment_pool_id"] = json!([1, 2]);
    let name = if pool_ids { "pool-ids" } else { "no-pool-ids" };
    snapshot_file(name, trace, vec![default, private])
}

#[test]
fn trace_entry_pool_ids_are_used_and_validate_exits_1_on_a_mismatch() {
    let with = private_pool_oom(true);
    let shown = with.display().to_string();
    let out = memprof(&["simulate", &shown, "--validate", "--json"]);
    std::fs::remove_file(&with).ok();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let d = &doc["validate"]["devices"][0];
    assert_eq!(d["first_mismatch"], Value::Null, "{d}");
    assert_eq!(
        (d["oom_events"].clone(), d["oom_matches"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(d["final_layout_matches"], true);
    assert_eq!(d["capacity_bytes"], 100 * MIB);
    // Without them the replay can only take the request for the default pool's, which the
    // cached block serves: the recorded OOM is not reproduced, and the exit code says so.
    let without = private_pool_oom(false);
    let shown = without.display().to_string();
    let out = memprof(&["simulate", &shown, "--validate"]);
    std::fs::remove_file(&without).ok();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("first mismatch at entry 7") && text.contains("do not say which pool"),
        "{text}"
    );
}

#[test]
fn a_trace_without_requests_says_nothing_was_replayed() {
    let one_free = vec![
        entry("free_requested", BASE, 20 * MIB),
        entry("free_completed", BASE, 20 * MIB),
    ];
    for (name, trace, why) in [
        (
            "empty",
            Vec::new(),
            "its trace is empty (the file kept no trace entry; `analyze` says why)",
        ),
        (
            "frees",
            one_free,
            "none of its 2 trace entries is an alloc, segment or oom entry",
        ),
    ] {
        let path = snapshot_file(name, trace, vec![segment(BASE, 20 * MIB, 0, false)]);
        let shown = path.display().to_string();
        let validate = memprof(&["simulate", &shown, "--validate"]);
        let sweep = memprof(&["simulate", &shown, "--sweep"]);
        let doc = run_json(&["simulate", &shown, "--sweep", "--json"]);
        let v = run_json(&["simulate", &shown, "--validate", "--json"]);
        std::fs::remove_file(&path).ok();
        assert_eq!(validate.status.code(), Some(0), "{}", stderr(&validate));
        assert_eq!(
            stdout(&validate),
            format!(
                "device 0: nothing to validate: {why}; reserved 20.00 MiB as the snapshot shows\n"
            ),
            "{name}"
        );
        let text = stdout(&sweep);
        assert_eq!(text.lines().count(), 2, "{name}: {text}");
        assert!(text.contains("device 0: nothing replayed: "), "{text}");
        assert!(
            text.ends_with("no setting would change anything; nothing compared\n"),
            "{text}"
        );
        // One run: the sweep over nothing is not made.
        assert_eq!(doc["runs"].as_array().map(Vec::len), Some(1), "{name}");
        let device = &v["validate"]["devices"][0];
        assert_eq!(device["replayed_requests"], 0);
        assert_eq!(
            doc["runs"][0]["devices"][0]["replayed_entries"],
            device["replayed_entries"]
        );
    }
}

#[test]
fn peak_figures_are_taken_at_one_named_entry() {
    // 30 + 30 MiB, the first freed; 40 MiB needs a new segment (the peak, 100 MiB reserved
    // with 70 MiB allocated); then 25 MiB reuses the freed 30 MiB block: 95 MiB allocated,
    // at another moment.
    let (x, y, z) = (BASE, BASE + 64 * MIB, BASE + 128 * MIB);
    let trace = vec![
        entry("segment_alloc", x, 30 * MIB),
        entry("alloc", x, 30 * MIB),
        entry("segment_alloc", y, 30 * MIB),
        entry("alloc", y, 30 * MIB),
        entry("free_requested", x, 30 * MIB),
        entry("free_completed", x, 30 * MIB),
        entry("segment_alloc", z, 40 * MIB),
        entry("alloc", z, 40 * MIB),
        entry("alloc", x, 25 * MIB),
    ];
    let mut first = segment(x, 30 * MIB, 25 * MIB, true);
    first["blocks"] = json!([
        {"address": x, "size": 25 * MIB, "requested_size": 25 * MIB,
         "state": "active_allocated", "frames": []},
        {"address": x + 25 * MIB, "size": 5 * MIB, "requested_size": 0,
         "state": "inactive", "frames": []},
    ]);
    let segments = vec![
        first,
        segment(y, 30 * MIB, 30 * MIB, true),
        segment(z, 40 * MIB, 40 * MIB, true),
    ];
    let path = snapshot_file("peak-moment", trace, segments);
    let shown = path.display().to_string();
    let out = memprof(&["simulate", &shown]);
    let doc = run_json(&["simulate", &shown, "--json"]);
    std::fs::remove_file(&path).ok();
    assert_eq!(
        stdout(&out).lines().nth(2),
        Some(
            "  device 0: peak reserved 100.00 MiB at entry 7, with 70.00 MiB allocated and \
             30.00 MiB free in cache (largest free block 30.00 MiB); no OOM; 0 OOM retries, 0 \
             empty_cache() calls"
        )
    );
    let d = &doc["runs"][0]["devices"][0];
    assert_eq!(d["peak_reserved_bytes"], 100 * MIB);
    assert_eq!(d["fragmentation_at_peak"]["entry_index"], 7);
    assert_eq!(d["fragmentation_at_peak"]["allocated_bytes"], 70 * MIB);
    assert_eq!(d["fragmentation_at_peak"]["external_bytes"], 30 * MIB);
    assert_eq!(d["peak_allocated_bytes"], 95 * MIB);
}

#[test]
fn every_setting_running_out_of_memory_is_one_line() {
    let file = fixture("snapshots/expandable.pickle").display().to_string();
    let out = memprof(&["simulate", &file, "--sweep", "--capacity", "200MiB"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "every setting tried runs out of memory; the recorded settings \
             (expandable_segments:True) run out at entry "
        ),
        "{last}"
    );
    assert!(!text.contains("best:"), "{text}");
    // The defaults recorded: said so.
    let path = published_case();
    let shown = path.display().to_string();
    let out = memprof(&["simulate", &shown, "--sweep", "--capacity", "40MiB"]);
    std::fs::remove_file(&path).ok();
    let text = stdout(&out);
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "every setting tried runs out of memory; the recorded settings are the defaults, \
             which run out at entry 5"
        ),
        "{last}"
    );
}

#[test]
fn a_collector_threshold_without_a_fraction_is_warned_about() {
    let file = fixture("snapshots/v2_1_basic.pickle").display().to_string();
    let out = memprof(&[
        "simulate",
        &file,
        "--alloc-conf",
        "garbage_collection_threshold:0.6",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: --alloc-conf: garbage_collection_threshold does nothing without a per-process memory fraction"),
        "{err}"
    );
    // The fraction is a settings key from PyTorch 2.9 on: a 2.10 file takes it.
    let newer = fixture("snapshots/v2_11_full.pickle").display().to_string();
    let out = memprof(&[
        "simulate",
        &newer,
        "--alloc-conf",
        "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
        "--capacity",
        "1GiB",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("garbage_collection_threshold"));
}

#[test]
fn a_time_more_than_a_million_years_out_is_one_line_and_exit_2() {
    let mut bad = entry("alloc", BASE, 512);
    bad["time_us"] = json!(1_i64 << 60);
    let path = snapshot_file("far-time", vec![bad], Vec::new());
    let out = memprof(&["analyze", &path.display().to_string()]);
    std::fs::remove_file(&path).ok();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("device_traces[0][0]: 'time_us' is more than a million years from 1970"),
        "{err}"
    );
}

#[test]
fn a_pool_id_that_is_not_a_pair_is_one_line_and_exit_2() {
    let mut bad = entry("alloc", BASE, 512);
    bad["pool_id"] = json!("graph");
    let path = snapshot_file("bad-pool-id", vec![bad], Vec::new());
    let out = memprof(&["simulate", &path.display().to_string(), "--validate"]);
    std::fs::remove_file(&path).ok();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("device_traces[0][0]: 'pool_id' is not a pair of integers"),
        "{err}"
    );
}
