//! The `plan ... --json` documents (docs/json/plan.md, `schema_version` 2).

use super::analyze_json::SCHEMA_VERSION;
use crate::plan::activations::Recompute;
use crate::plan::calibrate::CalibrationReport;
use crate::plan::checkpoint::{CheckpointPlan, Choice};
use crate::plan::compare::{comparisons, megatron_side_by_side};
use crate::plan::cost::StepCost;
use crate::plan::deepspeed::Version;
use crate::plan::explain::{terms, TermKind};
use crate::plan::fit::{one_line, FitReport};
use crate::plan::kv::KvPool;
use crate::plan::kv_sim::SimResult;
use crate::plan::model::ModelConfig;
use crate::plan::pack::{PackReport, PackSettings};
use crate::plan::search::{runner_up, Plan};
use crate::plan::serve::{ServeBudget, Solve};
use crate::plan::train::{Candidate, TrainSetup};
use crate::plan::verdict::Verdict;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct ModelJson {
    pub name: String,
    pub hidden_size: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub vocab: u64,
    pub params: u64,
    /// Parameters a token passes through (differs from `params` for MoE).
    pub active_params: u64,
}

impl ModelJson {
    pub fn new(model: &ModelConfig) -> ModelJson {
        let counts = model.param_counts();
        ModelJson {
            name: model.name.clone(),
            hidden_size: model.hidden_size,
            layers: model.layers,
            heads: model.heads,
            kv_heads: model.kv_heads,
            vocab: model.vocab,
            params: counts.total,
            active_params: counts.active,
        }
    }
}

/// A candidate's per-GPU bytes by term; the estimate terms add up to `total_bytes`.
#[derive(Debug, Serialize)]
pub struct MemoryJson {
    /// Weights, sharded and gathered (`params_sharded_bytes + params_gathered_bytes`).
    pub params_bytes: u64,
    pub params_sharded_bytes: u64,
    pub params_gathered_bytes: u64,
    /// Parameters of the ZeRO-3 / FSDP unit the gathered terms assume (0 below ZeRO-3).
    pub fsdp_unit_params: u64,
    pub grads_bytes: u64,
    pub grads_gathered_bytes: u64,
    pub optimizer_bytes: u64,
    /// Every activation term together.
    pub activations_bytes: u64,
    pub activations_layers_bytes: u64,
    pub activations_shape_bytes: i64,
    pub activations_recompute_bytes: u64,
    pub activations_head_bytes: u64,
    pub total_bytes: u64,
    pub context_bytes: u64,
    pub comm_buffers_bytes: u64,
    pub fragmentation_bytes: u64,
    /// `total_bytes` plus the headroom: what the GPU must have.
    pub required_bytes: u64,
}

/// One named term with its formula and source.
#[derive(Debug, Serialize)]
pub struct TermJson {
    pub name: &'static str,
    /// `estimate` or `headroom`.
    pub kind: &'static str,
    pub bytes: i64,
    pub formula: String,
    pub source: &'static str,
}

/// A published formula's figure for the same candidate.
#[derive(Debug, Serialize)]
pub struct PublishedJson {
    pub source: &'static str,
    pub covers: &'static str,
    pub bytes: u64,
    pub memprof_bytes: u64,
    /// memprof's terms whose sum reproduces `bytes`; empty when the tool counts differently.
    pub terms: &'static [&'static str],
    /// memprof's terms beyond the figure.
    pub additions: &'static [&'static str],
}

#[derive(Debug, Serialize)]
pub struct CandidateJson {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub zero: u8,
    pub recompute: Recompute,
    pub micro_batch: u64,
    pub grad_accum: u64,
    pub memory: MemoryJson,
    pub terms: Vec<TermJson>,
    pub published: Vec<PublishedJson>,
    /// Megatron-LM's `report_theoretical_memory` term by term beside memprof's; null where
    /// Megatron has no figure (ZeRO-2/3, CP).
    pub megatron_terms: Option<Vec<MegatronTermJson>>,
    pub fits: bool,
    /// `fit`, `tight` or `no_fit`.
    pub verdict: Verdict,
    pub comm_bytes_per_step: u64,
    /// Estimated step time by term (`docs/planners.md`, "How layouts are ranked").
    pub step_time: StepTimeJson,
}

