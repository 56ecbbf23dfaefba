//! The `plan train` search: every layout of the GPUs that the fixed settings allow, evaluated,
//! what does not fit with its headroom dropped, the rest ranked by estimated step time
//! (`plan::cost`) at one global batch for all, with the published rules of thumb as the
//! tie-break, and the choice and its runner-up explained in a line each.

use super::activations::Recompute;
use super::cost::GPUS_PER_NODE;
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
    /// Samples per optimizer step; sets gradient accumulation. Without it,
    /// `default_global_batch`.
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

/// Tokens per optimizer step assumed when no global batch is given: 4M, as Llama 2 was trained
/// (Touvron et al. 2023, §2.2: "a global batch-size of 4M tokens").
pub const DEFAULT_STEP_TOKENS: u64 = 1 << 22;

/// Estimated step times within this share of the fastest count as equal, and the rules of
/// thumb decide among them.
pub const SAME_SPEED: f64 = 0.03;

/// The global batch assumed without `--global-batch`: about `DEFAULT_STEP_TOKENS` tokens, a
/// multiple of micro-batch x GPUs so every layout can reach it.
pub fn default_global_batch(seq_len: u64, gpus: u64, micro_batch: u64) -> u64 {
    let per_round = gpus.saturating_mul(micro_batch).max(1);
    let rounds = (DEFAULT_STEP_TOKENS as f64 / seq_len.max(1) as f64 / per_round as f64)
        .round()
        .max(1.0) as u64;
    rounds.saturating_mul(per_round)
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
    /// Samples per optimizer step every layout was costed at.
    pub global_batch: u64,
    /// Whether `global_batch` was assumed (`default_global_batch`) rather than given.
    pub global_batch_assumed: bool,
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
    let global_batch = space
        .global_batch
        .unwrap_or_else(|| default_global_batch(setup.seq_len, space.gpus, space.micro_batch));
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
                let per_step = space.micro_batch * dp;
                if !global_batch.is_multiple_of(per_step) {
                    continue;
                }
                let grad_accum = global_batch / per_step;
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
        rank(&mut candidates);
    } else {
        candidates.sort_by_key(|c| c.memory.total);
    }
    candidates.truncate(top.max(1));
    Ok(Plan {
        recommended: (fitting > 0).then_some(0),
        candidates,
        evaluated,
        fitting,
        global_batch: space
            .global_batch
            .unwrap_or_else(|| default_global_batch(setup.seq_len, space.gpus, space.micro_batch)),
        global_batch_assumed: space.global_batch.is_none(),
    })
}

/// How far a layout strays from the published rules of thumb, least first: pipeline stages
/// only when needed and a model-parallel group (TP x PP x CP) just large enough to fit
/// (Narayanan et al. 2021, takeaways 1 and 2), then no recompute where memory allows.
fn rule_order(c: &Candidate) -> (u64, u64, bool) {
    let l = &c.layout;
    (l.pp, l.tp * l.cp, l.recompute != Recompute::None)
}

/// Orders fitting candidates: by estimated step time, except that among those within
/// `SAME_SPEED` of the fastest the rules of thumb decide.
fn rank(candidates: &mut [Candidate]) {
    candidates.sort_by(|a, b| {
        a.cost
            .step_s
            .total_cmp(&b.cost.step_s)
            .then(a.memory.total.cmp(&b.memory.total))
    });
    let Some(fastest) = candidates.first().map(|c| c.cost.step_s) else {
        return;
    };
    let same = candidates
        .iter()
        .take_while(|c| c.cost.step_s <= fastest * (1.0 + SAME_SPEED))
        .count();
    candidates[..same].sort_by(|a, b| {
        rule_order(a)
            .cmp(&rule_order(b))
            .then(a.cost.step_s.total_cmp(&b.cost.step_s))
    });
}

