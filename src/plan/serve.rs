//! Serving memory on one GPU, split the way vLLM's profiler splits it (weights, the profile
//! run's activation peak, non-PyTorch memory, the CUDA-graph pool, the KV cache), and the
//! solve a serving engineer asks for: given the GPU and `max_model_len` or `max_num_seqs` (or
//! both, to check), the largest value of the other that fits, the KV bytes that cap allows,
//! and the vLLM and SGLang flags that say so. `reference/planner-math.md` §3.3.

use super::kv::{cache_shape, KvDtype, KvError, KvSettings, DEFAULT_BLOCK_SIZE, WEIGHT_BYTES};
use super::model::ModelConfig;
use super::verdict::Verdict;

/// What the serving instance is given besides the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServeSetup {
    pub gpu_memory: u64,
    /// vLLM `--gpu-memory-utilization`: the share of the GPU the instance may use.
    pub utilization: f64,
    /// Memory the captured CUDA graphs keep (vLLM's graph pool).
    pub cuda_graph_bytes: u64,
    /// CUDA context and library workspaces.
    pub context_bytes: u64,
    /// NCCL and custom all-reduce buffers, counted when TP > 1.
    pub nccl_bytes: u64,
    /// Tokens of vLLM's profile run (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: u64,
}

/// vLLM's `max_num_seqs` when none is given (the OpenAI server's default on large GPUs).
pub const DEFAULT_MAX_NUM_SEQS: u64 = 256;

/// The profile run's tokens when `--max-num-batched-tokens` is not given.
pub const DEFAULT_BATCHED_TOKENS: u64 = 8192;

/// Largest `max_num_seqs` or `max_model_len` accepted.
pub const MAX_SETTING: u64 = 1 << 26;

/// One named term of the serving budget.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeTerm {
    /// The JSON field (`weights_bytes`, ...).
    pub name: &'static str,
    pub label: &'static str,
    pub bytes: u64,
    pub formula: String,
    pub source: &'static str,
}

/// The serving budget by term; the KV cache gets what is left.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeBudget {
    pub gpu_memory_bytes: u64,
    pub utilization: f64,
    /// `utilization x gpu_memory`.
    pub budget_bytes: u64,
    /// Weights, activation peak, non-PyTorch memory, CUDA graphs: what comes off the budget.
    pub terms: Vec<ServeTerm>,
    /// What is left for the cache (0 when the terms exceed the budget).
    pub kv_available_bytes: u64,
}

impl ServeBudget {
    /// The terms' sum.
    pub fn used_bytes(&self) -> u64 {
        self.terms.iter().map(|t| t.bytes).sum()
    }
}

/// Why the budget cannot be worked out.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ServeError {
    #[error("--utilization must be in (0, 1], got {0}")]
    Utilization(f64),
    #[error("--max-num-seqs, --max-model-len and --max-num-batched-tokens must be between 1 and {MAX_SETTING}")]
    Setting,
}

/// Bytes of vLLM's profile run: one forward of `tokens` tokens (per layer the QKV projection,
/// the MLP's up / gate output and its activation, a few hidden-size buffers, all bf16), then
/// fp32 logits and probabilities for `seqs` sampled rows over the whole vocabulary. memprof's
/// estimate of what vLLM measures as "PyTorch activation peak memory".
pub fn profile_peak(model: &ModelConfig, tp: u64, tokens: u64, seqs: u64) -> u64 {
    let t = tp.max(1);
    let h = model.hidden_size;
    let qkv = (model.heads + 2 * model.kv_heads) * model.head_dim / t;
    let ffn = match model.moe {
        None => model.ffn,
        Some(m) => (m.active + m.shared) * m.expert_ffn,
    } / t;
    // gate and up outputs (2 ffn), the activated product (ffn), four hidden-size buffers.
    let per_token = 2 * (qkv + 3 * ffn + 4 * h);
    let logits = seqs.min(tokens) * model.vocab * 8;
    tokens.saturating_mul(per_token).saturating_add(logits)
}

