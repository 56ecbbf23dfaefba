//! `memprof gate`: fail a CI job when peak memory regresses against a committed baseline or
//! passes an absolute limit.

use super::input::load_snapshot;
use super::Outcome;
use crate::analysis::categories::CategoryRules;
use crate::analysis::{left_alive, Site};
use crate::model::Bytes;
use crate::report::gate::{evaluate, Baseline, GateConfig, Measurement, Metric, SiteBytes};
use crate::report::gate_input::{parse_analyze_json, parse_baseline};
use crate::report::gate_output;
use crate::report::terminal_text::terminal_lines;
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Sites kept per device in measurements and baselines.
const SITES_KEPT: usize = 20;

#[derive(Debug, Args)]
pub struct GateArgs {
    /// The run to check: snapshots or memprof recordings (one per rank), or `memprof analyze
    /// --json` outputs of them.
    #[arg(required = true, value_name = "CURRENT")]
    pub current: Vec<PathBuf>,
    /// Baseline written earlier with --write-baseline.
    #[arg(long, value_name = "BASE.json", conflicts_with = "write_baseline")]
    pub baseline: Option<PathBuf>,
    /// Write the current run's measurements as a baseline and exit.
    #[arg(long, value_name = "BASE.json")]
    pub write_baseline: Option<PathBuf>,
    /// Allowed increase over the baseline: `5%` or `0.05`.
    #[arg(long, value_name = "PERCENT", default_value = "5%")]
    pub max_increase: String,
    /// Absolute limit (bytes or units: 20GiB).
    #[arg(long, value_name = "SIZE")]
    pub limit: Option<Bytes>,
    /// Which number to gate on.
    #[arg(long, value_enum, default_value_t = MetricArg::PeakActive)]
    pub metric: MetricArg,
    /// Also write JUnit XML here.
    #[arg(long, value_name = "OUT.xml")]
    pub junit: Option<PathBuf>,
    /// Also write a Markdown summary here (for a pull-request comment).
    #[arg(long, value_name = "OUT.md")]
    pub markdown: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MetricArg {
    /// The highest total of live allocations (stable from run to run).
    PeakActive,
    /// The highest reserved total (depends on what ran before).
    PeakReserved,
    /// Bytes allocated during the trace and alive at its end (what a test left behind).
    LeftAlive,
    /// The whole process's device memory at its peak, PyTorch's share and the rest (a memprof
    /// recording; with NVML samples, the CUDA context too).
    #[value(alias = "process_peak")]
    ProcessPeak,
}

impl From<MetricArg> for Metric {
    fn from(m: MetricArg) -> Metric {
        match m {
            MetricArg::PeakActive => Metric::PeakActive,
            MetricArg::PeakReserved => Metric::PeakReserved,
            MetricArg::LeftAlive => Metric::LeftAlive,
            MetricArg::ProcessPeak => Metric::ProcessPeak,
        }
    }
}

/// `5%`, `5 %` or `0.05` as a fraction.
pub(super) fn parse_increase(text: &str) -> anyhow::Result<f64> {
    let trimmed = text.trim();
    let value = match trimmed.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => trimmed.parse::<f64>(),
    };
    match value {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => {
            bail!("--max-increase {text:?}: expected a percentage like 5% or a fraction like 0.05")
        }
    }
}

