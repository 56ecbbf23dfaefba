//! The JSON reference in `docs/json/` kept true: every field a page documents must appear in
//! the output of its command on the shipped fixtures (and a generated OOM with recorded
//! settings, for the fields only such a file has; a gate baseline written to a temporary
//! folder; `attach` on a workload under the shim and `probe` on the fake driver). A documented
//! field that no output carries fails, so the pages cannot drift from what memprof prints.

use crate::attach_shim::{workload, Guard};
use crate::util::{
    fixture, memprof, model_snapshot, repo, stderr, stdout, write_snapshot, Scratch, Within,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Field names of a page: the backticked names in the first column of its tables.
fn documented(page: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("docs/json").join(page)).expect("the page");
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(first) = line.strip_prefix('|').and_then(|l| l.split('|').next()) else {
            continue;
        };
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
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
    check_keys(page, &output_keys(runs));
}

/// Fails naming the fields `page` documents that `seen` lacks.
fn check_keys(page: &str, seen: &BTreeSet<String>) {
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
fn oom_with_recorded_settings() -> Within {
    use memprof::model::{AllocatorSettings, StackTable};
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
    let settings = AllocatorSettings {
        alloc_conf: Some(conf.into()),
        max_split_size: Some(512 * MIB),
        ..AllocatorSettings::default()
    };
    let snapshot = model_snapshot(
        a.take_events(),
        a.layout(0),
        StackTable::default(),
        Some(settings),
    );
    let dir = Scratch::new("json-ref");
    let path = dir.join("fragmented.pickle");
    write_snapshot(&snapshot, &path);
    Within::new(dir, path)
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
            args(&["analyze", "--json", &f("recordings/ledger.memprof")]),
            args(&["analyze", "--json", &f("recordings/ledger.oom-857.pickle")]),
            args(&["analyze", "--json", &f("snapshots/expandable.pickle")]),
            args(&["analyze", "--json", &f("snapshots/multi_device.pickle")]),
        ],
    );
}

#[test]
fn every_documented_analyze_at_field_is_in_real_output() {
    check(
        "analyze-at.md",
        &[args(&[
            "analyze",
            "--json",
            "--full-stacks",
            "--at",
            "oom",
            &f("snapshots/demo_oom.pickle"),
        ])],
    );
}

