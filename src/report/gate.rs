//! The CI memory gate: what is measured per input and device, the versioned baseline file, and
//! the verdict of comparing a run against a baseline and a limit. Pure: no I/O.

use super::site_identity::{compare_sites, Normalizer, SiteChanges};
use crate::account::DeviceReport;
use crate::analysis::categories::CategoryBytes;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};

/// Version of the baseline file layout; bumped when a field changes meaning.
pub const BASELINE_VERSION: u32 = 1;
const BASELINE_KIND: &str = "memprof_gate_baseline";

/// Bytes held by one allocation site at the peak.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteBytes {
    pub frame: String,
    pub bytes: u64,
    /// Stack of the largest allocation at the site, innermost first.
    #[serde(default)]
    pub stack: Vec<String>,
}

/// What the gate measures for one device of one input (rank).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measurement {
    /// Position of the input on the command line (the rank, when one file per rank is given).
    pub rank: usize,
    /// The input's file name, for messages.
    pub input: String,
    pub device: u32,
    pub peak_active_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Sites alive at the peak, most bytes first.
    pub sites: Vec<SiteBytes>,
    /// Bytes allocated during the trace and still alive at its end (0 in baselines written
    /// before it was measured).
    #[serde(default)]
    pub left_alive_bytes: u64,
    /// Sites holding them, most bytes first.
    #[serde(default)]
    pub left_alive_sites: Vec<SiteBytes>,
    /// The categories alive at the peak, for `diff` (not kept in baselines).
    #[serde(skip)]
    pub categories: Vec<CategoryBytes>,
    /// The whole process's device memory at the peak of its driver total, from a memprof
    /// recording's ledger: NVML's figure when the recording has NVML samples, else the driver's
    /// total. `None` for a PyTorch snapshot, which sees only PyTorch's memory.
    #[serde(default)]
    pub process_peak_bytes: Option<u64>,
    /// Whether the input shows its peaks (a trace); without one the peak figures are those
    /// of the dump, as the account says (baselines written before this field had a trace).
    #[serde(default = "known", skip_serializing_if = "is_known")]
    pub peak_known: bool,
}

fn known() -> bool {
    true
}

fn is_known(k: &bool) -> bool {
    *k
}

impl Measurement {
    /// The measurement of one device from its account: its peaks where the input shows them,
    /// else the state at the dump.
    pub fn of(rank: usize, input: &str, device: &DeviceReport) -> Measurement {
        let (peaks, dump) = (&device.account.peaks, device.account.dump());
        Measurement {
            rank,
            input: input.to_string(),
            device: device.device,
            peak_active_bytes: peaks.requested.bytes.or(dump.requested_bytes).unwrap_or(0),
            peak_reserved_bytes: peaks.reserved.bytes.or(dump.reserved_bytes).unwrap_or(0),
            sites: device
                .top_sites
                .iter()
                .map(|s| SiteBytes {
                    frame: s.frame.clone(),
                    bytes: s.bytes,
                    stack: s.stack.clone(),
                })
                .collect(),
            left_alive_bytes: 0,
            left_alive_sites: Vec::new(),
            categories: device
                .categories
                .as_ref()
                .map(|c| c.at_peak.clone())
                .unwrap_or_default(),
            process_peak_bytes: None,
            peak_known: peaks.requested.bytes.is_some(),
        }
    }

    fn value(&self, metric: Metric) -> u64 {
        match metric {
            Metric::PeakActive => self.peak_active_bytes,
            Metric::PeakReserved => self.peak_reserved_bytes,
            Metric::LeftAlive => self.left_alive_bytes,
            Metric::ProcessPeak => self.process_peak_bytes.unwrap_or(0),
        }
    }

    /// The sites behind a metric's value.
    pub fn sites_of(&self, metric: Metric) -> &[SiteBytes] {
        match metric {
            Metric::PeakActive | Metric::PeakReserved | Metric::ProcessPeak => &self.sites,
            Metric::LeftAlive => &self.left_alive_sites,
        }
    }
}

/// The baseline file: small, versioned, meant to be committed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Baseline {
    pub schema_version: u32,
    pub kind: String,
    pub tool_version: String,
    pub measurements: Vec<Measurement>,
}