/// One line on why the runner-up (the second candidate) lost to the first.
pub fn runner_up(plan: &Plan) -> Option<String> {
    let (Some(0), [best, second, ..]) = (plan.recommended, plan.candidates.as_slice()) else {
        return None;
    };
    let (a, b) = (&best.cost, &second.cost);
    let slower = b.step_s / a.step_s - 1.0;
    let why = if slower <= SAME_SPEED && rule_order(second) > rule_order(best) {
        let (lb, ls) = (&best.layout, &second.layout);
        let rule = if ls.pp > lb.pp {
            format!(
                "it uses {} pipeline stages where {} do (PP only when needed: Narayanan et al. \
                 2021, takeaway 2)",
                ls.pp, lb.pp
            )
        } else if ls.tp * ls.cp > lb.tp * lb.cp {
            format!(
                "it splits each layer {} ways where {} do (a model-parallel group just large \
                 enough to fit: Narayanan et al. 2021, takeaway 2)",
                ls.tp * ls.cp,
                lb.tp * lb.cp
            )
        } else {
            "it recomputes where the winner need not".to_string()
        };
        format!(
            "within {:.0}% of the estimate ({:+.1}%), {rule}",
            SAME_SPEED * 100.0,
            slower * 100.0
        )
    } else if slower.abs() < 1e-9 {
        format!(
            "the same estimated step time, and it needs {} per GPU against {}",
            Bytes(second.memory.total),
            Bytes(best.memory.total)
        )
    } else {
        let (name, diff) = b
            .terms()
            .iter()
            .zip(a.terms())
            .map(|((name, x), (_, y))| (*name, x - y))
            .fold(("", f64::MIN), |m, t| if t.1 > m.1 { t } else { m });
        format!(
            "{:.1}% slower by the estimate, mostly {name} (+{})",
            slower * 100.0,
            seconds(diff)
        )
    };
    Some(format!("Runner-up: {} - {why}.", describe(&second.layout)))
}

/// Seconds in a short human form (`1.23 s`, `45 ms`).
pub fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.0} ms", s * 1000.0)
    }
}

/// The estimated step time of a candidate by term, in one line.
pub fn step_terms(c: &Candidate) -> String {
    let parts: Vec<String> = c
        .cost
        .terms()
        .iter()
        .filter(|(_, s)| *s > 0.0)
        .map(|(name, s)| format!("{name} {}", seconds(*s)))
        .collect();
    format!("{} ({})", seconds(c.cost.step_s), parts.join(" + "))
}

/// The rules of thumb the ranking follows, with where each comes from, checked against `c`.
pub fn rules(c: &Candidate) -> String {
    let l = &c.layout;
    let m = l.grad_accum;
    let mut out = vec![format!(
        "TP {} within a node of {GPUS_PER_NODE} (Narayanan et al. 2021, takeaway 1: TP up to \
         the GPUs of a server, PP across servers)",
        l.tp
    )];
    out.push(if l.pp > 1 {
        format!(
            "PP {} because no faster or equally fast layout with fewer stages fits (takeaway 2; \
             Ultra-Scale Playbook: PP when the model does not fit otherwise)",
            l.pp
        )
    } else {
        "no PP (takeaway 2: only when needed)".to_string()
    });
    if l.pp > 1 {
        out.push(format!(
            "{m} micro-batches for {} stages{} (GPipe, Huang et al. 2019: the bubble is \
             negligible from 4 micro-batches per stage)",
            l.pp,
            if m >= 4 * l.pp {
                ""
            } else {
                ", fewer than 4 per stage"
            }
        ));
    }
    format!("Rules of thumb: {}.", out.join("; "))
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
                "Recommended: {} - estimated step {} at a global batch of {}{}; the fastest of \
                 the {} with the rules of thumb breaking near-ties. It fits: {} estimate, {} \
                 headroom kept free, {} more to spare.",
                describe(&best.layout),
                step_terms(best),
                count(plan.global_batch, "sequence", "sequences"),
                if plan.global_batch_assumed {
                    " (assumed: about 4M tokens per step; give --global-batch)"
                } else {
                    ""
                },
                count(plan.fitting as u64, "fitting layout", "fitting layouts"),
                Bytes(best.memory.total),
                Bytes(best.headroom.total()),
                Bytes(spare),
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
