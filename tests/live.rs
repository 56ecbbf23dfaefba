//! The shim's live socket: `peak_oom wait` runs under the shim with its own runtime directory, a
//! client connects by the process's socket path, and receives the same records the file gets,
//! ending with the trailer; the socket is gone after the process ends.

use crate::shim_preload::{kernels, shim};
use memprof::source::live::{processes_in, LiveClient, LiveEvent};
use memprof_wire::{decode_recording, Record};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn a_client_receives_the_records_of_a_running_process() {
    let dir = kernels("live");
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).expect("runtime dir");
    let out = dir.join("live.memprof");
    let mut child = Command::new(dir.join("peak_oom"))
        .arg("wait")
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("MEMPROF_OUT", &out)
        .env("LD_PRELOAD", shim())
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
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
    let mut got: Vec<Record> = Vec::new();
    let mut end = None;
    while let Some(event) = client.next_event().expect("the stream reads") {
        match event {
            LiveEvent::Record(r) => got.push(r),
            LiveEvent::Lost(n) => panic!("{n} records lost on a small workload"),
            LiveEvent::End { dropped } => end = Some(dropped),
        }
    }
    assert!(child.wait().expect("exits").success());
    assert_eq!(end, Some(0), "the trailer ends the stream");

    let file = decode_recording(&std::fs::read(&out).expect("written")).expect("decodes");
    assert_eq!(
        file.records.len(),
        17,
        "one cuMemGetInfo, then the 16 calls"
    );
    // The first cuMemGetInfo may have been drained before the client connected; everything
    // after it reaches the client, identical to the file.
    let skipped = file.records.len() - got.len();
    assert!(
        skipped <= 1,
        "{} of 17 records reached the client",
        got.len()
    );
    assert_eq!(got, file.records[skipped..]);
    assert!(!path.exists(), "the socket is removed at exit");
}
