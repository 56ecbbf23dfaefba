//! "What would have fit": from one device's trace, the live memory at the peak (or at the OOM,
//! with the failed request) split into what grows with the micro-batch and the sequence
//! length (activations and autograd's saved tensors and gradients in flight, by the trace's
//! lifetimes and categories) and what does not (parameters, gradients, optimizer state,
//! workspaces, the rest); the per-token cost of the first; and the largest micro-batch and
//! sequence length that fit a capacity, each found by replaying the trace through the
//! allocator model with those allocations scaled, so fragmentation is the replay's own.
//!
//! Activations are taken as linear in tokens, which holds with FlashAttention / SDPA; with
//! eager attention the score matrices grow with the square of the sequence and the sequence
//! answer is then too long (the micro-batch answer is unaffected).

use crate::analysis::categories::{split_trace, CategoryRules};
use crate::model::{Bytes, Snapshot};
use crate::sim::replay::{prepare, recorded_config, run, run_scaled, DeviceTrace, Prepared};
use crate::sim::AllocatorConfig;
use serde::Serialize;

/// The categories whose bytes grow with the micro-batch and the sequence length.
pub const SCALING: [&str; 2] = ["activation", "autograd"];

/// What the question is asked with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitAsk {
    /// The device's memory.
    pub capacity: u64,
    /// Kept outside PyTorch's allocator (CUDA context, libraries).
    pub context_bytes: u64,
    /// The run's micro-batch, to answer in micro-batches.
    pub micro_batch: Option<u64>,
    /// The run's tokens per sequence, to answer in tokens.
    pub seq_len: Option<u64>,
}

/// Bytes of one category at the moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartJson {
    pub category: String,
    pub bytes: u64,
    /// Grows with the micro-batch and the sequence length.
    pub scales: bool,
}

/// One answer: the largest value of a setting whose scaled replay fits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Answer {
    /// The run's own value.
    pub given: u64,
    /// The largest value that fits (0: not even 1).
    pub largest: u64,
    /// The same by the straight-line estimate, before the replay.
    pub estimated: u64,
    /// The replay's peak reserved at `largest` (at 1 when `largest` is 0).
    pub replay_peak_reserved_bytes: u64,
    /// `budget_bytes` less that peak (negative when even 1 does not fit).
    pub spare_bytes: i64,
}

/// The whole answer.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FitReport {
    pub device: u32,
    /// The entry the split is taken at: the moment that limits growth most (for a trace that
    /// ran out, usually the OOM).
    pub moment_entry: Option<usize>,
    pub at_oom: bool,
    pub parts: Vec<PartJson>,
    pub scaling_bytes: u64,
    pub fixed_bytes: u64,
    /// The most bytes that do not grow alive at once anywhere in the trace (an optimizer
    /// step's peak, say): no micro-batch fits when this does not.
    pub fixed_peak_bytes: u64,
    /// `capacity - context_bytes`: what the allocator may reserve.
    pub budget_bytes: u64,
    /// The recorded run replayed without a limit: its peak reserved and allocated.
    pub recorded_peak_reserved_bytes: u64,
    pub recorded_peak_allocated_bytes: u64,
    /// Reserved over allocated at the recorded peak, less 1: the allocator's overhead the
    /// straight-line estimate keeps.
    pub fragmentation: f64,
    /// Bytes per token of the scaling part, when the micro-batch and sequence length are known.
    pub bytes_per_token: Option<f64>,
    /// Whether the run as recorded fits the budget (its replay does not run out).
    pub recorded_fits: bool,
    /// The largest factor (in hundredths) the scaling part may be multiplied by.
    pub factor_percent: Answer,
    pub micro_batch: Option<Answer>,
    pub seq_len: Option<Answer>,
}

/// Why the question has no answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FitError {
    #[error("device {0} has no allocation trace: record with torch.cuda.memory._record_memory_history() so the peak can be split")]
    NoTrace(u32),
    #[error(
        "no allocation of device {0}'s trace is an activation: nothing there grows with the batch"
    )]
    NothingScales(u32),
    #[error("--capacity {capacity} is not above --cuda-context {context}")]
    NoBudget { capacity: Bytes, context: Bytes },
    #[error("--micro-batch and --seq-len must be at least 1")]
    Zero,
}

/// Largest setting searched, so the replays stay few.
const MAX_SETTING: u64 = 1 << 24;

