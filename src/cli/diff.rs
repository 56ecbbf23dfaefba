//! `memprof diff BEFORE AFTER`: what changed at the peak between two runs (snapshots,
//! recordings or `analyze --json` documents), device by device: the peak before and after, and
//! the sites that grew or appeared, largest growth first, with their stacks, and the categories
//! at the peak in each run. Exit 1 when a device's peak grew by more than `--max-increase`, as
//! `memprof gate` does.

use super::gate::{measure, parse_increase, refuse_left_alive_from_json, MetricArg, Wanted};
use super::Outcome;
use crate::analysis::categories::CategoryBytes;
use crate::model::Bytes;
use crate::report::analyze_json::SCHEMA_VERSION;
use crate::report::gate::{evaluate, Baseline, Check, GateConfig, Measurement, Metric};
use crate::report::gate_output::signed_bytes;
use crate::report::site_identity::{compare_sites, SiteChanges};
use crate::report::terminal_text::{terminal_lines, terminal_text};

/// Rows of each kind of change listed.
const SITES_SHOWN: usize = 5;
/// Frames of a stack printed.
const STACK_SHOWN: usize = 12;
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
    /// Show each stack as measured (from the allocator inward frames out) instead of from the
    /// user's frames.
    #[arg(long)]
    pub full_stacks: bool,
}

/// A category at the peak in both runs.
#[derive(Debug, Serialize)]
struct CategoryChange {
    category: String,
    before_bytes: u64,
    after_bytes: u64,
}