impl Baseline {
    pub fn new(measurements: Vec<Measurement>) -> Baseline {
        Baseline {
            schema_version: BASELINE_VERSION,
            kind: BASELINE_KIND.to_string(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            measurements,
        }
    }

    /// Checks that a file read from disk is a baseline this version understands.
    pub fn validate(&self) -> Result<(), GateError> {
        if self.kind != BASELINE_KIND {
            return Err(GateError(format!(
                "not a memprof gate baseline (kind '{}')",
                self.kind
            )));
        }
        if self.schema_version != BASELINE_VERSION {
            return Err(GateError(format!(
                "baseline schema_version {} is not supported (this memprof reads {BASELINE_VERSION}); \
                 write a new one with --write-baseline",
                self.schema_version
            )));
        }
        Ok(())
    }
}

/// Which number the gate compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Highest total of live allocations (stable from run to run).
    PeakActive,
    /// Highest reserved total (depends on what ran before and on fragmentation).
    PeakReserved,
    /// Bytes allocated during the trace and alive at its end: what a test leaked, when the
    /// history was turned on at its start.
    LeftAlive,
    /// The whole process's device memory at its peak (a memprof recording's ledger): PyTorch's
    /// share and everything else, the CUDA context included when NVML was sampled.
    ProcessPeak,
}

impl Metric {
    pub fn label(self) -> &'static str {
        match self {
            Metric::PeakActive => "peak requested",
            Metric::PeakReserved => "peak reserved",
            Metric::LeftAlive => "left alive",
            Metric::ProcessPeak => "process peak",
        }
    }

    /// The name used on the command line and in reports.
    pub fn key(self) -> &'static str {
        match self {
            Metric::PeakActive => "peak_active",
            Metric::PeakReserved => "peak_reserved",
            Metric::LeftAlive => "left_alive",
            Metric::ProcessPeak => "process_peak",
        }
    }
}

/// The gate's bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GateConfig {
    pub metric: Metric,
    /// Allowed increase over the baseline, as a fraction (0.05 = 5%).
    pub max_increase: f64,
    /// Absolute limit in bytes.
    pub limit: Option<u64>,
}

/// A site whose bytes at the peak grew against the baseline (or, without one, holds the
/// most), named as `site_identity` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    pub frame: String,
    pub before: u64,
    pub after: u64,
    /// From the user's frames outward.
    pub stack: Vec<String>,
}

/// The verdict for one device of one input.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub rank: usize,
    pub input: String,
    pub device: u32,
    pub metric: Metric,
    pub measured: u64,
    pub baseline: Option<u64>,
    /// Why it failed; empty when it passed.
    pub failures: Vec<String>,
    /// Sites that grew or appeared most against the baseline; without one, the largest sites
    /// at the peak (grown from nothing), so that a check over its limit names them too.
    pub grew: Vec<Growth>,
    /// Every kind of change against the baseline (`None` without one), adding up to the
    /// total change.
    pub changes: Option<SiteChanges>,
    /// Whether the current input shows its peaks (see `Measurement::peak_known`).
    pub peak_known: bool,
}

impl Check {
    /// What was measured, in a reader's words: a peak metric of an input without a trace is
    /// the state at the dump.
    pub fn label(&self) -> &'static str {
        match (self.metric, self.peak_known) {
            (Metric::PeakActive, false) => "requested at the dump (no trace, peak not known)",
            (Metric::PeakReserved, false) => "reserved at the dump (no trace, peak not known)",
            (metric, _) => metric.label(),
        }
    }

    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// (measured - baseline) / baseline.
    pub fn increase(&self) -> Option<f64> {
        let base = self.baseline?;
        (base > 0).then(|| (self.measured as f64 - base as f64) / base as f64)
    }
}

/// Inputs that cannot be compared: the message says why.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct GateError(pub String);

/// How many growing sites a failing check names.
const GREW_SHOWN: usize = 5;

/// Compares every measurement with its baseline (same rank and device) and the limit.
pub fn evaluate(
    current: &[Measurement],
    baseline: Option<&Baseline>,
    config: &GateConfig,
) -> Result<Vec<Check>, GateError> {
    // Keyed by (rank, device), so that many devices stay linear; the first of a key counts.
    let key = |m: &Measurement| (m.rank, m.device);
    let mut ran: FxHashSet<(usize, u32)> = FxHashSet::default();
    ran.extend(current.iter().map(key));
    let mut base_of: FxHashMap<(usize, u32), &Measurement> = FxHashMap::default();
    if let Some(base) = baseline {
        for b in &base.measurements {
            if !ran.contains(&key(b)) {
                return Err(GateError(format!(
                    "the baseline has rank {} device {} ({}), the current run does not",
                    b.rank, b.device, b.input
                )));
            }
            base_of.entry(key(b)).or_insert(b);
        }
    }
    if config.metric == Metric::ProcessPeak {
        if let Some(c) = current.iter().find(|c| c.process_peak_bytes.is_none()) {
            return Err(GateError(format!(
                "{}: --metric process-peak needs a memprof recording (a PyTorch snapshot sees \
                 only PyTorch's memory)",
                c.input
            )));
        }
    }
    current
        .iter()
        .map(|c| {
            let base = match baseline {
                None => None,
                Some(_) => Some(base_of.get(&key(c)).copied().ok_or_else(|| {
                    GateError(format!(
                        "rank {} device {} ({}) is not in the baseline",
                        c.rank, c.device, c.input
                    ))
                })?),
            };
            Ok(check(c, base, config))
        })
        .collect()
}

