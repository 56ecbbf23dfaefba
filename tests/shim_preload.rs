//! The LD_PRELOAD shim on the fake driver: compiles `kernels/fake_cuda` and
//! `kernels/workloads/alloc_free.c` with `cc`, runs the workload with the shim preloaded, and
//! checks the recording against what the workload printed about every call it made.
//!
//! `cargo test` does not reliably build cdylibs, so the shim is built here with
//! `cargo build -p memprof-shim` into its own target directory (under `CARGO_TARGET_TMPDIR`,
//! so it never waits on the lock of the build that runs this test). Linux only.

use crate::util::{repo, Scratch};
use memprof_wire::{
    decode_recording, Kind, Record, Recording, CUDA_ERROR_OUT_OF_MEMORY, FLAG_LOOKED_UP,
    FLAG_PER_THREAD_STREAM,
};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Calls alloc_free makes in its main thread and the shim records: 24 by symbol, 10 through
/// cuGetProcAddress, 2 through dlsym(handle).
const MAIN_CALLS: usize = 36;

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

pub fn check(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the shim (once per test run) and returns the path of `libmemprof_shim.so`.
pub fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        let target = tmp().join("shim-build");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(repo())
            .args(["build", "--quiet", "-p", "memprof-shim", "--target-dir"])
            .arg(&target)
            .output()
            .expect("cargo runs");
        check("cargo build -p memprof-shim", &out);
        let so = target.join("debug/libmemprof_shim.so");
        assert!(so.is_file(), "{} was not built", so.display());
        so
    })
}

