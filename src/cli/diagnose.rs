//! `memprof diagnose FILE | --log LOGFILE`: the root cause of an OOM, from a snapshot's `oom`
//! entries (with remedies replayed through the simulator), from a memprof recording's failed
//! allocations (driver figures only), or from the OOM messages of a log.

use super::input::load_snapshot;
use super::Outcome;
use crate::diagnose::{diagnose_device, diagnose_log, diagnose_recording_device, Depth};
use crate::model::Bytes;
use crate::report::diagnose::DiagnoseReport;
use crate::sim::replay::{self, DeviceTrace};
use crate::sim::Backend;
use crate::source::oom_log::parse_log;
use anyhow::{anyhow, bail, Context};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct DiagnoseArgs {
    /// A PyTorch memory snapshot with an `oom` trace entry, or a memprof recording with a failed
    /// allocation.
    #[arg(
        value_name = "FILE",
        required_unless_present = "log",
        conflicts_with = "log"
    )]
    pub file: Option<PathBuf>,
    /// A log holding PyTorch OOM error messages (any format since 2.0).
    #[arg(long, value_name = "LOGFILE")]
    pub log: Option<PathBuf>,
    /// The device's total memory (bytes or units: 80GiB), to find memory held outside the
    /// allocator. Snapshots only: a message prints it.
    #[arg(long, value_name = "SIZE", conflicts_with = "log")]
    pub capacity: Option<String>,
    /// Print one JSON document (schema_version 1) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &DiagnoseArgs) -> anyhow::Result<Outcome> {
    let (report, source) = match (&args.file, &args.log) {
        (_, Some(log)) => (from_log(log)?, log),
        (Some(file), None) => (from_snapshot(file, args)?, file),
        (None, None) => bail!("give a snapshot FILE or --log LOGFILE"),
    };
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else if report.diagnoses.is_empty() {
        writeln!(stdout, "{}: no out-of-memory error found", source.display())?;
    } else {
        stdout.write_all(report.text().as_bytes())?;
    }
    stdout.flush()?;
    Ok(if report.diagnoses.is_empty() {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}

fn from_log(path: &Path) -> anyhow::Result<DiagnoseReport> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(DiagnoseReport::new(diagnose_log(&parse_log(&text))))
}

fn from_snapshot(path: &Path, args: &DiagnoseArgs) -> anyhow::Result<DiagnoseReport> {
    let total = match &args.capacity {
        Some(text) => Some(
            text.parse::<Bytes>()
                .map_err(|e| anyhow!("--capacity: {e}"))?
                .0,
        ),
        None => None,
    };
    let shown = path.display().to_string();
    let loaded = load_snapshot(path, !args.json).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    for w in &loaded.parsed.warnings {
        eprintln!("memprof: warning: {shown}: {w}");
    }
    if let Some(info) = &loaded.recording {
        let diagnoses = snapshot.devices().into_iter().filter_map(|device| {
            let recorded = info.device_total.get(&device).copied();
            diagnose_recording_device(snapshot, device, total.or(recorded), true)
        });
        return Ok(DiagnoseReport::new(diagnoses.collect()));
    }
    let (recorded, warning) = replay::recorded_config(snapshot);
    if let Some(w) = warning {
        eprintln!("memprof: warning: {shown}: {w}");
    }
    let mut diagnoses = Vec::new();
    for trace in DeviceTrace::all(snapshot) {
        if !trace
            .entries
            .iter()
            .any(|e| e.action == crate::model::Action::Oom)
        {
            continue;
        }
        if recorded.backend == Backend::CudaMallocAsync {
            bail!("{shown}: recorded with backend:cudaMallocAsync, which has no caching rules to diagnose");
        }
        let prepared = replay::prepare(&trace, &recorded, None);
        diagnoses.extend(diagnose_device(
            snapshot,
            &prepared,
            &recorded,
            total,
            Depth::WithRemedies,
        ));
    }
    Ok(DiagnoseReport::new(diagnoses))
}