/// The serving budget of `model` under `setup` with TP `tp`, for `max_num_seqs` sequences.
pub fn budget(
    model: &ModelConfig,
    setup: &ServeSetup,
    tp: u64,
    max_num_seqs: u64,
) -> Result<ServeBudget, ServeError> {
    if !(setup.utilization > 0.0 && setup.utilization <= 1.0) {
        return Err(ServeError::Utilization(setup.utilization));
    }
    let valid = 1..=MAX_SETTING;
    if !valid.contains(&max_num_seqs) || !valid.contains(&setup.max_num_batched_tokens) {
        return Err(ServeError::Setting);
    }
    let t = tp.max(1);
    let budget_bytes = (setup.gpu_memory as f64 * setup.utilization).floor() as u64;
    let params = model.param_counts().total;
    let nccl = if t > 1 { setup.nccl_bytes } else { 0 };
    let terms = vec![
        ServeTerm {
            name: "weights_bytes",
            label: "weights",
            bytes: params * WEIGHT_BYTES / t,
            formula: format!(
                "{:.2}B parameters x {WEIGHT_BYTES} B / TP {t}",
                params as f64 / 1e9
            ),
            source: "the model's parameter count in bf16 / fp16",
        },
        ServeTerm {
            name: "activation_peak_bytes",
            label: "profile-run activation peak",
            bytes: profile_peak(model, t, setup.max_num_batched_tokens, max_num_seqs),
            formula: format!(
                "{} tokens x 2 B x (QKV + 3 x MLP width + 4 x hidden) / TP, plus fp32 logits and \
                 probabilities for {} rows of a {}-token vocabulary",
                setup.max_num_batched_tokens,
                max_num_seqs.min(setup.max_num_batched_tokens),
                model.vocab
            ),
            source: "memprof's estimate of vLLM's profile run (--max-num-batched-tokens)",
        },
        ServeTerm {
            name: "non_torch_bytes",
            label: "non-PyTorch memory",
            bytes: setup.context_bytes + nccl,
            formula: if t > 1 {
                "CUDA context (--cuda-context) + NCCL buffers with TP > 1 (--nccl-memory)"
                    .to_string()
            } else {
                "CUDA context (--cuda-context); no NCCL buffers at TP 1".to_string()
            },
            source: "memprof defaults; vLLM logs its own as non_torch_memory",
        },
        ServeTerm {
            name: "cuda_graph_bytes",
            label: "CUDA-graph pool",
            bytes: setup.cuda_graph_bytes,
            formula: "--cuda-graph-memory (0 with vLLM's --enforce-eager)".to_string(),
            source: "memprof default; vLLM logs the graph capture's memory at startup",
        },
    ];
    let used: u64 = terms.iter().map(|t| t.bytes).sum();
    Ok(ServeBudget {
        gpu_memory_bytes: setup.gpu_memory,
        utilization: setup.utilization,
        budget_bytes,
        kv_available_bytes: budget_bytes.saturating_sub(used),
        terms,
    })
}

/// What the user fixes; the solve finds the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub max_model_len: Option<u64>,
    pub max_num_seqs: Option<u64>,
}

/// The answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Solve {
    pub max_model_len: u64,
    pub max_num_seqs: u64,
    /// `max_num_seqs x ceil(max_model_len / block)` blocks: what the cache needs for every
    /// sequence at full length, and the cap to hand the engine.
    pub kv_cache_bytes: u64,
    pub kv_available_bytes: u64,
    pub fits: bool,
    /// Fit, tight (only within `1 - utilization` of the GPU) or no fit (`plan::verdict`).
    pub verdict: Verdict,
    /// At `max_model_len`, the most sequences that fit.
    pub largest_max_num_seqs: u64,
    /// At `max_num_seqs`, the longest sequence that fits (capped at the model's maximum).
    pub largest_max_model_len: u64,
    pub flags: Flags,
}

/// The arguments to pass, as strings.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Flags {
    pub vllm: Vec<String>,
    pub sglang: Vec<String>,
}

/// Why nothing can be solved.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SolveError {
    #[error(
        "give --max-model-len or --max-num-seqs (the model does not state its maximum length)"
    )]
    NothingAsked,
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

fn flag(out: &mut Vec<String>, name: &str, value: impl ToString) {
    out.push(name.to_string());
    out.push(value.to_string());
}

