//! End to end: `peak_oom wait` runs under the shim (LD_PRELOAD, fake driver) and the real
//! `memprof attach PID` runs in a real terminal (tmux); the dashboard shows the allocations
//! alive, then the rest of the run as it streams, the OOM, and that the process ended.
//! `attach --json` on the same workload gives the series from the stream, and `memprof run
//! --live` shows the same dashboard on the command it starts. `memprof top` on the fake NVML
//! marks the workload as running the shim and opens the same view on Enter.

use crate::nvml_fake::fake_nvml;
use crate::shim_preload::{cc_with_driver, check, deep_runtime_dir, kernels, runtime_dir, shim};
use crate::util::{memprof, repo, Within};
use crate::view_tmux::Tmux;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Kills the workload if the test fails before it ends.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Spawns `command` (a workload under the shim) with piped stdin and stdout and waits for its
/// "ready" line; `name` names it in a failure.
fn spawn_ready(command: &mut Command, name: &str) -> (Guard, ChildStdin, BufReader<ChildStdout>) {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{name} runs: {e}"));
    let stdin = child.stdin.take().expect("stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
    let guard = Guard(child);
    let mut ready = String::new();
    lines.read_line(&mut ready).expect("a line");
    assert_eq!(ready, "ready\n");
    (guard, stdin, lines)
}

/// Starts `peak_oom wait` under the shim with a runtime directory of its own, deeper than a
/// socket address holds (as under a deep checkout: the live view must work there too); returns
/// it once it has printed "ready" (b and c alive), with its stdin to let it go on. The runtime
/// directory keeps the workload's build, removed when dropped.
pub fn workload(name: &str) -> (Guard, ChildStdin, Within) {
    let dir = kernels(name);
    let runtime = deep_runtime_dir(&dir);
    let mut command = Command::new(dir.join("peak_oom"));
    command
        .arg("wait")
        .env("FAKE_CUDA_CAPACITY", "1048576")
        .env("MEMPROF_OUT", dir.join("run.memprof"))
        .env("LD_PRELOAD", shim())
        .env("XDG_RUNTIME_DIR", &runtime);
    let (guard, stdin, _) = spawn_ready(&mut command, "peak_oom");
    (guard, stdin, Within::new(dir, runtime))
}

/// `nccl_hold` (kernels/workloads/nccl_hold.c) under the shim, its device memory held by the
/// library playing NCCL (two 8 MiB buffers and 3 MiB pinned) and 1 MiB by itself; returned once
/// it has printed "ready", with its stdin (a line makes it free one NCCL buffer and print
/// "shrunk", the next makes it end), its stdout and the runtime directory of its live socket
/// (`runtime`, or one of its own).
pub fn nccl_workload(
    name: &str,
    runtime: Option<&Path>,
) -> (Guard, ChildStdin, BufReader<ChildStdout>, Within) {
    let dir = kernels(name);
    let lib = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    let k = repo().join("kernels");
    let built = Command::new("cc")
        .args([
            "-O1",
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
            "-fno-omit-frame-pointer",
        ])
        .arg("-o")
        .arg(dir.join("libfakenccl.so"))
        .arg(k.join("fake_nccl/fake_nccl.c"))
        .args([&lib, "-l:libcuda.so.1", &rpath])
        .output()
        .expect("cc runs");
    check("cc fake_nccl.c", &built);
    cc_with_driver(
        &dir,
        &["-O1", "-fno-omit-frame-pointer"],
        &k.join("workloads/nccl_hold.c"),
        &dir.join("nccl_hold"),
        &["-lfakenccl"],
    );
    let runtime = runtime.map_or_else(|| runtime_dir(&dir), Path::to_path_buf);
    let mut command = Command::new(dir.join("nccl_hold"));
    command
        .env("MEMPROF_OUT", dir.join("run.memprof"))
        .env("LD_PRELOAD", shim())
        .env("XDG_RUNTIME_DIR", &runtime);
    let (guard, stdin, lines) = spawn_ready(&mut command, "nccl_hold");
    (guard, stdin, lines, Within::new(dir, runtime))
}

#[test]
fn attach_json_splits_memory_by_library_for_a_client_that_connected_late() {
    const MIB: u64 = 1 << 20;
    let (mut child, mut stdin, mut lines, runtime) = nccl_workload("attach-libraries", None);
    let pid = child.0.id().to_string();
    let attach = |duration: &str| {
        Command::new(env!("CARGO_BIN_EXE_memprof"))
            .args(["attach", &pid, "--json", "--duration", duration])
            .args(["--interval", "0.1"])
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .expect("memprof runs")
    };
    let split = |out: &std::process::Output| -> (Value, Value) {
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        let shim = &doc["shim"];
        (shim["libraries"].clone(), shim["pinned_host"].clone())
    };
    // Everything was allocated before attach connected: the stacks and mappings that name the
    // libraries come to it with the snapshot.
    let (libraries, pinned) = split(&attach("0.3"));
    assert_eq!(
        libraries,
        serde_json::json!([
            {"device": 0, "library": "libfakenccl.so", "bytes": 16 * MIB, "peak_bytes": 16 * MIB},
            {"device": 0, "library": "nccl_hold", "bytes": MIB, "peak_bytes": MIB},
        ])
    );
    let nccl_pinned = serde_json::json!([
        {"library": "libfakenccl.so", "bytes": 3 * MIB, "peak_bytes": 3 * MIB},
    ]);
    assert_eq!(pinned, nccl_pinned);
    stdin.write_all(b"shrink\n").expect("written");
    let mut shrunk = String::new();
    lines.read_line(&mut shrunk).expect("a line");
    assert_eq!(shrunk, "shrunk\n");
    let (libraries, pinned) = split(&attach("0.3"));
    assert_eq!(
        libraries,
        serde_json::json!([
            {"device": 0, "library": "libfakenccl.so", "bytes": 8 * MIB, "peak_bytes": 8 * MIB},
            {"device": 0, "library": "nccl_hold", "bytes": MIB, "peak_bytes": MIB},
        ])
    );
    assert_eq!(pinned, nccl_pinned);
    stdin.write_all(b"end\n").expect("written");
    drop(stdin);
    assert!(child.0.wait().expect("exits").success());
}

#[test]
fn attach_in_tmux_streams_a_shim_workload_until_it_ends() {
    let (mut child, mut stdin, runtime) = workload("attach-tmux");
    let pid = child.0.id();
    let command = format!(
        "sh -c 'XDG_RUNTIME_DIR={} {} attach {pid} --interval 0.2; echo \"exit=$?\"; echo end-of-check; sleep 60'",
        runtime.display(),
        env!("CARGO_BIN_EXE_memprof"),
    );
    let Some(tmux) = Tmux::start(&command, 100, 30) else {
        return;
    };
    let screen = tmux.wait_text("alive 2");
    assert!(screen.contains("shim stream (driver level)"), "{screen}");
    assert!(
        screen.contains(&format!("memprof attach {pid}")),
        "{screen}"
    );
    // b (300000 bytes) and c (200000), largest first, from the snapshot of what was alive.
    let b = screen.find("292.97 KiB  cuMemAlloc").expect("b listed");
    let c = screen.find("195.31 KiB  cuMemAlloc").expect("c listed");
    assert!(b < c, "{screen}");
    assert!(screen.contains("held 488.28 KiB"), "{screen}");
    // By library: the program's own calls, named by the stacks the late client was sent.
    assert!(
        screen.contains("GPU 0     488.28 KiB   488.28 KiB  peak_oom"),
        "{screen}"
    );

    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    let screen = tmux.wait_text("has ended");
    assert!(child.0.wait().expect("exits").success());
    assert!(screen.contains("OOM 1"), "{screen}");
    assert!(screen.contains("dropped by the shim 0"), "{screen}");
    // c and the 32768-byte mapping stay: the last state is kept on screen.
    assert!(screen.contains("alive 2"), "{screen}");
    assert!(screen.contains("32.00 KiB  cuMemMap"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
}

#[test]
fn attach_json_reads_the_shim_stream_until_the_process_ends() {
    let (mut child, mut stdin, runtime) = workload("attach-json");
    let pid = child.0.id().to_string();
    let mut attach = Guard(
        Command::new(env!("CARGO_BIN_EXE_memprof"))
            .args([
                "attach",
                &pid,
                "--json",
                "--duration",
                "30",
                "--interval",
                "0.1",
            ])
            .env("XDG_RUNTIME_DIR", &runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("memprof runs"),
    );
    // Let attach connect while b and c are alive, then let the workload finish.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    assert!(child.0.wait().expect("exits").success());
    let mut stdout = String::new();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut attach.0.stdout.take().expect("stdout"), &mut stdout)
        .expect("attach ends with the process, long before --duration");
    std::io::Read::read_to_string(&mut attach.0.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    let status = attach.0.wait().expect("attach exits");
    assert_eq!(status.code(), Some(0), "{err}");
    let doc: Value = serde_json::from_str(&stdout).expect("one JSON document");
    assert_eq!(doc["mode"], "shim");
    assert_eq!(doc["kind"], "memprof_attach");
    let shim = &doc["shim"];
    assert_eq!(shim["ended"], true, "{shim}");
    assert_eq!(shim["oom_events"], 1, "{shim}");
    assert_eq!(shim["dropped"], 0, "{shim}");
    assert_eq!(shim["alive"], 2, "c and the mapping: {shim}");
    // Every call came from the program itself.
    assert_eq!(
        shim["libraries"],
        serde_json::json!([{"device": 0, "library": "peak_oom", "bytes": 232_768,
                            "peak_bytes": 631_072}]),
        "{shim}"
    );
    assert_eq!(shim["pinned_host"], serde_json::json!([]), "{shim}");
    let samples = doc["samples"].as_array().expect("samples");
    let first = &samples[0]["devices"];
    let last = &samples[samples.len() - 1]["devices"];
    assert_eq!(
        last[0]["used"], 232_768,
        "c and the mapping at the end: {doc}"
    );
    // Between two samples: b and c with both 65536-byte handles mapped, from the stream.
    assert_eq!(doc["peak"][0]["used"], 631_072, "{doc}");
    // The first sample is what was alive at connect, b and c; later ones stay below the peak.
    assert_eq!(first[0]["used"], 500_000, "{doc}");
    for sample in samples {
        let used = sample["devices"][0]["used"].as_u64().unwrap_or(0);
        assert!(used <= 631_072, "{sample}");
    }
}

/// The first sample of `attach --json` is the whole live set at connect: 4000 allocations
/// alive before attach connected, however their snapshot arrives (it once took the first record
/// and whatever else had come, and on a loaded machine missed some).
#[test]
fn attach_json_first_sample_is_everything_alive_at_connect() {
    const HELD: u64 = 4_000;
    let dir = kernels("attach-first");
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).expect("runtime dir");
    for round in 0..3 {
        let mut child = Command::new(dir.join("hold"))
            .arg(HELD.to_string())
            .env("MEMPROF_OUT", dir.join(format!("hold{round}.memprof")))
            .env("LD_PRELOAD", shim())
            .env("XDG_RUNTIME_DIR", &runtime)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("hold runs");
        let mut stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let child = Guard(child);
        let mut ready = String::new();
        lines.read_line(&mut ready).expect("a line");
        assert_eq!(ready, "ready\n");
        // The shim's writer takes events in time order across threads, holding the newest
        // back for a moment; a client gets in its snapshot what the writer has taken. On a
        // loaded machine the writer may not have taken the last of the allocations yet when
        // `ready` is read, so the test lets it catch up first.
        std::thread::sleep(std::time::Duration::from_millis(500));
        let pid = child.0.id().to_string();
        let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
            .args([
                "attach",
                &pid,
                "--json",
                "--duration",
                "0.3",
                "--interval",
                "0.1",
            ])
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .expect("memprof runs");
        stdin.write_all(b"go\n").expect("written");
        drop(stdin);
        let mut child = child;
        assert!(child.0.wait().expect("exits").success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "round {round}: {err}");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        let first = &doc["samples"][0]["devices"][0];
        assert_eq!(first["used"], HELD * 4096, "round {round}: {first}");
    }
}

#[test]
fn run_live_shows_the_dashboard_on_its_command() {
    let dir = kernels("run-live");
    let runtime = deep_runtime_dir(&dir);
    // `run --live` gives the command no input: peak_oom waits on a FIFO the test writes to.
    let fifo = dir.join("go.fifo");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(made.success());
    let out = dir.join("run.memprof");
    let command = format!(
        "sh -c 'cd {dir} && XDG_RUNTIME_DIR={runtime} MEMPROF_SHIM={shim} FAKE_CUDA_CAPACITY=1048576 {memprof} run --live -o {out} -- sh -c \"exec ./peak_oom wait < go.fifo\"; echo \"exit=$?\"; echo end-of-check; sleep 60'",
        dir = dir.display(),
        runtime = runtime.display(),
        shim = shim().display(),
        memprof = env!("CARGO_BIN_EXE_memprof"),
        out = out.display(),
    );
    let Some(tmux) = Tmux::start(&command, 100, 30) else {
        return;
    };
    // Opening blocks until the command opens the FIFO to read it.
    let mut go = std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("the command reads the FIFO");
    let screen = tmux.wait_text("alive 2");
    assert!(screen.contains("shim stream (driver level)"), "{screen}");
    assert!(screen.contains("held 488.28 KiB"), "{screen}");
    go.write_all(b"go\n").expect("written");
    drop(go);
    let screen = tmux.wait_text("has ended");
    assert!(screen.contains("OOM 1"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
    assert!(
        screen.contains("1 out-of-memory"),
        "the summary follows:\n{screen}"
    );
    assert!(
        std::fs::read_to_string(dir.join("run.log")).is_ok_and(|log| log.contains("ready")),
        "the command's output went to the log"
    );
}

#[test]
fn top_in_tmux_marks_the_shim_process_and_opens_its_view() {
    let (_child, _stdin, runtime) = workload("top-tmux");
    let pid = _child.0.id();
    let nvml = fake_nvml("top-tmux");
    let scenario = nvml.join("scenario.txt");
    std::fs::write(
        &scenario,
        format!(
            "driver 550.54.15\n\
             device 1048576 600000 448576 12 3 GPU-a Fake GPU\n\
             process 0 {pid} compute 600000\n\
             process 0 {me} compute 1000\n",
            me = std::process::id()
        ),
    )
    .expect("write the scenario");
    let command = format!(
        "sh -c 'LD_LIBRARY_PATH={nvml} FAKE_NVML_SCENARIO={scenario} XDG_RUNTIME_DIR={runtime} {memprof} top --interval 0.2; echo \"exit=$?\"; echo end-of-check; sleep 60'",
        nvml = nvml.display(),
        scenario = scenario.display(),
        runtime = runtime.display(),
        memprof = env!("CARGO_BIN_EXE_memprof"),
    );
    let Some(tmux) = Tmux::start(&command, 100, 30) else {
        return;
    };
    let screen = tmux.wait_text("peak_oom wait");
    let row = |screen: &str, pid: u32| -> String {
        screen
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&pid.to_string()))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(row(&screen, pid).contains(" yes "), "{screen}");
    assert!(
        row(&screen, std::process::id()).contains(" no "),
        "{screen}"
    );
    // The workload holds the most: it is the first row.
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_text("alive 2");
    assert!(
        screen.contains(&format!("memprof attach {pid}")),
        "{screen}"
    );
    assert!(screen.contains("held 488.28 KiB"), "{screen}");
    tmux.keys(&["Escape"]);
    tmux.wait_text("Processes, most memory first");
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
}

#[test]
fn run_live_without_a_terminal_is_refused() {
    let out = memprof(&["run", "--live", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a terminal"),
        "{out:?}"
    );
}
