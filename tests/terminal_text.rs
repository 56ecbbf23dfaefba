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
