//! `memprof attach PID`: the live view of one process (`tui::attach`), or with `--json
//! --duration SECS` its series as one JSON document. With the shim loaded in the process its
//! socket's event stream is read; in a Python job that imported torch and initialized CUDA,
//! memprof's agent reads PyTorch's own figures (`attach_torch`, which also runs `--snapshot`,
//! `--record` and `--on-oom`); otherwise NVML is sampled for the PID.

use super::{attach_torch, Outcome};
use crate::report::attach_json::{AttachDocument, TorchSeries};
use crate::source::attach::feed::TorchFeed;
use crate::source::attach::session::Session;
use crate::source::attach::target::python_of_pid;
use crate::source::gpu::{open_nvml, Background, GpuSampler, ProcView, SystemClock};
use crate::source::live::{socket_path, LiveClient, LiveEvent};
use crate::source::live_feed::{FeedState, LiveFeed};
use crate::source::live_tally::LiveTally;
use crate::tui::attach::{AttachApp, Feed};
use crate::tui::terminal;
use crate::tui::theme::Theme;
use anyhow::{bail, Context};
use clap::Args;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The process to watch: its shim stream when it runs under the shim, else NVML.
    pub pid: u32,
    /// Print the time series as one JSON document instead of the live view.
    #[arg(long)]
    pub json: bool,
    /// How long to sample (seconds).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Seconds between samples.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,
    /// Write PyTorch's snapshot of the job's allocator to FILE now, then analyze it (a Python
    /// job that uses PyTorch; with --record, where the recorded window goes).
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,
    /// Turn PyTorch's memory history on with stacks for SECS seconds (Ctrl-C ends it early),
    /// dump it (to --snapshot FILE, else memprof-attach-PID.pickle) and analyze it; history is
    /// then put back as it was.
    #[arg(long, value_name = "SECS")]
    pub record: Option<f64>,
    /// Arm PyTorch's out-of-memory observer in the job, with memory history on: its next OOM
    /// writes its snapshot to FILE, which memprof then diagnoses. Waits in the foreground;
    /// Ctrl-C detaches, putting history back as it was.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["snapshot", "record"])]
    pub on_oom: Option<PathBuf>,
    /// Seconds to wait for a Python job to run memprof's code (it runs between two bytecodes of
    /// the job's main thread).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub wait: f64,
    /// Inject nothing into the job: read the shim or NVML only.
    #[arg(long, conflicts_with_all = ["snapshot", "record", "on_oom"])]
    pub no_inject: bool,
}

/// How long `--json` in shim mode waits, at most, for the records of what is alive (up to the
/// mark that ends them) before its first sample.
const FIRST_WAIT: Duration = Duration::from_secs(5);

fn seconds(flag: &str, value: f64) -> anyhow::Result<Duration> {
    if value.is_finite() && value > 0.0 && value <= 86_400.0 {
        Ok(Duration::from_secs_f64(value))
    } else {
        bail!("{flag} {value}: expected seconds between 0 and 86400")
    }
}