/// What the cache may take: what a GPU's budget leaves, or a size given outright (vLLM's
/// `--kv-cache-memory-bytes`).
#[derive(Clone, Copy, Debug)]
pub enum Room<'a> {
    Gpu {
        setup: &'a ServeSetup,
        budget: &'a ServeBudget,
    },
    Given(u64),
}

impl Room<'_> {
    fn available(&self) -> u64 {
        match self {
            Room::Gpu { budget, .. } => budget.kv_available_bytes,
            Room::Given(bytes) => *bytes,
        }
    }
}

/// Solves for what `ask` leaves open.
pub fn solve(
    model: &ModelConfig,
    kv: &KvSettings,
    room: Room,
    ask: Ask,
) -> Result<Solve, SolveError> {
    let (_, block_bytes) = cache_shape(model, kv)?;
    let available = room.available();
    let blocks = available / block_bytes;
    let block = kv.block_size;
    let model_max = model.max_positions.unwrap_or(u64::MAX);
    let len_at = |seqs: u64| {
        (blocks / seqs.max(1) * block)
            .min(model_max)
            .min(MAX_SETTING)
    };
    let seqs_at = |len: u64| (blocks / len.div_ceil(block).max(1)).min(MAX_SETTING);
    let (len, seqs) = match (ask.max_model_len, ask.max_num_seqs) {
        (Some(len), Some(seqs)) => (len, seqs),
        (Some(len), None) => (len, seqs_at(len)),
        (None, Some(seqs)) => (len_at(seqs), seqs),
        (None, None) => match model.max_positions {
            Some(len) => (len, seqs_at(len)),
            None => return Err(SolveError::NothingAsked),
        },
    };
    let need_blocks = seqs.saturating_mul(len.div_ceil(block));
    let fits = blocks > 0 && seqs > 0 && len > 0 && need_blocks <= blocks;
    let kv_cache_bytes = need_blocks.saturating_mul(block_bytes);
    let judged = match room {
        // The budget is the GPU less the `1 - utilization` the instance leaves free: that share
        // is the headroom.
        Room::Gpu { setup, budget } => Verdict::judge(
            budget.used_bytes().saturating_add(kv_cache_bytes),
            setup.gpu_memory.saturating_sub(budget.budget_bytes),
            setup.gpu_memory,
        ),
        Room::Given(bytes) => Verdict::judge(kv_cache_bytes, 0, bytes),
    };
    let verdict = match (fits, judged) {
        (true, _) => Verdict::Fit,
        (false, Verdict::Fit) => Verdict::NoFit,
        (false, v) => v,
    };
    let flags = if fits {
        flags_for(kv, room, len, seqs, kv_cache_bytes, need_blocks * block)
    } else {
        Flags::default()
    };
    Ok(Solve {
        max_model_len: len,
        max_num_seqs: seqs,
        kv_cache_bytes,
        kv_available_bytes: available,
        fits,
        verdict,
        largest_max_num_seqs: seqs_at(len),
        largest_max_model_len: len_at(seqs),
        flags,
    })
}

