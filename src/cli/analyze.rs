//! `memprof analyze FILE...`: usage, peak, fragmentation and top sites of snapshots, and with
//! `--plot` a picture of memory over time.

use super::input::load_snapshot;
use super::plot::{pick_device, write_plot};
use super::{AnalyzeArgs, Outcome};
use crate::analysis::analyze_snapshot;
use crate::diagnose::{classify_ooms, Origin};
use crate::model::SnapshotFormat;
use crate::report::analyze_json::{AnalyzeReport, InputKind, InputReport, ProcessReport};
use crate::report::analyze_text;
use crate::report::plot::{Format, Kind};
use crate::report::terminal_text::terminal_lines;
use crate::source::recording::RecordingInfo;
use anyhow::{bail, Context};
use std::io::Write;

pub fn run(args: &AnalyzeArgs) -> anyhow::Result<Outcome> {
    let plot_format = args.plot.as_deref().map(Format::from_path).transpose()?;
    if plot_format.is_some() && args.files.len() > 1 {
        bail!("--plot draws one file; give one FILE (or use `memprof plot` per file)");
    }
    let mut inputs = Vec::with_capacity(args.files.len());
    for path in &args.files {
        let shown = path.display().to_string();
        let loaded = load_snapshot(path, !args.json).with_context(|| shown.clone())?;
        let snapshot = &loaded.parsed.snapshot;
        if let Some(d) = args.device {
            if !snapshot.devices().contains(&d) {
                bail!("{shown}: device {d} has no segments and no trace entries");
            }
        }
        if let (Some(format), Some(out)) = (plot_format, &args.plot) {
            let device = pick_device(snapshot, &shown, args.device)?;
            write_plot(snapshot, path, device, Kind::Timeline, format, out)?;
        }
        inputs.push(InputReport {
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
            devices: classify_ooms(
                snapshot,
                origin(loaded.recording.as_ref()),
                analyze_snapshot(snapshot, args.top, args.device),
            ),
            warnings: loaded.parsed.warnings,
        });
    }
    let report = AnalyzeReport::new(inputs);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(terminal_lines(&analyze_text::render(&report)).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
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
