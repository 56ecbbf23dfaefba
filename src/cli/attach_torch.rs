//! `memprof attach PID` on a Python job that uses PyTorch and was started the usual way (no
//! shim): memprof's agent in the job (`source::attach`) gives PyTorch's own allocator figures
//! (`--json` series), a snapshot (`--snapshot FILE`), a recorded window (`--record SECS`), or the
//! snapshot of its next out-of-memory error (`--on-oom FILE`), each file then read like
//! `analyze` or `diagnose` read it. Detaching puts the job back as it was.

use super::Outcome;
use crate::report::attach_json::AttachDocument;
use crate::source::attach::figures::{add_nvml, from_answer as figures, TorchDevice};
use crate::source::attach::session::Session;
use crate::source::gpu::{Clock, GpuSampler, SystemClock};
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries of PyTorch's history ring buffer `--record` asks for.
const RECORD_ENTRIES: u64 = 100_000;

/// What the user asked of the job, beyond the live view.
pub struct Modes<'a> {
    pub snapshot: Option<&'a Path>,
    pub record: Option<Duration>,
    pub on_oom: Option<&'a Path>,
    pub json: bool,
}

/// Ctrl-C (SIGINT) and SIGTERM set this instead of ending memprof, so it can detach first.
pub fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&flag)).context("signal handler")?;
    }
    Ok(flag)
}

/// Attaches, or says in one line why not.
pub fn open(pid: u32, wait: Duration, stop: &AtomicBool) -> anyhow::Result<Session> {
    Session::open(pid, wait, stop).map_err(anyhow::Error::msg)
}

/// Why this job has no PyTorch figures to give (None when it has).
pub fn no_figures(session: &Session) -> Option<String> {
    let pid = session.pid();
    let hello = &session.hello;
    match (&hello.torch, hello.cuda_initialized) {
        (None, _) => Some(format!(
            "PID {pid} (Python {}) has not imported torch",
            hello.python
        )),
        (Some(version), false) => Some(format!(
            "torch {version} in PID {pid} has not initialized CUDA (memprof does not initialize it)"
        )),
        _ => None,
    }
}

/// One line per device of `figures`, for a terminal.
fn figures_text(figures: &[TorchDevice]) -> String {
    let b = |v: Option<crate::model::Bytes>| v.map_or("?".to_owned(), |b| b.to_string());
    let n = |v: Option<u64>| v.map_or("?".to_owned(), |n| n.to_string());
    figures
        .iter()
        .map(|d| {
            format!(
                "device {}: allocated {} (peak {}), reserved {} (peak {}), active {}, inactive split {}, alloc retries {}, OOMs {}\n",
                d.device,
                b(d.allocated),
                b(d.allocated_peak),
                b(d.reserved),
                b(d.reserved_peak),
                b(d.active),
                b(d.inactive_split),
                n(d.num_alloc_retries),
                n(d.num_ooms)
            )
        })
        .collect()
}

/// `--snapshot`, `--record`, `--on-oom`: each needs the agent; any failure is a refusal.
pub fn run_modes(pid: u32, wait: Duration, modes: &Modes) -> anyhow::Result<Outcome> {
    let stop = stop_flag()?;
    let mut session = open(pid, wait, &stop)?;
    if let Some(why) = no_figures(&session) {
        session.detach().map_err(anyhow::Error::msg)?;
        bail!("{why}: no PyTorch allocator to read (`memprof attach {pid}` shows NVML's figure)");
    }
    let backend = session.hello.backend.clone();
    if backend.as_deref().is_some_and(|b| b != "native") {
        let stats = session
            .request(json!({"cmd": "stats"}))
            .map_err(anyhow::Error::msg)?;
        print!("{}", figures_text(&figures(&stats)));
        session.detach().map_err(anyhow::Error::msg)?;
        bail!(
            "PID {pid} uses PyTorch's {} allocator, which keeps no snapshot or history; its memory_stats are above",
            backend.unwrap_or_default()
        );
    }
    // --record first: with it, --snapshot names where the window goes.
    let took = if let Some(window) = modes.record {
        record(session, window, &stop, modes)?
    } else if let Some(file) = modes.snapshot {
        let answer = session
            .request(json!({"cmd": "snapshot"}))
            .map_err(anyhow::Error::msg)?;
        take(&session, &answer, file)?;
        report_pause(&session);
        session.detach().map_err(anyhow::Error::msg)?;
        Took::Snapshot(file.to_path_buf())
    } else if let Some(file) = modes.on_oom {
        match await_oom(session, &stop, file)? {
            Some(took) => took,
            None => return Ok(Outcome::Ok),
        }
    } else {
        bail!("no mode given");
    };
    match took {
        Took::Snapshot(file) => analyze(&file, modes.json),
        Took::Oom(file) => diagnose(&file, modes.json),
    }
}

enum Took {
    Snapshot(PathBuf),
    Oom(PathBuf),
}

/// Moves the file an answer names to `to`, and says so on stderr.
fn take(session: &Session, answer: &Value, to: &Path) -> anyhow::Result<()> {
    let path = answer["path"].as_str().context("the agent named no file")?;
    session.take(path, to).map_err(anyhow::Error::msg)?;
    eprintln!("memprof: wrote {}", to.display());
    Ok(())
}

