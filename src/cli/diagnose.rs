//! `memprof diagnose FILE | --log LOGFILE`: the root cause of an OOM, from a snapshot's `oom`
//! entries (with remedies replayed through the simulator), from a memprof recording's failed
//! allocations (driver figures only), or from the OOM messages of a log.

use super::input::{load_snapshot, Loaded};
use super::Outcome;
use crate::analysis::categories::CategoryRules;
use crate::analysis::oom::Diagnosis;
use crate::analysis::version;
use crate::diagnose::remedies::{pressure_remedies, Recorded};
use crate::diagnose::{diagnose_device, diagnose_log, diagnose_recording_device, Depth};
use crate::model::Bytes;
use crate::model::{ReplayStarts, Snapshot};
use crate::plan::fit::{one_line, what_fits, FitAsk};
use crate::report::diagnose::{DevicePressure, DiagnoseReport, UntracedState, WouldFit};
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
    /// The run's micro-batch: an OOM in a snapshot's trace then also says the largest
    /// micro-batch that fits the replay's capacity (as `plan fit`). Snapshots only.
    #[arg(long, value_name = "N", conflicts_with = "log", value_parser = clap::value_parser!(u64).range(1..))]
    pub micro_batch: Option<u64>,
    /// Print one JSON document (schema_version 2) instead of text.
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
    let mut report = from_loaded(path, &loaded, total)?;
    if let Some(micro_batch) = args.micro_batch {
        report.would_fit = would_fit(&loaded.parsed.snapshot, &report.diagnoses, micro_batch);
    }
    Ok(report)
}

/// `plan fit`'s one line for each device whose OOM was replayed, at the capacity the replay
/// used (what the allocator may reserve, so no CUDA context comes off it). A device whose
/// trace cannot answer (no trace, nothing that scales) gets no line.
fn would_fit(snapshot: &Snapshot, diagnoses: &[Diagnosis], micro_batch: u64) -> Vec<WouldFit> {
    let mut lines: Vec<WouldFit> = Vec::new();
    for d in diagnoses {
        let Some(capacity) = d.replay_capacity_bytes else {
            continue;
        };
        if lines.iter().any(|w| w.device == d.device) {
            continue;
        }
        let ask = FitAsk {
            capacity,
            context_bytes: 0,
            micro_batch: Some(micro_batch),
            seq_len: None,
        };
        let Ok(report) = what_fits(snapshot, d.device, &ask) else {
            continue;
        };
        if let (Some(line), Some(a)) = (one_line(&report), report.micro_batch.as_ref()) {
            lines.push(WouldFit {
                device: d.device,
                line,
                largest_micro_batch: a.largest,
            });
        }
    }
    lines
}

/// The report of a snapshot or recording already read from `path`; `total` is `--capacity`.
pub(super) fn from_loaded(
    path: &Path,
    loaded: &Loaded,
    total: Option<u64>,
) -> anyhow::Result<DiagnoseReport> {
    let shown = path.display().to_string();
    let snapshot = &loaded.parsed.snapshot;
    for w in &loaded.parsed.warnings {
        super::warn(&format!("{shown}: {w}"));
    }
    if let Some(info) = &loaded.recording {
        let starts = ReplayStarts::new(snapshot);
        let diagnoses = snapshot.devices().into_iter().filter_map(|device| {
            let recorded = info.device_total.get(&device).copied();
            diagnose_recording_device(&starts, device, total.or(recorded), true)
        });
        return Ok(DiagnoseReport::new(
            diagnoses.collect(),
            Vec::new(),
            None,
            None,
        ));
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
    // The account every output renders: the figures at each moment, the pressure, the
    // findings. The diagnoses below add the remedies, replayed.
    let rules = CategoryRules::default();
    let mut account = crate::account::build(
        snapshot,
        &crate::account::Options {
            capacity: total,
            keep_replays: true,
            ..crate::account::Options::new(10, &rules, crate::diagnose::Origin::TorchSnapshot)
        },
    );
    let mut diagnoses: Vec<Diagnosis> = Vec::new();
    let mut devices: Vec<DevicePressure> = Vec::new();
    // Twins (devices alike in every entry and segment) are diagnosed once: where each
    // device's remedies and diagnosis went.
    let mut done: FxHashMap<u32, (usize, Option<usize>)> = FxHashMap::default();
    // The account's allocator replay of each device that ran out of memory or stalled: the
    // remedies replay from it rather than replaying the trace again.
    let mut replays = std::mem::take(&mut account.replays);
    for r in &account.devices {
        let device = r.device;
        let judged = r.account.peaks.requested.bytes.is_some();
        let dump = r.account.dump();
        let mut row = DevicePressure {
            device,
            pressure: r.pressure.clone().filter(|_| judged),
            remedies: None,
            untraced: (r.trace.entries == 0).then(|| UntracedState {
                reserved_bytes: dump.reserved_bytes.unwrap_or(0),
                active_bytes: dump.active_bytes.unwrap_or(0),
                free_in_cache_bytes: dump.cached_free_bytes.unwrap_or(0),
                largest_free_block_bytes: dump.largest_free_block_bytes.unwrap_or(0),
            }),
            twin_of: r.twin_of,
            account: r.account.clone(),
        };
        if let Some(&(p, g)) = r.twin_of.and_then(|t| done.get(&t)) {
            row.remedies = devices[p].remedies.clone();
            devices.push(row);
            if let Some(g) = g {
                let copy = Diagnosis {
                    device,
                    ..diagnoses[g].clone()
                };
                diagnoses.push(copy);
            }
            continue;
        }
        let stalled = row
            .pressure
            .as_ref()
            .is_some_and(|p| p.oom_retries > 0 || p.empty_cache_bursts > 0);
        if r.oom.is_none() && !stalled {
            devices.push(row);
            continue;
        }
        if config.backend == Backend::CudaMallocAsync {
            if r.oom.is_some() {
                bail!("{shown}: recorded with backend:cudaMallocAsync, which has no caching rules to diagnose");
            }
            devices.push(row);
            continue;
        }
        let prepared = match replays.remove(&device) {
            Some(kept) => kept,
            // (The account keeps one for every device that gets here.)
            None => replay::prepare(&DeviceTrace::of(snapshot, device), &config, None),
        };
        row.remedies = pressure_remedies(&prepared, &recorded);
        devices.push(row);
        let before = diagnoses.len();
        if r.oom.is_some() {
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
    devices.sort_by_key(|d| d.device);
    super::diagnose_ledger::name_outside_holders(path, &mut diagnoses);
    Ok(DiagnoseReport::new(
        diagnoses,
        devices,
        Some(version),
        account.axis.origin_us,
    ))
}
