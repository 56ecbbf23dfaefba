//! `memprof top`: the dashboard of every GPU and its processes, sampled through NVML, with the
//! processes that run the shim marked; Enter opens a process's attach view, or for a process
//! not under the shim the attach menu, whose `memprof attach` modes run here once the
//! dashboard has closed. A machine without NVML gets one line saying so (exit 2), never
//! made-up numbers.

use super::Outcome;
use crate::cli::attach::connect_shim;
use crate::source::gpu::{open_nvml, Background, GpuSampler, SystemClock};
use crate::source::live::{processes_in, socket_dir};
use crate::source::live_feed::LiveFeed;
use crate::tui::terminal;
use crate::tui::theme::Theme;
use crate::tui::top::menu::AttachChoice;
use crate::tui::top::TopApp;
use anyhow::{bail, Context};
use clap::Args;
use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between samples.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,
}

/// The sampler `top` reads: NVML, on a thread of its own so a hung driver call cannot freeze
/// the dashboard.
fn open_sampler(interval: Duration) -> anyhow::Result<Box<dyn GpuSampler>> {
    let sampler = open_nvml(Box::new(SystemClock)).context("cannot sample GPUs")?;
    Ok(Box::new(Background::start(sampler, interval)))
}

/// Whether each of `pids` runs the shim: a socket in our directory says yes; a process of ours
/// without one, no; another user's process (its socket would be in its own directory) is left
/// out, unknown.
fn shim_column(dir: &Path, pids: &[u32]) -> Vec<(u32, bool)> {
    let with_socket = processes_in(dir);
    let own = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    pids.iter()
        .filter_map(|&pid| {
            if with_socket.contains(&pid) {
                return Some((pid, true));
            }
            let owner = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
            (Some(owner) == own).then_some((pid, false))
        })
        .collect()
}

pub fn run(args: &TopArgs) -> anyhow::Result<Outcome> {
    if !(args.interval.is_finite() && (0.05..=3600.0).contains(&args.interval)) {
        bail!(
            "--interval {}: expected seconds between 0.05 and 3600",
            args.interval
        );
    }
    let interval = Duration::from_secs_f64(args.interval);
    let sampler = open_sampler(interval)?;
    if !std::io::stdout().is_terminal() {
        bail!("`memprof top` is an interactive dashboard and needs a terminal");
    }
    let clock = SystemClock;
    let theme = Theme::from_no_color(std::env::var_os("NO_COLOR").as_deref());
    let dir = socket_dir();
    let list = Box::new(move |pids: &[u32]| shim_column(&dir, pids));
    let open = Box::new(|pid| {
        let client = connect_shim(pid)?;
        LiveFeed::start(client).map_err(|e| e.to_string())
    });
    let alive = std::rc::Rc::new(|pid: u32| Path::new(&format!("/proc/{pid}")).exists());
    let mut app = TopApp::new(sampler, &clock, interval, theme)
        .with_shims(list, open)
        .with_liveness(alive);
    terminal::run(&mut app).context("terminal")?;
    match app.chosen.take() {
        Some((pid, choice)) => super::attach::run(&attach_args(pid, choice)),
        None => Ok(Outcome::Ok),
    }
}

/// The `memprof attach` a choice of the attach menu stands for.
fn attach_args(pid: u32, choice: AttachChoice) -> super::attach::AttachArgs {
    let mut args = super::attach::AttachArgs {
        pid,
        json: false,
        duration: None,
        interval: 1.0,
        snapshot: None,
        record: None,
        on_oom: None,
        wait: 10.0,
        no_inject: false,
    };
    match choice {
        AttachChoice::Watch => {}
        AttachChoice::Snapshot(file) => args.snapshot = Some(file),
        AttachChoice::Record { seconds, file } => {
            args.record = Some(seconds as f64);
            args.snapshot = Some(file);
        }
        AttachChoice::OnOom(file) => args.on_oom = Some(file),
    }
    args
}
