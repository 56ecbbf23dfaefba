//! `memprof diagnose FILE | --log LOGFILE`: the root cause of an OOM, from a snapshot's `oom`
//! entries (with remedies replayed through the simulator), from a memprof recording's failed
//! allocations (driver figures only), or from the OOM messages of a log.

use super::input::load_snapshot;
use super::Outcome;
use crate::analysis::oom::Diagnosis;
use crate::analysis::same_devices::SameDevices;
use crate::analysis::{layout_totals, version};
use crate::diagnose::remedies::Recorded;
use crate::diagnose::{diagnose_device, diagnose_log, diagnose_recording_device, pressure, Depth};
use crate::model::{Action, Bytes};
use crate::report::diagnose::{DevicePressure, DiagnoseReport, UntracedState};
use crate::report::terminal_text::terminal_lines;
use crate::sim::replay::{self, DeviceTrace};
use crate::sim::Backend;
use crate::source::oom_log::parse_log;
use anyhow::{anyhow, bail, Context};
use clap::Args;
use rustc_hash::FxHashMap;
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
    /// Exit with status 1 when an out-of-memory error is found (for scripts and CI).
    #[arg(long)]
    pub fail_on_oom: bool,
}

pub fn run(args: &DiagnoseArgs) -> anyhow::Result<Outcome> {
    let (report, source) = report(args)?;
    // Buffered: stdout writes at each newline, and JSON comes in many small pieces.
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        let text = report.text(&source.display().to_string());
        stdout.write_all(terminal_lines(&text).as_bytes())?;
    }
    stdout.flush()?;
    Ok(if args.fail_on_oom && !report.diagnoses.is_empty() {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}

/// The report `--json` prints (the MCP tool `diagnose` returns it too), and the file it read.
pub(super) fn report(args: &DiagnoseArgs) -> anyhow::Result<(DiagnoseReport, &PathBuf)> {
    Ok(match (&args.file, &args.log) {
        (_, Some(log)) => (from_log(log)?, log),
        (Some(file), None) => (from_snapshot(file, args)?, file),
        (None, None) => bail!("give a snapshot FILE or --log LOGFILE"),
    })
}

fn from_log(path: &Path) -> anyhow::Result<DiagnoseReport> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(DiagnoseReport::new(
        diagnose_log(&parse_log(&text)),
        Vec::new(),
        None,
    ))
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
        super::warn(&format!("{shown}: {w}"));
    }
    if let Some(info) = &loaded.recording {
        let diagnoses = snapshot.devices().into_iter().filter_map(|device| {
            let recorded = info.device_total.get(&device).copied();
            diagnose_recording_device(snapshot, device, total.or(recorded), true)
        });
        return Ok(DiagnoseReport::new(diagnoses.collect(), Vec::new(), None));
    }
    let (config, warning) = replay::recorded_config(snapshot);
    if let Some(w) = warning {
        super::warn(&format!("{shown}: {w}"));
    }
    let version = version::infer(
        snapshot.format,
        &loaded.parsed.keys,
        snapshot.has_trace_entries(),
    );
    let recorded = Recorded {
        config: &config,
        conf: snapshot.alloc_conf(),
        version,
    };
    let mut diagnoses: Vec<Diagnosis> = Vec::new();
    let mut devices: Vec<DevicePressure> = Vec::new();
    let traced: Vec<u32> = snapshot
        .devices()
        .into_iter()
        .filter(|&d| !snapshot.timeline.device(d as usize).is_empty())
        .collect();
    // Twins (devices alike in every entry and segment) are diagnosed once: where each device's
    // pressure and diagnosis went.
    let twins = SameDevices::find(snapshot, &traced);
    let mut done: FxHashMap<u32, (usize, Option<usize>)> = FxHashMap::default();
    for &device in &traced {
        if let Some(&(p, g)) = twins.twin_of(device).and_then(|t| done.get(&t)) {
            let pressure = devices[p].pressure.clone();
            devices.push(DevicePressure {
                device,
                pressure,
                untraced: None,
                twin_of: twins.twin_of(device),
            });
            if let Some(g) = g {
                let copy = Diagnosis {
                    device,
                    ..diagnoses[g].clone()
                };
                diagnoses.push(copy);
            }
            continue;
        }
        let trace = DeviceTrace::of(snapshot, device);
        let has_oom = trace.entries.iter().any(|e| e.action == Action::Oom);
        if has_oom && config.backend == Backend::CudaMallocAsync {
            bail!("{shown}: recorded with backend:cudaMallocAsync, which has no caching rules to diagnose");
        }
        if config.backend == Backend::CudaMallocAsync {
            continue;
        }
        let prepared = replay::prepare(&trace, &config, None);
        devices.push(DevicePressure {
            device,
            pressure: Some(pressure(snapshot, &prepared)),
            untraced: None,
            twin_of: None,
        });
        let before = diagnoses.len();
        if has_oom {
            diagnoses.extend(diagnose_device(
                snapshot,
                &prepared,
                &recorded,
                total,
                Depth::WithRemedies,
            ));
        }
        let diagnosis = (diagnoses.len() > before).then_some(before);
        done.insert(device, (devices.len() - 1, diagnosis));
    }
    // Devices without a trace: only the final layout speaks.
    for device in snapshot.devices() {
        // `traced` is in device order: a search, not a scan, per device.
        if traced.binary_search(&device).is_ok() {
            continue;
        }
        let totals = layout_totals(snapshot.device_segments(device));
        devices.push(DevicePressure {
            device,
            pressure: None,
            untraced: Some(UntracedState {
                reserved_bytes: totals.reserved_bytes,
                active_bytes: totals.active_bytes,
                free_in_cache_bytes: totals.fragmentation.external_bytes,
                largest_free_block_bytes: totals.fragmentation.largest_free_block_bytes,
            }),
            twin_of: None,
        });
    }
    devices.sort_by_key(|d| d.device);
    super::diagnose_ledger::name_outside_holders(path, &mut diagnoses);
    Ok(DiagnoseReport::new(diagnoses, devices, Some(version)))
}
