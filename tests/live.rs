//! The shim's live socket: `peak_oom wait` runs under the shim with its own runtime directory and
//! stops in the middle; a client connects by the process's socket path (deeper than a socket
//! address holds), gets what is alive then (flagged as snapshot) and every record after, ending
//! with the trailer, and folding both through the recording reader gives the figures of the
//! file. The socket is gone at exit.

use crate::shim_preload::{deep_runtime_dir, kernels, shim};
use memprof::source::live::{processes_in, LiveClient, LiveEvent};
use memprof::source::recording::from_recording;
use memprof_wire::{decode_recording, Kind, Record, Recording, FLAG_SNAPSHOT};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Pointer and size of every segment the reader finds alive at the end of `records`.
fn alive(recording: &Recording, records: &[Record]) -> Vec<(u64, u64)> {
    let part = Recording {
        records: records.to_vec(),
        ..recording.clone()
    };
    let read = from_recording(&part).expect("readable");
    read.parsed
        .snapshot
        .segments
        .iter()
        .map(|s| (s.address, s.total_size))
        .collect()
}

#[test]
fn a_client_connecting_mid_run_gets_the_live_state_then_every_record() {
    let dir = kernels("live");
    // Deeper than a socket address holds: the shim listens and the client connects all the same.
    let runtime = deep_runtime_dir(&dir);
    let out = dir.join("live.memprof");
    let mut child = Command::new(dir.join("peak_oom"))
        .arg("wait")
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("MEMPROF_OUT", &out)
        .env("LD_PRELOAD", shim())
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("peak_oom runs");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let mut ready = String::new();
    lines.read_line(&mut ready).expect("a line");
    assert_eq!(ready, "ready\n");

    let sockets = runtime.join("memprof");
    let mode = std::fs::metadata(&sockets)
        .expect("socket dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "only the owner may enter");
    assert_eq!(processes_in(&sockets), [child.id()]);
    let path = sockets.join(format!("{}.sock", child.id()));
    assert!(path.as_os_str().len() > memprof_wire::MAX_SOCKET_PATH);

    // Connect only once the writer has drained the five records made before the wait, so
    // they are what the snapshot must hold (a truncated file decodes to what is whole).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::fs::read(&out)
        .ok()
        .and_then(|bytes| decode_recording(&bytes).ok())
        .is_none_or(|r| r.records.len() < 5)
    {
        assert!(std::time::Instant::now() < deadline, "the writer drains");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut client = LiveClient::connect_path(&path).expect("the shim listens");
    client
        .set_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    assert_eq!(client.header.pid, child.id());
    let process = client.process.clone().expect("a process block");
    assert_eq!(
        process.args,
        [dir.join("peak_oom").display().to_string(), "wait".into()]
    );

    // The header came after the shim accepted us: let the workload go on.
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    let (mut snapshot, mut stream) = (Vec::new(), Vec::new());
    let mut end = None;
    while let Some(event) = client.next_event().expect("the stream reads") {
        match event {
            LiveEvent::Record(r) if r.flags & FLAG_SNAPSHOT != 0 => {
                assert!(stream.is_empty(), "the snapshot comes first");
                snapshot.push(r);
            }
            LiveEvent::Record(r) => stream.push(r),
            LiveEvent::Lost(n) => panic!("{n} records lost on a small workload"),
            LiveEvent::CaughtUp => {
                assert!(stream.is_empty(), "the snapshot ends before the stream")
            }
            LiveEvent::End { dropped } => end = Some(dropped),
        }
    }
    assert!(child.wait().expect("exits").success());
    let mut said = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut said)
        .expect("stderr");
    assert!(!said.contains("memprof:"), "no word from the shim: {said}");
    assert_eq!(end, Some(0), "the trailer ends the stream");
    assert!(!path.exists(), "the socket is removed at exit");

    let file = decode_recording(&std::fs::read(&out).expect("written")).expect("decodes");
    assert_eq!(file.records.len(), 16);
    // The five records drained before the client connected became the snapshot; everything
    // after reached the client as recorded.
    let before = file.records.len() - stream.len();
    assert_eq!(before, 5, "{} records streamed", stream.len());
    assert_eq!(stream, file.records[before..]);
    let unflagged: Vec<Record> = snapshot
        .iter()
        .map(|r| Record {
            flags: r.flags & !FLAG_SNAPSHOT,
            ..*r
        })
        .collect();
    assert_eq!(
        alive(&file, &unflagged),
        alive(&file, &file.records[..before]),
        "the snapshot holds what was alive"
    );
    let kinds: Vec<Kind> = snapshot.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [Kind::Alloc, Kind::Alloc, Kind::MemGetInfo],
        "b, c, free memory"
    );
    // Snapshot then stream: the state the file ends with.
    let joined: Vec<Record> = unflagged.into_iter().chain(stream).collect();
    assert_eq!(alive(&file, &joined), alive(&file, &file.records));
    assert_eq!(
        alive(&file, &joined).iter().map(|&(_, s)| s).sum::<u64>(),
        232_768
    );
}
