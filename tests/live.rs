//! The shim's live socket: `peak_oom wait` runs under the shim with its own runtime directory and
//! stops in the middle; a client connects by the process's socket path (deeper than a socket
//! address holds), gets what is alive then (flagged as snapshot) and every record after, ending
//! with the trailer, and folding both through the recording reader gives the figures of the
//! file. The socket is gone at exit. Clients that connect and never read neither keep another
//! from attaching nor stay connected past the shim's timeout; a client that reads stays.

use crate::attach_shim::Guard;
use crate::shim_preload::{deep_runtime_dir, kernels, runtime_dir, shim};
use crate::util::{bind_socket, connect_socket, repo};
use memprof::source::live::{processes_in, LiveClient, LiveEvent};
use memprof::source::recording::from_recording;
use memprof_wire::{decode_recording, Kind, Record, Recording, FLAG_SNAPSHOT};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

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
    let (mut stacks, mut mappings) = (std::collections::BTreeMap::new(), Vec::new());
    let mut end = None;
    while let Some(event) = client.next_event().expect("the stream reads") {
        if let LiveEvent::Record(r) = &event {
            assert!(
                r.stack == 0 || stacks.contains_key(&r.stack),
                "{r:?} came before its stack"
            );
        }
        match event {
            LiveEvent::Stack { id, frames } => {
                assert!(stacks.insert(id, frames).is_none(), "stack {id} twice");
            }
            LiveEvent::Mapping(m) => mappings.push(m),
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
    // Connected late, the client still got every definition the file has, before their use.
    assert!(!file.stacks.is_empty());
    assert_eq!(stacks, file.stacks);
    assert_eq!(mappings, file.mappings);
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

/// `hold N` under the shim with a runtime directory of its own, once it has printed "ready"
/// (N allocations of 4096 bytes alive); with its stdin, to let it free them and exit, and the
/// path of its socket.
fn hold(dir: &Path, held: u64) -> (Guard, ChildStdin, PathBuf, PathBuf) {
    let runtime = runtime_dir(dir);
    let mut child = Command::new(dir.join("hold"))
        .arg(held.to_string())
        .env("MEMPROF_OUT", dir.join("hold.memprof"))
        .env("LD_PRELOAD", shim())
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("hold runs");
    let stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let guard = Guard(child);
    let mut ready = String::new();
    lines.read_line(&mut ready).expect("a line");
    assert_eq!(ready, "ready\n");
    let socket = runtime
        .join("memprof")
        .join(format!("{}.sock", guard.0.id()));
    (guard, stdin, runtime, socket)
}

/// Whether the shim closed `client`'s connection (seen without reading what it holds).
fn closed_by_the_shim(client: &UnixStream) -> bool {
    let mut poll = libc::pollfd {
        fd: client.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, and its count; a zero timeout returns at once.
    let ready = unsafe { libc::poll(&mut poll, 1, 0) };
    ready == 1 && poll.revents & (libc::POLLRDHUP | libc::POLLHUP) != 0
}

#[test]
fn eight_clients_that_never_read_do_not_keep_a_ninth_from_its_first_sample() {
    const HELD: u64 = 4_000;
    let dir = kernels("live-idle");
    let (child, mut stdin, runtime, socket) = hold(&dir, HELD);
    // Eight clients, as many as the shim serves, connect and never read.
    let idle: Vec<UnixStream> = (0..8)
        .map(|_| connect_socket(&socket).expect("connects"))
        .collect();
    let pid = child.0.id().to_string();
    for attempt in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
            .args(["attach", &pid, "--json", "--duration", "0.2"])
            .args(["--interval", "0.1"])
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .expect("memprof runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "attach {attempt}: {err}");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        let first = &doc["samples"][0]["devices"][0];
        assert_eq!(first["used"], HELD * 4096, "attach {attempt}: {first}");
    }
    // The first attach took the place of a client that had read nothing.
    let dropped = idle.iter().filter(|c| closed_by_the_shim(c)).count();
    assert!(dropped >= 1, "no idle client dropped");
    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    let mut child = child;
    assert!(child.0.wait().expect("exits").success());
}

#[test]
fn a_client_that_never_reads_is_dropped_after_the_timeout_and_a_reader_is_not() {
    let dir = kernels("live-stall");
    let (child, mut stdin, _runtime, socket) = hold(&dir, 100);
    let connected = Instant::now();
    let silent = connect_socket(&socket).expect("connects");
    let mut reader = LiveClient::connect_path(&socket).expect("the shim listens");
    reader
        .set_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut snapshot = 0;
    loop {
        match reader.next_event().expect("reads") {
            Some(LiveEvent::Record(_)) => snapshot += 1,
            // The definitions the snapshot's stacks need come before it.
            Some(LiveEvent::Stack { .. } | LiveEvent::Mapping(_)) => {}
            Some(LiveEvent::CaughtUp) => break,
            other => panic!("{other:?} before the end of the snapshot"),
        }
    }
    assert_eq!(snapshot, 100, "the 100 allocations held");
    while !closed_by_the_shim(&silent) {
        assert!(
            connected.elapsed() < Duration::from_secs(30),
            "the silent client is still connected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = connected.elapsed();
    assert!(waited >= Duration::from_secs(5), "dropped after {waited:?}");
    // The reader, idle all along with nothing to read, still gets the rest and the end.
    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    let mut frees = 0;
    let mut end = None;
    while let Some(event) = reader.next_event().expect("reads") {
        match event {
            LiveEvent::Record(r) if r.kind == Kind::Free => frees += 1,
            LiveEvent::End { dropped } => end = Some(dropped),
            _ => {}
        }
    }
    assert_eq!((frees, end), (100, Some(0)));
    let mut child = child;
    assert!(child.0.wait().expect("exits").success());
}

/// No test reaches a Unix socket by an address of its own making, which fits at CI's checkout
/// path and not at a deeper one (`/home/someone/projects/gpu-tools/memprof`): every connect and
/// bind in `tests/` goes through `util::connect_socket` or `util::bind_socket` (or
/// `memprof_wire::at_socket_path`, as memprof's own code does), which keep the address short.
#[test]
fn every_socket_in_the_tests_is_reached_through_the_short_address_helper() {
    let direct = [
        "UnixStream::connect",
        "UnixListener::bind",
        "UnixDatagram::bind",
        "UnixDatagram::connect",
        "AF_UNIX",
    ];
    let mut found = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("tests"))
        .expect("tests/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs" || x == "py"))
        .filter(|p| !p.ends_with("util.rs"))
        .collect();
    files.sort();
    assert!(files.len() > 10, "the tests are found: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if direct.iter().any(|d| line.contains(d))
                && !line.contains("at_socket_path")
                && !code.starts_with("//")
                && !code.starts_with('"')
            {
                found.push(format!("{}:{}: {code}", file.display(), n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "connect and bind through util::connect_socket and util::bind_socket instead:\n{}",
        found.join("\n")
    );

    // The helpers reach a socket deeper than an address holds.
    let scratch = crate::util::Scratch::new("deep-socket");
    let mut deep = scratch.to_path_buf();
    while deep.as_os_str().len() <= memprof_wire::MAX_SOCKET_PATH {
        deep.push("a-folder-deep-enough-for-no-socket-address");
    }
    std::fs::create_dir_all(&deep).expect("mkdir");
    let path = deep.join("s.sock");
    let listener = bind_socket(&path).expect("binds");
    let _client = connect_socket(&path).expect("connects");
    listener.accept().expect("accepts");
}
