//! Small snapshots that share one object thousands of times through the pickle memo: memprof
//! keeps what it holds within its stated bound (`torch_snapshot::PER_INPUT_BYTE` bytes per
//! file byte plus `torch_snapshot::FLOOR`), refusing with one line beyond it, and reads shared
//! values that fit once.

use crate::util::{stderr, Scratch};
use memprof::report::export::pickle::PickleWriter;
use memprof::source::torch_snapshot::{FLOOR, PER_INPUT_BYTE};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output};

type Writer = PickleWriter<Vec<u8>>;

/// One block dict referenced `per_segment` times by one segment, referenced `segments` times.
fn shared_blocks(segments: usize, per_segment: usize) -> std::io::Result<Vec<u8>> {
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(2)?;
    w.key("segments")?;
    w.begin_list(segments)?;
    w.item()?;
    let segment = w.begin_dict(6)?;
    for (key, value) in [("address", 0), ("total_size", 512), ("device", 0)] {
        w.key(key)?;
        w.int(value)?;
    }
    w.key("stream")?;
    w.int(0)?;
    w.key("segment_type")?;
    w.str("large")?;
    w.key("blocks")?;
    w.begin_list(per_segment)?;
    w.item()?;
    let block = w.begin_dict(3)?;
    w.key("address")?;
    w.int(0)?;
    w.key("size")?;
    w.int(512)?;
    w.key("state")?;
    w.str("active_allocated")?;
    w.end()?;
    for _ in 1..per_segment {
        w.item()?;
        w.get(block)?;
    }
    w.end()?;
    w.end()?;
    for _ in 1..segments {
        w.item()?;
        w.get(segment)?;
    }
    w.end()?;
    w.key("device_traces")?;
    w.begin_list(0)?;
    w.end()?;
    w.end()?;
    w.finish()
}

/// `annotations` annotation dicts whose names are all one string of `text` bytes.
fn shared_annotation_text(annotations: usize, text: usize) -> std::io::Result<Vec<u8>> {
    let name = "n".repeat(text);
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(3)?;
    empty_segments_and_traces(&mut w)?;
    w.key("external_annotations")?;
    w.begin_list(annotations)?;
    for i in 0..annotations {
        w.item()?;
        w.begin_dict(4)?;
        w.key("device")?;
        w.int(0)?;
        w.key("time_us")?;
        w.int(i as i128)?;
        w.key("stage")?;
        w.str("START")?;
        w.key("name")?;
        w.str(&name)?;
        w.end()?;
    }
    w.end()?;
    w.end()?;
    w.finish()
}

/// `entries` alloc entries whose `forward_frames` list is one list holding `refs` references to
/// one string of `text` bytes (one entry: the file; many: a list shared as PyTorch
/// may share it).
fn shared_forward_frames(entries: usize, refs: usize, text: usize) -> std::io::Result<Vec<u8>> {
    let frame = "f".repeat(text);
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(2)?;
    w.key("segments")?;
    w.begin_list(0)?;
    w.end()?;
    w.key("device_traces")?;
    w.begin_list(1)?;
    w.item()?;
    w.begin_list(entries)?;
    let mut list = None;
    for i in 0..entries {
        w.item()?;
        w.begin_dict(6)?;
        w.key("action")?;
        w.str("alloc")?;
        for (key, value) in [("addr", 512 * i as i128), ("size", 512), ("stream", 0)] {
            w.key(key)?;
            w.int(value)?;
        }
        w.key("frames")?;
        w.begin_list(0)?;
        w.end()?;
        w.key("forward_frames")?;
        match list {
            Some(id) => w.get(id)?,
            None => {
                list = Some(w.begin_list(refs)?);
                for _ in 0..refs {
                    w.item()?;
                    w.str(&frame)?;
                }
                w.end()?;
            }
        }
        w.end()?;
    }
    w.end()?;
    w.end()?;
    w.end()?;
    w.finish()
}

