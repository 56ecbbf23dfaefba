//! The `plan train` search: every layout of the GPUs that the fixed settings allow, evaluated,
//! what does not fit dropped, the rest ranked by estimated step cost (communication, recompute
//! and pipeline bubble per sample), and the choice explained in a sentence.

use super::activations::Recompute;
use super::layout::Layout;
use super::recipe::Optimizer;
use super::states::ZeroStage;
use super::train::{evaluate, Candidate, MemoryBreakdown, TrainSetup};
use crate::model::{count, Bytes};
use std::collections::HashMap;

/// Largest TP degree searched unless fixed: TP stays inside a node.
pub const MAX_SEARCHED_TP: u64 = 8;

/// Bounds that keep the arithmetic in range and the search short.
pub const MAX_GPUS: u64 = 1 << 20;
pub const MAX_SEQ: u64 = 1 << 26;
pub const MAX_MICRO_BATCH: u64 = 1 << 20;

/// The dimensions of the search; `Some` fixes one.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SearchSpace {
    pub gpus: u64,
    pub dp: Option<u64>,
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub cp: Option<u64>,
    pub zero: Option<ZeroStage>,
    pub recompute: Option<Recompute>,
    pub shard_group: Option<u64>,
    pub sp: bool,
    pub micro_batch: u64,
    /// Samples per optimizer step; sets gradient accumulation. Without it each layout
    /// accumulates `pp` micro-batches, the fewest that fill a 1F1B pipeline.
    pub global_batch: Option<u64>,
}

/// Why no candidate could be formed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SearchError {
    #[error("--gpus, --seq-len and --micro-batch must be at least 1")]
    Zero,
    #[error("--gpus, --seq-len or --micro-batch is implausibly large (at most {MAX_GPUS} GPUs, {MAX_SEQ} tokens, {MAX_MICRO_BATCH} sequences)")]
    TooLarge,
    #[error("no layout of {gpus} GPUs matches the fixed settings ({why})")]
    NoLayout { gpus: u64, why: String },
}

/// The ranked result.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Fitting candidates best first; when none fits, the smallest ones.
    pub candidates: Vec<Candidate>,
    /// Index of the recommended candidate, when one fits.
    pub recommended: Option<usize>,
    /// Layouts evaluated.
    pub evaluated: usize,
    /// Layouts that fit.
    pub fitting: usize,
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

fn options(fixed: Option<u64>, all: &[u64], keep: impl Fn(u64) -> bool) -> Vec<u64> {
    match fixed {
        Some(v) => vec![v],
        None => all.iter().copied().filter(|&v| keep(v)).collect(),
    }
}