fn check(current: &Measurement, base: Option<&Measurement>, config: &GateConfig) -> Check {
    let metric = config.metric;
    let measured = current.value(metric);
    let mut result = Check {
        rank: current.rank,
        input: current.input.clone(),
        device: current.device,
        metric,
        measured,
        baseline: base.map(|b| b.value(metric)),
        failures: Vec::new(),
        grew: Vec::new(),
        changes: None,
        peak_known: current.peak_known,
    };
    let label = result.label();
    match base {
        Some(b) => {
            let deltas = compare_sites(b.sites_of(metric), current.sites_of(metric), false);
            let changes = SiteChanges::of(deltas, b.value(metric), measured, GREW_SHOWN);
            result.grew = grown(&changes);
            result.changes = Some(changes);
        }
        None => result.grew = largest(current.sites_of(metric)),
    }
    if let Some(limit) = config.limit {
        if measured > limit {
            result.failures.push(format!(
                "limited to {} but {} was {}",
                crate::model::Bytes(limit),
                label,
                crate::model::Bytes(measured)
            ));
        }
    }
    // From nothing, any growth is more than any allowed share: a test that left nothing alive
    // and now leaks fails (no percentage to give).
    if result.baseline == Some(0) && measured > 0 {
        result.failures.push(format!(
            "{} grew from 0 B to {}, more than the allowed +{:.1}%",
            label,
            crate::model::Bytes(measured),
            config.max_increase * 100.0
        ));
    }
    if let (Some(before), Some(increase)) = (result.baseline, result.increase()) {
        if increase > config.max_increase {
            result.failures.push(format!(
                "{} grew from {} to {} (+{:.1}%), more than the allowed +{:.1}%",
                label,
                crate::model::Bytes(before),
                crate::model::Bytes(measured),
                increase * 100.0,
                config.max_increase * 100.0
            ));
        }
    }
    result
}

/// The sites that grew or appeared, most growth first.
fn grown(changes: &SiteChanges) -> Vec<Growth> {
    let mut grew: Vec<Growth> = (changes.grew.iter().chain(&changes.appeared))
        .map(|d| Growth {
            frame: d.site.clone(),
            before: d.before_bytes,
            after: d.after_bytes,
            stack: d.stack.clone(),
        })
        .collect();
    grew.sort_by(|a, b| {
        (b.after - b.before)
            .cmp(&(a.after - a.before))
            .then(a.frame.cmp(&b.frame))
    });
    grew.truncate(GREW_SHOWN);
    grew
}