/// A trace list naming each of two alloc entries `refs` times (one with a frames list, which
/// the reader takes when it is appended; one flat, which it takes as it is decoded), then
/// two segments of one block each.
fn shared_entries(refs: usize) -> std::io::Result<Vec<u8>> {
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(2)?;
    w.key("device_traces")?;
    w.begin_list(1)?;
    w.item()?;
    w.begin_list(2 * refs)?;
    let mut entries = [None, None];
    for (i, with_frames) in [(0, true), (1, false)] {
        for _ in 0..refs {
            w.item()?;
            if let Some(id) = entries[i] {
                w.get(id)?;
                continue;
            }
            entries[i] = Some(w.begin_dict(4 + with_frames as usize)?);
            w.key("action")?;
            w.str("alloc")?;
            for (key, value) in [("addr", 512 * i as i128), ("size", 512), ("stream", 0)] {
                w.key(key)?;
                w.int(value)?;
            }
            if with_frames {
                crate::util::write_one_frame(&mut w)?;
            }
            w.end()?;
        }
    }
    w.end()?;
    w.end()?;
    w.key("segments")?;
    w.begin_list(2)?;
    for address in [0, 4 << 20] {
        w.item()?;
        w.begin_dict(6)?;
        for (key, value) in [("address", address), ("total_size", 2 << 20), ("device", 0)] {
            w.key(key)?;
            w.int(value)?;
        }
        w.key("stream")?;
        w.int(0)?;
        w.key("segment_type")?;
        w.str("large")?;
        w.key("blocks")?;
        w.begin_list(1)?;
        w.item()?;
        w.begin_dict(3)?;
        w.key("address")?;
        w.int(address)?;
        w.key("size")?;
        w.int(2 << 20)?;
        w.key("state")?;
        w.str("active_allocated")?;
        w.end()?;
        w.end()?;
        w.end()?;
    }
    w.end()?;
    w.end()?;
    w.finish()
}

