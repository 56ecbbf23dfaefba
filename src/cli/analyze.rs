//! `memprof analyze FILE...`: usage, peak, fragmentation and top sites of snapshots.

use super::input::load_snapshot;
use super::{AnalyzeArgs, Outcome};
use crate::analysis::analyze_snapshot;
use crate::model::SnapshotFormat;
use crate::report::analyze_json::{AnalyzeReport, InputKind, InputReport};
use crate::report::analyze_text;
use anyhow::{bail, Context};
use std::io::Write;

pub fn run(args: &AnalyzeArgs) -> anyhow::Result<Outcome> {
    if args.plot.is_some() {
        bail!("--plot is not built yet; use --json and plot the numbers elsewhere for now");
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
        inputs.push(InputReport {
            path: shown,
            kind: InputKind::TorchSnapshot,
            bytes: loaded.bytes,
            format: match snapshot.format {
                SnapshotFormat::History => "history",
                SnapshotFormat::Modern => "modern",
                SnapshotFormat::SegmentsOnly => "segments_only",
            },
            alloc_conf: snapshot
                .settings
                .as_ref()
                .and_then(|s| s.alloc_conf.clone()),
            devices: analyze_snapshot(snapshot, args.top, args.device),
            warnings: loaded.parsed.warnings,
        });
    }
    let report = AnalyzeReport::new(inputs);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(analyze_text::render(&report).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
}
