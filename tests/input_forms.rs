//! The forms an input comes in: a pipe (`/dev/stdin`, `<(…)`), read once as a stream; a
//! `torch.save` archive of a snapshot and a gzip-compressed snapshot or recording, which read
//! as the snapshot or recording inside; and other formats, refused by their name.

use crate::util::{fixture, memprof, stderr, stdout, Scratch};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_memprof"))
}

/// `memprof ARGS /dev/stdin` with `file` as its standard input (a pipe when `pipe`, else the
/// file itself).
fn with_stdin(args: &[&str], file: &Path, pipe: bool) -> Output {
    let bytes = std::fs::read(file).expect("fixture");
    let mut cmd = bin();
    cmd.args(args).arg("/dev/stdin");
    if !pipe {
        let opened = std::fs::File::open(file).expect("fixture");
        return cmd.stdin(opened).output().expect("runs");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    let mut input = child.stdin.take().expect("piped");
    // Written from a second thread: the pipe holds less than a snapshot.
    let writer = std::thread::spawn(move || {
        // memprof may stop reading early when it refuses the input.
        let _ = input.write_all(&bytes);
    });
    let out = child.wait_with_output().expect("runs");
    writer.join().expect("writer");
    out
}

/// `memprof analyze <(cat FILE)`: process substitution, as a shell user types it.
fn process_substitution(file: &Path) -> Output {
    Command::new("bash")
        .args(["-c", "\"$0\" analyze <(cat \"$1\")"])
        .arg(env!("CARGO_BIN_EXE_memprof"))
        .arg(file)
        .output()
        .expect("bash runs")
}

/// The report without its first line (the file's name and size).
fn body(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(out));
    let text = stdout(out);
    let (first, rest) = text.split_once('\n').expect("more than one line");
    assert!(first.contains("device"), "the file line: {first}");
    rest.to_string()
}

/// `analyze --json` of `path`, less what names the file (its path and size).
fn account(path: &Path) -> serde_json::Value {
    let out = memprof(&["analyze", "--json", &path.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let mut doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let input = doc["inputs"][0].as_object_mut().expect("an input");
    assert!(input.remove("path").is_some() && input.remove("bytes").is_some());
    doc
}

fn gzip(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).expect("fixture");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&bytes).expect("compressed");
    std::fs::write(to, gz.finish().expect("compressed")).expect("written");
}

fn assert_refused(out: &Output, want: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains(want), "says {want:?}: {err}");
}

#[test]
fn a_snapshot_or_recording_on_stdin_reads_as_the_file_does() {
    for name in [
        "snapshots/v2_11_full.pickle",
        "snapshots/demo_oom.pickle",
        "recordings/peak_oom_v2.memprof",
    ] {
        let file = fixture(name);
        let want = body(&memprof(&["analyze", &file.display().to_string()]));
        for pipe in [true, false] {
            let out = with_stdin(&["analyze"], &file, pipe);
            assert_eq!(body(&out), want, "{name} on stdin (pipe: {pipe})");
            // A pipe's size is the bytes read from it, a file's its length.
            let len = std::fs::metadata(&file).expect("fixture").len();
            let first = stdout(&out).lines().next().unwrap_or_default().to_string();
            let shown = memprof::model::Bytes(len).to_string();
            assert!(first.contains(&shown), "{name}: {first} says {shown}");
        }
        assert_eq!(body(&process_substitution(&file)), want, "<(cat {name})");
    }
    // diagnose, plot and the others open their input the same way.
    let file = fixture("snapshots/demo_oom.pickle");
    let out = with_stdin(&["diagnose", "--json"], &file, true);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn an_empty_pipe_is_an_empty_file() {
    let out = bin()
        .args(["analyze", "/dev/stdin"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_refused(&out, "the file is empty");
}

#[test]
fn a_torch_save_archive_reads_as_the_snapshot_it_holds() {
    // fixtures/torch_save/v2_11_full.pt: torch.save of the dict the pickle holds
    // (fixtures/gen/torch_save.py), its data.pkl's sizes given only after its data.
    let archive = fixture("torch_save/v2_11_full.pt");
    let pickle = fixture("snapshots/v2_11_full.pickle");
    assert_eq!(account(&archive), account(&pickle));
    let want = body(&memprof(&["analyze", &pickle.display().to_string()]));
    assert_eq!(
        body(&memprof(&["analyze", &archive.display().to_string()])),
        want
    );
    assert_eq!(body(&with_stdin(&["analyze"], &archive, true)), want);
    let diagnose = |path: &Path| {
        let shown = path.display().to_string();
        stdout(&memprof(&["diagnose", &shown])).replace(&shown, "FILE")
    };
    assert_eq!(diagnose(&archive), diagnose(&pickle));
}

#[test]
fn an_archive_of_tensors_is_refused_as_not_a_snapshot() {
    let out = memprof(&[
        "analyze",
        &fixture("torch_save/weights.pt").display().to_string(),
    ]);
    assert_refused(
        &out,
        "weights/data.pkl in the zip archive: refused opcode GLOBAL",
    );
    assert_refused(&out, "a memory snapshot is plain data");
}

#[test]
fn gzip_compressed_inputs_read_as_what_they_hold() {
    let dir = Scratch::new("gzip-inputs");
    for name in [
        "snapshots/demo_oom.pickle",
        "recordings/peak_oom_v2.memprof",
    ] {
        let file = fixture(name);
        let gz = dir.join(format!(
            "{}.gz",
            file.file_name().expect("a name").to_string_lossy()
        ));
        gzip(&file, &gz);
        assert_eq!(account(&gz), account(&file), "{name}.gz");
        assert_eq!(
            body(&process_substitution(&gz)),
            body(&memprof(&["analyze", &file.display().to_string()])),
            "<(cat {name}.gz)"
        );
    }
    // A pickle's error inside says where, in the decompressed bytes.
    let cut = dir.join("cut.pickle.gz");
    gzip(&fixture("invalid/truncated.pickle"), &cut);
    let out = memprof(&["analyze", &cut.display().to_string()]);
    assert_refused(&out, "once decompressed (gzip): truncated pickle");
}

#[test]
fn other_formats_are_named() {
    let dir = Scratch::new("other-formats");
    let json = fixture("invalid/snapshot.json");
    let json_gz = dir.join("snapshot.json.gz");
    gzip(&json, &json_gz);
    let not_gzip = dir.join("cut.gz");
    std::fs::write(&not_gzip, b"\x1f\x8b\x08\x00").expect("written");
    let trace = dir.join("trace.json");
    std::fs::write(&trace, b"\n{\"traceEvents\": []}").expect("written");
    // A zip archive holding one stored member, `notes.txt`.
    let mut zip = b"PK\x03\x04\x14\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00".to_vec();
    zip.extend_from_slice(&[2, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0]);
    zip.extend_from_slice(b"notes.txthiPK\x05\x06");
    let other_zip = dir.join("other.zip");
    std::fs::write(&other_zip, zip).expect("written");
    let cases: [(&Path, &str); 5] = [
        (
            &json,
            "not a snapshot or recording: JSON holding a snapshot's keys",
        ),
        (&json_gz, "gzip-compressed JSON holding a snapshot's keys"),
        (&not_gzip, "cannot decompress (gzip)"),
        (&trace, "JSON in the Chrome trace format"),
        (
            &other_zip,
            "a zip archive without data.pkl (members: notes.txt)",
        ),
    ];
    for (path, want) in cases {
        assert_refused(&memprof(&["analyze", &path.display().to_string()]), want);
    }
}
