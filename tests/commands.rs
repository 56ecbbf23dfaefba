//! The command line contract: usage errors and missing hardware exit 2 with one line; every
//! file written is announced as `wrote PATH`; a closed stdout ends a command quietly.

use crate::util::{fixture, memprof, stderr, stdout, Scratch};
use std::process::{Command, Stdio};

#[test]
fn top_without_nvml_or_a_terminal_says_so_and_exits_2() {
    let out = memprof(&["top"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // Without a driver (CI) NVML is missing; with one, the test's pipe is not a terminal.
    assert!(
        err.contains("cannot sample GPUs: NVML is not available")
            || err.contains("needs a terminal"),
        "{err}"
    );
    let out = memprof(&["top", "--interval", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--interval 0"), "{}", stderr(&out));
}

#[test]
fn view_needs_a_terminal_and_says_so() {
    let out = memprof(&["view", "fixtures/snapshots/demo_oom.pickle"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs a terminal; for text or JSON use `memprof analyze`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(memprof(&["analyze"]).status.code(), Some(2));
    assert_eq!(memprof(&["no-such-command"]).status.code(), Some(2));
    assert_eq!(
        memprof(&["analyze", "--top", "many", "x"]).status.code(),
        Some(2)
    );
}

#[test]
fn help_lists_every_subcommand() {
    let out = memprof(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "analyze", "simulate", "diagnose", "run", "attach", "top", "view", "plan", "gate",
        "export", "agent", "probe",
    ] {
        assert!(text.contains(sub), "{sub} in --help");
    }
}

const DEMO: &str = "fixtures/snapshots/demo_oom.pickle";

#[test]
fn every_file_written_is_announced_as_wrote_path() {
    let dir = Scratch::new("wrote");
    let demo = fixture("snapshots/demo_oom.pickle").display().to_string();
    let at = |name: &str| dir.join(name).display().to_string();
    // Commands whose product is the file: the line is their stdout.
    for (args, file) in [
        (vec!["plot", &demo, "-o"], at("plot.svg")),
        (vec!["plot", &demo, "--output"], at("plot.png")),
        (vec!["report", &demo, "-o"], at("report.html")),
        (
            vec!["export", &demo, "--to", "json", "-o"],
            at("export.json"),
        ),
        (
            vec!["export", &demo, "--to", "perfetto", "--output"],
            at("trace.json"),
        ),
        (vec!["gate", &demo, "--write-baseline"], at("base.json")),
    ] {
        let mut args = args.clone();
        args.push(&file);
        let out = memprof(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), format!("wrote {file}\n"), "{args:?}");
        assert!(
            std::fs::metadata(&file).is_ok_and(|m| m.len() > 0),
            "{file}"
        );
    }
    // A file beside a report: the line goes to stderr, stdout keeps the JSON document alone.
    let plot = at("analyze.svg");
    let out = memprof(&["analyze", "--json", &demo, "--plot", &plot]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), format!("wrote {plot}\n"));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is JSON alone");
    let bars = at("plan.svg");
    let out = memprof(&[
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
        "--json",
        "--plot",
        &bars,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), format!("wrote {bars}\n"));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is JSON alone");
}

#[test]
fn a_closed_stdout_ends_quietly_with_exit_0() {
    let dir = Scratch::new("closed-pipe");
    let at = |name: &str| dir.join(name).display().to_string();
    let commands: Vec<Vec<String>> = [
        vec!["analyze", DEMO],
        vec!["analyze", "--json", DEMO],
        vec!["diagnose", DEMO],
        vec!["diagnose", "--json", DEMO],
        vec!["simulate", DEMO],
        vec!["simulate", "--json", DEMO],
        vec![
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
        ],
        vec![
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
            "--json",
        ],
        vec![
            "plan",
            "kv",
            "--model",
            "llama-3-8b",
            "--gpu-memory",
            "80GiB",
        ],
        vec!["gate", DEMO, "--limit", "1GiB"],
        vec!["--help"],
    ]
    .iter()
    .map(|a| a.iter().map(|s| s.to_string()).collect())
    .chain([
        vec!["plot".into(), DEMO.into(), "-o".into(), at("p.svg")],
        vec!["report".into(), DEMO.into(), "-o".into(), at("r.html")],
        vec![
            "gate".into(),
            DEMO.into(),
            "--write-baseline".into(),
            at("b.json"),
        ],
    ])
    .collect();
    for args in commands {
        // The reading end is closed before memprof writes: every write fails with EPIPE, as
        // under `| head` once head has exited.
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
            .args(&args)
            .current_dir(crate::util::repo())
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("memprof runs");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}