/// Compiles `src` into `out` with `-Wall -Werror`, `flags` and `libs`, linked against the fake
/// `libcuda.so.1` in `dir` (found there at run time too).
pub fn cc_with_driver(dir: &Path, flags: &[&str], src: &Path, out: &Path, libs: &[&str]) {
    let built = Command::new("cc")
        .args(["-Wall", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .arg(format!("-L{}", dir.display()))
        .arg("-l:libcuda.so.1")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .args(libs)
        .output()
        .expect("cc runs");
    let name = src
        .file_name()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    check(&format!("cc {name}"), &built);
}

/// The fake driver and the workloads, compiled into a fresh directory named after `name`
/// (removed, with the sockets and recordings of the test, when dropped).
pub fn kernels(name: &str) -> Scratch {
    let dir = Scratch::new(&format!("kernels-{name}"));
    let k = repo().join("kernels");
    let out = Command::new("cc")
        .args([
            "-O1",
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
            "-Wl,-Bsymbolic",
        ])
        .args(["-Wl,-soname,libcuda.so.1", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(k.join("fake_cuda/fake_cuda.c"))
        .args(["-lpthread", "-ldl"])
        .output()
        .expect("cc runs");
    check("cc fake_cuda.c", &out);
    for (name, libs) in [
        ("alloc_free", &["-ldl", "-lpthread"][..]),
        ("stress", &["-lpthread"][..]),
        ("slow_free", &["-lpthread"][..]),
        ("peak_oom", &[][..]),
        ("hold", &[][..]),
        ("devices", &["-ldl"][..]),
    ] {
        let src = k.join(format!("workloads/{name}.c"));
        cc_with_driver(&dir, &["-O1"], &src, &dir.join(name), libs);
    }
    // Reaches the driver only through dlopen, as libcudart does: not linked against it.
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(dir.join("runtime_style"))
        .arg(k.join("workloads/runtime_style.c"))
        .arg("-ldl")
        .output()
        .expect("cc runs");
    check("cc runtime_style.c", &out);
    dir
}

/// A runtime directory for the live sockets of the processes a test runs in `dir`, so that they
/// stay out of the developer's own.
pub fn runtime_dir(dir: &Path) -> PathBuf {
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(&xdg).expect("mkdir");
    xdg
}

/// A runtime directory in `dir` so deep that the live socket's path, whatever the PID, is
/// longer than a socket address holds (108 bytes), as under a deep home or checkout.
pub fn deep_runtime_dir(dir: &Path) -> PathBuf {
    let mut xdg = dir.join("xdg");
    let socket = |xdg: &Path| {
        memprof_wire::socket_path(&memprof_wire::socket_dir(Some(xdg.as_os_str()), 0), 1)
    };
    while socket(&xdg).as_os_str().len() <= memprof_wire::MAX_SOCKET_PATH {
        xdg.push("a-deep-runtime-directory");
    }
    std::fs::create_dir_all(&xdg).expect("mkdir");
    xdg
}

/// Runs `cmd` in a process group of its own; after `secs` seconds kills the whole group (a hung
/// forked child too) and fails.
fn output_within(mut cmd: Command, secs: u64, what: &str) -> Output {
    use std::os::unix::process::CommandExt;
    let mut child = cmd
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!("{what} did not end in {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Alloc => "alloc",
        Kind::Free => "free",
        Kind::AllocAsync => "alloc_async",
        Kind::FreeAsync => "free_async",
        Kind::VmmCreate => "vmm_create",
        Kind::VmmMap => "vmm_map",
        Kind::VmmUnmap => "vmm_unmap",
        Kind::VmmRelease => "vmm_release",
        Kind::MemGetInfo => "mem_get_info",
        Kind::Trailer => "trailer",
        Kind::AllocPitch => "alloc_pitch",
        Kind::AllocManaged => "alloc_managed",
        Kind::AllocFromPoolAsync => "alloc_from_pool",
        Kind::AddressReserve => "address_reserve",
        Kind::AddressFree => "address_free",
        Kind::LiveDropped => "live_dropped",
        Kind::Stack => "stack",
        Kind::Mapping => "mapping",
        Kind::HostAlloc => "host_alloc",
        Kind::HostFree => "host_free",
        Kind::HostRegister => "host_register",
        Kind::HostUnregister => "host_unregister",
        Kind::NvmlSample => "nvml_sample",
    }
}

/// A record as the workload prints a call: `kind ptr size stream aux result`.
fn as_line(r: &Record) -> String {
    format!(
        "{} {} {} {} {} {}",
        kind_name(r.kind),
        r.ptr,
        r.size,
        r.stream,
        r.aux,
        r.result
    )
}

fn run_workload(dir: &Path, out: &Path, preload: bool) -> String {
    let mut cmd = Command::new(dir.join("alloc_free"));
    cmd.env("FAKE_CUDA_CAPACITY", "1048576")
        .env("MEMPROF_OUT", out)
        .env("XDG_RUNTIME_DIR", runtime_dir(dir))
        .env_remove("LD_PRELOAD");
    if preload {
        cmd.env("LD_PRELOAD", shim());
    }
    let output = cmd.output().expect("the workload runs");
    check("alloc_free", &output);
    String::from_utf8(output.stdout).expect("utf-8")
}

fn read(path: &Path) -> Recording {
    let bytes = std::fs::read(path).expect("the recording was written");
    decode_recording(&bytes).expect("the recording decodes")
}

#[test]
fn preloaded_shim_records_every_call_the_workload_makes() {
    let dir = kernels("exact");
    let out = dir.join("run.memprof");
    let printed = run_workload(&dir, &out, true);
    let recording = read(&out);

    // Closed cleanly, nothing lost.
    assert_eq!(recording.dropped, Some(0));
    assert_eq!(recording.trailing_bytes, 0);
    assert_ne!(recording.header.pid, 0);
    assert!(recording
        .records
        .iter()
        .all(|r| r.pid == recording.header.pid));
    // Every call that makes memory addressable carries a defined call stack, whichever way it
    // reached the driver (by symbol, cuGetProcAddress, dlsym; threads included); others none.
    for r in &recording.records {
        let wants = r.kind.allocates() || r.kind.pins_host() || r.kind == Kind::VmmMap;
        assert_eq!(
            recording.stacks.contains_key(&r.stack),
            wants,
            "{:?} flags {} stack {}",
            r.kind,
            r.flags,
            r.stack
        );
    }

    // The main thread's calls, in order, exactly as the workload saw them.
    let main_tid = recording.records[0].tid;
    let (main, workers): (Vec<&Record>, Vec<&Record>) =
        recording.records.iter().partition(|r| r.tid == main_tid);
    let lines: Vec<&str> = printed.lines().collect();
    let seen = |via: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(via))
            .map(str::to_string)
            .collect()
    };
    let by_symbol = seen("sym ");
    let by_proc_address = seen("gpa ");
    // dlopen + dlsym(handle, "cuGetProcAddress_v2"), as libcudart does.
    let by_dlsym = seen("dlsym ");
    assert_eq!(by_symbol.len(), 24);
    assert_eq!(by_proc_address.len(), 10);
    assert_eq!(by_dlsym.len(), 2);
    let recorded: Vec<String> = main.iter().map(|r| as_line(r)).collect();
    let expected: Vec<String> = by_symbol
        .iter()
        .chain(&by_proc_address)
        .chain(&by_dlsym)
        .cloned()
        .collect();
    assert_eq!(recorded, expected);

    // Which path each call came through.
    let (sym, gpa) = main.split_at(24);
    assert!(sym.iter().all(|r| r.flags == 0), "{sym:?}");
    assert!(gpa.iter().all(|r| r.flags & FLAG_LOOKED_UP != 0));
    let ptsz: Vec<Kind> = gpa
        .iter()
        .filter(|r| r.flags & FLAG_PER_THREAD_STREAM != 0)
        .map(|r| r.kind)
        .collect();
    assert_eq!(ptsz, [Kind::AllocAsync, Kind::FreeAsync]);

    // The specific events.
    assert_eq!(sym[0].kind, Kind::Alloc);
    assert_eq!(sym[0].size, 4096);
    assert_ne!(sym[0].ptr, 0);
    let oom: Vec<&&Record> = main.iter().filter(|r| r.is_oom()).collect();
    assert_eq!(oom.len(), 1);
    assert_eq!((oom[0].size, oom[0].ptr), (2 << 20, 0));
    assert_eq!(oom[0].result, CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!((sym[2].size, sym[2].aux), (1 << 20, (1 << 20) - 4096));
    assert_eq!((sym[3].kind, sym[3].ptr), (Kind::Free, sym[0].ptr));
    assert_eq!(sym[4].stream, 0x1234);
    let create = sym[6];
    assert_eq!(
        (create.kind, create.size, create.device),
        (Kind::VmmCreate, 65536, 3)
    );
    assert!(main
        .iter()
        .filter(|r| r.kind != Kind::VmmCreate)
        .all(|r| r.device == -1));
    assert_eq!(
        sym[7].aux, create.aux,
        "cuMemMap names the handle cuMemCreate returned"
    );
    assert_eq!((sym[9].kind, sym[9].aux), (Kind::VmmRelease, create.aux));
    // Pitch: 1000 bytes x 4 rows, rows padded to 1024.
    assert_eq!(
        (sym[10].kind, sym[10].size, sym[10].aux),
        (Kind::AllocPitch, 4096, 1024)
    );
    assert_eq!((sym[12].kind, sym[12].aux), (Kind::AllocManaged, 1));
    assert_eq!(
        (sym[14].kind, sym[14].aux, sym[14].stream),
        (Kind::AllocFromPoolAsync, 0x42, 0x1234)
    );
    assert_eq!(
        (sym[16].kind, sym[16].size),
        (Kind::AddressReserve, 1 << 30)
    );
    assert_eq!(
        (sym[17].kind, sym[17].ptr),
        (Kind::AddressFree, sym[16].ptr)
    );

    // Four worker threads, 2000 alloc/free pairs each: every event accounted for.
    assert!(printed.contains("threads 4 2000"));
    let mut per_thread: HashMap<u32, (usize, usize)> = HashMap::new();
    let mut live: HashMap<u32, u64> = HashMap::new();
    for r in &workers {
        assert_eq!(r.result, 0);
        let counts = per_thread.entry(r.tid).or_default();
        match r.kind {
            Kind::Alloc => {
                assert_eq!(r.size, 256);
                counts.0 += 1;
                assert!(
                    live.insert(r.tid, r.ptr).is_none(),
                    "alloc while one is live"
                );
            }
            Kind::Free => {
                counts.1 += 1;
                assert_eq!(live.remove(&r.tid), Some(r.ptr), "frees the pointer it got");
            }
            other => panic!("unexpected {other:?} from a worker"),
        }
    }
    assert_eq!(per_thread.len(), 4);
    assert!(
        per_thread.values().all(|&c| c == (2000, 2000)),
        "{per_thread:?}"
    );
    assert!(live.is_empty());

    // Timestamps are monotonic per thread.
    let mut last: HashMap<u32, u64> = HashMap::new();
    for r in &recording.records {
        let prev = last.insert(r.tid, r.ts_ns).unwrap_or(0);
        assert!(r.ts_ns >= prev);
    }
}

/// The writer thread blocks every signal it can: a handler run on it while it holds the writer
/// lock could fork (whose prepare handler waits for that lock) or make a hooked call.
#[test]
fn the_writer_thread_blocks_signals() {
    let dir = kernels("sigmask");
    let output = Command::new(dir.join("alloc_free"))
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("ALLOC_FREE_WRITER_MASK", "1")
        .env("MEMPROF_OUT", dir.join("mask.memprof"))
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env("LD_PRELOAD", shim())
        .output()
        .expect("runs");
    check("alloc_free", &output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mask = stdout
        .lines()
        .find_map(|l| l.strip_prefix("writer_sigblk "))
        .expect("the mask printed");
    let mask = u64::from_str_radix(mask.trim(), 16).unwrap_or_else(|_| panic!("{mask}"));
    // Signal n is bit n - 1; SIGUSR1, SIGTERM, SIGCHLD and SIGPROF (x86_64 and aarch64 Linux).
    for signal in [10, 15, 17, 27] {
        assert_ne!(mask & 1 << (signal - 1), 0, "signal {signal} in {mask:x}");
    }
}

#[test]
fn shim_changes_no_result() {
    let dir = kernels("same");
    let with = run_workload(&dir, &dir.join("with.memprof"), true);
    let without = run_workload(&dir, &dir.join("without.memprof"), false);
    assert_eq!(
        with, without,
        "the workload sees the same results with the shim"
    );
    assert!(!dir.join("without.memprof").exists());
}

#[test]
fn without_memprof_out_nothing_is_written() {
    let dir = kernels("off");
    let output = Command::new(dir.join("alloc_free"))
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env_remove("MEMPROF_OUT")
        .env("LD_PRELOAD", shim())
        .current_dir(&dir)
        .output()
        .expect("runs");
    check("alloc_free", &output);
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .filter(|name| name.to_string_lossy().contains("memprof"))
        .collect();
    assert!(files.is_empty(), "{files:?}");
}

#[test]
fn a_process_that_cannot_listen_says_so_once_and_still_records() {
    let dir = kernels("no-live-view");
    let xdg = runtime_dir(&dir);
    // A socket directory other users may enter: the shim refuses to listen in it.
    let sockets = xdg.join("memprof");
    std::fs::create_dir(&sockets).expect("mkdir");
    std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = dir.join("refused.memprof");
    let output = Command::new(dir.join("alloc_free"))
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("MEMPROF_OUT", &out)
        .env("XDG_RUNTIME_DIR", &xdg)
        .env("LD_PRELOAD", shim())
        .output()
        .expect("runs");
    check("alloc_free", &output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("memprof: "))
        .collect();
    assert_eq!(
        said,
        [format!(
            "memprof: no live view of PID {pid} (memprof attach, top and agent will not see it): \
             cannot listen in {}: other users may enter it (mode 755, expected 700); the \
             recording to the file goes on",
            sockets.display(),
            pid = recording_pid(&out),
        )],
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(&sockets).expect("dir").count(), 0);
    let recording = decode_recording(&std::fs::read(&out).expect("written")).expect("decodes");
    assert_eq!(recording.dropped, Some(0), "the recording is whole");
}

/// The PID in the header of the recording at `path`.
fn recording_pid(path: &Path) -> u32 {
    decode_recording(&std::fs::read(path).expect("written"))
        .expect("decodes")
        .header
        .pid
}

#[test]
fn driver_reached_only_through_dlopen_and_lookups_is_recorded() {
    // libcuda.so.1 dlopen'ed RTLD_LOCAL: not in the global scope, so plain LD_PRELOAD symbol
    // interposition sees nothing; the shim's dlsym and cuGetProcAddress wrappers must.
    let dir = kernels("runtime");
    let out = dir.join("rt.memprof");
    let output = Command::new(dir.join("runtime_style"))
        .env("LD_LIBRARY_PATH", &dir)
        .env("MEMPROF_OUT", &out)
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env("LD_PRELOAD", shim())
        .output()
        .expect("runs");
    check("runtime_style", &output);
    let printed = String::from_utf8(output.stdout).expect("utf-8");
    let recording = read(&out);
    assert_eq!(recording.dropped, Some(0));
    let expected: Vec<&str> = printed
        .lines()
        .map(|l| l.split_once(' ').expect("via").1)
        .collect();
    let recorded: Vec<String> = recording.records.iter().map(as_line).collect();
    assert_eq!(expected.len(), 10);
    assert_eq!(recorded, expected);
    assert!(recording
        .records
        .iter()
        .all(|r| r.flags & FLAG_LOOKED_UP != 0));
    let ptsz: Vec<Kind> = recording
        .records
        .iter()
        .filter(|r| r.flags & FLAG_PER_THREAD_STREAM != 0)
        .map(|r| r.kind)
        .collect();
    assert_eq!(ptsz, [Kind::AllocFromPoolAsync, Kind::FreeAsync]);
}

fn memprof_run(args: &[&str], dir: &Path, shim: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memprof"));
    cmd.arg("run")
        .args(args)
        .current_dir(dir)
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("XDG_RUNTIME_DIR", runtime_dir(dir))
        .env_remove("MEMPROF_OUT")
        .env_remove("LD_PRELOAD");
    match shim {
        Some(shim) => cmd.env("MEMPROF_SHIM", shim),
        None => cmd.env_remove("MEMPROF_SHIM"),
    };
    cmd.output().expect("memprof runs")
}

#[test]
fn memprof_run_records_the_command_and_passes_its_exit_code() {
    let dir = kernels("run");
    let workload = dir.join("alloc_free");
    let workload = workload.to_str().expect("utf-8 path");
    let out = memprof_run(&["-o", "rec.memprof", "--", workload], &dir, Some(shim()));
    check("memprof run", &out);
    let recording = read(&dir.join("rec.memprof"));
    assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);
    assert_eq!(recording.dropped, Some(0));
    let summary = String::from_utf8_lossy(&out.stderr);
    // Every allocation is freed before the next; the largest is the 65536-byte cuMemCreate.
    assert!(
        summary.contains(&format!("recorded {} calls", MAIN_CALLS + 4 * 2000 * 2))
            && summary.contains("1 out-of-memory")
            && summary.contains("peak live device memory 64.00 KiB"),
        "{summary}"
    );

    // The command's exit code comes back; no CUDA calls, no recording, and a stale one is gone.
    std::fs::copy(dir.join("rec.memprof"), dir.join("stale.memprof")).expect("copy");
    let out = memprof_run(
        &["-o", "stale.memprof", "--", "sh", "-c", "exit 7"],
        &dir,
        Some(shim()),
    );
    assert_eq!(out.status.code(), Some(7));
    assert!(!dir.join("stale.memprof").exists());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no recording written"));

    // Refusals: a missing shim, and the dashboard without a terminal.
    let out = memprof_run(&["--", "true"], &dir, Some(&dir.join("nope.so")));
    assert_eq!(out.status.code(), Some(2));
    let out = memprof_run(&["--live", "--", "true"], &dir, Some(shim()));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a terminal"));
}

/// `-o` never removes what is not a recording: a file of the user's, a directory, a fifo, a link
/// and /dev/null are refused with one line before CMD runs, and left as they are; a place that
/// cannot be written is refused before CMD runs; an earlier recording is replaced; and when the
/// shim cannot create the recording after all, the summary says so, and where.
#[test]
fn memprof_run_replaces_only_a_recording_and_says_when_it_cannot_write() {
    use std::os::unix::fs::FileTypeExt;
    let dir = kernels("run-out");
    let workload = dir.join("peak_oom");
    let workload = workload.to_str().expect("utf-8 path");
    let refused = |out: &str, want: &str| {
        let ran = dir.join("ran");
        let o = memprof_run(&["-o", out, "--", "touch", "ran"], &dir, Some(shim()));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "-o {out}: {err}");
        assert_eq!(err.lines().count(), 1, "-o {out}: {err}");
        assert!(err.contains(want), "-o {out}: {err}");
        assert!(!ran.exists(), "-o {out}: CMD did not run");
    };
    let notes = dir.join("notes.txt");
    std::fs::write(&notes, b"my notes").expect("write");
    refused(
        "notes.txt",
        "is a file that is not a memprof recording; it is left as it is",
    );
    assert_eq!(std::fs::read(&notes).expect("still there"), b"my notes");
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    refused("sub", "sub is a directory");
    assert!(dir.join("sub").is_dir());
    let made = Command::new("mkfifo")
        .arg(dir.join("pipe"))
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    refused("pipe", "pipe is a fifo");
    let meta = std::fs::symlink_metadata(dir.join("pipe")).expect("still there");
    assert!(meta.file_type().is_fifo());
    std::os::unix::fs::symlink(&notes, dir.join("link")).expect("symlink");
    refused("link", "link is a symbolic link");
    refused("/dev/null", "/dev/null is a device");
    let null = std::fs::metadata("/dev/null").expect("/dev/null");
    assert!(null.file_type().is_char_device());
    refused("/proc/nope", "cannot write the recording to /proc/nope: ");

    // An earlier recording is replaced by this run's.
    let first = memprof_run(&["-o", "rec.memprof", "--", workload], &dir, Some(shim()));
    check("memprof run", &first);
    let before = read(&dir.join("rec.memprof")).header.pid;
    let again = memprof_run(&["-o", "rec.memprof", "--", workload], &dir, Some(shim()));
    check("memprof run over a recording", &again);
    let after = read(&dir.join("rec.memprof"));
    assert_ne!(after.header.pid, before, "this run's recording");
    assert_eq!(after.records.len(), 16);

    // The directory is gone when CMD makes its first call: the shim reports it.
    std::fs::create_dir_all(dir.join("gone")).expect("mkdir");
    let script = format!("rmdir gone && exec {workload}");
    let out = memprof_run(
        &["-o", "gone/rec.memprof", "--", "sh", "-c", &script],
        &dir,
        Some(shim()),
    );
    check("memprof run into a removed directory", &out);
    let summary = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "memprof: no recording: {} could not be created (No such file or directory",
        dir.join("gone/rec.memprof").display()
    );
    assert!(summary.contains(&want), "{summary}");
    assert!(
        summary.contains("went to the driver unrecorded"),
        "{summary}"
    );
    assert!(!summary.contains("no CUDA memory calls seen"), "{summary}");
}

/// Whether this process ignores `signal` (then its children do too, and `memprof run` leaves it).
fn ignored_here(signal: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// SIGTERM, SIGHUP and SIGINT sent to `memprof run` go on to CMD: memprof waits for it, prints
/// the summary and exits with CMD's status, and CMD is not left running.
#[test]
fn memprof_run_forwards_sigterm_sighup_and_sigint_and_waits() {
    use std::io::{BufRead, BufReader};
    let dir = kernels("run-signals");
    let workload = dir.join("peak_oom");
    for (name, number) in [("TERM", 15), ("HUP", 1), ("INT", 2)] {
        if ignored_here(number) {
            eprintln!("SIG{name} is ignored by this test process: skipped");
            continue;
        }
        let rec = dir.join(format!("sig{name}.memprof"));
        let mut run = Command::new(env!("CARGO_BIN_EXE_memprof"))
            .arg("run")
            .arg("-o")
            .arg(&rec)
            .arg("--")
            .arg(&workload)
            .arg("wait")
            .current_dir(&dir)
            .env("FAKE_CUDA_CAPACITY", "1048576")
            .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
            .env("MEMPROF_SHIM", shim())
            .env_remove("LD_PRELOAD")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("memprof runs");
        let mut ready = String::new();
        let stdout = run.stdout.take().expect("piped");
        BufReader::new(stdout).read_line(&mut ready).expect("reads");
        assert_eq!(ready, "ready\n", "SIG{name}");
        let sent = Command::new("kill")
            .args(["-s", name, &run.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while run.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = run.kill();
                panic!("SIG{name}: memprof run did not end");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = run.wait_with_output().expect("output");
        let summary = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(128 + number as i32),
            "SIG{name}: {summary}"
        );
        assert!(
            summary.contains("memprof: recorded ")
                && summary.contains(&format!("calls to {} (", rec.display())),
            "SIG{name}: the summary: {summary}"
        );
        let pid = read(&rec).header.pid;
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "SIG{name}: PID {pid} was left running"
        );
    }
}

#[test]
fn another_rtld_next_interposer_works_before_or_after_the_shim() {
    let dir = kernels("other");
    let other = dir.join("libother_preload.so");
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&other)
        .arg(repo().join("kernels/preload/other_preload.c"))
        .arg("-ldl")
        .output()
        .expect("cc runs");
    check("cc other_preload.c", &out);
    let shim = shim();
    for (i, order) in [[shim, other.as_path()], [other.as_path(), shim]]
        .iter()
        .enumerate()
    {
        let rec = dir.join(format!("order{i}.memprof"));
        let preload = format!("{} {}", order[0].display(), order[1].display());
        let output = Command::new(dir.join("alloc_free"))
            .env("FAKE_CUDA_CAPACITY", "1048576")
            .env("MEMPROF_OUT", &rec)
            .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
            .env("LD_PRELOAD", &preload)
            .output()
            .expect("runs");
        check(&format!("alloc_free with LD_PRELOAD={preload}"), &output);
        // 2 calls by symbol in the main thread, 4 x 2000 in the workers.
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("other_preload: 8002 cuMemAlloc_v2 calls"),
            "{stderr}"
        );
        let recording = read(&rec);
        assert_eq!(
            recording.records.len(),
            MAIN_CALLS + 4 * 2000 * 2,
            "{preload}"
        );
        assert_eq!(recording.dropped, Some(0));
    }
}

