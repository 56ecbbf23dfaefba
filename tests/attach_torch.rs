//! `memprof attach PID` on a real Python process started the usual way (no shim, no environment
//! variable, no code of memprof's): `tests/python/attach_job.py` over the stand-in torch of
//! `tests/python/standin` (PyTorch's signatures and snapshot format; no GPU here). memprof
//! queues its agent through gdb and reads PyTorch's figures, a snapshot, a recorded window and
//! the snapshot of an out-of-memory error; after each, the job is as it was: history, observers,
//! `sys.modules`, `__main__`, and no folder left in /tmp. Not tested with real PyTorch on a GPU
//! here (scripts/gpu-check.sh does that where a GPU is lent) nor with Python 3.14 (none here).

use crate::util::{have, repo, skip, stderr, stdout, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running job; killed when dropped.
struct Job {
    child: Child,
    pid: u32,
    folder: Scratch,
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this machine can run the tests: python3 of 3.8-3.13 and a gdb that can make a call
/// in another process here.
pub fn ready() -> bool {
    if !python_ready() {
        return false;
    }
    if let Err(why) = gdb_calls_work() {
        skip(&format!(
            "gdb cannot make a call in another process on this machine: {why}"
        ));
        return false;
    }
    true
}

/// Whether this machine has gdb and python3 of 3.8-3.13, which the refusals made before gdb
/// stops a job need.
fn python_ready() -> bool {
    if !have("gdb") || !have("python3") {
        return false;
    }
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.version_info[1])"])
        .output()
        .expect("python3 runs");
    let minor: u32 = stdout(&out).trim().parse().unwrap_or(0);
    if !(8..=13).contains(&minor) {
        skip(&format!(
            "python3 is 3.{minor}; these tests attach through gdb, for 3.8-3.13"
        ));
        return false;
    }
    true
}

/// Whether gdb can stop a process here and make a call in it, as `memprof attach` has it do:
/// some gdb builds cannot set a thread's registers under some kernels (on CPUs with AMX, "Couldn't
/// write extended state status"), and then nothing here can attach. Found once per run.
fn gdb_calls_work() -> Result<(), String> {
    static FOUND: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let mut sleeper = Command::new("sleep").arg("30").spawn().expect("sleep runs");
            let pid = sleeper.id().to_string();
            let out = Command::new("gdb")
                .args(["-batch", "-nx", "-nh", "-p", &pid])
                .args(["-ex", "call (int)getpid()"])
                .stdin(std::process::Stdio::null())
                .output()
                .expect("gdb runs");
            let _ = sleeper.kill();
            let _ = sleeper.wait();
            let text = format!("{}{}", stdout(&out), stderr(&out));
            if text.contains(&format!("= {pid}")) {
                Ok(())
            } else {
                Err(text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("no output")
                    .to_string())
            }
        })
        .clone()
}

/// Starts the job with `options`, waits until it runs.
fn start(name: &str, options: &[&str]) -> Job {
    let folder = Scratch::new(&format!("attach-torch-{name}"));
    let child = Command::new("python3")
        .arg(repo().join("tests/python/attach_job.py"))
        .arg(repo().join("tests/python/standin"))
        .arg(&*folder)
        .args(options)
        .env_remove("PYTHONPATH")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let pid = child.id();
    let start = Instant::now();
    while !folder.join("pid").exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the job started");
        std::thread::sleep(Duration::from_millis(20));
    }
    Job { child, pid, folder }
}

impl Job {
    /// The job's own account of itself (it writes it on SIGUSR1).
    fn state(&self) -> Value {
        let path = self.folder.join("state.json");
        let _ = std::fs::remove_file(&path);
        let start = Instant::now();
        for asked in 0.. {
            if asked % 100 == 0 {
                // SAFETY: kill(2) on our own child, which is running.
                unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGUSR1) };
            }
            if let Ok(text) = std::fs::read_to_string(&path) {
                return serde_json::from_str(&text).expect("state.json is JSON");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the job wrote its state"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        unreachable!()
    }

    fn attach(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_memprof"))
            .arg("attach")
            .arg(self.pid.to_string())
            .args(args)
            .output()
            .expect("memprof runs")
    }

    /// Folders memprof made for this job and left in /tmp.
    fn left_in_tmp(&self) -> Vec<PathBuf> {
        let prefix = format!("memprof-attach-{}-", self.pid);
        std::fs::read_dir("/tmp")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect()
    }

    /// Asserts the job is as `before` says it was: its history, its observers, its modules and
    /// `__main__`'s names; and that memprof left no folder.
    fn assert_as_before(&self, before: &Value) {
        let after = self.state();
        for key in ["history", "observers", "modules", "main"] {
            assert_eq!(after[key], before[key], "{key} is as it was");
        }
        assert_eq!(self.left_in_tmp(), Vec::<PathBuf>::new());
    }
}