fn report_pause(session: &Session) {
    eprintln!(
        "memprof: the longest request held PID {}'s interpreter for {:.1} ms",
        session.pid(),
        session.longest_held_us as f64 / 1000.0
    );
}

/// Turns history on (unless it was), waits `window` or until Ctrl-C, dumps, puts it back.
fn record(
    mut session: Session,
    window: Duration,
    stop: &AtomicBool,
    modes: &Modes,
) -> anyhow::Result<Took> {
    let pid = session.pid();
    let started = session
        .request(json!({"cmd": "record_start", "max_entries": RECORD_ENTRIES}))
        .map_err(anyhow::Error::msg)?;
    if started["was_on"].as_bool() == Some(true) {
        eprintln!("memprof: PyTorch's memory history was already on in PID {pid}; it stays on");
    }
    eprintln!(
        "memprof: recording PID {pid} for {} s (Ctrl-C ends the window early)",
        window.as_secs_f64()
    );
    let start = Instant::now();
    while start.elapsed() < window && !stop.load(Ordering::Relaxed) {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            bail!("PID {pid} ended during the window");
        }
        std::thread::sleep(Duration::from_millis(50).min(window));
    }
    let answer = session
        .request(json!({"cmd": "record_stop"}))
        .map_err(anyhow::Error::msg)?;
    let file = modes
        .snapshot
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(format!("memprof-attach-{pid}.pickle")));
    take(&session, &answer, &file)?;
    report_pause(&session);
    session.detach().map_err(anyhow::Error::msg)?;
    Ok(Took::Snapshot(file))
}

/// Arms the OOM observer and waits for it; None when the wait ended first (Ctrl-C, or the
/// job exited without one).
fn await_oom(mut session: Session, stop: &AtomicBool, file: &Path) -> anyhow::Result<Option<Took>> {
    let pid = session.pid();
    // With history on, the snapshot holds the trace that led to the error (and its `oom`
    // entry), which the diagnosis reads; it is put back as it was on detach.
    session
        .request(json!({"cmd": "record_start", "max_entries": RECORD_ENTRIES}))
        .map_err(anyhow::Error::msg)?;
    session
        .request(json!({"cmd": "arm_oom"}))
        .map_err(anyhow::Error::msg)?;
    eprintln!(
        "memprof: waiting for an out-of-memory error in PID {pid}; its snapshot goes to {} (Ctrl-C detaches)",
        file.display()
    );
    loop {
        if stop.load(Ordering::Relaxed) {
            session.detach().map_err(anyhow::Error::msg)?;
            eprintln!("memprof: detached from PID {pid} before any out-of-memory error");
            return Ok(None);
        }
        let state = match session.request(json!({"cmd": "oom"})) {
            Ok(state) => state,
            // The job died, most likely of the error itself: the observer wrote first.
            Err(e) => {
                if session
                    .take_left("oom.pickle", file)
                    .map_err(anyhow::Error::msg)?
                {
                    eprintln!(
                        "memprof: PID {pid} ended after an out-of-memory error; wrote {}",
                        file.display()
                    );
                    return Ok(Some(Took::Oom(file.to_path_buf())));
                }
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    bail!("PID {pid} exited without an out-of-memory error while memprof waited");
                }
                bail!(e)
            }
        };
        if state["oom"].is_object() {
            take(&session, &state["oom"], file)?;
            session.detach().map_err(anyhow::Error::msg)?;
            return Ok(Some(Took::Oom(file.to_path_buf())));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn analyze(file: &Path, json: bool) -> anyhow::Result<Outcome> {
    super::analyze::run(&super::AnalyzeArgs {
        files: vec![file.to_path_buf()],
        json,
        top: 10,
        full_stacks: false,
        device: None,
        plot: None,
        categories: Vec::new(),
        at: None,
    })
}

fn diagnose(file: &Path, json: bool) -> anyhow::Result<Outcome> {
    super::diagnose::run(&super::diagnose::DiagnoseArgs {
        file: Some(file.to_path_buf()),
        log: None,
        capacity: None,
        micro_batch: None,
        json,
        fail_on_oom: false,
    })
}

/// The `--json` series of PyTorch's figures (with NVML's figure for the process beside them
/// where NVML runs), until `duration` passed, the job ended or Ctrl-C; then detaches.
pub fn follow(
    mut session: Session,
    doc: &mut AttachDocument,
    mut nvml: Option<Box<dyn GpuSampler + Send>>,
    duration: Duration,
    interval: Duration,
) -> anyhow::Result<()> {
    let stop = stop_flag()?;
    let clock = SystemClock;
    let start = Instant::now();
    loop {
        let answer = session
            .request(json!({"cmd": "stats"}))
            .map_err(anyhow::Error::msg)?;
        let mut devices = figures(&answer);
        let now = clock.now_ms();
        if let Some(sample) = nvml.as_mut().and_then(|s| s.sample().ok()) {
            doc.push(&sample);
            add_nvml(&mut devices, session.pid(), &sample);
        }
        doc.push_torch(now, devices);
        if start.elapsed() + interval > duration || stop.load(Ordering::Relaxed) {
            break;
        }
        std::thread::sleep(interval);
    }
    if let Some(torch) = doc.torch.as_mut() {
        torch.longest_held_us = session.longest_held_us;
        torch.restored = Some(session.detach().map_err(anyhow::Error::msg)?);
    }
    Ok(())
}