/// Every layout the space allows.
pub fn layouts(setup: &TrainSetup, space: &SearchSpace) -> Result<Vec<Layout>, SearchError> {
    if space.gpus == 0 || space.micro_batch == 0 || setup.seq_len == 0 {
        return Err(SearchError::Zero);
    }
    if space.gpus > MAX_GPUS || setup.seq_len > MAX_SEQ || space.micro_batch > MAX_MICRO_BATCH {
        return Err(SearchError::TooLarge);
    }
    let model = &setup.model;
    let all = divisors(space.gpus);
    let tps = options(space.tp, &all, |t| {
        t <= MAX_SEARCHED_TP && model.heads.is_multiple_of(t)
    });
    let pps = options(space.pp, &all, |p| p <= model.layers);
    let cps = options(space.cp, &all, |c| setup.seq_len.is_multiple_of(c));
    let zeros = space.zero.map_or(ZeroStage::ALL.to_vec(), |z| vec![z]);
    let recomputes = space.recompute.map_or(Recompute::ALL.to_vec(), |r| vec![r]);
    let mut out = Vec::new();
    for &tp in &tps {
        for &pp in &pps {
            for &cp in &cps {
                let Some(model_parallel) = tp.checked_mul(pp).and_then(|x| x.checked_mul(cp))
                else {
                    continue;
                };
                if model_parallel == 0 || !space.gpus.is_multiple_of(model_parallel) {
                    continue;
                }
                let dp = space.gpus / model_parallel;
                if space.dp.is_some_and(|d| d != dp) {
                    continue;
                }
                let grad_accum = match space.global_batch {
                    None => pp,
                    Some(g) => {
                        let per_step = space.micro_batch * dp;
                        if !g.is_multiple_of(per_step) {
                            continue;
                        }
                        g / per_step
                    }
                };
                if space
                    .shard_group
                    .is_some_and(|f| f == 0 || !(dp * cp).is_multiple_of(f))
                {
                    continue;
                }
                for &zero in &zeros {
                    // Pipeline engines (Megatron, DeepSpeed) shard at most optimizer states.
                    if space.zero.is_none() && pp > 1 && zero > ZeroStage::Optimizer {
                        continue;
                    }
                    for &recompute in &recomputes {
                        out.push(Layout {
                            dp,
                            tp,
                            pp,
                            cp,
                            zero,
                            shard_group: space.shard_group,
                            sp: space.sp,
                            recompute,
                            micro_batch: space.micro_batch,
                            grad_accum,
                        });
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return Err(SearchError::NoLayout {
            gpus: space.gpus,
            why: describe_fixed(space),
        });
    }
    Ok(out)
}

fn describe_fixed(space: &SearchSpace) -> String {
    let mut parts = Vec::new();
    for (name, value) in [
        ("dp", space.dp),
        ("tp", space.tp),
        ("pp", space.pp),
        ("cp", space.cp),
        ("global batch", space.global_batch),
        ("shard group", space.shard_group),
    ] {
        if let Some(v) = value {
            parts.push(format!("{name} {v}"));
        }
    }
    parts.push(format!("micro-batch {}", space.micro_batch));
    format!(
        "{}; dp x tp x pp x cp must equal the GPU count, tp must divide the heads, cp the \
         sequence length, and the global batch must be a multiple of micro-batch x dp",
        parts.join(", ")
    )
}

/// Evaluates every layout and ranks them; keeps at most `top` candidates.
pub fn search(setup: &TrainSetup, space: &SearchSpace, top: usize) -> Result<Plan, SearchError> {
    let layouts = layouts(setup, space)?;
    let evaluated = layouts.len();
    let mut candidates = without_idle_zero_stages(layouts.iter().map(|l| evaluate(setup, l)));
    let fitting = candidates.iter().filter(|c| c.fits).count();
    if fitting > 0 {
        candidates.retain(|c| c.fits);
        candidates.sort_by(|a, b| {
            a.cost
                .seconds_per_sample
                .total_cmp(&b.cost.seconds_per_sample)
                .then(a.memory.total.cmp(&b.memory.total))
        });
    } else {
        candidates.sort_by_key(|c| c.memory.total);
    }
    candidates.truncate(top.max(1));
    Ok(Plan {
        recommended: (fitting > 0).then_some(0),
        candidates,
        evaluated,
        fitting,
    })
}

/// The candidates less each one that differs from a lower ZeRO stage's only in the stage and
/// comes out the same (one data-parallel rank: nothing to shard), so the stages are shown only
/// where they make a difference.
fn without_idle_zero_stages(candidates: impl Iterator<Item = Candidate>) -> Vec<Candidate> {
    let mut kept: Vec<Candidate> = Vec::new();
    // Kept candidates by their layout at stage 0; the layouts come lowest stage first.
    let mut by_layout: HashMap<Layout, Vec<usize>> = HashMap::new();
    for c in candidates {
        let key = Layout {
            zero: ZeroStage::None,
            ..c.layout
        };
        let same = by_layout.entry(key).or_default();
        if same.iter().any(|&i| {
            let k = &kept[i];
            // The FSDP unit size is what ZeRO-3 would gather; with nothing to shard it changes
            // no byte.
            let unit = |m: &MemoryBreakdown| MemoryBreakdown {
                unit_params: 0,
                ..*m
            };
            k.layout.zero < c.layout.zero && unit(&k.memory) == unit(&c.memory) && k.cost == c.cost
        }) {
            continue;
        }
        same.push(kept.len());
        kept.push(c);
    }
    kept
}

/// Short name of a layout: `dp 8, tp 1, pp 1, cp 1, ZeRO-1, selective recompute,
/// micro-batch 2, 4 per step`.
pub fn describe(l: &Layout) -> String {
    let recompute = match l.recompute {
        Recompute::None => "no recompute",
        Recompute::Selective => "selective recompute",
        Recompute::Full => "full recompute",
        Recompute::PerOp => "per-operator recompute",
    };
    let sp = if l.sp && l.tp > 1 { " (+SP)" } else { "" };
    format!(
        "dp {}, tp {}{sp}, pp {}, cp {}, ZeRO-{}, {recompute}, micro-batch {}, {} per step",
        l.dp,
        l.tp,
        l.pp,
        l.cp,
        l.zero.number(),
        l.micro_batch,
        l.grad_accum
    )
}

/// One sentence on why the plan recommends what it does (or why nothing fits, and what would
/// help).
pub fn explain(plan: &Plan, setup: &TrainSetup) -> String {
    let gpu_memory = setup.gpu_memory;
    match (plan.recommended, plan.candidates.first()) {
        (Some(i), _) => {
            let Some(best) = plan.candidates.get(i) else {
                return String::new();
            };
            let spare = best.spare_bytes(gpu_memory).max(0) as u64;
            format!(
                "Recommended: {} - it fits with {} to spare after headroom and has the lowest \
                 estimated cost per sample of the {} ({} communicated per step \
                 per GPU, recompute +{:.1}% FLOPs, pipeline bubble {:.0}%).",
                describe(&best.layout),
                Bytes(spare),
                count(plan.fitting as u64, "fitting layout", "fitting layouts"),
                Bytes(best.cost.comm_bytes.round() as u64),
                best.cost.recompute_fraction() * 100.0,
                best.cost.bubble * 100.0,
            )
        }
        (None, Some(smallest)) => format!(
            "Nothing fits: the smallest of {} ({}) needs {} plus {} headroom on a {} GPU; \
             {}add GPUs, shorten the sequence or lower the micro-batch.",
            count(plan.evaluated as u64, "layout", "layouts"),
            describe(&smallest.layout),
            Bytes(smallest.memory.total),
            Bytes(smallest.headroom.total()),
            Bytes(gpu_memory),
            optimizer_advice(setup, smallest),
        ),
        (None, None) => "Nothing was evaluated.".to_string(),
    }
}

/// When optimizer states are the largest part of `smallest`: what the optimizers that keep
/// fewer states would need for the same layout, as the first thing to try (else nothing).
fn optimizer_advice(setup: &TrainSetup, smallest: &Candidate) -> String {
    let m = &smallest.memory;
    if m.optimizer <= m.params().max(m.grads).max(m.activations()) {
        return String::new();
    }
    let states = |o| setup.precision.state_bytes(o).optimizer;
    let options: Vec<String> = [
        (Optimizer::AdamW8bit, "adamw8bit", "8-bit AdamW states"),
        (Optimizer::Sgd, "sgd", "SGD's one momentum"),
    ]
    .into_iter()
    .filter(|&(o, _, _)| states(o) < states(setup.optimizer))
    .map(|(optimizer, flag, what)| {
        let other = TrainSetup {
            optimizer,
            ..setup.clone()
        };
        let c = evaluate(&other, &smallest.layout);
        format!(
            "--optimizer {flag} ({what}) needs {}{}",
            Bytes(c.memory.total),
            if c.fits { ", which fits" } else { "" }
        )
    })
    .collect();
    if options.is_empty() {
        return String::new();
    }
    format!(
        "optimizer states are most of it ({}): {}; or ",
        Bytes(m.optimizer),
        options.join(", ")
    )
}
