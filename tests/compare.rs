//! Devices and ranks compared: `analyze` on a folder of rank files and on one file driving
//! several GPUs names the outlier and the site that makes the difference. The files are built
//! by driving memprof's allocator model (`fixtures/README.md`, "Generated rank files") and
//! written as snapshot pickles into a temporary directory.

use crate::util::{memprof, model_snapshot, stdout, write_snapshot, Scratch};
use memprof::model::{Action, Frame, Snapshot, SnapshotFormat, StackTable, Timeline, TraceEntry};
use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
use serde_json::Value;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// One rank's step: ten 4 MiB activations from `model.py:10`, and `extra` 40 MiB tensors from
/// `model.py:20` on a heavy rank. Returns its entries (with stacks) and the allocator.
fn rank(extra: usize, stacks: &mut StackTable) -> (Vec<TraceEntry>, CachingAllocator) {
    let mut site = |line: i64| {
        let f = stacks.add_frame(Frame {
            filename: "/home/user/model.py".into(),
            line,
            name: "forward".into(),
        });
        stacks.add_stack(vec![f].into_boxed_slice())
    };
    let (light, heavy) = (site(10), site(20));
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(None));
    for _ in 0..10 {
        a.malloc(4 * MIB, 0).expect("no capacity limit");
    }
    for _ in 0..extra {
        a.malloc(40 * MIB, 0).expect("no capacity limit");
    }
    let mut entries = a.take_events();
    for e in &mut entries {
        if e.action() == Action::Alloc {
            e.stack = if e.size == 40 * MIB { heavy } else { light };
        }
    }
    (entries, a)
}

fn analyze_json(path: &Path) -> Value {
    let out = memprof(&["analyze", "--json", &path.display().to_string()]);
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_str(&stdout(&out)).expect("JSON")
}

#[test]
fn a_folder_of_rank_files_names_the_heavy_rank_and_its_site() {
    let dir = Scratch::new("ranks");
    for (r, extra) in [(0, 0), (1, 2), (2, 0), (3, 0)] {
        rank_file(extra, &dir.join(format!("rank{r}.pickle")));
    }
    std::fs::write(dir.join("notes.txt"), "not a snapshot").expect("writable");
    let doc = analyze_json(&dir);
    assert_eq!(
        doc["inputs"].as_array().map(Vec::len),
        Some(4),
        "notes.txt is skipped"
    );
    let c = &doc["comparison"];
    assert!(c["outlier"]["input"]
        .as_str()
        .is_some_and(|p| p.ends_with("rank1.pickle")));
    assert_eq!(c["median_peak_bytes"], 40 * MIB);
    assert_eq!(c["spread_ratio"], 3.0);
    let first = &c["differences"][0];
    assert_eq!(first["site"], "/home/user/model.py:20:forward");
    assert_eq!(first["bytes_outlier"], 80 * MIB);
    assert_eq!(first["bytes_median"], 0);
    let out = memprof(&["analyze", &dir.display().to_string()]);
    let text = stdout(&out);
    let line = text.lines().next().unwrap_or_default();
    assert!(line.starts_with("outlier: "), "{text}");
    assert!(
        line.contains("rank1.pickle device 0, peak requested 120.00 MiB, 3.0x the median"),
        "{line}"
    );
    assert!(
        line.contains("/home/user/model.py:20:forward (+80.00 MiB: 80.00 MiB against 0 B)"),
        "{line}"
    );
}

#[test]
fn one_file_driving_several_gpus_names_the_heavy_device() {
    let dir = Scratch::new("devices");
    let mut stacks = StackTable::default();
    let mut all = Vec::new();
    let mut ranges = Vec::new();
    let mut segments = Vec::new();
    for (device, extra) in [(0u32, 0), (1, 3), (2, 0)] {
        let (entries, a) = rank(extra, &mut stacks);
        ranges.push(all.len()..all.len() + entries.len());
        all.extend(entries);
        segments.extend(a.layout(device));
    }
    let snapshot = Snapshot {
        format: SnapshotFormat::Modern,
        segments,
        timeline: Timeline::new(all, ranges),
        stacks,
        settings: None,
        annotations: Vec::new(),
    };
    let file = dir.join("three_gpus.pickle");
    write_snapshot(&snapshot, &file);
    let doc = analyze_json(&file);
    let c = &doc["comparison"];
    assert_eq!(c["outlier"]["device"], 1);
    assert_eq!(c["differences"][0]["bytes_outlier"], 120 * MIB);
    let text = stdout(&memprof(&["analyze", &file.display().to_string()]));
    assert!(
        text.starts_with(
            "outlier: device 1, peak requested 160.00 MiB, 4.0x the median (device 2, 40.00 MiB)"
        ),
        "{text}"
    );
    // One device alone has nothing to compare.
    let doc = analyze_json(&crate::util::fixture("snapshots/demo_oom.pickle"));
    assert_eq!(doc["comparison"], Value::Null);
}

