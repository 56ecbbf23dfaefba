//! `memprof tree FILE`: the live memory at one moment (the OOM by default, else the peak) as a
//! caller-first tree with inclusive and self bytes and their share, as text, JSON or an SVG
//! icicle. Sizes are block sizes where the account knows the allocated bytes at that moment (the
//! root holds its `allocated_bytes` then), else requested bytes (the root holds its
//! `requested_bytes`).

use super::analyze::origin;
use super::input::load_snapshot;
use super::Outcome;
use crate::account::{self, DeviceReport, Figure, InputAccount, MomentQuery};
use crate::analysis::categories::CategoryRules;
use crate::analysis::live_tree::{walk, Node};
use crate::model::{Bytes, Snapshot};
use crate::report::analyze_json::SCHEMA_VERSION;
use crate::report::terminal_text::terminal_text;
use crate::report::tree_at::{tree_at, TreeAt};
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct TreeArgs {
    /// A snapshot or a memprof recording.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The moment: `peak`, `peak-allocated`, `peak-reserved`, `oom`, `dump`, a trace entry
    /// (`120`: just after it) or a time in seconds from the first trace entry (`2.5s`).
    /// Default: the OOM, else the peak.
    #[arg(long, value_name = "MOMENT")]
    pub at: Option<String>,
    /// Levels shown below the root.
    #[arg(long, value_name = "N", default_value_t = 12)]
    pub depth: usize,
    /// Leave out nodes under this share of the root: `1%` or `0.01`.
    #[arg(long, value_name = "PERCENT", default_value = "1%")]
    pub min_share: String,
    /// Only this device.
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write the tree as an SVG icicle (the first device shown).
    #[arg(long, value_name = "OUT.svg")]
    pub svg: Option<PathBuf>,
}

/// The moment resolved on one device.
#[derive(Debug, Serialize)]
struct MomentShown {
    /// `peak_requested`, `oom`, `dump`, `entry`.
    kind: String,
    /// The trace entry just after which the tree is; null for the dump and the state before
    /// the trace.
    entry: Option<usize>,
    seconds: Option<f64>,
}

#[derive(Debug, Serialize)]
struct DeviceTree {
    device: u32,
    moment: MomentShown,
    /// The account's requested bytes at that moment (null where it holds no moment there);
    /// the root's `inclusive_bytes` when `figure` is `requested_bytes`.
    requested_bytes: Option<u64>,
    /// The account's allocated bytes at that moment (null where it does not know them); the
    /// root's `inclusive_bytes` when `figure` is `allocated_bytes`.
    allocated_bytes: Option<u64>,
    /// What this tree's bytes are.
    figure: Figure,
    tree: Node,
}

#[derive(Debug, Serialize)]
struct TreeReport {
    schema_version: u32,
    kind: &'static str,
    input: String,
    /// What the bytes of every device's tree are: `allocated_bytes` or `requested_bytes`,
    /// `mixed` when the devices' differ.
    figure: &'static str,
    devices: Vec<DeviceTree>,
}

pub fn run(args: &TreeArgs) -> anyhow::Result<Outcome> {
    let at = args
        .at
        .as_deref()
        .map(MomentQuery::parse)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--at {e}"))?;
    let min_share = super::gate::parse_increase(&args.min_share)
        .map_err(|_| anyhow::anyhow!("--min-share {:?}: expected 1% or 0.01", args.min_share))?;
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, false).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    let rules = CategoryRules::default();
    let input = account::build(
        snapshot,
        &account::Options {
            only: args.device,
            ..account::Options::new(1, &rules, origin(loaded.recording.as_ref()))
        },
    );
    let mut devices = Vec::new();
    for d in &input.devices {
        if !d.account.holds_memory() && args.device.is_none() {
            continue;
        }
        devices.push(device_tree(snapshot, &input, d, at, args.depth, min_share)?);
    }
    let figure = match devices.first().map(|d| d.figure) {
        Some(first) if devices.iter().any(|d| d.figure != first) => "mixed",
        Some(Figure::AllocatedBytes) => "allocated_bytes",
        _ => "requested_bytes",
    };
    let report = TreeReport {
        schema_version: SCHEMA_VERSION,
        kind: "memprof_tree",
        input: shown,
        figure,
        devices,
    };
    if let (Some(out), Some(first)) = (&args.svg, report.devices.first()) {
        let title = format!(
            "{} device {}: live memory at {}",
            report.input, first.device, first.moment.kind
        );
        std::fs::write(out, crate::report::tree_svg::svg(&first.tree, &title))
            .with_context(|| format!("writing {}", out.display()))?;
        super::wrote_beside(out);
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(text(&report).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
}

fn device_tree(
    snapshot: &Snapshot,
    input: &InputAccount,
    d: &DeviceReport,
    at: Option<MomentQuery>,
    depth: usize,
    min_share: f64,
) -> anyhow::Result<DeviceTree> {
    let device = d.analysis.device;
    let entries = snapshot.timeline.device(device as usize);
    let a = &d.account;
    let query = at.unwrap_or_else(|| a.oom_else_peak());
    let resolved = a
        .resolve(query, entries, input.axis)
        .map_err(|e| anyhow::anyhow!("device {device}: {e}"))?;
    let TreeAt { figure, root } = tree_at(
        snapshot,
        device,
        &resolved,
        d.analysis.block_sizes(),
        depth,
        min_share,
    );
    let kind = match resolved.kind {
        Some(kind) => serde_json::to_value(kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        None => "entry".to_string(),
    };
    Ok(DeviceTree {
        device,
        moment: MomentShown {
            kind,
            entry: resolved.entry,
            seconds: resolved.offset_us.map(|us| us as f64 / 1e6),
        },
        requested_bytes: resolved.figures.and_then(|f| f.requested_bytes),
        allocated_bytes: resolved.figures.and_then(|f| f.allocated_bytes),
        figure,
        tree: root,
    })
}

fn text(report: &TreeReport) -> String {
    let mut out = String::new();
    if report.devices.is_empty() {
        out.push_str("no device holds memory\n");
    }
    for d in &report.devices {
        let when = match (d.moment.entry, d.moment.seconds) {
            (Some(e), Some(s)) => format!(" (entry {e}, {s:.3} s)"),
            (Some(e), None) => format!(" (entry {e})"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "device {}: live memory at {}{when}: {} {}\n",
            d.device,
            d.moment.kind,
            Bytes(d.tree.inclusive_bytes),
            d.figure.word()
        ));
        out.push_str(&format!(
            "  {:>11} {:>11} {:>6}  caller first\n",
            "inclusive", "self", "share"
        ));
        walk(&d.tree, 0, &mut |n, depth| {
            if depth == 0 {
                return;
            }
            let hidden = if n.hidden_children > 0 {
                format!("  (+{} below, not shown)", n.hidden_children)
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  {:>11} {:>11} {:>5.1}%  {}{}{hidden}\n",
                Bytes(n.inclusive_bytes).to_string(),
                Bytes(n.self_bytes).to_string(),
                n.share * 100.0,
                "  ".repeat(depth - 1),
                terminal_text(&n.name)
            ));
        });
    }
    out
}