impl CandidateJson {
    fn new(setup: &TrainSetup, c: &Candidate, deepspeed: Version) -> CandidateJson {
        let l = &c.layout;
        let m = &c.memory;
        CandidateJson {
            dp: l.dp,
            tp: l.tp,
            pp: l.pp,
            cp: l.cp,
            zero: l.zero.number(),
            recompute: l.recompute,
            micro_batch: l.micro_batch,
            grad_accum: l.grad_accum,
            memory: MemoryJson {
                params_bytes: m.params(),
                params_sharded_bytes: m.params_sharded,
                params_gathered_bytes: m.params_gathered,
                fsdp_unit_params: m.unit_params,
                grads_bytes: m.grads,
                grads_gathered_bytes: m.grads_gathered,
                optimizer_bytes: m.optimizer,
                activations_bytes: m.activations(),
                activations_layers_bytes: m.activations_layers,
                activations_shape_bytes: m.activations_shape,
                activations_recompute_bytes: m.activations_recompute,
                activations_head_bytes: m.activations_head,
                total_bytes: m.total,
                context_bytes: c.headroom.context,
                comm_buffers_bytes: c.headroom.comm,
                fragmentation_bytes: c.headroom.fragmentation,
                required_bytes: m.total + c.headroom.total(),
            },
            terms: terms(setup, c)
                .into_iter()
                .map(|t| TermJson {
                    name: t.name,
                    kind: match t.kind {
                        TermKind::Estimate => "estimate",
                        TermKind::Headroom => "headroom",
                    },
                    bytes: t.bytes,
                    formula: t.formula,
                    source: t.source,
                })
                .collect(),
            published: comparisons(setup, c, deepspeed)
                .into_iter()
                .map(|p| PublishedJson {
                    source: p.source,
                    covers: p.covers,
                    bytes: p.bytes,
                    memprof_bytes: p.memprof_bytes,
                    terms: p.terms,
                    additions: p.additions,
                })
                .collect(),
            megatron_terms: megatron_side_by_side(setup, c).map(|rows| {
                rows.into_iter()
                    .map(|r| MegatronTermJson {
                        term: r.term,
                        formula: r.formula,
                        megatron_bytes: r.megatron_bytes,
                        memprof_bytes: r.memprof_bytes,
                        reason: r.reason,
                    })
                    .collect()
            }),
            fits: c.fits,
            verdict: c.verdict,
            step_time: StepTimeJson::new(&c.cost),
            comm_bytes_per_step: c.cost.comm_bytes.round() as u64,
        }
    }
}

/// `plan train --json`.
#[derive(Debug, Serialize)]
pub struct TrainJson {
    pub schema_version: u32,
    pub model: ModelJson,
    pub candidates: Vec<CandidateJson>,
    pub recommended: Option<usize>,
    /// Samples per optimizer step every candidate was costed at.
    pub global_batch: u64,
    /// Whether `global_batch` was assumed (about 4M tokens) rather than given.
    pub global_batch_assumed: bool,
    /// Why the second candidate lost to the first, in words; null with fewer than two.
    pub runner_up: Option<String>,
    /// `fit` when the recommended candidate fits with its headroom; else the smallest
    /// candidate's `tight` or `no_fit`.
    pub verdict: Option<Verdict>,
    /// `--calibrate`: the measured configuration's formula against the snapshot, and the first
    /// candidate calibrated; null without it.
    pub calibration: Option<CalibrationReport>,
}

impl TrainJson {
    pub fn new(setup: &TrainSetup, plan: &Plan, deepspeed: Version) -> TrainJson {
        TrainJson {
            schema_version: SCHEMA_VERSION,
            model: ModelJson::new(&setup.model),
            candidates: plan
                .candidates
                .iter()
                .map(|c| CandidateJson::new(setup, c, deepspeed))
                .collect(),
            recommended: plan.recommended,
            global_batch: plan.global_batch,
            global_batch_assumed: plan.global_batch_assumed,
            runner_up: runner_up(plan),
            verdict: plan.candidates.first().map(|c| c.verdict),
            calibration: None,
        }
    }
}

/// `plan fit --json`: the report with the schema version.
#[derive(Debug, Serialize)]
pub struct FitJson<'a> {
    pub schema_version: u32,
    #[serde(flatten)]
    pub report: &'a FitReport,
    /// The line `diagnose` can print; null without --micro-batch.
    pub summary: Option<String>,
}

impl FitJson<'_> {
    pub fn new(report: &FitReport) -> FitJson<'_> {
        FitJson {
            schema_version: SCHEMA_VERSION,
            report,
            summary: one_line(report),
        }
    }
}