/// Answers `ask` for `device` of `snapshot`.
pub fn what_fits(snapshot: &Snapshot, device: u32, ask: &FitAsk) -> Result<FitReport, FitError> {
    if ask.micro_batch == Some(0) || ask.seq_len == Some(0) {
        return Err(FitError::Zero);
    }
    let budget = ask
        .capacity
        .checked_sub(ask.context_bytes)
        .filter(|b| *b > 0)
        .ok_or(FitError::NoBudget {
            capacity: Bytes(ask.capacity),
            context: Bytes(ask.context_bytes),
        })?;
    let trace = DeviceTrace::of(snapshot, device);
    if trace.entries.is_empty() {
        return Err(FitError::NoTrace(device));
    }
    let (config, _) = recorded_config(snapshot);
    let prepared = prepare(&trace, &config, None);
    let recorded = run(&prepared, &config, None);
    let fragmentation = if recorded.peak_allocated_bytes > 0 {
        (recorded.peak_reserved_bytes as f64 / recorded.peak_allocated_bytes as f64 - 1.0).max(0.0)
    } else {
        0.0
    };
    // What the allocator may hold in allocations, keeping the recorded run's overhead.
    let room = budget as f64 / (1.0 + fragmentation);
    // The moment that limits growth: where the fewest extra bytes per growing byte are left.
    let split = split_trace(
        snapshot,
        device,
        &CategoryRules::default(),
        |n| SCALING.contains(&n),
        |totals, growing| {
            totals
                .iter()
                .zip(growing)
                .enumerate()
                .filter(|(_, (_, g))| **g > 0)
                .map(|(i, (&t, &g))| (i, (room - t.saturating_sub(g) as f64) / g as f64))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(i, _)| i)
        },
    );
    let scales: Vec<bool> = split
        .names
        .iter()
        .map(|n| SCALING.contains(&n.as_str()))
        .collect();
    let parts: Vec<PartJson> = split
        .names
        .iter()
        .zip(&split.bytes)
        .zip(&scales)
        .filter(|((_, b), _)| **b > 0)
        .map(|((n, &b), &s)| PartJson {
            category: n.clone(),
            bytes: b,
            scales: s,
        })
        .collect();
    let scaling: u64 = parts.iter().filter(|p| p.scales).map(|p| p.bytes).sum();
    let fixed: u64 = parts.iter().filter(|p| !p.scales).map(|p| p.bytes).sum();
    if scaling == 0 {
        return Err(FitError::NothingScales(device));
    }
    let factor = (room - fixed as f64) / scaling as f64;
    let replay = Replay {
        prepared: &prepared,
        config: &config,
        budget,
        scaled: split
            .entry_category
            .iter()
            .map(|c| c.is_some_and(|k| scales[k]))
            .collect(),
    };
    let recorded_fits = replay.peak(1.0).is_some();
    let answer = |base: u64| replay.largest(base, factor);
    let bytes_per_token = match (ask.micro_batch, ask.seq_len) {
        (Some(b), Some(s)) => Some(scaling as f64 / (b as f64 * s as f64)),
        _ => None,
    };
    Ok(FitReport {
        device,
        moment_entry: split.moment,
        at_oom: split.oom.is_some() && split.oom == split.moment,
        parts,
        scaling_bytes: scaling,
        fixed_bytes: fixed,
        fixed_peak_bytes: split.fixed_peak,
        budget_bytes: budget,
        recorded_peak_reserved_bytes: recorded.peak_reserved_bytes,
        recorded_peak_allocated_bytes: recorded.peak_allocated_bytes,
        fragmentation,
        bytes_per_token,
        recorded_fits,
        factor_percent: answer(100),
        micro_batch: ask.micro_batch.map(answer),
        seq_len: ask.seq_len.map(answer),
    })
}

/// The trace, ready to replay with its scaling allocations resized.
struct Replay<'a> {
    prepared: &'a Prepared,
    config: &'a AllocatorConfig,
    budget: u64,
    /// For each entry, whether its allocation scales.
    scaled: Vec<bool>,
}

impl Replay<'_> {
    /// The peak reserved of a replay with the scaling allocations times `factor`, when it
    /// does not run out of the budget.
    fn peak(&self, factor: f64) -> Option<u64> {
        let r = run_scaled(self.prepared, self.config, Some(self.budget), |entry| {
            if self.scaled.get(entry).copied().unwrap_or(false) {
                factor
            } else {
                1.0
            }
        });
        r.oom.is_none().then_some(r.peak_reserved_bytes)
    }

    /// The largest `n` whose replay at `n / base` of the recorded size fits, starting from the
    /// straight-line estimate `factor x base` and searching both ways.
    fn largest(&self, base: u64, factor: f64) -> Answer {
        let at = |n: u64| self.peak(n as f64 / base as f64);
        let estimated = (factor * base as f64)
            .floor()
            .clamp(0.0, MAX_SETTING as f64) as u64;
        // `lo` fits (0 always does, vacuously), `hi` does not.
        let (mut lo, mut hi) = match estimated {
            0 => (0, None),
            n if at(n).is_some() => (n, None),
            n => (0, Some(n)),
        };
        if hi.is_none() {
            let mut step = 1;
            loop {
                let next = lo.saturating_add(step).min(MAX_SETTING);
                if next == lo || at(next).is_none() {
                    hi = Some(next);
                    break;
                }
                lo = next;
                step *= 2;
            }
        }
        let mut hi = hi.unwrap_or(MAX_SETTING);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if at(mid).is_some() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let peak = at(lo.max(1));
        Answer {
            given: base,
            largest: lo,
            estimated,
            replay_peak_reserved_bytes: peak.unwrap_or(0),
            spare_bytes: match peak {
                Some(p) => self.budget as i64 - p as i64,
                None => -1,
            },
        }
    }
}

/// One line for `diagnose`: "at micro-batch 3 instead of 4 this run fits with 2.10 GiB to
/// spare" (or that the run already fits, and up to what). `None` without a micro-batch.
pub fn one_line(r: &FitReport) -> Option<String> {
    let a = r.micro_batch.as_ref()?;
    let spare = Bytes(a.spare_bytes.max(0) as u64);
    Some(if a.largest == 0 {
        format!(
            "not even micro-batch 1 fits: what does not grow with the batch ({} at its own \
             peak) leaves too little of the {}",
            Bytes(r.fixed_peak_bytes),
            Bytes(r.budget_bytes)
        )
    } else if a.largest < a.given {
        format!(
            "at micro-batch {} instead of {} this run fits with {spare} to spare",
            a.largest, a.given
        )
    } else {
        format!(
            "at micro-batch {} this run fits; up to {} would, with {spare} to spare",
            a.given, a.largest
        )
    })
}
