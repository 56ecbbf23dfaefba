//! `memprof plan ...`: the planners' flags (docs/planners.md) and their runs.

use super::Outcome;
use crate::model::{count, Bytes};
use crate::plan::activations::{ActivationSettings, Attention, Loss, Recompute};
use crate::plan::calibrate::{calibrate, CalibrationReport, MeasuredRun};
use crate::plan::checkpoint::{layers_from_model, plan_checkpoints, LayerCost};
use crate::plan::deepspeed::Version;
use crate::plan::fit::{what_fits, FitAsk};
use crate::plan::kv::{cache_shape, size_pool, KvDtype, KvSettings, DEFAULT_BLOCK_SIZE};
use crate::plan::kv_sim::{parse_workload, simulate_contiguous, simulate_paged};
use crate::plan::layer_costs::parse_layer_costs;
use crate::plan::model::ModelConfig;
use crate::plan::pack::{micro_batch_activations, parse_lengths, plan_packing, PackSettings};
use crate::plan::recipe::{Optimizer, Precision};
use crate::plan::search::{search, Plan, SearchSpace, MAX_MICRO_BATCH, MAX_SEQ};
use crate::plan::serve::{
    budget, solve, solve_on_gpu, Ask, Room, ServeSetup, DEFAULT_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
};
use crate::plan::states::ZeroStage;
use crate::plan::train::{Headroom, TrainSetup};
use crate::plan::verdict::Verdict;
use crate::plan::{builtin, hf};
use crate::report::{plan_json, plan_text, plot};
use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(subcommand)]
    pub planner: Planner,
}

#[derive(Debug, Subcommand)]
pub enum Planner {
    /// Training memory per GPU for a model and parallelism; searches what is not fixed.
    Train(TrainArgs),
    /// Which layers to recompute under an activation-memory budget, with the least compute.
    Checkpoint(CheckpointArgs),
    /// Sequence packing against padding.
    Pack(PackArgs),
    /// KV-cache pool sizing for serving.
    Kv(KvArgs),
    /// What would have fit: from a snapshot with its trace, the largest micro-batch and
    /// sequence length whose activations fit a capacity, checked by the allocator replay.
    Fit(FitArgs),
}