#[test]
fn forked_children_record_nothing_and_exec_children_get_their_own_file() {
    let dir = kernels("fork");
    let rec = dir.join("fork.memprof");
    let output = Command::new(dir.join("alloc_free"))
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("ALLOC_FREE_FORK", "1")
        .env("MEMPROF_OUT", &rec)
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env("LD_PRELOAD", shim())
        .env_remove("MEMPROF_FORK")
        .output()
        .expect("runs");
    check("alloc_free with a forked child", &output);
    let recording = read(&rec);
    assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);
    assert_eq!(recording.dropped, Some(0));
    assert!(!recording.records.iter().any(|r| r.size == 12345));
    let children = child_pids(&output);
    assert_eq!(children.len(), 1);
    assert_eq!(
        recordings_beside(&rec),
        std::slice::from_ref(&rec),
        "the child wrote nothing"
    );

    // Two CUDA programs under one `memprof run`: the second records next to the first.
    let workload = dir.join("alloc_free");
    // The second one runs in a subdirectory: the recording still goes to the path given.
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    let script = format!(
        "{0} >/dev/null && cd sub && {0} >/dev/null",
        workload.display()
    );
    let out = memprof_run(
        &["-o", "two.memprof", "--", "sh", "-c", &script],
        &dir,
        Some(shim()),
    );
    check("memprof run -- sh -c", &out);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().contains("two.memprof"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 2, "{files:?}");
    let first = read(&files[0]);
    let second = read(&files[1]);
    assert_eq!(
        files[1].file_name(),
        Some(std::ffi::OsStr::new(&format!(
            "two.memprof.{}",
            second.header.pid
        )))
    );
    assert_ne!(first.header.pid, second.header.pid);
    for recording in [first, second] {
        assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);
        assert_eq!(recording.dropped, Some(0));
    }
}