/// One row of the Megatron comparison.
#[derive(Debug, Serialize)]
pub struct MegatronTermJson {
    pub term: &'static str,
    pub formula: String,
    pub megatron_bytes: u64,
    pub memprof_bytes: u64,
    pub reason: String,
}

/// A candidate's estimated step time, seconds by term.
#[derive(Debug, Serialize)]
pub struct StepTimeJson {
    pub compute_s: f64,
    pub bubble_s: f64,
    pub recompute_s: f64,
    pub tp_s: f64,
    pub cp_s: f64,
    pub pp_s: f64,
    pub dp_s: f64,
    pub step_s: f64,
    /// Idle share of the pipeline: (pp - 1) / micro-batches per step.
    pub bubble_fraction: f64,
}

impl StepTimeJson {
    fn new(c: &StepCost) -> StepTimeJson {
        StepTimeJson {
            compute_s: c.compute_s,
            bubble_s: c.bubble_s,
            recompute_s: c.recompute_s,
            tp_s: c.tp_s,
            cp_s: c.cp_s,
            pp_s: c.pp_s,
            dp_s: c.dp_s,
            step_s: c.step_s,
            bubble_fraction: c.bubble,
        }
    }
}

/// `plan kv --json`.
#[derive(Debug, Serialize)]
pub struct KvJson {
    pub schema_version: u32,
    pub kv_bytes_per_token: u64,
    pub block_bytes: u64,
    /// Blocks, tokens and full-length requests of the pool; null without a memory size.
    pub num_blocks: Option<u64>,
    pub max_tokens: Option<u64>,
    /// The full length `max_concurrent_sequences` counts (`--max-model-len`, or the model's).
    pub max_model_len: Option<u64>,
    /// Full-length requests the pool holds at once; null when the length or size is unknown.
    pub max_concurrent_sequences: Option<u64>,
    /// The serving budget by term (with `--gpu-memory`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetJson>,
    /// The solve for `--max-model-len` / `--max-num-seqs` (with `--gpu-memory`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub solve: Option<SolveJson>,
    /// The `--workload` simulation, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadJson>,
}

/// One term of the serving budget.
#[derive(Debug, Serialize)]
pub struct ServeTermJson {
    pub name: &'static str,
    pub bytes: u64,
    pub formula: String,
    pub source: &'static str,
}

/// The serving budget: `budget_bytes` = the terms + `kv_available_bytes` (when they fit).
#[derive(Debug, Serialize)]
pub struct BudgetJson {
    pub gpu_memory_bytes: u64,
    pub utilization: f64,
    pub budget_bytes: u64,
    /// What comes off the budget before the cache: the terms' sum.
    pub used_bytes: u64,
    pub weights_bytes: u64,
    pub activation_peak_bytes: u64,
    pub non_torch_bytes: u64,
    pub cuda_graph_bytes: u64,
    pub kv_available_bytes: u64,
    pub terms: Vec<ServeTermJson>,
}

/// The flags to pass, as argument strings.
#[derive(Debug, Serialize)]
pub struct FlagsJson {
    pub vllm: Vec<String>,
    pub sglang: Vec<String>,
}

/// The solve.
#[derive(Debug, Serialize)]
pub struct SolveJson {
    pub max_model_len: u64,
    pub max_num_seqs: u64,
    /// What every sequence at full length needs: the cap to pass.
    pub kv_cache_bytes: u64,
    pub kv_available_bytes: u64,
    pub fits: bool,
    /// `fit`, `tight` or `no_fit` (`docs/planners.md`, "What fits means").
    pub verdict: Verdict,
    pub largest_max_num_seqs: u64,
    pub largest_max_model_len: u64,
    /// Empty when the settings do not fit.
    pub flags: FlagsJson,
}

