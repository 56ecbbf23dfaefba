//! `memprof gate` end to end: pass, regression, limit, errors, baseline round trip, and the
//! JUnit and Markdown files.

use crate::util::{fixture, have, memprof, stderr, stdout};
use std::path::PathBuf;

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("memprof-gate-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scratch(dir)
    }

    fn path(&self, file: &str) -> String {
        self.0.join(file).display().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn snapshot(name: &str) -> String {
    fixture(&format!("snapshots/{name}.pickle"))
        .display()
        .to_string()
}

/// Writes `base.json` from v2_1_basic in `dir`, then gates v2_11_full (a regression) against
/// it with `gate.xml` and `gate.md` asked for; returns the run and those two paths.
fn regression_against_v2_1_basic(dir: &Scratch) -> (std::process::Output, String, String) {
    let base = dir.path("base.json");
    let write = memprof(&["gate", &snapshot("v2_1_basic"), "--write-baseline", &base]);
    assert_eq!(write.status.code(), Some(0), "{}", stderr(&write));
    let (junit, md) = (dir.path("gate.xml"), dir.path("gate.md"));
    let worse = memprof(&[
        "gate",
        &snapshot("v2_11_full"),
        "--baseline",
        &base,
        "--junit",
        &junit,
        "--markdown",
        &md,
    ]);
    (worse, junit, md)
}

#[test]
fn same_run_passes_and_a_regression_fails_naming_the_sites_that_grew() {
    let dir = Scratch::new("regress");
    let (worse, junit, md) = regression_against_v2_1_basic(&dir);
    let base = dir.path("base.json");
    let same = memprof(&["gate", &snapshot("v2_1_basic"), "--baseline", &base]);
    assert_eq!(same.status.code(), Some(0), "{}", stdout(&same));
    assert!(stdout(&same).starts_with("memprof gate: PASS"));

    assert_eq!(worse.status.code(), Some(1));
    let text = stdout(&worse);
    assert!(
        text.starts_with("memprof gate: FAIL (1 of 1 check failed)"),
        "{text}"
    );
    assert!(
        text.contains(
            "peak requested grew from 34.09 MiB to 92.10 MiB (+170.1%), more than the allowed +5.0%"
        ),
        "{text}"
    );
    assert!(
        text.contains("model.py:38:forward  (1.71 MiB -> 23.14 MiB)"),
        "{text}"
    );
    assert!(
        text.contains("train.py:96:train_step"),
        "the stack is shown: {text}"
    );

    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(xml.contains("<testsuite name=\"memprof gate\" tests=\"1\" failures=\"1\""));
    assert!(xml.contains("type=\"memory_regression\""));
    let summary = std::fs::read_to_string(&md).expect("markdown written");
    assert!(summary.contains("| 0 | v2_11_full.pickle | 0 | peak requested | 34.09 MiB | 92.10 MiB | +170.1% | **fail** |"), "{summary}");

    let loose = memprof(&[
        "gate",
        &snapshot("v2_11_full"),
        "--baseline",
        &base,
        "--max-increase",
        "200%",
    ]);
    assert_eq!(loose.status.code(), Some(0), "{}", stdout(&loose));
}

/// Validates a JUnit file against `fixtures/schemas/junit.xsd` with libxml2's `xmllint`
/// (`.ci/run` installs it).
fn junit_is_valid(path: &str) -> bool {
    let schema = fixture("schemas/junit.xsd");
    let out = std::process::Command::new("xmllint")
        .args(["--noout", "--schema"])
        .arg(&schema)
        .arg(path)
        .output()
        .expect("xmllint runs");
    out.status.success()
}

#[test]
fn junit_validates_against_the_schema_and_markdown_matches_its_snapshot() {
    let dir = Scratch::new("formats");
    let (worse, junit, md) = regression_against_v2_1_basic(&dir);
    assert_eq!(worse.status.code(), Some(1), "{}", stderr(&worse));
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert!(
        xml.contains("train.py:96:train_step"),
        "stacks in the failure: {xml}"
    );
    let summary = std::fs::read_to_string(&md).expect("markdown written");
    insta::assert_snapshot!("markdown_regression", summary);

    // A passing run over two devices, and the failing one above, are valid JUnit; a copy
    // without the required `errors` count is not (the validator really checks).
    let two = dir.path("two.xml");
    let mbase = dir.path("multi.json");
    assert_eq!(
        memprof(&[
            "gate",
            &snapshot("multi_device"),
            "--write-baseline",
            &mbase
        ])
        .status
        .code(),
        Some(0)
    );
    let pass = memprof(&[
        "gate",
        &snapshot("multi_device"),
        "--baseline",
        &mbase,
        "--junit",
        &two,
    ]);
    assert_eq!(pass.status.code(), Some(0), "{}", stderr(&pass));
    let broken = dir.path("broken.xml");
    std::fs::write(
        &broken,
        xml.replacen(" errors=\"0\" skipped", " skipped", 1),
    )
    .expect("write broken copy");
    if have("xmllint") {
        assert!(junit_is_valid(&junit), "the failing run's JUnit is valid");
        assert!(junit_is_valid(&two), "the passing run's JUnit is valid");
        assert!(
            !junit_is_valid(&broken),
            "a testsuite without errors= is rejected"
        );
    }
}

/// A dump without a trace has no peak: the gate compares the dump's figures and says so, as
/// `analyze` does, instead of calling them a peak.
#[test]
fn without_a_trace_the_gate_names_the_dump_not_a_peak() {
    let out = memprof(&["gate", &snapshot("segments_only"), "--limit", "1KiB"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("limited to 1.00 KiB but requested at the dump (no trace, peak not known) was 60.58 MiB"),
        "{text}"
    );
    assert!(text.contains("largest sites at the dump:"), "{text}");
    assert!(!text.contains("peak requested"), "{text}");
}

#[test]
fn absolute_limit_and_the_reserved_metric() {
    let low = memprof(&["gate", &snapshot("v2_1_basic"), "--limit", "10MiB"]);
    assert_eq!(low.status.code(), Some(1));
    assert!(stdout(&low).contains("limited to 10.00 MiB but peak requested was 34.09 MiB"));
    // With no baseline to grow from, the largest sites at the peak are named.
    assert!(
        stdout(&low)
            .contains("largest sites at the peak:\n            13.99 MiB  train.py:104:train_step"),
        "{}",
        stdout(&low)
    );
    let reserved = memprof(&[
        "gate",
        &snapshot("v2_1_basic"),
        "--limit",
        "60MiB",
        "--metric",
        "peak-reserved",
    ]);
    assert_eq!(reserved.status.code(), Some(0), "{}", stdout(&reserved));
    assert!(stdout(&reserved).contains("peak reserved 54.00 MiB"));
}

#[test]
fn process_peak_is_the_whole_process_from_a_recording_and_refused_for_a_snapshot() {
    let recording = fixture("recordings/ledger.memprof").display().to_string();
    // 48 MiB from the driver (PyTorch 32, the NCCL stand-in 16) and a 312 MiB context.
    let over = memprof(&[
        "gate",
        &recording,
        "--metric",
        "process_peak",
        "--limit",
        "350MiB",
    ]);
    assert_eq!(over.status.code(), Some(1), "{}", stderr(&over));
    assert!(
        stdout(&over).contains("limited to 350.00 MiB but process peak was 360.00 MiB"),
        "{}",
        stdout(&over)
    );
    let under = memprof(&[
        "gate",
        &recording,
        "--metric",
        "process-peak",
        "--limit",
        "360MiB",
    ]);
    assert_eq!(under.status.code(), Some(0), "{}", stdout(&under));
    let snapshot = memprof(&[
        "gate",
        &snapshot("v2_1_basic"),
        "--metric",
        "process-peak",
        "--limit",
        "1GiB",
    ]);
    assert_eq!(snapshot.status.code(), Some(2));
    assert!(stderr(&snapshot).contains("needs a memprof recording"));
}

#[test]
fn analyze_json_is_accepted_as_the_current_run() {
    let dir = Scratch::new("json");
    let base = dir.path("base.json");
    let json = dir.path("analyze.json");
    let analyzed = memprof(&["analyze", "--json", &snapshot("multi_device")]);
    std::fs::write(&json, &analyzed.stdout).expect("write analyze json");
    assert_eq!(
        memprof(&["gate", &snapshot("multi_device"), "--write-baseline", &base])
            .status
            .code(),
        Some(0)
    );
    let out = memprof(&["gate", &json, "--baseline", &base]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("(0 of 2 checks failed)"),
        "both devices checked: {}",
        stdout(&out)
    );
}

#[test]
fn bad_and_mismatched_inputs_exit_2() {
    let dir = Scratch::new("bad");
    let base = dir.path("base.json");
    assert_eq!(
        memprof(&["gate", &snapshot("v2_1_basic"), "--write-baseline", &base])
            .status
            .code(),
        Some(0)
    );

    let other_device = memprof(&["gate", &snapshot("multi_device"), "--baseline", &base]);
    assert_eq!(other_device.status.code(), Some(2));
    assert!(
        stderr(&other_device).contains("is not in the baseline"),
        "{}",
        stderr(&other_device)
    );

    let text = std::fs::read_to_string(&base).expect("baseline");
    let newer = dir.path("newer.json");
    std::fs::write(
        &newer,
        text.replace("\"schema_version\": 1", "\"schema_version\": 9"),
    )
    .expect("write");
    let out = memprof(&["gate", &snapshot("v2_1_basic"), "--baseline", &newer]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("schema_version 9 is not supported"),
        "{}",
        stderr(&out)
    );

    let nothing = memprof(&["gate", &snapshot("v2_1_basic")]);
    assert_eq!(nothing.status.code(), Some(2));
    assert!(stderr(&nothing).contains("nothing to compare against"));

    let bad_percent = memprof(&[
        "gate",
        &snapshot("v2_1_basic"),
        "--baseline",
        &base,
        "--max-increase",
        "lots",
    ]);
    assert_eq!(bad_percent.status.code(), Some(2));

    let broken = memprof(&[
        "gate",
        &fixture("invalid/truncated.pickle").display().to_string(),
        "--baseline",
        &base,
    ]);
    assert_eq!(broken.status.code(), Some(2));
    assert!(stderr(&broken).contains("truncated pickle"));
}

/// `--metric left-alive`: what the trace allocated and did not free by its end (a test's leak,
/// when the history starts with the test), in the baseline and against a limit, with the sites
/// that left it.
#[test]
fn left_alive_is_what_the_trace_allocated_and_did_not_free() {
    let dir = Scratch::new("left-alive");
    let base = dir.path("base.json");
    let write = memprof(&["gate", &snapshot("v2_1_basic"), "--write-baseline", &base]);
    assert_eq!(write.status.code(), Some(0), "{}", stderr(&write));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&base).expect("baseline")).expect("JSON");
    // Counted from the pickle apart (device 0's `alloc` entries without a later
    // `free_completed` of their address): 21 allocations, 7339764 bytes.
    let m = &doc["measurements"][0];
    assert_eq!(m["left_alive_bytes"], 7_339_764, "{m}");
    assert_eq!(
        m["left_alive_sites"][0]["frame"],
        "Functions.cpp:torch::autograd::generated::MmBackward0::apply"
    );

    let over = memprof(&[
        "gate",
        &snapshot("v2_1_basic"),
        "--metric",
        "left-alive",
        "--limit",
        "1MiB",
    ]);
    assert_eq!(over.status.code(), Some(1), "{}", stderr(&over));
    let text = stdout(&over);
    assert!(
        text.contains("limited to 1.00 MiB but left alive was 7.00 MiB"),
        "{text}"
    );
    assert!(text.contains("sites that left most alive:\n             7.00 MiB  Functions.cpp:"));
    let within = memprof(&[
        "gate",
        &snapshot("v2_1_basic"),
        "--metric",
        "left-alive",
        "--baseline",
        &base,
        "--max-increase",
        "0%",
    ]);
    assert_eq!(within.status.code(), Some(0), "{}", stdout(&within));
}