/// Without a baseline: the largest sites (they come most bytes first).
fn largest(sites: &[SiteBytes]) -> Vec<Growth> {
    let n = Normalizer::of_sites(sites);
    sites
        .iter()
        .take(GREW_SHOWN)
        .map(|s| Growth {
            frame: n.label(&s.frame),
            before: 0,
            after: s.bytes,
            stack: n.user_stack(&s.stack),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurement(peak: u64, sites: &[(&str, u64)]) -> Measurement {
        Measurement {
            rank: 0,
            input: "run.pickle".into(),
            device: 0,
            peak_active_bytes: peak,
            peak_reserved_bytes: peak * 2,
            sites: sites
                .iter()
                .map(|&(frame, bytes)| SiteBytes {
                    frame: frame.into(),
                    bytes,
                    stack: vec![frame.into()],
                })
                .collect(),
            left_alive_bytes: 0,
            left_alive_sites: Vec::new(),
            categories: Vec::new(),
            process_peak_bytes: None,
            peak_known: true,
        }
    }

    const FIVE_PERCENT: GateConfig = GateConfig {
        metric: Metric::PeakActive,
        max_increase: 0.05,
        limit: None,
    };

    /// 300k devices (an analyze document of a snapshot with that many trace lists) against a
    /// baseline of the same, in reverse order: matched by key, each to its own.
    #[test]
    fn many_devices_are_matched_to_their_baseline() {
        let run: Vec<Measurement> = (0..300_000u32)
            .map(|d| Measurement {
                device: d,
                ..measurement(1000 + u64::from(d), &[])
            })
            .collect();
        let base = Baseline::new(run.iter().rev().cloned().collect());
        let checks = evaluate(&run, Some(&base), &FIVE_PERCENT).expect("all in the baseline");
        assert_eq!(checks.len(), run.len());
        assert!(checks
            .iter()
            .all(|c| c.passed() && c.baseline == Some(c.measured)));
    }

    #[test]
    fn passes_within_the_allowed_increase_and_fails_beyond_it() {
        let base = Baseline::new(vec![measurement(
            1000,
            &[("a.py:1:f", 600), ("b.py:2:g", 400)],
        )]);
        let ok = evaluate(
            &[measurement(1040, &[("a.py:1:f", 640)])],
            Some(&base),
            &FIVE_PERCENT,
        );
        assert!(
            ok.as_ref().map(|c| c[0].passed()).unwrap_or(false),
            "{ok:?}"
        );
        let bad = evaluate(
            &[measurement(1300, &[("a.py:1:f", 650), ("b.py:2:g", 650)])],
            Some(&base),
            &FIVE_PERCENT,
        )
        .unwrap_or_default();
        assert!(!bad[0].passed());
        assert!(
            bad[0].failures[0].contains("+30.0%"),
            "{:?}",
            bad[0].failures
        );
        let grew: Vec<(&str, u64)> = bad[0]
            .grew
            .iter()
            .map(|g| (g.frame.as_str(), g.after - g.before))
            .collect();
        assert_eq!(grew, [("b.py:2:g", 250), ("a.py:1:f", 50)]);
    }

    /// A baseline of 0 B (a test that left nothing alive) has no percentage to grow by: any
    /// bytes now fail, none still pass.
    #[test]
    fn growth_from_nothing_fails_whatever_the_allowed_increase() {
        let config = GateConfig {
            metric: Metric::LeftAlive,
            max_increase: 0.05,
            limit: None,
        };
        let base = Baseline::new(vec![measurement(1000, &[])]);
        let mut leaking = measurement(1000, &[]);
        leaking.left_alive_bytes = 4096;
        leaking.left_alive_sites = vec![SiteBytes {
            frame: "a.py:1:f".into(),
            bytes: 4096,
            stack: vec!["a.py:1:f".into()],
        }];
        let checks = evaluate(&[leaking], Some(&base), &config).unwrap_or_default();
        assert!(!checks[0].passed());
        assert_eq!(
            checks[0].failures,
            ["left alive grew from 0 B to 4.00 KiB, more than the allowed +5.0%"]
        );
        assert_eq!(checks[0].grew[0].frame, "a.py:1:f");
        let clean = evaluate(&[measurement(1000, &[])], Some(&base), &config).unwrap_or_default();
        assert!(clean[0].passed(), "{:?}", clean[0].failures);
    }

    #[test]
    fn absolute_limit_and_reserved_metric() {
        let config = GateConfig {
            metric: Metric::PeakReserved,
            max_increase: 0.05,
            limit: Some(1500),
        };
        let checks = evaluate(&[measurement(1000, &[])], None, &config).unwrap_or_default();
        assert_eq!(checks[0].measured, 2000);
        assert!(checks[0].failures[0].starts_with("limited to 1.46 KiB but peak reserved was"));
    }

    #[test]
    fn mismatched_devices_are_errors() {
        let base = Baseline::new(vec![measurement(1000, &[])]);
        let mut other = measurement(1000, &[]);
        other.device = 1;
        assert!(evaluate(&[other.clone()], Some(&base), &FIVE_PERCENT).is_err());
        let both = [measurement(1000, &[]), other];
        assert!(evaluate(&both, Some(&base), &FIVE_PERCENT).is_err());
    }

    #[test]
    fn baseline_round_trips_and_rejects_other_versions() {
        let base = Baseline::new(vec![measurement(7, &[("a.py:1:f", 7)])]);
        let text = serde_json::to_string(&base).unwrap_or_default();
        let back: Result<Baseline, _> = serde_json::from_str(&text);
        assert_eq!(back.as_ref().ok(), Some(&base));
        let mut newer = base;
        newer.schema_version = 2;
        assert!(newer.validate().is_err());
    }
}