/// One rank's step written as a snapshot: `extra` 40 MiB tensors beside the activations.
fn rank_file(extra: usize, path: &Path) {
    let mut stacks = StackTable::default();
    let (entries, a) = rank(extra, &mut stacks);
    write_snapshot(&model_snapshot(entries, a.layout(0), stacks, None), path);
}

#[test]
fn diff_names_the_added_tensors_first_with_their_stack() {
    let dir = Scratch::new("diff");
    let (before, after) = (dir.join("before.pickle"), dir.join("after.pickle"));
    // The same step twice; the second run keeps two 40 MiB tensors more.
    rank_file(0, &before);
    rank_file(2, &after);
    let (b, a) = (before.display().to_string(), after.display().to_string());
    let out = memprof(&["diff", &b, &a]);
    assert_eq!(out.status.code(), Some(1), "the peak grew beyond 5%");
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "device 0: peak requested 40.00 MiB -> 120.00 MiB, +80.00 MiB (+200.0%)  GREW"
    );
    assert_eq!(lines[1], "  appeared, largest first:");
    assert_eq!(
        lines[2],
        "      +80.00 MiB  model.py:20:forward  (0 B -> 80.00 MiB)"
    );
    assert!(
        lines[3].contains("+0 B  everything else (total change +80.00 MiB)"),
        "everything else adds up: {text}"
    );
    assert!(
        lines[5].contains("model.py:20:forward"),
        "the stack follows: {text}"
    );
    let out = memprof(&["diff", "--json", &b, &a]);
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(doc["kind"], "memprof_diff");
    assert_eq!(
        doc["devices"][0]["appeared"][0]["site"],
        "model.py:20:forward"
    );
    assert_eq!(doc["devices"][0]["appeared"][0]["before_bytes"], 0);
    // No growth: exit 0; a growth within --max-increase: exit 0 too.
    assert_eq!(memprof(&["diff", &b, &b]).status.code(), Some(0));
    assert_eq!(
        memprof(&["diff", "--max-increase", "300%", &b, &a])
            .status
            .code(),
        Some(0)
    );
    // A file that is not a snapshot: exit 2 with one line.
    let bad = dir.join("bad.pickle");
    std::fs::write(&bad, b"not a pickle").expect("writable");
    let out = memprof(&["diff", &b, &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_device_that_ran_out_is_shown_against_what_every_device_held() {
    let dir = Scratch::new("imbalance");
    let mut stacks = StackTable::default();
    let mut all = Vec::new();
    let mut ranges = Vec::new();
    let mut segments = Vec::new();
    for (device, extra) in [(0u32, 0), (1, 3)] {
        let (entries, mut a) = rank(extra, &mut stacks);
        // The heavy device then asks for more than its 200 MiB device has left.
        let mut entries = entries;
        if extra > 0 {
            entries.push(TraceEntry::oom(
                64 * MIB,
                Some(8 * MIB),
                memprof::model::StreamIndex(0),
            ));
        }
        // One entry a millisecond, on one clock for both devices.
        for (i, e) in entries.iter_mut().enumerate() {
            *e = e.with_time(Some(1_000_000 + 1_000 * i as i64));
        }
        ranges.push(all.len()..all.len() + entries.len());
        all.extend(entries);
        segments.extend(a.layout(device));
        let _ = a.take_events();
    }
    let snapshot = Snapshot {
        format: SnapshotFormat::Modern,
        segments,
        timeline: Timeline::new(all, ranges),
        stacks,
        settings: None,
        annotations: Vec::new(),
    };
    let file = dir.join("two_gpus.pickle");
    write_snapshot(&snapshot, &file);
    let shown = file.display().to_string();
    let text = stdout(&memprof(&["diagnose", &shown]));
    assert!(
        text.contains(
            "at the OOM (0.018 s) every device held (requested / reserved): device 0 40.00 MiB / \
             40.00 MiB; device 1 160.00 MiB / 160.00 MiB. Device 1 held 4.0x the median \
             (40.00 MiB)"
        ),
        "{text}"
    );
    let text = stdout(&memprof(&["analyze", &shown]));
    assert!(text.contains("Device 1 held 4.0x the median"), "{text}");
}
