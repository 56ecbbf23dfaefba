//! `memprof analyze FILE...`: usage, peak, fragmentation and top sites of snapshots, and with
//! `--plot` a picture of memory over time.

use super::plot::{pick_device, write_plot};
use super::{AnalyzeArgs, Outcome};
use crate::analysis::categories::CategoryRules;
use crate::analysis::host_pinned::host_pinned;
use crate::analysis::version;
use crate::diagnose::Origin;
use crate::model::SnapshotFormat;
use crate::report::analyze_json::{
    AnalyzeReport, InputKind, InputReport, LedgerReport, ProcessReport,
};
use crate::report::analyze_text;
use crate::report::plot::{Format, Kind, Stacking};
use crate::report::terminal_text::terminal_lines;
use crate::source::recording::RecordingInfo;
use anyhow::{bail, Context};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

pub fn run(args: &AnalyzeArgs) -> anyhow::Result<Outcome> {
    if let Some(at) = &args.at {
        return super::analyze_at::run(args, at);
    }
    let report = report(args)?;
    // Buffered: stdout writes at each newline, and JSON comes in many small pieces.
    let mut stdout = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(terminal_lines(&analyze_text::render(&report)).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
}

/// The report `--json` prints (the MCP tool `analyze` returns it too); writes `--plot`.
pub(super) fn report(args: &AnalyzeArgs) -> anyhow::Result<AnalyzeReport> {
    let plot_format = args.plot.as_deref().map(Format::from_path).transpose()?;
    let rules = CategoryRules::parse(&args.categories).map_err(anyhow::Error::msg)?;
    let files = expand(&args.files)?;
    if plot_format.is_some() && files.len() > 1 {
        bail!("--plot draws one file; give one FILE (or use `memprof plot` per file)");
    }
    let joined = super::ledger_join::pair(&files);
    let inputs = if files.len() == 1 {
        vec![analyze_file(
            &files[0],
            args,
            &rules,
            plot_format,
            !args.json,
            None,
        )?]
    } else {
        analyze_in_parallel(&files, args, &rules, joined.as_ref())?
    };
    // A recording and the snapshot its ledger joins are one run, not two ranks.
    let one_run = files.len() == 2 && joined.is_some();
    Ok(AnalyzeReport::new(inputs, one_run))
}

/// Reads and analyzes one file; `progress` shows a bar for a big file on a terminal.
fn analyze_file(
    path: &Path,
    args: &AnalyzeArgs,
    rules: &CategoryRules,
    plot_format: Option<Format>,
    progress: bool,
    snapshot: Option<&Path>,
) -> anyhow::Result<InputReport> {
    let shown = path.display().to_string();
    let (mut loaded, joined) = super::ledger_join::load_with_ledger(path, progress, snapshot)
        .with_context(|| shown.clone())?;
    let ledger = joined.transpose()?.map(|joined| {
        loaded.parsed.warnings.extend(joined.warning);
        LedgerReport {
            snapshot: joined.snapshot.map(|p| p.display().to_string()),
            devices: joined.ledger,
        }
    });
    let snapshot = &loaded.parsed.snapshot;
    if let Some(d) = args.device {
        if !snapshot.devices().contains(&d) {
            bail!("{shown}: device {d} has no segments and no trace entries");
        }
    }
    let account = crate::account::build(
        snapshot,
        &crate::account::Options {
            only: args.device,
            ..crate::account::Options::new(args.top, rules, origin(loaded.recording.as_ref()))
        },
    );
    if let (Some(format), Some(out)) = (plot_format, &args.plot) {
        let device = pick_device(&account, &shown)?;
        write_plot(
            snapshot,
            &account,
            device,
            path,
            (Kind::Timeline, &Stacking::Site),
            format,
            out,
        )?;
        super::wrote_beside(out);
    }
    Ok(InputReport {
        path: shown,
        kind: if loaded.recording.is_some() {
            InputKind::MemprofRecording
        } else {
            InputKind::TorchSnapshot
        },
        bytes: loaded.bytes,
        format: match snapshot.format {
            SnapshotFormat::History => "history",
            SnapshotFormat::Modern => "modern",
            SnapshotFormat::SegmentsOnly => "segments_only",
            SnapshotFormat::Recording => "recording",
        },
        process: loaded.recording.as_ref().map(process_report),
        alloc_conf: snapshot
            .settings
            .as_ref()
            .and_then(|s| s.alloc_conf.clone()),
        torch_version: loaded.recording.is_none().then(|| {
            version::infer(
                snapshot.format,
                &loaded.parsed.keys,
                snapshot.has_trace_entries(),
            )
        }),
        time_origin_us: account.axis.origin_us,
        devices: account
            .devices
            .into_iter()
            .map(|mut d| {
                if !args.full_stacks {
                    d.top_sites.iter_mut().for_each(|s| s.full_stack.clear());
                }
                d
            })
            .collect(),
        ledger,
        pinned_host_allocator: loaded.parsed.host.as_ref().map(host_pinned),
        warnings: loaded.parsed.warnings,
    })
}

/// Analyzes several files at once, one worker per core, keeping their order.
/// `pair` is a recording and the snapshot its ledger joins.
fn analyze_in_parallel(
    files: &[PathBuf],
    args: &AnalyzeArgs,
    rules: &CategoryRules,
    pair: Option<&(PathBuf, PathBuf)>,
) -> anyhow::Result<Vec<InputReport>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(files.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<anyhow::Result<InputReport>>> = Vec::new();
    results.resize_with(files.len(), || None);
    let done = Mutex::new(results);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = files.get(i) else { return };
                let snapshot = pair.filter(|(r, _)| r == path).map(|(_, s)| s.as_path());
                let result = analyze_file(path, args, rules, None, false, snapshot);
                if let Ok(mut done) = done.lock() {
                    done[i] = Some(result);
                }
            });
        }
    });
    let results = done
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a worker analyzing the files failed"))?;
    results
        .into_iter()
        .zip(files)
        .map(|(r, path)| r.unwrap_or_else(|| bail!("{}: not analyzed", path.display())))
        .collect()
}