/// A trace list holding one flat alloc entry and `dups` copies of it made by DUP (one byte
/// each, where a memo reference takes two): the cheapest way a pickle names a dict again.
fn duplicated_entry(dups: usize) -> Vec<u8> {
    fn text(out: &mut Vec<u8>, s: &str) {
        out.push(b'X');
        out.extend((s.len() as u32).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut out = b"\x80\x02}(".to_vec();
    text(&mut out, "segments");
    out.push(b']');
    text(&mut out, "device_traces");
    out.extend(b"]](}(");
    text(&mut out, "action");
    text(&mut out, "alloc");
    text(&mut out, "addr");
    out.extend(b"K\x00");
    text(&mut out, "size");
    out.extend(b"K\x01u");
    out.extend(std::iter::repeat_n(b'2', dups));
    out.extend(b"eau.");
    out
}

fn empty_segments_and_traces(w: &mut Writer) -> std::io::Result<()> {
    w.key("segments")?;
    w.begin_list(0)?;
    w.end()?;
    w.key("device_traces")?;
    w.begin_list(1)?;
    w.item()?;
    w.begin_list(0)?;
    w.end()?;
    w.end()
}

/// Address space allowed to memprof on an input of `bytes`: the stated bound, plus room for
/// the program itself (its code, debug information and thread stacks).
fn address_space_for(bytes: usize) -> u64 {
    bytes as u64 * PER_INPUT_BYTE + FLOOR + (1 << 30)
}

/// `memprof ARGS FILE` with its address space capped for the size of `file`: a run that needs
/// more memory than the bound allows fails to allocate and aborts.
fn memprof_capped(args: &[&str], file: &Path) -> Output {
    let bytes = std::fs::metadata(file).expect("written").len() as usize;
    let cap = address_space_for(bytes);
    let mut command = Command::new(env!("CARGO_BIN_EXE_memprof"));
    command.args(args).arg(file);
    // SAFETY: setrlimit is async-signal-safe and only changes the child's own limit.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: cap,
                rlim_max: cap,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.output().expect("memprof runs")
}

/// Refused in one line that says why and names `place`, where in the file it went wrong.
fn assert_refused(out: &Output, file: &Path, place: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{}: {err}", file.display());
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("expands past memprof's bound"),
        "says why: {err}"
    );
    assert!(lines[0].contains(place), "names where: {err}");
}

#[test]
fn a_segment_of_shared_blocks_shared_by_every_segment_is_refused_within_the_bound() {
    // 10,000 references to a segment whose block list holds 10,000 references to one block:
    // 10^8 blocks from under 40 KB.
    let dir = Scratch::new("amplification_blocks");
    let file = dir.join("blocks.pickle");
    std::fs::write(&file, shared_blocks(10_000, 10_000).expect("written")).expect("written");
    let out = memprof_capped(&["analyze"], &file);
    assert_refused(&out, &file, "segments[");
}

#[test]
fn one_long_string_named_by_every_annotation_is_refused_within_the_bound() {
    let dir = Scratch::new("amplification_annotations");
    let file = dir.join("annotations.pickle");
    // The file named a 1 MiB string; a quarter of it expands as far past the bound
    // (500 MiB from 256 KiB) and the test writes it four times faster.
    let bytes = shared_annotation_text(2_000, 256 << 10).expect("written");
    std::fs::write(&file, bytes).expect("written");
    let out = memprof_capped(&["analyze"], &file);
    assert_refused(&out, &file, "external_annotations[");
}

#[test]
fn one_long_string_repeated_in_forward_frames_is_refused_within_the_bound() {
    let dir = Scratch::new("amplification_forward");
    let file = dir.join("forward.pickle");
    let bytes = shared_forward_frames(1, 1_000, 1 << 20).expect("written");
    std::fs::write(&file, bytes).expect("written");
    let out = memprof_capped(&["analyze"], &file);
    assert_refused(&out, &file, "device_traces[0][0]");
}

#[test]
fn forward_frames_shared_by_many_entries_are_read_once() {
    // 20,000 entries naming one list of 20 references to a 64 KiB string: 26 GB if copied per
    // entry and reference, 1.3 MB once; a file of 1.4 MB. Read, within the bound.
    let dir = Scratch::new("amplification_shared_forward");
    let file = dir.join("shared.pickle");
    let bytes = shared_forward_frames(20_000, 20, 64 << 10).expect("written");
    std::fs::write(&file, bytes).expect("written");
    let out = memprof_capped(&["analyze", "--json"], &file);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let device = &crate::util::devices(&doc)[0];
    assert_eq!(device["trace"]["entries"], 20_000, "{device}");
}

#[test]
fn one_trace_entry_named_thousands_of_times_is_a_row_each_time() {
    // A valid file: Python reads 10,000 entries. The references come in batches of 1,000
    // (APPENDS), as Python writes them; each names an entry the reader took already.
    let dir = Scratch::new("amplification_shared_entries");
    let file = dir.join("entries.pickle");
    std::fs::write(&file, shared_entries(5_000).expect("written")).expect("written");
    let out = memprof_capped(&["analyze", "--json"], &file);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let device = &crate::util::devices(&doc)[0];
    assert_eq!(device["trace"]["entries"], 10_000, "{device}");
    // The dicts after the shared entries are read as themselves.
    assert_eq!(device["segments"], 2, "{device}");
    assert_eq!(device["reserved_bytes"], 4 << 20, "{device}");
}

#[test]
fn one_trace_entry_duplicated_a_million_times_is_a_row_each_time_within_the_bound() {
    // A million one-byte DUPs of one entry: a row of 32 bytes each, as many bytes a byte as
    // the bound allows, so such a file is read in full, within it.
    let dir = Scratch::new("amplification_duplicated_entry");
    let file = dir.join("dup.pickle");
    std::fs::write(&file, duplicated_entry(1_000_000)).expect("written");
    let out = memprof_capped(&["analyze", "--json"], &file);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let device = &crate::util::devices(&doc)[0];
    assert_eq!(device["trace"]["entries"], 1_000_001, "{device}");
}
