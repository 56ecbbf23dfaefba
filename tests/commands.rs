//! The command line contract: unbuilt subcommands say so and exit 2; usage errors exit 2.

use crate::util::{memprof, stderr};

#[test]
fn unbuilt_subcommands_refuse_with_exit_2() {
    let cases: [&[&str]; 2] = [&["view", "x.pickle"], &["top"]];
    for args in cases {
        let out = memprof(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&out).contains("is not built yet"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
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