/// An analyze document does not hold what a trace left alive: `--metric left-alive` refuses it
/// rather than reading 0 B and passing.
#[test]
fn left_alive_refuses_an_analyze_document() {
    let dir = Scratch::new("left-alive-json");
    let json = dir.path("analyzed.json");
    let analyzed = memprof(&["analyze", "--json", &snapshot("v2_1_basic")]);
    std::fs::write(&json, &analyzed.stdout).expect("write analyze json");
    let refused = memprof(&["gate", &json, "--metric", "left-alive", "--limit", "1MiB"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    let message = stderr(&refused);
    assert!(
        message.contains(
            "analyzed.json: an analyze --json document does not hold what the trace left alive"
        ),
        "{message}"
    );
    // `diff --metric left-alive` too, which compared 0 B with 0 B and passed.
    let refused = memprof(&["diff", "--metric", "left-alive", &json, &json]);
    assert_eq!(refused.status.code(), Some(2), "{}", stdout(&refused));
    assert!(stderr(&refused).contains("does not hold what the trace left alive"));
}

/// `diff --metric left-alive` speaks of what was left alive at the end, not of the peak.
#[test]
fn diff_of_what_was_left_alive_names_it() {
    let out = memprof(&[
        "diff",
        "--metric",
        "left-alive",
        &snapshot("v2_1_basic"),
        &snapshot("demo_oom"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("device 0: left alive 7.00 MiB -> 14.09 GiB"),
        "{text}"
    );
    assert_eq!(lines[1], "  left more alive at the end, largest first:");
}
