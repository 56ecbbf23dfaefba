//! The JSON reference in `docs/json/` kept true: every field a page documents must appear in
//! the output of its command on the shipped fixtures (and a generated OOM with recorded
//! settings, for the fields only such a file has). A documented field that no output carries
//! fails, so the pages cannot drift from what memprof prints.

use crate::util::{fixture, memprof, repo, stdout};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Field names of a page: the backticked names in the first column of its tables.
fn documented(page: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("docs/json").join(page)).expect("the page");
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(first) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            continue;
        };
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 && part.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                names.insert(part.to_string());
            }
        }
    }
    names.remove("field");
    names
}

/// Every object key anywhere in `v`.
fn keys(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                out.insert(k.clone());
                keys(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

fn output_keys(runs: &[Vec<String>]) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for args in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = memprof(&args);
        let doc: Value = serde_json::from_str(&stdout(&out))
            .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"));
        keys(&doc, &mut seen);
    }
    seen
}

fn check(page: &str, runs: &[Vec<String>]) {
    let seen = output_keys(runs);
    let missing: Vec<String> = documented(page)
        .into_iter()
        .filter(|f| !seen.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/json/{page} documents fields no output carries: {missing:?}"
    );
}

fn f(rel: &str) -> String {
    fixture(rel).display().to_string()
}

/// A generated OOM whose file records allocator settings, so that a remedy keeps them and a
/// setting is already on: 120 MiB, a fragmented segment, then 25 MiB asked for.
fn oom_with_recorded_settings() -> PathBuf {
    use memprof::model::{AllocatorSettings, Snapshot, SnapshotFormat, StackTable, Timeline};
    use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
    const MIB: u64 = 1 << 20;
    let conf = "max_split_size_mb:512";
    let config = AllocatorConfig::parse(conf).expect("valid");
    let mut a = CachingAllocator::new(config, Driver::new(Some(120 * MIB)));
    let x = a.malloc(60 * MIB, 0).expect("fits");
    a.free(x).expect("allocated");
    let p = a.malloc(20 * MIB, 0).expect("fits");
    a.malloc(30 * MIB, 0).expect("fits");
    a.free(p).expect("allocated");
    a.malloc(60 * MIB, 0).expect("fits");
    assert!(a.malloc(25 * MIB, 0).is_err());
    let entries = a.take_events();
    let n = entries.len();
    let snapshot = Snapshot {
        format: SnapshotFormat::Modern,
        segments: a.layout(0),
        timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
        stacks: StackTable::default(),
        settings: Some(AllocatorSettings {
            alloc_conf: Some(conf.into()),
            max_split_size: Some(512 * MIB),
            ..AllocatorSettings::default()
        }),
        annotations: Vec::new(),
    };
    let dir = std::env::temp_dir().join(format!("memprof-json-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let path = dir.join("fragmented.pickle");
    let file = std::fs::File::create(&path).expect("writable");
    memprof::report::export::torch_snapshot::write(&snapshot, std::io::BufWriter::new(file))
        .expect("written");
    path
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[test]
fn every_documented_analyze_field_is_in_real_output() {
    check(
        "analyze.md",
        &[
            args(&["analyze", "--json", &f("snapshots/demo_oom.pickle")]),
            args(&["analyze", "--json", &f("recordings/peak_oom_v2.memprof")]),
            args(&["analyze", "--json", &f("snapshots/expandable.pickle")]),
            args(&["analyze", "--json", &f("snapshots/multi_device.pickle")]),
        ],
    );
}

#[test]
fn every_documented_diagnose_field_is_in_real_output() {
    let generated = oom_with_recorded_settings();
    check(
        "diagnose.md",
        &[
            args(&["diagnose", "--json", &f("snapshots/demo_oom.pickle")]),
            args(&["diagnose", "--json", &f("snapshots/oom.pickle")]),
            args(&["diagnose", "--json", &f("snapshots/segments_only.pickle")]),
            args(&["diagnose", "--json", &generated.display().to_string()]),
        ],
    );
    let _ = std::fs::remove_dir_all(generated.parent().expect("a directory"));
}

#[test]
fn every_documented_diff_field_is_in_real_output() {
    check(
        "diff.md",
        &[args(&[
            "diff",
            "--json",
            &f("snapshots/v2_1_basic.pickle"),
            &f("snapshots/v2_11_full.pickle"),
        ])],
    );
}

#[test]
fn every_documented_plan_field_is_in_real_output() {
    let dir = std::env::temp_dir().join(format!("memprof-json-ref-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let workload = dir.join("requests.jsonl");
    let lines: String = (0..40)
        .map(|i| format!("{{\"arrival\": {i}, \"prompt\": 300, \"output\": 50}}\n"))
        .collect();
    std::fs::write(&workload, lines).expect("writable");
    let w = workload.display().to_string();
    let train = [
        "plan",
        "train",
        "--model",
        "llama-3-8b",
        "--gpus",
        "8",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--micro-batch",
        "1",
        "--top",
        "50",
        "--json",
    ];
    check(
        "plan.md",
        &[
            args(&train),
            args(&[
                "plan",
                "kv",
                "--model",
                "llama-3-8b",
                "--gpu-memory",
                "24GiB",
                "--max-model-len",
                "4096",
                "--workload",
                &w,
                "--json",
            ]),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