impl KvJson {
    pub fn new(
        kv_bytes_per_token: u64,
        block_bytes: u64,
        pool: Option<&KvPool>,
        budget: Option<&ServeBudget>,
        solve: Option<&Solve>,
        workload: Option<WorkloadJson>,
    ) -> KvJson {
        let term = |b: &ServeBudget, name: &str| {
            b.terms
                .iter()
                .find(|t| t.name == name)
                .map_or(0, |t| t.bytes)
        };
        KvJson {
            schema_version: SCHEMA_VERSION,
            kv_bytes_per_token,
            block_bytes,
            num_blocks: pool.map(|p| p.num_blocks),
            max_tokens: pool.map(|p| p.max_tokens),
            max_model_len: pool.and_then(|p| p.max_model_len),
            max_concurrent_sequences: pool.and_then(|p| p.max_concurrent_sequences),
            budget: budget.map(|b| BudgetJson {
                gpu_memory_bytes: b.gpu_memory_bytes,
                utilization: b.utilization,
                budget_bytes: b.budget_bytes,
                used_bytes: b.used_bytes(),
                weights_bytes: term(b, "weights_bytes"),
                activation_peak_bytes: term(b, "activation_peak_bytes"),
                non_torch_bytes: term(b, "non_torch_bytes"),
                cuda_graph_bytes: term(b, "cuda_graph_bytes"),
                kv_available_bytes: b.kv_available_bytes,
                terms: b
                    .terms
                    .iter()
                    .map(|t| ServeTermJson {
                        name: t.name,
                        bytes: t.bytes,
                        formula: t.formula.clone(),
                        source: t.source,
                    })
                    .collect(),
            }),
            solve: solve.map(|s| SolveJson {
                max_model_len: s.max_model_len,
                max_num_seqs: s.max_num_seqs,
                kv_cache_bytes: s.kv_cache_bytes,
                kv_available_bytes: s.kv_available_bytes,
                fits: s.fits,
                verdict: s.verdict,
                largest_max_num_seqs: s.largest_max_num_seqs,
                largest_max_model_len: s.largest_max_model_len,
                flags: FlagsJson {
                    vllm: s.flags.vllm.clone(),
                    sglang: s.flags.sglang.clone(),
                },
            }),
            workload,
        }
    }
}

/// The workload at one `max_num_seqs` setting, on the whole pool.
#[derive(Debug, Serialize)]
pub struct SettingJson {
    pub max_num_seqs: u64,
    pub steps: u64,
    pub completed: u64,
    pub rejected: u64,
    pub preemptions: u64,
    pub mean_concurrency: f64,
    pub max_concurrency: u64,
}

impl SettingJson {
    pub fn new(max_num_seqs: u64, r: &SimResult) -> SettingJson {
        SettingJson {
            max_num_seqs,
            steps: r.steps,
            completed: r.completed,
            rejected: r.rejected,
            preemptions: r.preemptions,
            mean_concurrency: r.mean_running,
            max_concurrency: r.max_running,
        }
    }
}

/// One point of the concurrency-over-time series.
#[derive(Debug, Serialize)]
pub struct SampleJson {
    pub step: u64,
    pub running: u64,
    pub waiting: u64,
    pub used_tokens: u64,
    pub allocated_tokens: u64,
}

/// One allocation policy's simulation.
#[derive(Debug, Serialize)]
pub struct SimJson {
    pub steps: u64,
    pub completed: u64,
    pub rejected: u64,
    pub preemptions: u64,
    pub mean_concurrency: f64,
    pub max_concurrency: u64,
    pub utilization: f64,
    pub waste_fraction: f64,
    pub peak_allocated_tokens: u64,
    pub series: Vec<SampleJson>,
}

impl SimJson {
    pub fn new(r: &SimResult) -> SimJson {
        SimJson {
            steps: r.steps,
            completed: r.completed,
            rejected: r.rejected,
            preemptions: r.preemptions,
            mean_concurrency: r.mean_running,
            max_concurrency: r.max_running,
            utilization: r.utilization,
            waste_fraction: 1.0 - r.utilization,
            peak_allocated_tokens: r.peak_allocated_tokens,
            series: r
                .series
                .iter()
                .map(|s| SampleJson {
                    step: s.step,
                    running: s.running,
                    waiting: s.waiting,
                    used_tokens: s.used_tokens,
                    allocated_tokens: s.allocated_tokens,
                })
                .collect(),
        }
    }
}

/// Paged against contiguous on the same request stream.
#[derive(Debug, Serialize)]
pub struct WorkloadJson {
    pub requests: u64,
    /// Tokens each request reserves under contiguous allocation.
    pub reservation_tokens: u64,
    pub paged: SimJson,
    pub contiguous: SimJson,
    /// With `--gpu-memory`: the paged pool at several `max_num_seqs` settings, the solve's
    /// worst-case answer first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<Vec<SettingJson>>,
}