/// The solve on a GPU, where the budget itself depends on the answer: the profile run samples
/// `max_num_seqs` rows of logits, so the more sequences, the less is left for the cache. Given
/// `max_num_seqs` (or both settings) the budget is that count's. Given only the length, the
/// answer is the fixed point: the largest count n whose own budget holds n sequences at that
/// length, so asking that count back gives the same length.
pub fn solve_on_gpu(
    model: &ModelConfig,
    kv: &KvSettings,
    setup: &ServeSetup,
    ask: Ask,
) -> Result<(ServeBudget, Solve), SolveError> {
    let at = |seqs: u64, ask: Ask| -> Result<(ServeBudget, Solve), SolveError> {
        let b = budget(model, setup, kv.tp, seqs)?;
        let s = solve(model, kv, Room::Gpu { setup, budget: &b }, ask)?;
        Ok((b, s))
    };
    if let Some(seqs) = ask.max_num_seqs {
        return at(seqs, ask);
    }
    let Some(len) = ask.max_model_len.or(model.max_positions) else {
        return Err(SolveError::NothingAsked);
    };
    let len_only = Ask {
        max_model_len: Some(len),
        max_num_seqs: None,
    };
    // Sequences of `len` that `seqs`'s budget holds: never more as `seqs` grows.
    let holds = |seqs: u64| at(seqs, len_only).map(|(_, s)| s.largest_max_num_seqs);
    let (mut lo, mut hi) = (0, holds(1)?.min(MAX_SETTING));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if mid <= holds(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let (b, mut s) = at(
        lo.max(1),
        Ask {
            max_model_len: Some(len),
            max_num_seqs: Some(lo.max(1)),
        },
    )?;
    s.largest_max_num_seqs = lo;
    if !s.fits {
        s.flags = Flags::default();
    }
    Ok((b, s))
}

/// The vLLM and SGLang arguments for settings that fit.
fn flags_for(
    kv: &KvSettings,
    room: Room,
    len: u64,
    seqs: u64,
    kv_cache_bytes: u64,
    tokens: u64,
) -> Flags {
    let mut flags = Flags::default();
    let v = &mut flags.vllm;
    if let Room::Gpu { setup, .. } = room {
        flag(v, "--gpu-memory-utilization", setup.utilization);
    }
    flag(v, "--kv-cache-memory-bytes", kv_cache_bytes);
    flag(v, "--max-model-len", len);
    flag(v, "--max-num-seqs", seqs);
    if kv.tp > 1 {
        flag(v, "--tensor-parallel-size", kv.tp);
    }
    if kv.dtype == KvDtype::Fp8 {
        flag(v, "--kv-cache-dtype", "fp8");
    }
    if kv.block_size != DEFAULT_BLOCK_SIZE {
        flag(v, "--block-size", kv.block_size);
    }
    if let Room::Gpu { setup, .. } = room {
        if setup.max_num_batched_tokens != DEFAULT_BATCHED_TOKENS {
            flag(v, "--max-num-batched-tokens", setup.max_num_batched_tokens);
        }
        if setup.cuda_graph_bytes == 0 {
            v.push("--enforce-eager".to_string());
        }
    }
    let g = &mut flags.sglang;
    if let Room::Gpu { setup, budget } = room {
        // SGLang sizes weights and pool from one fraction of the GPU.
        let weights = budget.terms.first().map_or(0, |t| t.bytes);
        let fraction =
            ((weights + kv_cache_bytes) as f64 / setup.gpu_memory as f64 * 100.0).ceil() / 100.0;
        flag(
            g,
            "--mem-fraction-static",
            format!("{:.2}", fraction.min(setup.utilization)),
        );
    }
    // ... and caps the pool in tokens.
    flag(g, "--max-total-tokens", tokens);
    flag(g, "--context-length", len);
    flag(g, "--max-running-requests", seqs);
    if kv.tp > 1 {
        flag(g, "--tp-size", kv.tp);
    }
    if kv.dtype == KvDtype::Fp8 {
        flag(g, "--kv-cache-dtype", "fp8_e4m3");
    }
    if let Room::Gpu { setup, .. } = room {
        if setup.cuda_graph_bytes == 0 {
            g.push("--disable-cuda-graph".to_string());
        }
    }
    flags
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::builtin;

    const GIB: u64 = 1 << 30;

    fn setup(gpu: u64) -> ServeSetup {
        ServeSetup {
            gpu_memory: gpu,
            utilization: 0.9,
            cuda_graph_bytes: GIB,
            context_bytes: GIB,
            nccl_bytes: GIB,
            max_num_batched_tokens: DEFAULT_BATCHED_TOKENS,
        }
    }

    fn kv(tp: u64) -> KvSettings {
        KvSettings {
            dtype: KvDtype::Bf16,
            tp,
            block_size: DEFAULT_BLOCK_SIZE,
            max_model_len: None,
        }
    }

    /// Llama-3-8B on an 80 GiB GPU: the budget terms add up, the 8192-token length gives the
    /// most sequences that fit, and those sequences give back (at least) that length.
    #[test]
    fn both_directions_agree() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let s = setup(80 * GIB);
        let b = budget(&model, &s, 1, DEFAULT_MAX_NUM_SEQS).expect("a budget");
        assert_eq!(b.budget_bytes, 72 * GIB);
        assert_eq!(b.used_bytes() + b.kv_available_bytes, b.budget_bytes);
        assert_eq!(b.terms[0].bytes, 2 * 8_030_261_248);
        let by_len = solve(
            &model,
            &kv(1),
            Room::Gpu {
                setup: &s,
                budget: &b,
            },
            Ask {
                max_model_len: Some(8192),
                max_num_seqs: None,
            },
        )
        .expect("solved");
        assert!(by_len.fits);
        // 2 MiB blocks, 512 per 8192-token sequence.
        let blocks = b.kv_available_bytes / (2 << 20);
        assert_eq!(by_len.max_num_seqs, blocks / 512);
        assert!(by_len.kv_cache_bytes <= b.kv_available_bytes);
        assert!(by_len.kv_cache_bytes + 512 * (2 << 20) > b.kv_available_bytes);
        let by_seqs = solve(
            &model,
            &kv(1),
            Room::Gpu {
                setup: &s,
                budget: &b,
            },
            Ask {
                max_model_len: None,
                max_num_seqs: Some(by_len.max_num_seqs),
            },
        )
        .expect("solved");
        assert!(by_seqs.max_model_len >= 8192, "{}", by_seqs.max_model_len);
        assert_eq!(by_seqs.max_num_seqs, by_len.max_num_seqs);
        let flags = &by_len.flags.vllm;
        let at = |name: &str| {
            let i = flags.iter().position(|f| f == name).expect(name);
            flags[i + 1].clone()
        };
        assert_eq!(at("--max-model-len"), "8192");
        assert_eq!(
            at("--kv-cache-memory-bytes"),
            by_len.kv_cache_bytes.to_string()
        );
        assert_eq!(at("--gpu-memory-utilization"), "0.9");
        assert!(by_len
            .flags
            .sglang
            .contains(&"--max-running-requests".to_string()));
    }

    /// Asking for both checks them: one sequence too many does not fit, and the answer says
    /// how many do.
    #[test]
    fn both_given_is_a_check() {
        let model = builtin::find("llama-3-70b").expect("built-in");
        let s = setup(80 * GIB);
        let b = budget(&model, &s, 4, 64).expect("a budget");
        let fit = solve(
            &model,
            &kv(4),
            Room::Gpu {
                setup: &s,
                budget: &b,
            },
            Ask {
                max_model_len: Some(8192),
                max_num_seqs: None,
            },
        )
        .expect("solved");
        let over = solve(
            &model,
            &kv(4),
            Room::Gpu {
                setup: &s,
                budget: &b,
            },
            Ask {
                max_model_len: Some(8192),
                max_num_seqs: Some(fit.max_num_seqs + 1),
            },
        )
        .expect("solved");
        assert!(!over.fits);
        assert!(over.flags.vllm.is_empty());
        assert_eq!(over.largest_max_num_seqs, fit.max_num_seqs);
        assert!(over.largest_max_model_len < 8192);
        assert!(fit
            .flags
            .vllm
            .contains(&"--tensor-parallel-size".to_string()));
        assert!(fit.flags.sglang.contains(&"--tp-size".to_string()));
        assert!(!fit
            .flags
            .vllm
            .contains(&"--max-num-batched-tokens".to_string()));
        // A smaller profile run is passed on, since the activation peak depends on it.
        let short = ServeSetup {
            max_num_batched_tokens: 2048,
            ..s
        };
        let b = budget(&model, &short, 4, 64).expect("a budget");
        let peak = |b: &ServeBudget| b.terms[1].bytes;
        assert!(peak(&b) < peak(&budget(&model, &s, 4, 64).expect("a budget")));
        let ask = Ask {
            max_model_len: Some(8192),
            max_num_seqs: None,
        };
        let fit = solve(
            &model,
            &kv(4),
            Room::Gpu {
                setup: &short,
                budget: &b,
            },
            ask,
        )
        .expect("solved");
        let v = &fit.flags.vllm;
        let i = v
            .iter()
            .position(|f| f == "--max-num-batched-tokens")
            .expect("the flag");
        assert_eq!(v[i + 1], "2048");
    }

    /// A 70B model does not fit one 80 GiB GPU: nothing is left for the cache.
    /// The round trip the fixed point promises, on the kind of case (Llama-3-70B on
    /// two 80 GiB GPUs): 64 sequences give a length L; asking L gives back at least 64, and
    /// exactly the count whose own budget holds it, which gives L back again.
    #[test]
    fn the_solve_is_a_round_trip() {
        let model = builtin::find("llama-3-70b").expect("built-in");
        let s = setup(80 * GIB);
        let ask = |len, seqs| Ask {
            max_model_len: len,
            max_num_seqs: seqs,
        };
        let (_, by_seqs) = solve_on_gpu(&model, &kv(2), &s, ask(None, Some(64))).expect("ok");
        assert!(by_seqs.fits);
        let len = by_seqs.largest_max_model_len;
        let (_, by_len) = solve_on_gpu(&model, &kv(2), &s, ask(Some(len), None)).expect("ok");
        assert!(by_len.fits);
        let n = by_len.max_num_seqs;
        assert!(n >= 64, "{n}");
        assert_eq!(by_len.largest_max_num_seqs, n);
        let (_, back) = solve_on_gpu(&model, &kv(2), &s, ask(None, Some(n))).expect("ok");
        assert_eq!(back.largest_max_model_len, len);
        // One more sequence than the answer does not fit its own budget at that length.
        let (_, over) = solve_on_gpu(&model, &kv(2), &s, ask(Some(len), Some(n + 1))).expect("ok");
        assert!(!over.fits);
    }

    #[test]
    fn no_room_is_a_no_fit() {
        let model = builtin::find("llama-3-70b").expect("built-in");
        let s = setup(80 * GIB);
        let b = budget(&model, &s, 1, DEFAULT_MAX_NUM_SEQS).expect("a budget");
        assert_eq!(b.kv_available_bytes, 0);
        let got = solve(
            &model,
            &kv(1),
            Room::Gpu {
                setup: &s,
                budget: &b,
            },
            Ask {
                max_model_len: Some(8192),
                max_num_seqs: None,
            },
        )
        .expect("an answer");
        assert!(!got.fits);
        assert_eq!(got.verdict, Verdict::NoFit);
        assert_eq!(got.largest_max_num_seqs, 0);
        let bad = ServeSetup {
            utilization: 1.5,
            ..s
        };
        assert!(budget(&model, &bad, 1, 1).is_err());
        assert!(budget(&model, &s, 1, 0).is_err());
    }

    /// vLLM PR #10511 (a maintainer's log): `vllm serve meta-llama/Meta-Llama-3-8B` on an
    /// 80 GB H100 measured 14.96 GiB of weights and a 1.26 GiB activation peak for the
    /// default 8192-token profile run; memprof's weights are exact and its peak is within 10%.
    #[test]
    fn profile_peak_against_vllm_log() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let weights = model.param_counts().total * WEIGHT_BYTES;
        assert_eq!((weights as f64 / GIB as f64 * 100.0).round() / 100.0, 14.96);
        let peak = profile_peak(&model, 1, 8192, 256) as f64 / GIB as f64;
        assert!((peak - 1.26).abs() / 1.26 < 0.10, "{peak}");
    }

    /// A KV size given outright (vLLM `--kv-cache-memory-bytes`): the reference worked check,
    /// Llama-3-8B bf16 with 50 GiB holds 25,600 blocks, 50 sequences of 8192 tokens; no
    /// fraction of a GPU is printed, since none was given.
    #[test]
    fn a_given_kv_size_solves_too() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let ask = Ask {
            max_model_len: Some(8192),
            max_num_seqs: None,
        };
        let got = solve(&model, &kv(1), Room::Given(50 * GIB), ask).expect("solved");
        assert_eq!(got.max_num_seqs, 50);
        assert_eq!(got.kv_cache_bytes, 50 * GIB);
        assert!(!got
            .flags
            .vllm
            .contains(&"--gpu-memory-utilization".to_string()));
        assert!(!got
            .flags
            .sglang
            .contains(&"--mem-fraction-static".to_string()));
        assert!(got.flags.sglang.contains(&"409600".to_string()));
        // Less than one block is a no-fit answer, not an error.
        let tiny = solve(&model, &kv(1), Room::Given(1 << 20), ask).expect("an answer");
        assert!(!tiny.fits);
        assert_eq!(tiny.verdict, Verdict::NoFit);
        assert_eq!(
            (tiny.largest_max_num_seqs, tiny.largest_max_model_len),
            (0, 0)
        );
    }
}