pub fn run(args: &GateArgs) -> anyhow::Result<Outcome> {
    let config = GateConfig {
        metric: args.metric.into(),
        max_increase: parse_increase(&args.max_increase)?,
        limit: args.limit.map(|b| b.0),
    };
    let wanted = if args.write_baseline.is_some() {
        Wanted::baseline()
    } else {
        Wanted::for_metric(config.metric)
    };
    let mut current = Vec::new();
    for path in &args.current {
        let shown = path.display().to_string();
        let first_rank = current
            .iter()
            .map(|m: &Measurement| m.rank + 1)
            .max()
            .unwrap_or(0);
        refuse_left_alive_from_json(path, config.metric)?;
        current.extend(measure(path, first_rank, wanted).with_context(|| shown.clone())?);
    }
    if let Some(out) = &args.write_baseline {
        let text = serde_json::to_string_pretty(&Baseline::new(current))?;
        std::fs::write(out, text + "\n").with_context(|| format!("writing {}", out.display()))?;
        super::wrote(out)?;
        return Ok(Outcome::Ok);
    }
    let baseline = match &args.baseline {
        Some(path) => Some(read_baseline(path).with_context(|| path.display().to_string())?),
        None if config.limit.is_none() => {
            bail!("nothing to compare against: give --baseline BASE.json, --limit SIZE, or --write-baseline")
        }
        None => None,
    };
    let checks = evaluate(&current, baseline.as_ref(), &config)?;
    if let Some(out) = &args.junit {
        std::fs::write(out, gate_output::junit(&checks))
            .with_context(|| format!("writing {}", out.display()))?;
        super::wrote_beside(out);
    }
    if let Some(out) = &args.markdown {
        std::fs::write(out, gate_output::markdown(&checks))
            .with_context(|| format!("writing {}", out.display()))?;
        super::wrote_beside(out);
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(terminal_lines(&gate_output::text(&checks)).as_bytes())?;
    stdout.flush()?;
    Ok(if checks.iter().all(|c| c.passed()) {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}

fn read_baseline(path: &Path) -> anyhow::Result<Baseline> {
    let text = std::fs::read_to_string(path).context("cannot read")?;
    parse_baseline(&text)
}

/// `--metric left-alive` needs the trace: an analyze document given for it is refused (it would
/// read 0 B and pass).
pub(super) fn refuse_left_alive_from_json(path: &Path, metric: Metric) -> anyhow::Result<()> {
    if matches!(metric, Metric::LeftAlive) && is_analyze_json(path) {
        bail!(
            "{}: an analyze --json document does not hold what the trace left alive; give \
             --metric left-alive the snapshot or recording",
            path.display()
        );
    }
    Ok(())
}

/// Whether `path` holds JSON (its first byte a `{`): an analyze document, not a snapshot.
fn is_analyze_json(path: &Path) -> bool {
    super::input::peek(path, 1).is_some_and(|head| head == b"{")
}

/// What `measure` works out beyond the input's account: each costs a pass of its own (what was
/// left alive replays the trace, the process peak reads the recording again for its ledger).
#[derive(Clone, Copy, Debug)]
pub(super) struct Wanted {
    pub left_alive: bool,
    pub process_peak: bool,
}

impl Wanted {
    /// The figure `metric` compares.
    pub(super) fn for_metric(metric: Metric) -> Wanted {
        Wanted {
            left_alive: metric == Metric::LeftAlive,
            process_peak: metric == Metric::ProcessPeak,
        }
    }

    /// Every figure a baseline file keeps, so that any metric can be checked against it later.
    fn baseline() -> Wanted {
        Wanted {
            left_alive: true,
            process_peak: true,
        }
    }
}

/// Measurements of one file: a snapshot (analyzed here) or an analyze JSON document.
pub(super) fn measure(
    path: &Path,
    first_rank: usize,
    wanted: Wanted,
) -> anyhow::Result<Vec<Measurement>> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    if is_analyze_json(path) {
        let text = std::fs::read_to_string(path).context("cannot read")?;
        return parse_analyze_json(&text, &name, first_rank);
    }
    // The ledger, when wanted, comes from the same pass over a recording.
    let (loaded, joined) = if wanted.process_peak {
        let (loaded, joined) = super::ledger_join::load_with_ledger(path, false, None)?;
        (loaded, joined.transpose()?)
    } else {
        (load_snapshot(path, false)?, None)
    };
    let snapshot = &loaded.parsed.snapshot;
    let rules = CategoryRules::default();
    let account = crate::account::build(
        snapshot,
        &crate::account::Options::new(
            SITES_KEPT,
            &rules,
            super::analyze::origin(loaded.recording.as_ref()),
        ),
    );
    let devices = account.devices;
    if devices.is_empty() {
        bail!("no device has a segment or a trace entry");
    }
    let ledger = joined.map_or_else(Vec::new, |joined| joined.ledger);
    Ok(devices
        .iter()
        .map(|d| {
            let mut m = Measurement::of(first_rank, &name, d);
            if wanted.left_alive {
                let (bytes, sites) = left_alive(snapshot, d.device, SITES_KEPT);
                m.left_alive_bytes = bytes;
                m.left_alive_sites = sites.iter().map(site_bytes).collect();
            }
            m.process_peak_bytes = (ledger.iter().find(|l| l.device == d.device))
                .map(|l| l.at_peak.nvml_bytes.unwrap_or(l.at_peak.device_bytes));
            m
        })
        .collect())
}

fn site_bytes(site: &Site) -> SiteBytes {
    SiteBytes {
        frame: site.frame.clone(),
        bytes: site.bytes,
        stack: site.stack.clone(),
    }
}