#[test]
fn every_documented_account_field_is_in_real_output() {
    check(
        "account.md",
        &[
            args(&["analyze", "--json", &f("snapshots/demo_oom.pickle")]),
            args(&["analyze", "--json", &f("snapshots/private_pool.pickle")]),
            args(&["analyze", "--json", &f("snapshots/segments_only.pickle")]),
            args(&["diagnose", "--json", &f("snapshots/demo_oom.pickle")]),
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
}

#[test]
fn every_documented_diff_field_is_in_real_output() {
    check(
        "diff.md",
        &[args(&[
            "diff",
            "--json",
            "--full-stacks",
            &f("snapshots/v2_1_basic.pickle"),
            &f("snapshots/v2_11_full.pickle"),
        ])],
    );
}

#[test]
fn every_documented_tree_field_is_in_real_output() {
    check(
        "tree.md",
        &[args(&[
            "tree",
            "--json",
            "--depth",
            "3",
            &f("snapshots/demo_oom.pickle"),
        ])],
    );
}

/// A temporary folder of this test, removed when it ends.
fn temp_dir(name: &str) -> Scratch {
    Scratch::new(&format!("json-ref-{name}"))
}

/// Every key of the JSON document in `path`.
fn file_keys(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).expect("the document was written");
    let doc: Value = serde_json::from_str(&text).expect("one JSON document");
    let mut seen = BTreeSet::new();
    keys(&doc, &mut seen);
    seen
}

#[test]
fn every_documented_plan_pack_and_checkpoint_field_is_in_real_output() {
    let config = f("examples/tinyllama-1.1b/config.json");
    check(
        "plan-pack.md",
        &[args(&[
            "plan",
            "pack",
            "--lengths",
            &f("examples/lengths.txt"),
            "--max-len",
            "2048",
            "--model",
            &config,
            "--json",
        ])],
    );
    check(
        "plan-checkpoint.md",
        &[args(&[
            "plan",
            "checkpoint",
            "--layers",
            &f("examples/layer-costs.json"),
            "--budget",
            "6GiB",
            "--json",
        ])],
    );
}

#[test]
fn every_documented_plan_field_is_in_real_output() {
    let dir = temp_dir("plan");
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
    // A step that holds 1 GiB at its peak and frees it, for `--calibrate`.
    let step = dir.join("step.pickle");
    let s = memprof::model::StreamIndex(0);
    let block =
        |action| memprof::model::TraceEntry::new(action, Some(0x7f00_0000_0000), 1 << 30, s);
    write_snapshot(
        &model_snapshot(
            vec![
                block(memprof::model::Action::Alloc),
                block(memprof::model::Action::FreeCompleted),
            ],
            Vec::new(),
            memprof::model::StackTable::default(),
            None,
        ),
        &step,
    );
    let step = step.display().to_string();
    let mut calibrated = train.to_vec();
    calibrated.extend(["--calibrate", &step, "--calibrate-seq-len", "16"]);
    check(
        "plan.md",
        &[
            args(&train),
            args(&calibrated),
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
}

#[test]
fn every_documented_baseline_and_export_field_is_in_real_output() {
    let dir = temp_dir("files");
    let baseline = dir.join("baseline.json");
    let out = memprof(&[
        "gate",
        &f("snapshots/v2_1_basic.pickle"),
        &f("snapshots/multi_device.pickle"),
        "--write-baseline",
        &baseline.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    check_keys("gate.md", &file_keys(&baseline));

    let mut seen = BTreeSet::new();
    for (input, name) in [
        ("snapshots/v2_11_full.pickle", "full.json"),
        ("recordings/peak_oom_v2.memprof", "recording.json"),
    ] {
        let path = dir.join(name);
        let out = memprof(&[
            "export",
            &f(input),
            "--to",
            "json",
            "-o",
            &path.display().to_string(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{input}: {}", stderr(&out));
        seen.extend(file_keys(&path));
    }
    check_keys("export.md", &seen);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_documented_attach_field_is_in_real_output() {
    let (mut child, mut stdin, runtime) = workload("json-ref-attach");
    let pid = child.0.id().to_string();
    let spawned = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args([
            "attach",
            &pid,
            "--json",
            "--duration",
            "30",
            "--interval",
            "0.2",
        ])
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memprof runs");
    let mut attach = Guard(spawned);
    // Let attach connect while allocations are alive, then let the workload finish: attach
    // ends with it.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    assert!(child.0.wait().expect("exits").success());
    let mut text = String::new();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut attach.0.stdout.take().expect("stdout"), &mut text)
        .expect("attach ends with the process");
    std::io::Read::read_to_string(&mut attach.0.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert_eq!(
        attach.0.wait().expect("attach exits").code(),
        Some(0),
        "{err}"
    );
    let doc: Value = serde_json::from_str(&text).expect("one JSON document");
    assert_eq!(doc["mode"], "shim", "{doc}");
    let mut seen = BTreeSet::new();
    keys(&doc, &mut seen);
    // Torch mode's fields: a Python job over the stand-in torch, attached through gdb.
    if !crate::attach_torch::ready() {
        return;
    }
    keys(&crate::attach_torch::torch_document(), &mut seen);
    check_keys("attach.md", &seen);
}

#[test]
fn every_documented_probe_field_is_in_real_output() {
    // The fake driver, as `libcuda.so` (the first name the CUDA loader tries) and `.so.1`.
    let dir = temp_dir("probe");
    let built = Command::new("cc")
        .args(["-O1", "-shared", "-fPIC", "-Wl,-Bsymbolic"])
        .args(["-Wl,-soname,libcuda.so.1", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(repo().join("kernels/fake_cuda/fake_cuda.c"))
        .arg("-lpthread")
        .output()
        .expect("cc runs");
    assert!(built.status.success(), "cc: {}", stderr(&built));
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libcuda.so")).expect("copy");
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["probe", "--json"])
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .expect("memprof runs");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    assert_eq!(doc["devices"][0]["name"], "Fake CUDA Device", "{doc}");
    let mut seen = BTreeSet::new();
    keys(&doc, &mut seen);
    check_keys("probe.md", &seen);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_documented_simulate_field_is_in_real_output() {
    check(
        "simulate.md",
        &[
            args(&["simulate", "--json", &f("snapshots/demo_oom.pickle")]),
            args(&[
                "simulate",
                "--json",
                "--validate",
                &f("snapshots/demo_oom.pickle"),
            ]),
            args(&["simulate", "--json", "--sweep", &f("snapshots/oom.pickle")]),
            args(&["simulate", "--json", &f("snapshots/segments_only.pickle")]),
        ],
    );
}