/// The pids alloc_free printed for its forked children ("child <pid>").
fn child_pids(output: &Output) -> Vec<u32> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_prefix("child ")?.parse().ok())
        .collect()
}

/// `rec` and the files named `rec.<something>` beside it, sorted.
fn recordings_beside(rec: &Path) -> Vec<PathBuf> {
    let name = rec.file_name().expect("a file name").to_string_lossy();
    let prefix = format!("{name}.");
    let mut files: Vec<PathBuf> = std::fs::read_dir(rec.parent().expect("a directory"))
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            let file = p.file_name().expect("a name").to_string_lossy();
            file == name || file.starts_with(&prefix)
        })
        .collect();
    files.sort();
    files
}

/// alloc_free's forked child `pid` recorded exactly its 3 pairs of 12345 bytes (and none of its
/// parent's events, nor its parent's stack definitions) to `rec.<pid>`.
fn check_child_recording(rec: &Path, pid: u32, parent: &Recording) {
    let path = PathBuf::from(format!("{}.{pid}", rec.display()));
    let child = read(&path);
    assert_eq!(child.header.pid, pid);
    assert_eq!(child.dropped, Some(0), "{}", path.display());
    assert_eq!(child.delayed, 0, "{}", path.display());
    let kinds: Vec<(Kind, u64)> = child.records.iter().map(|r| (r.kind, r.size)).collect();
    assert_eq!(
        kinds.len(),
        6,
        "{} records in {}",
        kinds.len(),
        path.display()
    );
    assert_eq!(
        kinds,
        [(Kind::Alloc, 12345), (Kind::Free, 0)].repeat(3),
        "{}",
        path.display()
    );
    // Its only thread is its main one: the parent's cached thread id is not reused.
    assert!(child.records.iter().all(|r| r.pid == pid && r.tid == pid));
    // Its stacks are defined in its own file, with the mappings to symbolize them.
    for r in child.records.iter().filter(|r| r.kind == Kind::Alloc) {
        assert!(child.stacks.contains_key(&r.stack), "stack {}", r.stack);
    }
    assert!(!child.mappings.is_empty());
    let args = |r: &Recording| r.process.as_ref().map(|p| p.args.clone());
    assert_eq!(args(&child), args(parent));
}