pub fn run(args: &AttachArgs) -> anyhow::Result<Outcome> {
    let interval = seconds("--interval", args.interval)?;
    check_process(Path::new("/proc"), args.pid)?;
    let wait = seconds("--wait", args.wait)?;
    if args.snapshot.is_some() || args.record.is_some() || args.on_oom.is_some() {
        if args.duration.is_some() {
            bail!("--duration is for the live series, not --snapshot, --record or --on-oom");
        }
        let modes = attach_torch::Modes {
            snapshot: args.snapshot.as_deref(),
            record: args.record.map(|r| seconds("--record", r)).transpose()?,
            on_oom: args.on_oom.as_deref(),
            json: args.json,
        };
        return attach_torch::run_modes(args.pid, wait, &modes);
    }
    let duration = match (args.json, args.duration) {
        (true, None) => bail!("`memprof attach --json` needs --duration SECS"),
        (true, Some(d)) => Some(seconds("--duration", d)?),
        (false, Some(_)) => bail!("--duration is for `memprof attach --json`"),
        (false, None) => None,
    };
    if !args.json && !std::io::stdout().is_terminal() {
        bail!("`memprof attach PID` is an interactive dashboard and needs a terminal; use --json --duration SECS for a series");
    }
    let command = ProcView::system().command(args.pid);
    let shim = connect_shim(args.pid);
    // Not under the shim: PyTorch's own figures where the job has them.
    let (torch, shim) = match shim {
        Err(why) if !args.no_inject => match torch_session(args.pid, wait)? {
            Ok(session) => (Some(session), Err(why)),
            Err(not_torch) => (None, Err(format!("{why}; {not_torch}"))),
        },
        shim => (None, shim),
    };
    if let Some(duration) = duration {
        let doc = match (torch, shim) {
            (Some(session), _) => {
                let nvml = open_nvml(Box::new(SystemClock)).ok();
                let source = nvml.as_ref().map_or_else(
                    || "PyTorch (memprof agent in the job); NVML not available".to_owned(),
                    |s| format!("PyTorch (memprof agent in the job) and {}", s.describe()),
                );
                let series = TorchSeries {
                    python: session.hello.python.clone(),
                    torch_version: session.hello.torch.clone(),
                    backend: session.hello.backend.clone(),
                    samples: Vec::new(),
                    longest_held_us: 0,
                    restored: None,
                };
                let mut doc =
                    AttachDocument::new_torch(args.pid, command, args.interval, series, source);
                attach_torch::follow(session, &mut doc, nvml, duration, interval)?;
                doc
            }
            (None, Ok(client)) => {
                let mut doc = AttachDocument::new_shim(args.pid, command, args.interval);
                follow_shim(LiveFeed::start(client)?, &mut doc, duration, interval);
                doc
            }
            (None, Err(why)) => {
                let mut sampler = open_nvml_for(args.pid, &why)?;
                let mut doc =
                    AttachDocument::new(args.pid, command, sampler.describe(), args.interval);
                follow(sampler.as_mut(), &mut doc, duration, interval)?;
                doc
            }
        };
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &doc)?;
        writeln!(out)?;
        return Ok(Outcome::Ok);
    }
    let (feed, why) = match (torch, shim) {
        (Some(session), _) => {
            let nvml = open_nvml(Box::new(SystemClock)).ok();
            (
                Feed::Torch(TorchFeed::start(session, nvml, interval)),
                String::new(),
            )
        }
        (None, Ok(client)) => (Feed::Shim(LiveFeed::start(client)?), String::new()),
        (None, Err(why)) => {
            // The dashboard samples on a thread of its own: a hung driver call cannot freeze it.
            let sampler = Box::new(Background::start(open_nvml_for(args.pid, &why)?, interval));
            let proc_dir = PathBuf::from(format!("/proc/{}", args.pid));
            let alive = Box::new(move || proc_dir.exists());
            (Feed::Nvml { sampler, alive }, why)
        }
    };
    let clock = SystemClock;
    let theme = Theme::from_no_color(std::env::var_os("NO_COLOR").as_deref());
    let mut app = AttachApp::new(args.pid, command, feed, &clock, interval, theme, &why);
    terminal::run(&mut app).context("terminal")?;
    Ok(Outcome::Ok)
}

/// Attaches memprof's agent to a Python job that has PyTorch figures to give. Ok(Err(why)) when
/// the process has none (not Python, no torch, CUDA not initialized: NVML is read instead, and
/// `why` says so); Err when it is a Python job memprof may not or cannot attach to (a refusal).
fn torch_session(pid: u32, wait: Duration) -> anyhow::Result<Result<Session, String>> {
    if let Err(why) = python_of_pid(Path::new("/proc"), pid) {
        if why.starts_with("not a Python process") {
            return Ok(Err(format!("PID {pid} is {why}")));
        }
    }
    let stop = attach_torch::stop_flag()?;
    let session = attach_torch::open(pid, wait, &stop)?;
    match attach_torch::no_figures(&session) {
        None => Ok(Ok(session)),
        Some(why) => {
            session.detach().map_err(anyhow::Error::msg)?;
            Ok(Err(why))
        }
    }
}

/// Connects to the shim in `pid`, or says why not (then NVML is sampled instead).
pub fn connect_shim(pid: u32) -> Result<LiveClient, String> {
    let path = socket_path(pid);
    if !path.exists() {
        return Err(format!(
            "no memprof shim in PID {pid} (no socket {})",
            path.display()
        ));
    }
    LiveClient::connect(pid)
        .map_err(|e| format!("the shim socket of PID {pid} did not answer ({e})"))
}