fn json_of(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    serde_json::from_str(&stdout(out)).expect("one JSON document")
}

/// A torch-mode `attach --json` document of a fresh job.
pub fn torch_document() -> Value {
    let job = start("document", &[]);
    json_of(&job.attach(&["--json", "--duration", "1", "--interval", "0.5"]))
}

/// Where gdb cannot set a thread's registers (this gdb under this kernel), a failed call
/// leaves the stopped thread's system call broken: the job's `time.sleep` raised OSError and it
/// died. memprof finds this on a process of its own first and leaves the job alone.
#[test]
fn a_gdb_that_cannot_set_registers_never_touches_the_job() {
    if !have("gdb") || !have("python3") {
        return;
    }
    if gdb_calls_work().is_ok() {
        skip("gdb makes calls in other processes on this machine, so memprof attaches");
        return;
    }
    let job = start("registers", &[]);
    let before = job.state();
    let out = job.attach(&["--json", "--duration", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let text = stderr(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        text.contains("gdb cannot set a thread's registers on this machine")
            && text.contains("so the job was not touched"),
        "{text}"
    );
    // The job still runs and answers, as it was.
    job.assert_as_before(&before);
}

#[test]
fn live_figures_are_pytorchs_own_and_the_job_is_left_as_it_was() {
    if !ready() {
        return;
    }
    let job = start("live", &[]);
    let before = job.state();
    let doc = json_of(&job.attach(&["--json", "--duration", "1.5", "--interval", "0.5"]));
    assert_eq!(doc["mode"], "torch");
    let torch = &doc["torch"];
    assert_eq!(torch["torch_version"], "2.5.0+standin");
    assert_eq!(torch["backend"], "native");
    let samples = torch["samples"].as_array().expect("samples");
    assert!(samples.len() >= 3, "{samples:?}");
    let first = &samples[0]["devices"][0];
    let last = &samples[samples.len() - 1]["devices"][0];
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    // The job keeps 2 MiB every 20 steps: what it holds grows between the samples.
    assert!(
        n(last, "allocated") > n(first, "allocated"),
        "{first} {last}"
    );
    assert!(n(last, "reserved") >= n(last, "allocated"));
    assert!(n(last, "allocated_peak") >= n(last, "allocated"));
    assert_eq!(n(last, "num_ooms"), 0);
    assert_eq!(last["nvml_used"], Value::Null, "no NVML here");
    assert_eq!(torch["restored"]["history_stopped"], false);
    assert!(torch["longest_held_us"].as_u64().expect("held") > 0);
    job.assert_as_before(&before);
}

#[test]
fn a_snapshot_is_written_and_analyzed() {
    if !ready() {
        return;
    }
    let job = start("snapshot", &[]);
    let before = job.state();
    let out_dir = Scratch::new("attach-torch-snapshot-out");
    let file = out_dir.join("now.pickle");
    let doc = json_of(&job.attach(&["--snapshot", &file.display().to_string(), "--json"]));
    assert!(file.is_file(), "the snapshot is at FILE");
    let device = &doc["inputs"][0]["devices"][0];
    let reserved = device["reserved_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("reserved at the dump in {device}"));
    // The job's live memory: its kept outputs, whole segments of 2 MiB each.
    assert!(
        reserved >= 2 << 20 && reserved.is_multiple_of(2 << 20),
        "{reserved}"
    );
    job.assert_as_before(&before);
}

/// Every site's bytes in an analyze document's live-at-peak table, by site text.
fn sites(doc: &Value) -> String {
    doc["inputs"][0]["devices"][0].to_string()
}

#[test]
fn a_recorded_window_names_the_growing_site_and_history_is_put_back_off() {
    if !ready() {
        return;
    }
    let job = start("record", &[]);
    let before = job.state();
    assert_eq!(before["history"], Value::Null, "history is off in the job");
    let out_dir = Scratch::new("attach-torch-record-out");
    let file = out_dir.join("window.pickle");
    let out = job.attach(&[
        "--record",
        "1",
        "--snapshot",
        &file.display().to_string(),
        "--json",
    ]);
    let doc = json_of(&out);
    assert!(stderr(&out).contains("recording PID"), "{}", stderr(&out));
    let text = sites(&doc);
    assert!(
        text.contains("cache_outputs"),
        "the growing site is named: {text}"
    );
    assert!(text.contains("/work/model.py"), "{text}");
    job.assert_as_before(&before);
}

#[test]
fn history_the_job_turned_on_itself_stays_on() {
    if !ready() {
        return;
    }
    let job = start("history", &["history"]);
    let before = job.state();
    assert_eq!(before["history"][0], 5000, "the job's own history");
    let out_dir = Scratch::new("attach-torch-history-out");
    let file = out_dir.join("window.pickle");
    let out = job.attach(&["--record", "0.5", "--snapshot", &file.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("was already on"), "{}", stderr(&out));
    let after = job.state();
    assert_eq!(after["history"][0], 5000, "still on, with the job's size");
    assert!(after["history"][1].as_u64() > Some(0));
}

#[test]
fn an_out_of_memory_error_after_attaching_is_caught_and_diagnosed() {
    if !ready() {
        return;
    }
    let mut job = start("oom", &[]);
    let out_dir = Scratch::new("attach-torch-oom-out");
    let file = out_dir.join("oom.pickle");
    let attach = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["attach", &job.pid.to_string(), "--on-oom"])
        .arg(&file)
        .arg("--json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memprof runs");
    // Armed: the job counts one observer more.
    let start = Instant::now();
    while job.state()["observers"] != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the observer was armed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(job.folder.join("oom-now"), b"").expect("trigger");
    let out = attach.wait_with_output().expect("memprof ends");
    let doc = json_of(&out);
    assert!(file.is_file(), "the OOM snapshot is at FILE");
    let diagnoses = doc["diagnoses"].as_array().expect("diagnoses");
    assert_eq!(diagnoses.len(), 1, "{doc}");
    assert!(
        diagnoses[0].to_string().contains("forward"),
        "the failing site: {}",
        diagnoses[0]
    );
    // The job died of the error, as an unhandled OOM does; the observer had written first.
    let status = job.child.wait().expect("the job ended");
    assert!(!status.success());
    let mut job_err = String::new();
    std::io::Read::read_to_string(job.child.stderr.as_mut().expect("stderr"), &mut job_err)
        .expect("read");
    assert!(job_err.contains("OutOfMemoryError"), "{job_err}");
    // The traceback names the job's files under the checkout, whose path may say memprof.
    let job_err = job_err.replace(&*repo().to_string_lossy(), "REPO");
    assert!(
        !job_err.contains("memprof"),
        "nothing of memprof's in the job's output: {job_err}"
    );
    assert_eq!(job.left_in_tmp(), Vec::<PathBuf>::new());
}

#[test]
fn detaching_before_an_oom_disarms_the_observer() {
    if !ready() {
        return;
    }
    let job = start("disarm", &[]);
    let attach = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args([
            "attach",
            &job.pid.to_string(),
            "--on-oom",
            "/nonexistent/never.pickle",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memprof runs");
    let start = Instant::now();
    while job.state()["observers"] != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the observer was armed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child, which is running.
    unsafe { libc::kill(attach.id() as libc::pid_t, libc::SIGINT) };
    let out = attach.wait_with_output().expect("memprof ends");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("before any out-of-memory error"),
        "{}",
        stderr(&out)
    );
    let after = job.state();
    assert_eq!(after["history"], Value::Null, "history put back off");
    assert_eq!(after["observers"], 1, "PyTorch cannot remove an observer");
    // It stays, disarmed: an OOM now writes nothing.
    std::fs::write(job.folder.join("oom-now"), b"").expect("trigger");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(job.left_in_tmp(), Vec::<PathBuf>::new());
}

/// One line on stderr, exit 2.
fn assert_refused(out: &Output, says: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(says), "{err}");
}

#[test]
fn refusals_are_one_line() {
    if !ready() {
        return;
    }
    let mut sleeper = Command::new("sleep").arg("30").spawn().expect("sleep runs");
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args([
            "attach",
            &sleeper.id().to_string(),
            "--snapshot",
            "/tmp/x.pickle",
        ])
        .output()
        .expect("memprof runs");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_refused(&out, "not a Python process (its executable is");

    let job = start("no-torch", &["no-torch"]);
    let before = job.state();
    assert_refused(
        &job.attach(&["--snapshot", "/tmp/x.pickle"]),
        "has not imported torch",
    );
    job.assert_as_before(&before);
    drop(job);

    let job = start("no-cuda", &["no-cuda"]);
    assert_refused(
        &job.attach(&["--snapshot", "/tmp/x.pickle"]),
        "has not initialized CUDA",
    );
    drop(job);

    // cudaMallocAsync keeps no snapshot: memory_stats are printed, then the refusal.
    let job = start("async", &["async"]);
    let out = job.attach(&["--snapshot", "/tmp/x.pickle"]);
    assert_refused(&out, "cudaMallocAsync allocator, which keeps no snapshot");
    assert!(
        stdout(&out).starts_with("device 0: allocated "),
        "{}",
        stdout(&out)
    );
    assert!(!Path::new("/tmp/x.pickle").exists());
}

#[test]
fn another_users_job_is_refused() {
    // The refusal comes before gdb stops the job.
    if !python_ready() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("needs root to run memprof as another user (setpriv) against this user's job");
        return;
    }
    if !have("setpriv") {
        return;
    }
    let job = start("other-user", &[]);
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_memprof"))
        .args([
            "attach",
            &job.pid.to_string(),
            "--snapshot",
            "/tmp/never.pickle",
        ])
        .output()
        .expect("setpriv runs");
    assert_refused(&out, "belongs to another user");
}
