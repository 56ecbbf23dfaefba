//! Text from a file never reaches a terminal raw: a snapshot whose frame names, and a recording
//! whose host name, command line and mapping paths, carry terminal sequences and newlines;
//! `analyze` and `gate` print them escaped, in text and in Markdown.

use crate::util::{memprof, stderr, stdout, Scratch};
use memprof_wire::{encode_mapping, encode_stack, FileHeader, Kind, Mapping, ProcessInfo, Record};
use serde_json::json;
use std::path::Path;

/// Retitles the window, clears the screen, and starts a line of its own.
const HOSTILE: &str = "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m\r\nFAKE: all clear";

/// A fresh scratch folder for one test, removed when it ends.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("tty-{name}"))
}

/// No control character but line breaks, and no C1 control; the sequences are there, escaped.
fn assert_no_raw_control(what: &str, text: &str) {
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| c.is_control() && c != '\n')
        .collect();
    assert!(raw.is_empty(), "{what}: raw {raw:?} in:\n{text}");
    assert!(
        text.contains("\\x1b]0;pwned\\x07"),
        "{what}: escaped:\n{text}"
    );
}

/// No line that the file started.
fn assert_no_fake_line(what: &str, text: &str) {
    assert!(
        !text.lines().any(|l| l.starts_with("FAKE")),
        "{what}: a line from the file:\n{text}"
    );
}

/// One device, one live 1 MiB (or `size`) block allocated at a frame named `HOSTILE`, in a
/// file named `HOSTILE` too.
fn snapshot(size: u64) -> Vec<u8> {
    let frames = json!([{"filename": format!("/home/u/{HOSTILE}.py"), "line": 3,
                          "name": HOSTILE}]);
    let snap = json!({
        "segments": [{"device": 0, "address": 4096, "total_size": 4194304,
            "stream": 0, "segment_type": "large", "frames": [],
            "blocks": [
                {"address": 4096, "size": size, "requested_size": size,
                 "state": "active_allocated", "frames": frames},
                {"address": 4096 + size, "size": 4194304 - size, "requested_size": 0,
                 "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 4096, "size": 4194304, "stream": 0,
             "time_us": 1000, "frames": []},
            {"action": "alloc", "addr": 4096, "size": size, "stream": 0,
             "time_us": 1001, "frames": frames}]]
    });
    serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).expect("pickle")
}