/// NVML, or one line saying that neither the shim nor NVML can see the process. NVML names
/// processes by their PID in the host's namespace, so inside a container (another PID
/// namespace) it would never find this PID: that is refused rather than shown as no memory.
fn open_nvml_for(pid: u32, why: &str) -> anyhow::Result<Box<dyn GpuSampler + Send>> {
    if !ProcView::system().host_namespace() {
        bail!(
            "cannot watch PID {pid}: {why}, and NVML reports host PIDs, which this PID namespace \
             (a container) cannot match; run memprof on the host or load the shim"
        );
    }
    open_nvml(Box::new(SystemClock))
        .with_context(|| format!("cannot watch PID {pid}: {why}, and NVML cannot be used"))
}

/// Takes the shim's stream every `interval` into the series until `duration` has passed or the
/// process ended.
fn follow_shim(feed: LiveFeed, doc: &mut AttachDocument, duration: Duration, interval: Duration) {
    let start = Instant::now();
    let clock = SystemClock;
    let mut tally = LiveTally::default();
    // The first sample waits for every record of what was alive at connect, which may not all
    // have arrived yet: the shim ends them with a mark.
    while let Some(remaining) = FIRST_WAIT.checked_sub(start.elapsed()) {
        match feed.next_within(remaining) {
            Some(Ok(LiveEvent::CaughtUp)) | Some(Err(_)) | None => break,
            Some(Ok(event)) => {
                let ended = matches!(event, LiveEvent::End { .. });
                tally.apply(&event);
                if ended {
                    break;
                }
            }
        }
    }
    loop {
        let state = feed.drain(usize::MAX, |item| {
            if let Ok(event) = item {
                tally.apply(&event);
            }
        });
        doc.push_shim(crate::source::gpu::Clock::now_ms(&clock), &tally);
        if state == FeedState::Closed || start.elapsed() + interval > duration {
            return;
        }
        std::thread::sleep(interval);
    }
}

/// Samples until `duration` has passed (the first sample at once, the last no later than
/// `duration`). Only a failing first sample is an error; later failures (a transient driver
/// error an hour in) are counted and the series goes on.
fn follow(
    sampler: &mut dyn GpuSampler,
    doc: &mut AttachDocument,
    duration: Duration,
    interval: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    doc.push(&sampler.sample()?);
    loop {
        if start.elapsed() + interval > duration {
            return Ok(());
        }
        std::thread::sleep(interval);
        match sampler.sample() {
            Ok(sample) => doc.push(&sample),
            Err(_) => doc.failed_samples += 1,
        }
    }
}

/// The process must exist and, unless we are root, be ours: NVML would list any process, but
/// attaching to another user's is refused as it will be in shim mode.
fn check_process(proc_root: &Path, pid: u32) -> anyhow::Result<()> {
    let status = match std::fs::read_to_string(proc_root.join(pid.to_string()).join("status")) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no process with PID {pid}")
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read /proc/{pid}/status")),
    };
    let ours = std::fs::read_to_string(proc_root.join("self/status"))
        .context("cannot read /proc/self/status")?;
    let (Some(theirs), Some(mine)) = (real_uid(&status), real_uid(&ours)) else {
        bail!("cannot tell which user owns PID {pid} (no Uid line in /proc/{pid}/status)");
    };
    if mine != 0 && theirs != mine {
        bail!("PID {pid} belongs to another user (uid {theirs}); attach as that user or as root");
    }
    Ok(())
}

/// The real UID from a /proc/PID/status text (`Uid:\treal\teffective\tsaved\tfs`).
fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_proc(name: &str, mine: u32, theirs: u32) -> std::path::PathBuf {
        let root =
            std::env::temp_dir().join(format!("memprof-attach-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (dir, uid) in [("self", mine), ("42", theirs)] {
            std::fs::create_dir_all(root.join(dir)).expect("temp dir");
            let text = format!("Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
            std::fs::write(root.join(dir).join("status"), text).expect("write");
        }
        root
    }

    #[test]
    fn refuses_missing_and_foreign_processes_but_not_for_root() {
        let root = fake_proc("users", 1000, 1001);
        assert_eq!(
            check_process(&root, 43).map_err(|e| e.to_string()),
            Err("no process with PID 43".to_owned())
        );
        assert_eq!(
            check_process(&root, 42).map_err(|e| e.to_string()),
            Err(
                "PID 42 belongs to another user (uid 1001); attach as that user or as root"
                    .to_owned()
            )
        );
        let _ = std::fs::remove_dir_all(&root);
        let root = fake_proc("root", 0, 1001);
        assert!(check_process(&root, 42).is_ok());
        let _ = std::fs::remove_dir_all(&root);
        let root = fake_proc("same", 1000, 1000);
        assert!(check_process(&root, 42).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }
}