/// Every category at the peak of either run, most growth first.
fn category_changes(before: &[CategoryBytes], after: &[CategoryBytes]) -> Vec<CategoryChange> {
    let mut changes: Vec<CategoryChange> = after
        .iter()
        .map(|a| CategoryChange {
            category: a.category.clone(),
            before_bytes: before
                .iter()
                .find(|b| b.category == a.category)
                .map_or(0, |b| b.bytes),
            after_bytes: a.bytes,
        })
        .collect();
    changes.extend(
        before
            .iter()
            .filter(|b| !after.iter().any(|a| a.category == b.category))
            .map(|b| CategoryChange {
                category: b.category.clone(),
                before_bytes: b.bytes,
                after_bytes: 0,
            }),
    );
    let growth = |c: &CategoryChange| c.after_bytes as i128 - c.before_bytes as i128;
    changes.sort_by_key(|c| std::cmp::Reverse(growth(c)));
    changes
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
    /// The sites that grew, shrank, appeared and disappeared, and everything else.
    #[serde(flatten)]
    sites: SiteChanges,
    /// The categories at the peak in each run, most growth first.
    categories: Vec<CategoryChange>,
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

/// The categories at the peak of each (rank, device).
type CategoriesBy = Vec<((usize, u32), Vec<CategoryBytes>)>;

fn categories_by(measurements: &[Measurement]) -> CategoriesBy {
    measurements
        .iter()
        .map(|m| ((m.rank, m.device), m.categories.clone()))
        .collect()
}

fn device_diff(
    c: &Check,
    sites: SiteChanges,
    before: &CategoriesBy,
    after: &CategoriesBy,
) -> DeviceDiff {
    let of = |by: &CategoriesBy| {
        by.iter()
            .find(|(key, _)| *key == (c.rank, c.device))
            .map(|(_, list)| list.clone())
            .unwrap_or_default()
    };
    DeviceDiff {
        categories: category_changes(&of(before), &of(after)),
        device: c.device,
        before_bytes: c.baseline.unwrap_or(0),
        after_bytes: c.measured,
        increase: c.increase(),
        passed: c.passed(),
        sites,
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
        ("no site holds more at the peak", "grew at the peak")
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
        let changed: Vec<String> = d
            .categories
            .iter()
            .filter(|c| c.after_bytes != c.before_bytes)
            .map(|c| {
                let delta = if c.after_bytes >= c.before_bytes {
                    format!("+{}", Bytes(c.after_bytes - c.before_bytes))
                } else {
                    format!("-{}", Bytes(c.before_bytes - c.after_bytes))
                };
                format!(
                    "{} {delta} ({} -> {})",
                    terminal_text(&c.category),
                    Bytes(c.before_bytes),
                    Bytes(c.after_bytes)
                )
            })
            .collect();
        let by_category = if changed.is_empty() {
            String::new()
        } else {
            format!("  by category at the peak: {}\n", changed.join(", "))
        };
        if d.sites.is_empty() {
            out.push_str(&format!("  {none}\n"));
        }
        out.push_str(&site_rows(&d.sites, grew));
        out.push_str(&by_category);
    }
    out
}

/// The site rows: what grew, shrank, appeared and disappeared, then everything else, adding
/// up to the total change; then the stack of the site that grew most.
fn site_rows(c: &SiteChanges, grew: &str) -> String {
    let mut out = String::new();
    let kinds = [
        (grew, &c.grew),
        ("shrank", &c.shrank),
        ("appeared", &c.appeared),
        ("disappeared", &c.disappeared),
    ];
    for (title, list) in kinds {
        if list.is_empty() {
            continue;
        }
        out.push_str(&format!("  {title}, largest first:\n"));
        for g in list.iter() {
            let was = match &g.was {
                Some(was) => format!(", was {}", terminal_text(was)),
                None => String::new(),
            };
            out.push_str(&format!(
                "    {:>12}  {}  ({} -> {}{was})\n",
                signed_bytes(g.delta()),
                terminal_text(&g.site),
                Bytes(g.before_bytes),
                Bytes(g.after_bytes)
            ));
        }
    }
    if c.is_empty() {
        return out;
    }
    out.push_str(&format!(
        "    {:>12}  everything else (total change {})\n",
        signed_bytes(c.everything_else_bytes),
        signed_bytes(c.total_change_bytes)
    ));
    let top = c.grew.iter().chain(&c.appeared).max_by_key(|d| d.delta());
    if let Some(top) = top.filter(|t| !t.stack.is_empty() || !t.full_stack.is_empty()) {
        let (stack, how) = if top.full_stack.is_empty() {
            (&top.stack, "from the user's frames outward")
        } else {
            (&top.full_stack, "innermost first")
        };
        out.push_str(&format!(
            "  stack of the largest allocation at {}, {how}:\n",
            terminal_text(&top.site)
        ));
        for frame in stack.iter().take(STACK_SHOWN) {
            out.push_str(&format!("        {}\n", terminal_text(frame)));
        }
    }
    out
}

/// The sites of a check's device compared, every change listed up to `SITES_SHOWN` of a kind.
fn site_changes(
    c: &Check,
    before: &[Measurement],
    after: &[Measurement],
    metric: Metric,
    full: bool,
) -> SiteChanges {
    let sites = |ms: &[Measurement]| {
        ms.iter()
            .find(|m| (m.rank, m.device) == (c.rank, c.device))
            .map(|m| m.sites_of(metric).to_vec())
            .unwrap_or_default()
    };
    let deltas = compare_sites(&sites(before), &sites(after), full);
    SiteChanges::of(deltas, c.baseline.unwrap_or(0), c.measured, SITES_SHOWN)
}

pub fn run(args: &DiffArgs) -> anyhow::Result<Outcome> {
    let report = report(args)?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &report).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(terminal_lines(&text(&report, report.metric_label)).as_bytes())?;
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
    let wanted = Wanted::for_metric(config.metric);
    let before =
        measure(&args.before, 0, wanted).with_context(|| args.before.display().to_string())?;
    let after =
        measure(&args.after, 0, wanted).with_context(|| args.after.display().to_string())?;
    let (before_categories, after_categories) = (categories_by(&before), categories_by(&after));
    let checks = evaluate(&after, Some(&Baseline::new(before.clone())), &config)?;
    Ok(DiffReport {
        schema_version: SCHEMA_VERSION,
        kind: "memprof_diff",
        before: args.before.display().to_string(),
        after: args.after.display().to_string(),
        metric: config.metric.key(),
        max_increase: config.max_increase,
        devices: checks
            .iter()
            .map(|c| {
                let sites = site_changes(c, &before, &after, config.metric, args.full_stacks);
                device_diff(c, sites, &before_categories, &after_categories)
            })
            .collect(),
        metric_label: config.metric.label(),
    })
}
