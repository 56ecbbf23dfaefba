//! The command line contract: usage errors and missing hardware exit 2 with one line.

use crate::util::{memprof, stderr};

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
