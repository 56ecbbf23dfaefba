//! `memprof diff BEFORE AFTER`: what changed at the peak between two runs (snapshots,
//! recordings or `analyze --json` documents), device by device: the peak before and after, and
//! the sites that grew or appeared, largest growth first, with their stacks. Exit 1 when a
//! device's peak grew by more than `--max-increase`, as `memprof gate` does.

use super::gate::{measure, parse_increase, refuse_left_alive_from_json, MetricArg};
use super::Outcome;
use crate::model::Bytes;
use crate::report::analyze_json::SCHEMA_VERSION;
use crate::report::gate::{evaluate, Baseline, Check, GateConfig, Metric};
use anyhow::Context;
use clap::Args;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The earlier run: a snapshot, a recording or a `memprof analyze --json` output.
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The later run, of the same kind.
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// Growth of the peak that still exits 0: `5%` or `0.05`.
    #[arg(long, value_name = "PERCENT", default_value = "5%")]
    pub max_increase: String,
    /// Which figure to compare.
    #[arg(long, value_enum, default_value_t = MetricArg::PeakActive)]
    pub metric: MetricArg,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A site at the peak in both runs.
#[derive(Debug, Serialize)]
struct SiteChange {
    site: String,
    before_bytes: u64,
    after_bytes: u64,
    /// Stack of the largest allocation at the site in the later run, innermost first.
    stack: Vec<String>,
}

/// One device compared.
#[derive(Debug, Serialize)]
struct DeviceDiff {
    device: u32,
    before_bytes: u64,
    after_bytes: u64,
    /// (after - before) / before; null when before is 0.
    increase: Option<f64>,
    /// Within `--max-increase`.
    passed: bool,
    /// Sites that grew or appeared, largest growth first.
    grew: Vec<SiteChange>,
}

#[derive(Debug, Serialize)]
pub(super) struct DiffReport {
    schema_version: u32,
    kind: &'static str,
    before: String,
    after: String,
    metric: &'static str,
    max_increase: f64,
    devices: Vec<DeviceDiff>,
    /// How the text names the metric.
    #[serde(skip)]
    metric_label: &'static str,
}

fn device_diff(c: &Check) -> DeviceDiff {
    DeviceDiff {
        device: c.device,
        before_bytes: c.baseline.unwrap_or(0),
        after_bytes: c.measured,
        increase: c.increase(),
        passed: c.passed(),
        grew: c
            .grew
            .iter()
            .map(|g| SiteChange {
                site: g.frame.clone(),
                before_bytes: g.before,
                after_bytes: g.after,
                stack: g.stack.clone(),
            })
            .collect(),
    }
}

fn text(report: &DiffReport, label: &str) -> String {
    let mut out = String::new();
    // The sites counted at the peak, or in what was left alive at the trace's end.
    let (none, grew) = if report.metric == Metric::LeftAlive.key() {
        (
            "no site left more alive at the end",
            "left more alive at the end",
        )
    } else {
        (
            "no site holds more at the peak",
            "grew or appeared at the peak",
        )
    };
    for d in &report.devices {
        let change = match d.increase {
            Some(f) => format!(" ({:+.1}%)", f * 100.0),
            None => String::new(),
        };
        let delta = if d.after_bytes >= d.before_bytes {
            format!("+{}", Bytes(d.after_bytes - d.before_bytes))
        } else {
            format!("-{}", Bytes(d.before_bytes - d.after_bytes))
        };
        let verdict = if d.passed { "" } else { "  GREW" };
        out.push_str(&format!(
            "device {}: {label} {} -> {}, {delta}{change}{verdict}\n",
            d.device,
            Bytes(d.before_bytes),
            Bytes(d.after_bytes)
        ));
        if d.grew.is_empty() {
            out.push_str(&format!("  {none}\n"));
            continue;
        }
        out.push_str(&format!("  {grew}, largest first:\n"));
        for g in &d.grew {
            let was = if g.before_bytes == 0 {
                "new".to_string()
            } else {
                format!("{} before", Bytes(g.before_bytes))
            };
            out.push_str(&format!(
                "    +{:>11}  {}  ({was}, {} after)\n",
                Bytes(g.after_bytes - g.before_bytes).to_string(),
                g.site,
                Bytes(g.after_bytes)
            ));
        }
        if let Some(top) = d.grew.first().filter(|t| !t.stack.is_empty()) {
            out.push_str(&format!(
                "  stack of the largest allocation at {}, innermost first:\n",
                top.site
            ));
            for frame in top.stack.iter().take(8) {
                out.push_str(&format!("        {frame}\n"));
            }
        }
    }
    out
}

pub fn run(args: &DiffArgs) -> anyhow::Result<Outcome> {
    let report = report(args)?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(text(&report, report.metric_label).as_bytes())?;
    }
    stdout.flush()?;
    Ok(if report.devices.iter().all(|d| d.passed) {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}

/// The report `--json` prints (the MCP tool `diff` returns it too).
pub(super) fn report(args: &DiffArgs) -> anyhow::Result<DiffReport> {
    let config = GateConfig {
        metric: args.metric.into(),
        max_increase: parse_increase(&args.max_increase)?,
        limit: None,
    };
    for path in [&args.before, &args.after] {
        refuse_left_alive_from_json(path, config.metric)?;
    }
    let before = measure(&args.before, 0).with_context(|| args.before.display().to_string())?;
    let after = measure(&args.after, 0).with_context(|| args.after.display().to_string())?;
    let checks = evaluate(&after, Some(&Baseline::new(before)), &config)?;
    Ok(DiffReport {
        schema_version: SCHEMA_VERSION,
        kind: "memprof_diff",
        before: args.before.display().to_string(),
        after: args.after.display().to_string(),
        metric: config.metric.key(),
        max_increase: config.max_increase,
        devices: checks.iter().map(device_diff).collect(),
        metric_label: config.metric.label(),
    })
}