/// A recording of one allocation at a stack in a mapping whose path is `HOSTILE`, from a
/// process whose host name and command line are too.
fn recording() -> Vec<u8> {
    let mut out = FileHeader {
        pid: 4242,
        start_ns: 1,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(
        &ProcessInfo {
            wall_start_ns: Some(1_700_000_000_000_000_000),
            host: Some(format!("gpu-7{HOSTILE}")),
            args: vec!["python".into(), format!("train.py{HOSTILE}"), "a b".into()],
        }
        .encode(),
    );
    out.extend_from_slice(&encode_mapping(&Mapping {
        start: 0x40_0000,
        len: 0x1000,
        file_offset: 0,
        path: format!("/opt/{HOSTILE}.so").into_bytes(),
    }));
    out.extend_from_slice(&encode_stack(1, &[0x40_0100]));
    let mut alloc = Record::new(Kind::Alloc);
    alloc.ts_ns = 2;
    alloc.ptr = 0x7f00_0000_0000;
    alloc.size = 1 << 20;
    alloc.device = 0;
    alloc.stack = 1;
    out.extend_from_slice(&alloc.encode());
    let mut end = Record::new(Kind::Trailer);
    end.size = 1;
    out.extend_from_slice(&end.encode());
    out
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn analyze_escapes_frames_host_command_and_mappings() {
    let dir = scratch("analyze");
    let snap = dir.join("hostile.pickle");
    std::fs::write(&snap, snapshot(1 << 20)).expect("written");
    let rec = dir.join("hostile.memprof");
    std::fs::write(&rec, recording()).expect("written");
    for input in [&snap, &rec] {
        let out = memprof(&["analyze", &path(input)]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_no_raw_control(&path(input), &stdout(&out));
    }
    // The header lines: the host name and the command line, quoted words kept apart. (Frame
    // names, mapping paths among them, are the device sections' to escape.)
    let text = stdout(&memprof(&["analyze", &path(&rec)]));
    let header: String = text
        .lines()
        .take_while(|l| !l.starts_with("device "))
        .collect::<Vec<_>>()
        .join("\n");
    assert_no_fake_line("analyze header", &header);
    let escaped = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\r\\nFAKE: all clear";
    assert!(
        header.contains(&format!(
            "process 4242 on gpu-7{escaped}: python 'train.py{escaped}' 'a b'"
        )),
        "{header}"
    );
    // Both inputs at once: the comparison names them.
    let out = memprof(&["analyze", &path(&snap), &path(&rec)]);
    assert_no_raw_control("comparison", &stdout(&out));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gate_escapes_frames_in_text_and_markdown() {
    let dir = scratch("gate");
    let (small, big) = (dir.join("small.pickle"), dir.join("big.pickle"));
    std::fs::write(&small, snapshot(1 << 20)).expect("written");
    std::fs::write(&big, snapshot(3 << 20)).expect("written");
    let base = path(&dir.join("base.json"));
    let write = memprof(&["gate", &path(&small), "--write-baseline", &base]);
    assert_eq!(write.status.code(), Some(0), "{}", stderr(&write));
    let md = dir.join("gate.md");
    let out = memprof(&[
        "gate",
        &path(&big),
        "--baseline",
        &base,
        "--markdown",
        &path(&md),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("sites that grew most"), "{text}");
    assert_no_raw_control("gate text", &text);
    assert_no_fake_line("gate text", &text);
    let markdown = std::fs::read_to_string(&md).expect("markdown written");
    assert_no_raw_control("gate markdown", &markdown);
    assert_no_fake_line("gate markdown", &markdown);
    std::fs::remove_dir_all(&dir).ok();
}

/// Copies the clipboard (OSC 52), rings the bell, and carries a NUL, U+FFFE and U+FFFF (which
/// XML forbids) and a C1 CSI.
const CLIPBOARD: &str = "\u{1b}]52;c;cHduZWQ=\u{7}\u{0}\u{fffe}\u{ffff}\u{9b}2J";
/// The same in a file name (which cannot hold a NUL).
const CLIPBOARD_NAME: &str = "\u{1b}]52;c;cHduZWQ=\u{7}\u{fffe}\u{ffff}\u{9b}2J";

/// `snapshot` whose trace ends in an OOM at a frame named `HOSTILE` and `CLIPBOARD`, with an
/// entry of an action named `HOSTILE` (skipped with a warning that names it).
fn oom_snapshot(size: u64) -> Vec<u8> {
    let frames = json!([{"filename": format!("/home/u/{HOSTILE}.py"), "line": 3,
                          "name": format!("{HOSTILE}{CLIPBOARD}")}]);
    let snap = json!({
        "segments": [{"device": 0, "address": 4096, "total_size": 4194304,
            "stream": 0, "segment_type": "large", "frames": [],
            "blocks": [
                {"address": 4096, "size": size, "requested_size": size,
                 "state": "active_allocated", "frames": frames},
                {"address": 4096 + size, "size": 4194304 - size, "requested_size": 0,
                 "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 4096, "size": 4194304, "stream": 0,
             "time_us": 1000, "frames": []},
            {"action": "alloc", "addr": 4096, "size": size, "stream": 0,
             "time_us": 1001, "frames": frames},
            {"action": HOSTILE, "addr": 0, "size": 1, "stream": 0, "time_us": 1002,
             "frames": []},
            {"action": "oom", "addr": 0, "size": 1u64 << 33, "stream": 0, "time_us": 1003,
             "device_free": 0, "frames": frames}]]
    });
    serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).expect("pickle")
}

/// No character that is not printable: controls but line breaks, C1 controls, U+FFFE, U+FFFF.
fn assert_printable(what: &str, text: &str) {
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| (c.is_control() && c != '\n') || matches!(c, '\u{fffe}' | '\u{ffff}'))
        .collect();
    assert!(raw.is_empty(), "{what}: raw {raw:?} in:\n{text}");
}

#[test]
fn diagnose_diff_warnings_and_plot_escape_frames_and_file_names() {
    let dir = scratch("diagnose");
    // The files' own names carry the sequences too.
    let small = dir.join(format!("small{CLIPBOARD_NAME}.pickle"));
    let big = dir.join(format!("big{HOSTILE}.pickle"));
    std::fs::write(&small, oom_snapshot(1 << 20)).expect("written");
    std::fs::write(&big, oom_snapshot(3 << 20)).expect("written");

    let out = memprof(&["diagnose", &path(&big)]);
    let text = stdout(&out);
    assert!(text.contains("OUT OF MEMORY"), "{text}\n{}", stderr(&out));
    assert!(text.contains("\\x1b]52;c;"), "the frame, escaped: {text}");
    for (what, text) in [("diagnose", text), ("diagnose stderr", stderr(&out))] {
        assert_printable(what, &text);
        assert_no_fake_line(what, &text);
    }
    assert!(
        stderr(&out).contains("warning") && stderr(&out).contains("unknown action"),
        "{}",
        stderr(&out)
    );

    let out = memprof(&["diff", &path(&small), &path(&big)]);
    assert!(out.status.code().is_some_and(|c| c < 2), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("\\x1b]0;pwned"), "the frame, escaped: {text}");
    for (what, text) in [("diff", text), ("diff stderr", stderr(&out))] {
        assert_printable(what, &text);
        assert_no_fake_line(what, &text);
    }

    let svg = dir.join(format!("timeline{CLIPBOARD_NAME}.svg"));
    let out = memprof(&["plot", &path(&big), "-o", &path(&svg)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with("wrote "), "{}", stdout(&out));
    for (what, text) in [("plot", stdout(&out)), ("plot stderr", stderr(&out))] {
        assert_printable(what, &text);
        assert_no_fake_line(what, &text);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `xmllint --noout FILE` (well-formedness): true when it passes.
fn well_formed(file: &Path) -> bool {
    let out = std::process::Command::new("xmllint")
        .arg("--noout")
        .arg(file)
        .output()
        .expect("xmllint runs");
    if !out.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    }
    out.status.success()
}

#[test]
fn junit_svg_and_markdown_stay_well_formed_with_hostile_frames_and_names() {
    let dir = scratch("documents");
    let small = dir.join("small.pickle");
    // Markup in the file's name: it must not reach the Markdown as HTML.
    let big = dir.join("<img src=x onerror=alert(1)>.pickle");
    std::fs::write(&small, oom_snapshot(1 << 20)).expect("written");
    std::fs::write(&big, oom_snapshot(3 << 20)).expect("written");
    let base = path(&dir.join("base.json"));
    let write = memprof(&["gate", &path(&small), "--write-baseline", &base]);
    assert_eq!(write.status.code(), Some(0), "{}", stderr(&write));
    let (junit, md) = (dir.join("gate.xml"), dir.join("gate.md"));
    let out = memprof(&[
        "gate",
        &path(&big),
        "--baseline",
        &base,
        "--junit",
        &path(&junit),
        "--markdown",
        &path(&md),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let xml = std::fs::read_to_string(&junit).expect("junit written");
    assert_printable("junit", &xml);
    let markdown = std::fs::read_to_string(&md).expect("markdown written");
    assert_printable("markdown", &markdown);
    assert!(!markdown.contains("<img"), "raw HTML: {markdown}");
    assert!(
        markdown.contains("&lt;img"),
        "the name, escaped: {markdown}"
    );

    let svg = dir.join("timeline.svg");
    let out = memprof(&["plot", &path(&big), "-o", &path(&svg)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let drawn = std::fs::read_to_string(&svg).expect("svg written");
    assert_printable("svg", &drawn);
    assert!(drawn.contains("\\x1b]0;pwned"), "the frame, escaped");

    let html = dir.join("report.html");
    let out = memprof(&["report", &path(&big), "-o", &path(&html)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_printable(
        "html",
        &std::fs::read_to_string(&html).expect("html written"),
    );

    if crate::util::have("xmllint") {
        assert!(well_formed(&junit), "junit is well-formed");
        assert!(well_formed(&svg), "svg is well-formed");
    }
    std::fs::remove_dir_all(&dir).ok();
}