/// The files to read: each FILE as given, and for a directory every snapshot or recording
/// directly in it (by their first bytes: a pickle's protocol mark or a recording's magic), in
/// name order.
fn expand(given: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for path in given {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path)
            .with_context(|| format!("{}: cannot list the directory", path.display()))?;
        let mut found: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && looks_like_an_input(p))
            .collect();
        if found.is_empty() {
            bail!(
                "{}: no snapshot or recording in this directory",
                path.display()
            );
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// Whether a file starts like a pickle of protocol 2 or later, or a memprof recording.
fn looks_like_an_input(path: &Path) -> bool {
    let mut head = [0u8; 8];
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let n = file.read(&mut head).unwrap_or(0);
    (n >= 2 && head[0] == 0x80 && (2..=5).contains(&head[1]))
        || head[..n].starts_with(memprof_wire::MAGIC)
}
/// The recorded process of a memprof recording.
fn process_report(info: &RecordingInfo) -> ProcessReport {
    let process = info.process.as_ref();
    ProcessReport {
        pid: info.pid,
        host: process.and_then(|p| p.host.clone()),
        command: process
            .map(|p| p.args.clone())
            .filter(|args| !args.is_empty()),
        start_time_us: process
            .and_then(|p| p.wall_start_ns)
            .and_then(|ns| i64::try_from(ns / 1000).ok()),
    }
}

/// How `analyze` and `view` diagnose a loaded file's OOMs.
pub(super) fn origin(recording: Option<&RecordingInfo>) -> Origin<'_> {
    match recording {
        Some(info) => Origin::Recording {
            device_totals: &info.device_total,
        },
        None => Origin::TorchSnapshot,
    }
}