/// alloc_free with `knobs`, recording to `rec` with `MEMPROF_FORK=record` (its socket under
/// `dir`).
fn alloc_free_forking(dir: &Path, rec: &Path, knobs: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(dir.join("alloc_free"));
    cmd.env("FAKE_CUDA_CAPACITY", "1048576")
        .envs(knobs.iter().copied())
        .env("MEMPROF_FORK", "record")
        .env("MEMPROF_OUT", rec)
        .env("XDG_RUNTIME_DIR", runtime_dir(dir))
        .env("LD_PRELOAD", shim());
    cmd
}

/// The parent's recording is exactly what it is without children (nothing dropped), each of
/// the `children` forked children alloc_free printed recorded exactly its own events, and no
/// other recording is beside them. Returns the parent's.
fn check_parent_and_children(rec: &Path, output: &Output, children: usize) -> Recording {
    let parent = read(rec);
    assert_eq!(parent.records.len(), MAIN_CALLS + 4 * 2000 * 2);
    assert_eq!(parent.dropped, Some(0));
    assert!(!parent.records.iter().any(|r| r.size == 12345));
    assert!(parent.records.iter().all(|r| r.pid == parent.header.pid));
    let pids = child_pids(output);
    assert_eq!(pids.len(), children);
    let mut expected = vec![rec.to_path_buf()];
    for &pid in &pids {
        check_child_recording(rec, pid, &parent);
        expected.push(PathBuf::from(format!("{}.{pid}", rec.display())));
    }
    expected.sort();
    assert_eq!(recordings_beside(rec), expected);
    parent
}

#[test]
fn with_memprof_fork_record_forked_children_record_to_their_own_file() {
    let dir = kernels("fork-record");
    let rec = dir.join("fork.memprof");
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(&xdg).expect("mkdir");
    let sockets = xdg.join("memprof");
    let sockets = sockets.to_str().expect("utf-8 path");
    let output = alloc_free_forking(
        &dir,
        &rec,
        &[("ALLOC_FREE_FORK", "2"), ("ALLOC_FREE_SOCKETS", sockets)],
    )
    .env("XDG_RUNTIME_DIR", &xdg)
    .output()
    .expect("runs");
    check("alloc_free with forked children", &output);
    check_parent_and_children(&rec, &output, 2);
    // Each child had a socket of its own (it checks), gone once it ended; the parent's is still
    // there (a child never removes it).
    let stdout = String::from_utf8_lossy(&output.stdout);
    let sockets: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("sockets "))
        .collect();
    assert_eq!(sockets, ["sockets 0 1", "sockets 0 1"], "{stdout}");
}

/// A parent thread records without pause while the main thread forks 20 times: each child gets
/// the writer lock free (it may have been inside the writer, or a hook, at the fork) and records
/// its own events only; nothing hangs.
#[test]
fn forking_while_another_thread_records_does_not_deadlock() {
    let dir = kernels("fork-busy");
    let rec = dir.join("busy.memprof");
    let cmd = alloc_free_forking(
        &dir,
        &rec,
        &[("ALLOC_FREE_FORK", "20"), ("ALLOC_FREE_BUSY", "1")],
    );
    let output = output_within(cmd, 120, "alloc_free forking while recording");
    check("alloc_free forking while a thread records", &output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let busy: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("busy ")?.parse().ok())
        .expect("busy pairs printed");
    let parent = read(&rec);
    let dropped = parent.dropped.expect("a trailer");
    // The ring may fill while a fork holds the writer lock: a drop is counted, never lost.
    assert_eq!(
        parent.records.len() as u64 + dropped,
        (MAIN_CALLS + 4 * 2000 * 2) as u64 + 2 * busy
    );
    assert!(!parent.records.iter().any(|r| r.size == 12345));
    let children = child_pids(&output);
    assert_eq!(children.len(), 20);
    for &pid in &children {
        check_child_recording(&rec, pid, &parent);
    }
    assert_eq!(recordings_beside(&rec).len(), 21);
}