/// Activation bytes of each strategy's largest micro-batch, when a model was given.
#[derive(Debug, Default)]
pub struct MicroBatches {
    pub padded: Option<u64>,
    pub bucketed: Option<u64>,
    pub packed: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct PaddedJson {
    pub batches: u64,
    pub padding_fraction: f64,
    pub micro_batch_tokens: u64,
    pub micro_batch_activation_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct BucketedJson {
    pub edges: Vec<u64>,
    pub counts: Vec<u64>,
    pub batches: u64,
    pub padding_fraction: f64,
    /// Tokens of the largest micro-batch (the top bucket's).
    pub micro_batch_tokens: u64,
    pub micro_batch_activation_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct PackedJson {
    pub bins: u64,
    pub padding_fraction: f64,
    pub efficiency: f64,
    pub algorithm: &'static str,
    pub batches: u64,
    pub micro_batch_tokens: u64,
    pub micro_batch_activation_bytes: Option<u64>,
}

/// `plan pack --json`.
#[derive(Debug, Serialize)]
pub struct PackJson {
    pub schema_version: u32,
    pub sequences: u64,
    pub tokens: u64,
    pub truncated: u64,
    pub max_len: u64,
    pub padded: PaddedJson,
    pub bucketed: BucketedJson,
    pub packed: PackedJson,
    pub lower_bound_bins: u64,
}

impl PackJson {
    pub fn new(r: &PackReport, s: &PackSettings, micro: &MicroBatches) -> PackJson {
        let b = s.micro_batch;
        PackJson {
            schema_version: SCHEMA_VERSION,
            sequences: r.sequences,
            tokens: r.tokens,
            truncated: r.truncated,
            max_len: s.max_len,
            padded: PaddedJson {
                batches: r.padded.batches,
                padding_fraction: r.padded.padding_fraction,
                micro_batch_tokens: b * s.max_len,
                micro_batch_activation_bytes: micro.padded,
            },
            bucketed: BucketedJson {
                edges: r.bucketed.edges.clone(),
                counts: r.bucketed.counts.clone(),
                batches: r.bucketed.batches,
                padding_fraction: r.bucketed.padding_fraction,
                micro_batch_tokens: b * r.bucketed.edges.last().copied().unwrap_or(0),
                micro_batch_activation_bytes: micro.bucketed,
            },
            packed: PackedJson {
                bins: r.packed.bins,
                padding_fraction: r.packed.padding_fraction,
                efficiency: r.packed.efficiency,
                algorithm: r.packed.algorithm,
                batches: r.packed.batches,
                micro_batch_tokens: b * s.max_len,
                micro_batch_activation_bytes: micro.packed,
            },
            lower_bound_bins: r.lower_bound_bins,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct StrategyJson {
    pub name: &'static str,
    pub activation_bytes: u64,
    /// Extra FLOPs as a fraction of the step's forward and backward FLOPs.
    pub recompute_flops_fraction: f64,
    pub fits: bool,
}

#[derive(Debug, Serialize)]
pub struct OptimalJson {
    pub activation_bytes: u64,
    pub recompute_flops_fraction: f64,
    /// Layer indices (from 0) by choice.
    pub store: Vec<usize>,
    pub selective: Vec<usize>,
    pub full: Vec<usize>,
}

/// `plan checkpoint --json`.
#[derive(Debug, Serialize)]
pub struct CheckpointJson {
    pub schema_version: u32,
    pub model: String,
    pub layers: usize,
    pub budget_bytes: u64,
    pub strategies: Vec<StrategyJson>,
    /// The least-compute plan that fits; null when none does.
    pub optimal: Option<OptimalJson>,
}

impl CheckpointJson {
    pub fn new(model: &str, plan: &CheckpointPlan, step_flops: f64) -> CheckpointJson {
        let share = |flops: f64| {
            if step_flops > 0.0 {
                flops / step_flops
            } else {
                0.0
            }
        };
        CheckpointJson {
            schema_version: SCHEMA_VERSION,
            model: model.to_string(),
            layers: plan.layers,
            budget_bytes: plan.budget.round() as u64,
            strategies: plan
                .strategies
                .iter()
                .map(|s| StrategyJson {
                    name: s.name,
                    activation_bytes: s.bytes.round() as u64,
                    recompute_flops_fraction: share(s.extra_flops),
                    fits: s.fits,
                })
                .collect(),
            optimal: plan.optimal.as_ref().map(|o| {
                let pick = |want: Choice| {
                    o.choices
                        .iter()
                        .enumerate()
                        .filter(|(_, c)| **c == want)
                        .map(|(i, _)| i)
                        .collect()
                };
                OptimalJson {
                    activation_bytes: o.bytes.round() as u64,
                    recompute_flops_fraction: share(o.extra_flops),
                    store: pick(Choice::Store),
                    selective: pick(Choice::Selective),
                    full: pick(Choice::Full),
                }
            }),
        }
    }
}