#[derive(Debug, Args)]
pub struct FitArgs {
    /// A PyTorch memory snapshot (or memprof recording) with its allocation trace.
    pub file: PathBuf,
    /// Memory of the GPU to fit (80GiB, 24GB, plain bytes).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub capacity: u64,
    /// The run's sequences per micro-batch, to answer in micro-batches.
    #[arg(long)]
    pub micro_batch: Option<u64>,
    /// The run's tokens per sequence, to answer in tokens.
    #[arg(long)]
    pub seq_len: Option<u64>,
    /// Memory outside PyTorch's allocator (CUDA context, libraries), taken off the capacity.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub cuda_context: u64,
    /// The device to look at (default: the one with the longest trace).
    #[arg(long)]
    pub device: Option<u32>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Parses a size flag (`80GiB`, `1.5GB`, plain bytes).
pub fn parse_size(text: &str) -> Result<u64, String> {
    text.parse::<Bytes>()
        .map(|b| b.0)
        .map_err(|e| e.to_string())
}

/// Parses a parameter count: `7000000000`, `7e9`, `7B`, `405B`, `125M`.
fn parse_count(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (number, scale) = match t.chars().last() {
        Some('B' | 'b') => (&t[..t.len() - 1], 1e9),
        Some('M' | 'm') => (&t[..t.len() - 1], 1e6),
        Some('K' | 'k') => (&t[..t.len() - 1], 1e3),
        _ => (t, 1.0),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid parameter count {text:?} (use 7000000000, 7e9 or 7B)"))?;
    let n = (value * scale).round();
    if !(1.0..=1e15).contains(&n) {
        return Err(format!("parameter count {text:?} is out of range"));
    }
    Ok(n as u64)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// bf16 weights and grads, fp32 master and Adam moments (16 B/param with Adam).
    Bf16,
    /// fp16 mixed precision, as bf16 (16-bit weights and activations; torch.autocast over fp32
    /// weights is amp-fp16).
    Fp16,
    /// fp32 weights, grads and Adam moments, no separate master copy (16 B/param with Adam).
    Fp32,
    /// Transformer Engine FP8 (fp32 weights and grads).
    Fp8,
    /// bf16 with an fp32 gradient-accumulation buffer (20 B/param).
    Bf16Fp32Accum,
    /// Megatron-LM bf16 params with fp32 main grads (18 B/param).
    MegatronBf16,
    /// Megatron-LM fp16 params and grads with fp32 main params and grads (20 B/param).
    MegatronFp16,
    /// FP8-LM O3 (9 B/param).
    Fp8Lm,
    /// DeepSeek-V3 FP8 recipe (15 B/param).
    DeepseekFp8,
    /// Nanotron FP8 recipe (10 B/param).
    NanotronFp8,
    /// torch.autocast to fp16 over fp32 weights, as the Hugging Face Trainer's fp16=True (16
    /// B/param with Adam, plus the 16-bit copies autocast makes of the matmul weights).
    AmpFp16,
    /// torch.autocast to bf16 over fp32 weights, as the Hugging Face Trainer's bf16=True.
    AmpBf16,
}

impl PrecisionArg {
    fn recipe(self) -> Precision {
        match self {
            PrecisionArg::Bf16 | PrecisionArg::Fp16 => Precision::Mixed,
            PrecisionArg::Fp32 => Precision::Fp32,
            PrecisionArg::Fp8 => Precision::TeFp8,
            PrecisionArg::Bf16Fp32Accum => Precision::Bf16Fp32Accum,
            PrecisionArg::MegatronBf16 => Precision::MegatronBf16,
            PrecisionArg::MegatronFp16 => Precision::MegatronFp16,
            PrecisionArg::Fp8Lm => Precision::Fp8LmO3,
            PrecisionArg::DeepseekFp8 => Precision::DeepSeekV3Fp8,
            PrecisionArg::NanotronFp8 => Precision::NanotronFp8,
            PrecisionArg::AmpFp16 | PrecisionArg::AmpBf16 => Precision::Autocast,
        }
    }
}

/// Parses a fraction in [0, 1].
fn parse_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("expected a fraction between 0 and 1, got {text:?}")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeepSpeedArg {
    /// deepspeedai/DeepSpeed today: 2 P + 18 P / gpus.
    Current,
    /// microsoft/DeepSpeed and its docs: 4 P + 16 P / gpus.
    Legacy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    /// Adam / AdamW: two fp32 moments (8 B/param).
    Adamw,
    /// SGD with momentum: one fp32 moment (4 B/param).
    Sgd,
    /// bitsandbytes 8-bit AdamW: two 1-byte moments (about 2 B/param).
    Adamw8bit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RecomputeArg {
    /// Keep every activation for backward.
    None,
    /// Recompute the attention core (Korthikanti et al. 2022), keep the rest.
    Selective,
    /// Keep only each layer's input and recompute the layer in backward.
    Full,
    /// Per operator, as torchtitan's selective_ac_option "op": keep every other matmul output and the attention output
    PerOp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AttentionArg {
    /// FlashAttention / SDPA: no attention-score matrix is kept.
    Flash,
    /// Plain attention: the scores and softmax of each layer are kept for backward.
    Eager,
}

impl From<AttentionArg> for Attention {
    fn from(a: AttentionArg) -> Attention {
        match a {
            AttentionArg::Flash => Attention::Flash,
            AttentionArg::Eager => Attention::Eager,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossArg {
    /// PyTorch's cross_entropy on fp32 logits, run eagerly (fp32 log-softmax kept, fp32
    /// gradients in backward).
    Eager,
    /// The same under torch.compile (torchtitan's --training.compile compiles it): the 16-bit
    /// logits kept and their 16-bit gradient.
    Compiled,
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A Hugging Face config.json or a built-in name (llama-3-8b, gpt3-175b, ...).
    #[arg(long)]
    pub model: String,
    /// Override the parameter count (7000000000, 7e9, 7B).
    #[arg(long, value_name = "COUNT", value_parser = parse_count)]
    pub params: Option<u64>,
    /// GPUs in the job (dp x tp x pp x cp).
    #[arg(long)]
    pub gpus: u64,
    /// Memory of one GPU (80GiB, 141GB, plain bytes).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub gpu_memory: u64,
    /// Tokens per sequence.
    #[arg(long)]
    pub seq_len: u64,
    /// Sequences per micro-batch on each data-parallel rank.
    #[arg(long)]
    pub micro_batch: u64,
    /// Samples per optimizer step (sets gradient accumulation; without it each layout
    /// accumulates pp micro-batches).
    #[arg(long)]
    pub global_batch: Option<u64>,
    /// Training precision recipe.
    #[arg(long, value_enum, default_value = "bf16")]
    pub precision: PrecisionArg,
    /// Optimizer, which sets the states kept per parameter.
    #[arg(long, value_enum, default_value = "adamw")]
    pub optimizer: OptimizerArg,
    /// ZeRO stage (FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// Tensor-parallel degree (searched up to 8 when not given).
    #[arg(long)]
    pub tp: Option<u64>,
    /// Pipeline stages (1F1B schedule).
    #[arg(long)]
    pub pp: Option<u64>,
    /// Context-parallel degree.
    #[arg(long)]
    pub cp: Option<u64>,
    /// Data-parallel degree.
    #[arg(long)]
    pub dp: Option<u64>,
    /// Hybrid sharding (HSDP): shard over groups of this many DP ranks, replicate across.
    #[arg(long)]
    pub shard_group: Option<u64>,
    /// Tensor parallelism without sequence parallelism.
    #[arg(long)]
    pub no_sp: bool,
    /// Activation recompute (searched when not given).
    #[arg(long, value_enum)]
    pub recompute: Option<RecomputeArg>,
    /// Attention kernel, which sets whether the attention scores are kept for backward.
    #[arg(long, value_enum, default_value = "flash")]
    pub attention: AttentionArg,
    /// How the loss over the logits runs, which sets what its backward holds (the
    /// megatron-* precisions use Megatron-LM's own loss).
    #[arg(long, value_enum, default_value = "eager")]
    pub loss: LossArg,
    /// Memory kept for the CUDA context and library workspaces per GPU.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub cuda_context: u64,
    /// Memory kept per GPU for NCCL and other communication buffers when the job has more
    /// than one GPU.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub comm_buffers: u64,
    /// Share of the estimate kept free for allocator fragmentation (0.05-0.10 with
    /// expandable segments, more without).
    #[arg(long, value_name = "F", default_value_t = 0.10, value_parser = parse_fraction)]
    pub fragmentation: f64,
    /// DeepSpeed release whose ZeRO-2 estimator is printed for comparison.
    #[arg(long, value_enum, default_value = "current")]
    pub deepspeed_version: DeepSpeedArg,
    /// How many candidates to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Print every term of the recommended candidate's estimate with its formula and the
    /// paper or tool it comes from.
    #[arg(long)]
    pub explain: bool,
    /// Also draw the memory breakdown of each listed candidate as a bar chart; the extension
    /// picks PNG or SVG.
    #[arg(long, value_name = "OUT.png|OUT.svg")]
    pub plot: Option<PathBuf>,
    /// A short run's snapshot with its allocation trace (a step or two of a smaller
    /// configuration of the same model, on one GPU): the most its step holds at once of what it
    /// frees calibrates the per-layer activation terms of the first listed candidate.
    #[arg(long, value_name = "SNAPSHOT")]
    pub calibrate: Option<PathBuf>,
    /// The calibration run's model, when it is not --model (a config.json or a built-in name).
    #[arg(long, value_name = "MODEL", requires = "calibrate")]
    pub calibrate_model: Option<String>,
    /// The calibration run's tokens per sequence (default: --seq-len).
    #[arg(long, value_name = "N", requires = "calibrate")]
    pub calibrate_seq_len: Option<u64>,
    /// The calibration run's sequences per micro-batch (default: --micro-batch).
    #[arg(long, value_name = "N", requires = "calibrate")]
    pub calibrate_micro_batch: Option<u64>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvDtypeArg {
    Bf16,
    Fp16,
    Fp8,
}

#[derive(Debug, Args)]
pub struct KvArgs {
    /// A Hugging Face config.json or a built-in name.
    #[arg(long)]
    pub model: String,
    /// Element type of the cached keys and values.
    #[arg(long, value_enum, default_value = "bf16")]
    pub dtype: KvDtypeArg,
    /// Memory of one GPU: the pool gets utilization x this, less the weights' TP shard, the
    /// profile run's activation peak, non-PyTorch memory and the CUDA-graph pool.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub gpu_memory: Option<u64>,
    /// Share of the GPU the serving instance may use (vLLM gpu_memory_utilization).
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub utilization: f64,
    /// Memory for the cache itself, instead of deriving it from --gpu-memory.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "gpu_memory")]
    pub kv_memory: Option<u64>,
    /// Tokens per block.
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: u64,
    /// Tensor-parallel degree (the KV heads are split across it).
    #[arg(long, default_value_t = 1)]
    pub tp: u64,
    /// Tokens of a full-length request; with --gpu-memory, solves for the most sequences that
    /// fit (default: the model's maximum).
    #[arg(long)]
    pub max_model_len: Option<u64>,
    /// Sequences running at once; with --gpu-memory, solves for the longest length that fits
    /// (with --max-model-len too, checks that both fit).
    #[arg(long)]
    pub max_num_seqs: Option<u64>,
    /// Tokens of vLLM's profile run, which sets the activation peak.
    #[arg(long, default_value_t = DEFAULT_BATCHED_TOKENS)]
    pub max_num_batched_tokens: u64,
    /// Memory the captured CUDA graphs keep (0 for vLLM's --enforce-eager).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub cuda_graph_memory: u64,
    /// CUDA context and library workspaces per GPU.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub cuda_context: u64,
    /// NCCL and all-reduce buffers per GPU, counted when --tp is above 1.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    pub nccl_memory: u64,
    /// Requests to simulate (JSON Lines: arrival step, prompt, output, optional prefix
    /// group and length), paged against contiguous reservation of --max-model-len; with
    /// --gpu-memory, also at several --max-num-seqs settings.
    #[arg(long, value_name = "FILE")]
    pub workload: Option<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PackArgs {
    /// One sequence length per line, or JSON Lines with a length field or a token list.
    #[arg(long, value_name = "FILE")]
    pub lengths: PathBuf,
    /// Tokens per sequence slot (and per packed bin).
    #[arg(long)]
    pub max_len: u64,
    /// Sequences (or packed bins) per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u64,
    /// Buckets to recommend edges for.
    #[arg(long, default_value_t = 8)]
    pub buckets: usize,
    /// A model (built-in name or config.json) to size each micro-batch's activations.
    #[arg(long)]
    pub model: Option<String>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// A Hugging Face config.json or a built-in name.
    #[arg(long, required_unless_present = "layers", conflicts_with = "layers")]
    pub model: Option<String>,
    /// Measured per-layer costs instead of a model: a JSON array (or JSON Lines) of
    /// {"stored_bytes", "input_bytes", "forward_cost", "selective_bytes"?, "selective_cost"?}.
    #[arg(long, value_name = "FILE")]
    pub layers: Option<PathBuf>,
    /// Activation bytes outside the layers (with --layers).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "0")]
    pub fixed: u64,
    /// Tokens per sequence (with --model).
    #[arg(long, required_unless_present = "layers")]
    pub seq_len: Option<u64>,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u64,
    /// Memory one GPU has for activations (what is left after weights and optimizer).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub budget: u64,
    /// Tensor-parallel degree.
    #[arg(long, default_value_t = 1)]
    pub tp: u64,
    /// Tensor parallelism without sequence parallelism.
    #[arg(long)]
    pub no_sp: bool,
    /// Attention kernel, which sets whether the attention scores are kept for backward.
    #[arg(long, value_enum, default_value = "flash")]
    pub attention: AttentionArg,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs a planner.
pub fn run(args: &PlanArgs) -> anyhow::Result<Outcome> {
    match &args.planner {
        Planner::Train(a) => train(a),
        Planner::Checkpoint(a) => checkpoint(a),
        Planner::Pack(a) => pack(a),
        Planner::Kv(a) => kv(a),
        Planner::Fit(a) => fit(a),
    }
}

/// A built-in name, or a path to a `config.json` (or to the folder holding one).
pub fn load_model(spec: &str) -> anyhow::Result<ModelConfig> {
    if let Some(model) = builtin::find(spec) {
        return Ok(model);
    }
    let given = Path::new(spec);
    let dir_config = given.join("config.json");
    let path = if given.is_dir() {
        dir_config.as_path()
    } else {
        given
    };
    if !path.exists() {
        bail!(
            "--model {spec}: no such file and not a built-in model ({})",
            builtin::NAMES.join(", ")
        );
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("--model {spec}"))?;
    let name = path
        .parent()
        .and_then(Path::file_name)
        .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned());
    hf::parse_config(&text, &name).with_context(|| format!("--model {spec}"))
}

fn train(a: &TrainArgs) -> anyhow::Result<Outcome> {
    let planned = train_plan(a)?;
    let mut stdout = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer(&mut stdout, &planned.json()).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        if let (Some(report), Some(path)) = (&planned.calibration, &a.calibrate) {
            let name = path.display().to_string();
            stdout.write_all(plan_text::calibration(report, &name).as_bytes())?;
        }
        let PlannedTraining {
            setup,
            plan,
            version,
            ..
        } = &planned;
        stdout.write_all(plan_text::train(setup, a.gpus, plan, *version, a.explain).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
}

/// The `plan train` document `--json` prints (the MCP tool `plan_train` returns it too).
pub(super) fn train_json(a: &TrainArgs) -> anyhow::Result<String> {
    Ok(serde_json::to_string(&train_plan(a)?.json())?)
}

/// What `plan train` found: the setup, the searched candidates and the `--calibrate` result.
struct PlannedTraining {
    setup: TrainSetup,
    plan: Plan,
    version: Version,
    calibration: Option<CalibrationReport>,
}

impl PlannedTraining {
    fn json(&self) -> plan_json::TrainJson {
        let mut doc = plan_json::TrainJson::new(&self.setup, &self.plan, self.version);
        doc.calibration = self.calibration.clone();
        doc
    }
}

/// Searches the layouts; writes `--plot`.
fn train_plan(a: &TrainArgs) -> anyhow::Result<PlannedTraining> {
    let compiled_loss = a.loss == LossArg::Compiled;
    if compiled_loss && a.precision.recipe().fused_loss() {
        bail!("--loss compiled is PyTorch's cross_entropy; the megatron-* precisions use Megatron-LM's own loss");
    }
    let mut model = load_model(&a.model)?;
    model.params_override = a.params;
    let setup = TrainSetup {
        model,
        precision: a.precision.recipe(),
        optimizer: match a.optimizer {
            OptimizerArg::Adamw => Optimizer::AdamW,
            OptimizerArg::Sgd => Optimizer::Sgd,
            OptimizerArg::Adamw8bit => Optimizer::AdamW8bit,
        },
        seq_len: a.seq_len,
        attention: a.attention.into(),
        compiled_loss,
        gpu_memory: a.gpu_memory,
        headroom: Headroom {
            context_bytes: a.cuda_context,
            comm_bytes: a.comm_buffers,
            fragmentation: a.fragmentation,
        },
    };
    let space = SearchSpace {
        gpus: a.gpus,
        dp: a.dp,
        tp: a.tp,
        pp: a.pp,
        cp: a.cp,
        zero: a.zero.and_then(ZeroStage::from_number),
        recompute: a.recompute.map(|r| match r {
            RecomputeArg::None => Recompute::None,
            RecomputeArg::Selective => Recompute::Selective,
            RecomputeArg::Full => Recompute::Full,
            RecomputeArg::PerOp => Recompute::PerOp,
        }),
        shard_group: a.shard_group,
        sp: !a.no_sp,
        micro_batch: a.micro_batch,
        global_batch: a.global_batch,
    };
    let plan = search(&setup, &space, a.top)?;
    let calibration = match &a.calibrate {
        Some(path) => Some(calibration(a, path, &setup, &plan)?),
        None => None,
    };
    if let Some(path) = &a.plot {
        write_candidates_plot(path, &setup, a.gpus, &plan)?;
        super::wrote_beside(path);
    }
    let version = match a.deepspeed_version {
        DeepSpeedArg::Current => Version::Current,
        DeepSpeedArg::Legacy => Version::Legacy,
    };
    Ok(PlannedTraining {
        setup,
        plan,
        version,
        calibration,
    })
}

/// Reads the `--calibrate` snapshot and calibrates the first listed candidate with it.
fn calibration(
    a: &TrainArgs,
    path: &Path,
    setup: &TrainSetup,
    plan: &Plan,
) -> anyhow::Result<CalibrationReport> {
    let context = || format!("--calibrate {}", path.display());
    let loaded = super::input::load_snapshot(path, false).with_context(context)?;
    let model = match &a.calibrate_model {
        Some(spec) => load_model(spec)?,
        None => setup.model.clone(),
    };
    let run = MeasuredRun {
        model: &model,
        seq_len: a.calibrate_seq_len.unwrap_or(a.seq_len),
        micro_batch: a.calibrate_micro_batch.unwrap_or(a.micro_batch),
    };
    if run.seq_len == 0 || run.micro_batch == 0 {
        bail!("--calibrate-seq-len and --calibrate-micro-batch must be at least 1");
    }
    calibrate(&loaded.parsed.snapshot, &run, setup, &plan.candidates).with_context(context)
}

/// Draws `plan train`'s candidates as stacked bars and writes the picture to `path`.
fn write_candidates_plot(
    path: &Path,
    setup: &TrainSetup,
    gpus: u64,
    plan: &Plan,
) -> anyhow::Result<()> {
    let format = plot::Format::from_path(path)?;
    let figure = plot::CandidatesPlot {
        title: format!(
            "Memory per GPU by candidate layout - {}, {}, sequence {}",
            setup.model.name,
            count(gpus, "GPU", "GPUs"),
            setup.seq_len
        ),
        gpu_memory: setup.gpu_memory,
        bars: plan
            .candidates
            .iter()
            .map(plan_text::candidate_bar)
            .collect(),
        recommended: plan.recommended,
    };
    let bytes = plot::render(&figure, format)?;
    std::fs::write(path, bytes).with_context(|| format!("{}: cannot write", path.display()))
}

fn fit(a: &FitArgs) -> anyhow::Result<Outcome> {
    let shown = a.file.display().to_string();
    let loaded = super::input::load_snapshot(&a.file, false).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    let device = match a.device {
        Some(d) => d,
        None => snapshot
            .devices()
            .into_iter()
            .max_by_key(|&d| {
                (
                    snapshot.timeline.device(d as usize).len(),
                    std::cmp::Reverse(d),
                )
            })
            .with_context(|| format!("{shown}: no device has segments or a trace"))?,
    };
    let ask = FitAsk {
        capacity: a.capacity,
        context_bytes: a.cuda_context,
        micro_batch: a.micro_batch,
        seq_len: a.seq_len,
    };
    let report = what_fits(snapshot, device, &ask).with_context(|| shown.clone())?;
    let mut stdout = std::io::stdout().lock();
    if a.json {
        let doc = plan_json::FitJson::new(&report);
        serde_json::to_writer(&mut stdout, &doc).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(plan_text::fit(&report).as_bytes())?;
    }
    stdout.flush()?;
    Ok(if report.recorded_fits {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}

/// Exit 0 when the answer fits (or nothing was judged), 1 when it is tight or does not fit.
fn outcome_of(verdict: Option<Verdict>) -> Outcome {
    if verdict.is_some_and(Verdict::is_finding) {
        Outcome::Finding
    } else {
        Outcome::Ok
    }
}

/// Most `--max-num-seqs` settings the workload is simulated at.
const SWEEP_SETTINGS: usize = 6;

fn kv(a: &KvArgs) -> anyhow::Result<Outcome> {
    let (model, settings, doc) = kv_plan(a)?;
    let mut stdout = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer(&mut stdout, &doc).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        let text = plan_text::kv(&model.name, &settings, a.kv_memory, &doc);
        stdout.write_all(text.as_bytes())?;
        if let Some(w) = &doc.workload {
            stdout.write_all(plan_text::workload(w).as_bytes())?;
        }
    }
    stdout.flush()?;
    Ok(outcome_of(doc.solve.as_ref().map(|s| s.verdict)))
}

/// The `plan kv` document `--json` prints (the MCP tool `plan_kv` returns it too).
pub(super) fn kv_json(a: &KvArgs) -> anyhow::Result<String> {
    Ok(serde_json::to_string(&kv_plan(a)?.2)?)
}

/// Sizes the pool, and simulates `--workload`.
fn kv_plan(a: &KvArgs) -> anyhow::Result<(ModelConfig, KvSettings, plan_json::KvJson)> {
    let model = load_model(&a.model)?;
    let settings = KvSettings {
        dtype: match a.dtype {
            KvDtypeArg::Bf16 => KvDtype::Bf16,
            KvDtypeArg::Fp16 => KvDtype::Fp16,
            KvDtypeArg::Fp8 => KvDtype::Fp8,
        },
        tp: a.tp,
        block_size: a.block_size,
        max_model_len: a.max_model_len,
    };
    let (per_token, block_bytes) = cache_shape(&model, &settings)?;
    let serve = ServeSetup {
        gpu_memory: a.gpu_memory.unwrap_or(0),
        utilization: a.utilization,
        cuda_graph_bytes: a.cuda_graph_memory,
        context_bytes: a.cuda_context,
        nccl_bytes: a.nccl_memory,
        max_num_batched_tokens: a.max_num_batched_tokens,
    };
    let ask = Ask {
        max_model_len: a.max_model_len,
        max_num_seqs: a.max_num_seqs,
    };
    let asked = a.max_model_len.is_some() || a.max_num_seqs.is_some();
    let (serving, solved) = match (a.gpu_memory, a.kv_memory) {
        (Some(_), _) if asked || model.max_positions.is_some() => {
            let (b, s) = solve_on_gpu(&model, &settings, &serve, ask)?;
            (Some(b), Some(s))
        }
        (Some(_), _) => {
            let b = budget(&model, &serve, a.tp, DEFAULT_MAX_NUM_SEQS)?;
            (Some(b), None)
        }
        (None, Some(bytes)) if asked => {
            let s = solve(&model, &settings, Room::Given(bytes), ask)?;
            (None, Some(s))
        }
        _ => (None, None),
    };
    let available = match (a.kv_memory, &serving) {
        (Some(bytes), _) => Some(bytes),
        (None, Some(b)) => Some(b.kv_available_bytes),
        (None, None) => None,
    };
    let pool = available
        .map(|bytes| size_pool(&model, &settings, bytes))
        .transpose()?;
    let workload = match (&a.workload, &pool) {
        (None, _) => None,
        (Some(_), None) => {
            bail!("--workload needs --gpu-memory SIZE or --kv-memory SIZE to size the pool")
        }
        (Some(path), Some(pool)) => {
            let shown = path.display().to_string();
            let file =
                std::fs::File::open(path).with_context(|| format!("{shown}: cannot open"))?;
            let requests =
                parse_workload(std::io::BufReader::new(file)).with_context(|| shown.clone())?;
            let Some(max_len) = pool.max_model_len else {
                bail!("--workload needs --max-model-len (the model does not state its maximum)");
            };
            let capacity = pool.num_blocks * settings.block_size;
            let sweep = solved.as_ref().map(|s| {
                sweep_settings(s.max_num_seqs, requests.len() as u64)
                    .into_iter()
                    .map(|n| {
                        let r = simulate_paged(
                            &requests,
                            pool.num_blocks,
                            settings.block_size,
                            Some(n),
                        );
                        plan_json::SettingJson::new(n, &r)
                    })
                    .collect()
            });
            Some(plan_json::WorkloadJson {
                requests: requests.len() as u64,
                reservation_tokens: max_len,
                paged: plan_json::SimJson::new(&simulate_paged(
                    &requests,
                    pool.num_blocks,
                    settings.block_size,
                    None,
                )),
                contiguous: plan_json::SimJson::new(&simulate_contiguous(
                    &requests, capacity, max_len,
                )),
                settings: sweep,
            })
        }
    };
    let doc = plan_json::KvJson::new(
        per_token,
        block_bytes,
        pool.as_ref(),
        serving.as_ref(),
        solved.as_ref(),
        workload,
    );
    Ok((model, settings, doc))
}

/// The `--max-num-seqs` settings to simulate: the worst-case answer, then doubled until the
/// request count, at most `SWEEP_SETTINGS` of them.
fn sweep_settings(worst_case: u64, requests: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut n = worst_case.max(1);
    while out.len() < SWEEP_SETTINGS {
        out.push(n);
        if n >= requests {
            break;
        }
        n = n.saturating_mul(2).min(requests.max(1));
    }
    out
}

fn pack(a: &PackArgs) -> anyhow::Result<Outcome> {
    let model = a.model.as_deref().map(load_model).transpose()?;
    let shown = a.lengths.display().to_string();
    let file = std::fs::File::open(&a.lengths).with_context(|| format!("{shown}: cannot open"))?;
    let lengths = parse_lengths(std::io::BufReader::with_capacity(1 << 20, file))
        .with_context(|| shown.clone())?;
    let settings = PackSettings {
        max_len: a.max_len,
        micro_batch: a.micro_batch,
        buckets: a.buckets,
    };
    let report = plan_packing(&lengths, &settings).with_context(|| shown.clone())?;
    let memory = |seq: u64| {
        model
            .as_ref()
            .map(|m| micro_batch_activations(m, seq, a.micro_batch))
    };
    let largest_edge = report.bucketed.edges.last().copied().unwrap_or(a.max_len);
    let micro = plan_json::MicroBatches {
        padded: memory(a.max_len),
        bucketed: memory(largest_edge),
        packed: memory(a.max_len),
    };
    let doc = plan_json::PackJson::new(&report, &settings, &micro);
    let mut stdout = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer(&mut stdout, &doc).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(plan_text::pack(&report, &doc).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
}

fn checkpoint(a: &CheckpointArgs) -> anyhow::Result<Outcome> {
    let (name, layers, fixed, step_flops) = match (&a.layers, &a.model, a.seq_len) {
        (Some(path), _, _) => {
            let shown = path.display().to_string();
            let text =
                std::fs::read_to_string(path).with_context(|| format!("{shown}: cannot read"))?;
            let layers = parse_layer_costs(&text).with_context(|| shown.clone())?;
            let step = 3.0 * layers.iter().map(|l| l.full_flops).sum::<f64>();
            (shown, layers, a.fixed as f64, step)
        }
        (None, Some(model), Some(seq_len)) => model_layers(a, model, seq_len)?,
        _ => bail!("plan checkpoint needs --model and --seq-len, or --layers FILE"),
    };
    let plan = plan_checkpoints(&layers, fixed, a.budget as f64);
    let doc = plan_json::CheckpointJson::new(&name, &plan, step_flops);
    let mut stdout = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer(&mut stdout, &doc).context("writing JSON")?;
        stdout.write_all(b"\n")?;
    } else {
        stdout.write_all(plan_text::checkpoint(&doc).as_bytes())?;
    }
    stdout.flush()?;
    Ok(Outcome::Ok)
}

/// The layers of a model config: (name, layers, bytes outside them, step FLOPs).
fn model_layers(
    a: &CheckpointArgs,
    spec: &str,
    seq_len: u64,
) -> anyhow::Result<(String, Vec<LayerCost>, f64, f64)> {
    if seq_len == 0 || a.micro_batch == 0 || a.tp == 0 {
        bail!("--seq-len, --micro-batch and --tp must be at least 1");
    }
    if seq_len > MAX_SEQ || a.micro_batch > MAX_MICRO_BATCH {
        bail!("--seq-len is at most {MAX_SEQ} and --micro-batch at most {MAX_MICRO_BATCH}");
    }
    let model = load_model(spec)?;
    let settings = ActivationSettings {
        seq_len,
        micro_batch: a.micro_batch,
        tp: a.tp,
        sp: !a.no_sp && a.tp > 1,
        cp: 1,
        pp: 1,
        micro_batches: 1,
        recompute: Recompute::None,
        attention: a.attention.into(),
        element_bytes: 2.0,
        loss: Loss::Eager,
        autocast: false,
    };
    let (layers, fixed, step_flops) = layers_from_model(&model, &settings);
    Ok((model.name, layers, fixed, step_flops))
}