/// Two threads fork at the same time, five times each: one waits in the prepare handler while
/// the other's child is made. Every child records exactly its own events, none dropped or
/// delayed, and nothing hangs.
#[test]
fn two_threads_forking_at_once_each_child_records_exactly() {
    let dir = kernels("fork-two");
    let rec = dir.join("two.memprof");
    let cmd = alloc_free_forking(
        &dir,
        &rec,
        &[("ALLOC_FREE_FORK", "5"), ("ALLOC_FREE_FORKERS", "2")],
    );
    let output = output_within(cmd, 120, "alloc_free forking from two threads");
    check("alloc_free forking from two threads at once", &output);
    check_parent_and_children(&rec, &output, 10);
}

/// The fake driver's child fork handler, which runs before the shim's, makes a hooked call: in
/// a child forked before the parent's first call (the shim still idle: starting would wait for
/// the writer lock the forking thread holds) and in one forked while it records. The call is
/// forwarded and not recorded, nothing hangs, and each child still records its own events.
#[test]
fn a_call_from_an_earlier_fork_handler_in_the_child_is_forwarded_unrecorded() {
    let dir = kernels("fork-handler-call");
    let rec = dir.join("early.memprof");
    let cmd = alloc_free_forking(
        &dir,
        &rec,
        &[
            ("FAKE_CUDA_FORK_CALL", "1"),
            ("ALLOC_FREE_FORK_FIRST", "1"),
            ("ALLOC_FREE_FORK", "1"),
        ],
    );
    let what = "alloc_free with a fork handler that calls the driver";
    let output = output_within(cmd, 60, what);
    check(what, &output);
    check_parent_and_children(&rec, &output, 2);
}

/// Before the run, only earlier recordings at `OUT.<digits>` are removed: another file, and a
/// directory, are left alone and do not stop it. The summary leaves out a recording at such a
/// name whose header names another process, or an earlier start.
#[test]
fn memprof_run_removes_and_lists_only_its_own_recordings() {
    let dir = kernels("run-own");
    let workload = dir.join("alloc_free");
    let workload = workload.to_str().expect("utf-8 path");
    // An earlier run's recording.
    let out = memprof_run(&["-o", "first.memprof", "--", workload], &dir, Some(shim()));
    check("memprof run", &out);
    let first = read(&dir.join("first.memprof"));
    let earlier_pid = first.header.pid;
    let rec = dir.join("rec.memprof");
    let not_recording = dir.join("rec.memprof.7");
    std::fs::write(&not_recording, b"a user's file").expect("write");
    let directory = dir.join("rec.memprof.8");
    std::fs::create_dir_all(&directory).expect("mkdir");
    let stale = dir.join("rec.memprof.99999");
    std::fs::copy(dir.join("first.memprof"), &stale).expect("copy");
    // While CMD runs, an earlier run's recording appears at a name that matches its pid, and
    // another at a name that does not.
    let script = format!(
        "cp first.memprof rec.memprof.{earlier_pid} && cp first.memprof rec.memprof.1 && \
         exec env ALLOC_FREE_FORK=1 {workload}"
    );
    let out = memprof_run(
        &[
            "-o",
            "rec.memprof",
            "--follow-forks",
            "--",
            "sh",
            "-c",
            &script,
        ],
        &dir,
        Some(shim()),
    );
    check("memprof run beside other files", &out);
    assert_eq!(
        std::fs::read(&not_recording).expect("still there"),
        b"a user's file"
    );
    assert!(directory.is_dir());
    assert!(!stale.exists(), "the earlier recording was removed");
    let children = child_pids(&out);
    assert_eq!(children.len(), 1);
    let summary = String::from_utf8_lossy(&out.stderr);
    let listed: Vec<&str> = summary
        .lines()
        .filter_map(|l| l.strip_prefix("memprof: recorded "))
        .collect();
    assert_eq!(listed.len(), 2, "{summary}");
    assert!(listed[0].contains(&format!("calls to {} (", rec.display())));
    assert!(listed[1].contains(&format!("calls to {}.{} (", rec.display(), children[0])));
    assert!(!summary.contains("warning"), "{summary}");
}

/// A forked child that recorded execs a CUDA program, which keeps its pid: the new program
/// records to `OUT.<pid>.1` (its own file is taken), and `memprof run` lists it.
#[test]
fn a_recording_child_that_execs_a_cuda_program_records_it_to_a_file_of_its_own() {
    let dir = kernels("fork-exec");
    let workload = dir.join("alloc_free");
    let workload = workload.to_str().expect("utf-8 path");
    let cmd = [
        "--",
        "env",
        "ALLOC_FREE_FORK=1",
        "ALLOC_FREE_CHILD_EXEC=1",
        workload,
    ];
    let args = [&["-o", "rec.memprof", "--follow-forks"][..], &cmd[..]].concat();
    let out = memprof_run(&args, &dir, Some(shim()));
    check("memprof run with a child that execs", &out);
    let children = child_pids(&out);
    assert_eq!(children.len(), 1);
    let rec = dir.join("rec.memprof");
    let child = PathBuf::from(format!("{}.{}", rec.display(), children[0]));
    let after_exec = PathBuf::from(format!("{}.1", child.display()));
    // The child's own recording is cut short by the exec (no exit handler runs).
    assert_eq!(
        recordings_beside(&rec),
        [rec.clone(), child.clone(), after_exec.clone()]
    );
    let recording = read(&after_exec);
    assert_eq!(recording.header.pid, children[0]);
    assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);
    assert_eq!(recording.dropped, Some(0));
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains(&format!(
            "recorded {} calls to {} (",
            MAIN_CALLS + 4 * 2000 * 2,
            after_exec.display()
        )),
        "{summary}"
    );
}

#[test]
fn memprof_run_follow_forks_records_and_lists_forked_children() {
    let dir = kernels("run-forks");
    let workload = dir.join("alloc_free");
    let workload = workload.to_str().expect("utf-8 path");
    let rec = dir.join("rec.memprof");
    // A file at a child's name that is not a recording is neither removed nor taken for this
    // run's.
    let other = dir.join("rec.memprof.999999999");
    std::fs::write(&other, b"old").expect("write");
    let cmd = ["--", "env", "ALLOC_FREE_FORK=1", workload];
    let args = [&["-o", "rec.memprof", "--follow-forks"][..], &cmd[..]].concat();
    let out = memprof_run(&args, &dir, Some(shim()));
    check("memprof run --follow-forks", &out);
    let children = child_pids(&out);
    assert_eq!(children.len(), 1);
    let child = PathBuf::from(format!("{}.{}", rec.display(), children[0]));
    assert_eq!(
        recordings_beside(&rec),
        [rec.clone(), child.clone(), other.clone()]
    );
    let parent = read(&rec);
    assert_eq!(parent.records.len(), MAIN_CALLS + 4 * 2000 * 2);
    check_child_recording(&rec, children[0], &parent);
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains(&format!(
            "recorded {} calls to {}",
            MAIN_CALLS + 4 * 2000 * 2,
            rec.display()
        )) && summary.contains(&format!(
            "recorded 6 calls to {} (3 allocations, 3 frees",
            child.display()
        )) && !summary.contains("999999999"),
        "{summary}"
    );

    // Without the flag a forked child records nothing, whatever MEMPROF_FORK says.
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["run", "-o", "rec.memprof"])
        .args(cmd)
        .current_dir(&dir)
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env("MEMPROF_FORK", "record")
        .env("MEMPROF_SHIM", shim())
        .env_remove("MEMPROF_OUT")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("memprof runs");
    check("memprof run", &out);
    assert_eq!(recordings_beside(&rec), [rec.clone(), other]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr)
            .matches("recorded ")
            .count(),
        1
    );
}

/// Runs `stress` with `threads` threads of `pairs` alloc/free pairs and checks that the recording
/// has every event, nothing dropped, each thread's in its order (each free after its allocation).
fn stress_accounts_for_every_event(threads: usize, pairs: usize) -> Recording {
    let dir = kernels("stress");
    // Its own name: the tests that call this share the directory and may run at once.
    let rec = dir.join(format!("stress-{threads}x{pairs}.memprof"));
    let output = Command::new(dir.join("stress"))
        .args([threads.to_string(), pairs.to_string()])
        .env("MEMPROF_OUT", &rec)
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env("LD_PRELOAD", shim())
        .output()
        .expect("runs");
    check("stress", &output);
    let bytes = std::fs::read(&rec).expect("recording");
    let recording = decode_recording(&bytes).expect("decodes");
    let _ = std::fs::remove_file(&rec);
    let dropped = recording.dropped.expect("closed with a trailer");
    // A hook that finds its buffer and the spill full waits for the writer: nothing is dropped.
    assert_eq!(dropped, 0, "delayed: {}", recording.delayed);
    assert_eq!(recording.records.len(), threads * pairs * 2);
    let mut last_of_thread: HashMap<u32, (usize, u64)> = HashMap::new();
    for r in &recording.records {
        let (count, last) = last_of_thread.entry(r.tid).or_default();
        assert!(*last <= r.ts_ns, "{r:?} after a later record of its thread");
        (*count, *last) = (*count + 1, r.ts_ns);
    }
    assert_eq!(last_of_thread.len(), threads);
    assert!(
        last_of_thread.values().all(|&(n, _)| n == pairs * 2),
        "{last_of_thread:?}"
    );
    let mut held = HashSet::new();
    for r in &recording.records {
        match r.kind {
            Kind::Alloc => assert!(held.insert(r.ptr), "{r:?} allocated twice"),
            Kind::Free => assert!(held.remove(&r.ptr), "{r:?} freed before its allocation"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(held.is_empty());
    recording
}

/// The buffers (about 37 MiB) start all zero, so they take no room in the library file.
#[test]
fn the_shim_library_does_not_carry_its_buffers() {
    let len = std::fs::metadata(shim()).expect("the shim").len();
    assert!(len < 32 << 20, "{len} bytes");
}

#[test]
fn eight_threads_of_100k_pairs_every_event_accounted_for() {
    let recording = stress_accounts_for_every_event(8, 100_000);
    let records = &recording.records;
    let span = records[records.len() - 1].ts_ns - records[0].ts_ns;
    eprintln!(
        "8 x 100,000 pairs in {:.3} s ({:.2} M pairs/s), {} delayed",
        span as f64 / 1e9,
        800_000.0 / span as f64 * 1e3,
        recording.delayed
    );
}

/// More threads at once than the shim has buffers (64): the others record through the shared
/// spill. The writer merges all of it by time (fewer events than it may hold back, so only a
/// thread stuck for a second inside a hook could put one out of order).
#[test]
fn more_threads_than_buffers_lose_nothing_and_keep_time_order() {
    let recording = stress_accounts_for_every_event(100, 500);
    let first_late = recording
        .records
        .windows(2)
        .position(|w| w[1].ts_ns < w[0].ts_ns);
    assert_eq!(first_late, None, "records out of time order");
}

/// A free is stamped when its call starts and the writer holds back other threads' newer events
/// until it is in: a free that is still running when another thread allocates comes first (so an
/// allocation that gets a freed address back never comes before that free).
#[test]
fn a_free_comes_before_what_other_threads_do_while_it_runs() {
    let dir = kernels("slow_free");
    let rec = dir.join("slow_free.memprof");
    let output = Command::new(dir.join("slow_free"))
        .env("MEMPROF_OUT", &rec)
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env("LD_PRELOAD", shim())
        .env("FAKE_CUDA_FREE_DELAY_US", "600000")
        .output()
        .expect("runs");
    check("slow_free", &output);
    let recording = decode_recording(&std::fs::read(&rec).expect("recording")).expect("decodes");
    let _ = std::fs::remove_file(&rec);
    let calls: Vec<(Kind, u64)> = recording.records.iter().map(|r| (r.kind, r.size)).collect();
    assert_eq!(
        calls,
        [(Kind::Alloc, 256), (Kind::Free, 0), (Kind::Alloc, 512)],
        "{:?}",
        recording.records
    );
    let (free, alloc) = (&recording.records[1], &recording.records[2]);
    assert_ne!(free.tid, alloc.tid);
    // The free started 300 ms before the allocation and took 600 ms.
    assert!(free.ts_ns + 200_000_000 < alloc.ts_ns, "{free:?} {alloc:?}");
    assert_eq!(recording.dropped, Some(0));
}

/// `MEMPROF_SHIM` relative to where `memprof run` starts still reaches a child that changes
/// directory (the loader would otherwise skip the preload with only a warning).
#[test]
fn memprof_run_takes_a_relative_shim_path() {
    let dir = kernels("relative");
    std::fs::copy(shim(), dir.join("shim.so")).expect("copy the shim");
    let workload = dir.join("alloc_free");
    let script = format!("cd / && exec {}", workload.display());
    let out = memprof_run(
        &["-o", "rec.memprof", "--", "sh", "-c", &script],
        &dir,
        Some(Path::new("./shim.so")),
    );
    check("memprof run with a relative MEMPROF_SHIM", &out);
    let recording = read(&dir.join("rec.memprof"));
    assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);
}

/// The binary alone, with no shim beside it and no `MEMPROF_SHIM` (as `cargo install` or the
/// wheel leave it), records with the shim it carries: written once into a private folder of the
/// user's cache, and used from there the next time.
#[test]
fn memprof_run_alone_records_with_the_shim_it_carries() {
    use std::os::unix::fs::MetadataExt;
    let dir = kernels("alone");
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    std::fs::copy(env!("CARGO_BIN_EXE_memprof"), bin.join("memprof")).expect("copy memprof");
    let cache = dir.join("cache");
    let workload = dir.join("alloc_free");
    let run = |out: &str| {
        Command::new(bin.join("memprof"))
            .args(["run", "-o", out, "--"])
            .arg(&workload)
            .current_dir(&dir)
            .env("FAKE_CUDA_CAPACITY", "1048576")
            .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
            .env("XDG_CACHE_HOME", &cache)
            .env_remove("MEMPROF_SHIM")
            .env_remove("MEMPROF_OUT")
            .env_remove("LD_PRELOAD")
            .output()
            .expect("memprof runs")
    };
    check("memprof run with the carried shim", &run("first.memprof"));
    let recording = read(&dir.join("first.memprof"));
    assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);

    let folder = cache.join("memprof");
    let files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .expect("the cache folder")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let meta = std::fs::metadata(&folder).expect("metadata");
    assert_eq!(meta.mode() & 0o777, 0o700);
    let written = std::fs::metadata(&files[0]).expect("metadata").modified();

    check("memprof run again", &run("second.memprof"));
    assert_eq!(
        read(&dir.join("second.memprof")).records.len(),
        MAIN_CALLS + 4 * 2000 * 2
    );
    let again = std::fs::metadata(&files[0]).expect("metadata").modified();
    assert_eq!(written.ok(), again.ok(), "the shim is written once");
}

/// A library loaded from a folder whose name is not UTF-8 (`caf\xe9`, Latin-1): the shim still
/// defines every mapping, that one with its path byte for byte, and `analyze` reads the
/// recording. (Reading the maps as text dropped every mapping of the process.)
#[test]
fn a_library_path_that_is_not_utf8_costs_no_mapping() {
    use std::os::unix::ffi::OsStrExt;
    let dir = kernels("non-utf8");
    let odd = dir.join(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&odd).expect("mkdir");
    std::fs::copy(dir.join("libcuda.so.1"), odd.join("libcuda.so.1")).expect("copy");
    let out = dir.join("odd.memprof");
    let output = Command::new(dir.join("alloc_free"))
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("MEMPROF_OUT", &out)
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        // Searched before the workload's run path: the driver comes from the odd folder.
        .env("LD_LIBRARY_PATH", &odd)
        .env("LD_PRELOAD", shim())
        .output()
        .expect("the workload runs");
    check("alloc_free", &output);
    let recording = read(&out);
    let driver = odd.join("libcuda.so.1");
    let paths: Vec<&[u8]> = recording.mappings.iter().map(|m| &m.path[..]).collect();
    assert!(
        paths.contains(&driver.as_os_str().as_bytes()),
        "the driver's mapping, byte for byte: {:?}",
        paths
            .iter()
            .map(|p| String::from_utf8_lossy(p))
            .collect::<Vec<_>>()
    );
    let workload = dir.join("alloc_free");
    assert!(paths.contains(&workload.as_os_str().as_bytes()));
    // The reader takes it as it is.
    let doc = crate::util::analyze_json(&[out]);
    assert_eq!(doc["inputs"][0]["kind"], "memprof_recording");
}

/// `run` takes what the system passes: arguments and an output name that are not UTF-8, and
/// `%p` in the name (the command's pid); the summary names the file that was written.
#[test]
fn memprof_run_takes_names_that_are_not_utf8_and_percent_p() {
    use std::os::unix::ffi::OsStrExt;
    let dir = kernels("run-bytes");
    let workload = dir.join("alloc_free");
    let run = |args: &[&std::ffi::OsStr]| {
        Command::new(env!("CARGO_BIN_EXE_memprof"))
            .arg("run")
            .args(args)
            .current_dir(&dir)
            .env("FAKE_CUDA_CAPACITY", "1048576")
            .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
            .env("MEMPROF_SHIM", shim())
            .env_remove("MEMPROF_OUT")
            .env_remove("LD_PRELOAD")
            .output()
            .expect("memprof runs")
    };
    let os = |b: &'static [u8]| std::ffi::OsStr::from_bytes(b);

    // An argument that is not UTF-8 reaches the command as it is.
    let out = run(&[
        os(b"-o"),
        os(b"args.memprof"),
        os(b"--"),
        os(b"sh"),
        os(b"-c"),
        os(b"printf %s \"$1\" > arg"),
        os(b"sh"),
        os(b"caf\xe9"),
    ]);
    check("memprof run with a Latin-1 argument", &out);
    assert_eq!(std::fs::read(dir.join("arg")).expect("written"), b"caf\xe9");

    // An output name that is not UTF-8 is recorded to, and the summary says so.
    let odd = os(b"x\xff.memprof");
    let out = run(&[os(b"-o"), odd, os(b"--"), workload.as_os_str()]);
    check("memprof run -o x\\xff.memprof", &out);
    let recording = read(&dir.join(odd));
    assert_eq!(recording.records.len(), MAIN_CALLS + 4 * 2000 * 2);
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("recorded "), "{summary}");
    assert!(!summary.contains("no CUDA memory calls seen"), "{summary}");

    // `%p` is the command's pid, in the file and in the summary.
    let out = run(&[
        os(b"-o"),
        os(b"%p.memprof"),
        os(b"--"),
        workload.as_os_str(),
    ]);
    check("memprof run -o %p.memprof", &out);
    let written: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".memprof"))
                .is_some_and(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    let recording = read(&written[0]);
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains(&format!(
            "recorded {} calls to {}",
            recording.records.len(),
            written[0].display()
        )),
        "{summary}"
    );
    assert!(!summary.contains("no recording written"), "{summary}");
}

/// A command killed by a signal cannot remove its live socket: `run` does, and passes on the
/// signal as the exit status (128 + the signal).
#[test]
fn memprof_run_removes_the_live_socket_of_a_command_killed_by_a_signal() {
    use std::io::BufRead;
    let dir = kernels("run-killed");
    let runtime = runtime_dir(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["run", "-o", "held.memprof", "--"])
        .arg(dir.join("hold"))
        .arg("10")
        .current_dir(&dir)
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("MEMPROF_SHIM", shim())
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("memprof runs");
    let mut ready = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("a line");
    assert_eq!(ready, "ready\n");
    let sockets: Vec<PathBuf> = std::fs::read_dir(runtime.join("memprof"))
        .expect("the socket folder")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(sockets.len(), 1, "{sockets:?}");
    let pid = sockets[0]
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("PID.sock")
        .to_string();
    let killed = Command::new("kill")
        .args(["-s", "KILL", &pid])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let out = child.wait_with_output().expect("memprof ends");
    assert_eq!(
        out.status.code(),
        Some(128 + 9),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !sockets[0].exists(),
        "{} is left behind",
        sockets[0].display()
    );
}
