//! The named terms of a `plan train` estimate: each term's bytes, the formula that gave them
//! with the candidate's own numbers, and where the formula comes from, so every figure can be
//! traced to a paper or to memprof's own addition.

use super::activations::{
    loss_bytes_per_logit, loss_kept_bytes_per_logit, Attention, Loss, Recompute,
};
use super::layout::Layout;
use super::model::Mlp;
use super::states::{ZeroStage, UNITS_IN_FLIGHT};
use super::train::{Candidate, TrainSetup};

/// Whether a term is part of the estimate or of the headroom kept next to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TermKind {
    Estimate,
    Headroom,
}

/// One named term.
#[derive(Clone, Debug, PartialEq)]
pub struct Term {
    /// The JSON field that holds it (`params_sharded_bytes`, ...).
    pub name: &'static str,
    /// What it is, in words.
    pub label: &'static str,
    pub kind: TermKind,
    /// Signed: the shape term is negative when a model stores less than the formula assumes.
    pub bytes: i64,
    /// The formula with this candidate's numbers.
    pub formula: String,
    /// Where the formula comes from.
    pub source: &'static str,
}

const ZERO: &str = "Rajbhandari et al. 2020 (ZeRO), section 5; TP/PP share as Megatron-LM's \
                    most loaded shard";
const FSDP: &str = "PyTorch FSDP FULL_SHARD / DeepSpeed ZeRO-3 (unit being computed plus the \
                    prefetched one); memprof's addition to the ZeRO paper";
const KORTHIKANTI: &str = "Korthikanti et al. 2022, Table 2; Ultra-Scale Playbook";
const SHAPE: &str = "memprof: this model's own layer shapes against the published formula";
const SHAPE_AUTOCAST: &str = "memprof: this model's own layer shapes against the published \
                              formula; under autocast, PyTorch's float32 op list (layer_norm, \
                              softmax) and its cast of each matmul's inputs and weights to 16 \
                              bits, saved for backward (aten/src/ATen/autocast_mode.h and .cpp \
                              in pytorch/pytorch; docs/plan-accuracy.md)";
const RECOMPUTE: &str = "Korthikanti et al. 2022, section 5 (the layer recomputed in \
                         backward); torchtitan's per-operator policy (selective_ac_option \
                         \"op\"); memprof's addition to the published formula";
const HEAD: &str = "Korthikanti et al. 2022, section 4.1 (embedding dropout, final norm, output \
                    projection, fp32 logits); the loss's backward as PyTorch's cross_entropy \
                    computes it (log-softmax kept, its gradient and the logits' gradient in \
                    fp32); memprof's addition to the per-layer formula";
const HEAD_COMPILED: &str = "Korthikanti et al. 2022, section 4.1 (embedding dropout, final \
                             norm, output projection); the loss under torch.compile keeps the \
                             logits in their own type and writes their gradient in one kernel \
                             (PyTorch's Inductor; docs/plan-accuracy.md); memprof's addition to \
                             the per-layer formula";
const CONTEXT: &str = "memprof default (--cuda-context): CUDA context and library workspaces";
const COMM: &str = "memprof default (--comm-buffers), counted with more than one GPU: NCCL \
                    buffers (NCCL_BUFFSIZE, 4 MiB per channel and peer of each communicator)";
const FRAGMENTATION: &str = "memprof default (--fragmentation): caching-allocator fragmentation, \
                             5-10% with expandable segments, more without";

const LABELS: [(&str, &str); 12] = [
    ("params_sharded_bytes", "this GPU's share of the weights"),
    ("params_gathered_bytes", "weights gathered for ZeRO-3 units"),
    ("grads_bytes", "gradients"),
    (
        "grads_gathered_bytes",
        "a unit's gradient before reduce-scatter",
    ),
    ("optimizer_bytes", "optimizer state"),
    (
        "activations_layers_bytes",
        "activations by the published formula",
    ),
    ("activations_shape_bytes", "this model's layer shapes"),
    ("activations_recompute_bytes", "the layer being recomputed"),
    ("activations_head_bytes", "embedding and LM head"),
    ("context_bytes", "headroom: CUDA context"),
    ("comm_buffers_bytes", "headroom: communication buffers"),
    ("fragmentation_bytes", "headroom: fragmentation"),
];

/// The words for a term's JSON name (the name itself when unknown).
pub fn label(name: &str) -> &str {
    LABELS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(name, |(_, l)| l)
}

fn signed(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

fn count(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.1}M", n as f64 / 1e6)
    } else {
        n.to_string()
    }
}

/// `/ N` when the stage shards this part, nothing otherwise.
fn over(sharded: bool, n: u64) -> String {
    if sharded && n > 1 {
        format!(" / {n}")
    } else {
        String::new()
    }
}

/// The Table 2 row a layout uses, in words and symbols.
fn table_2_row(l: &Layout, attention: Attention) -> &'static str {
    let sp = l.sp && l.tp > 1;
    let scores = l.recompute == Recompute::None && attention == Attention::Eager;
    match (l.recompute, sp, scores) {
        (Recompute::Full, true, _) => "2sbh/t (full recompute: the layer input, split by SP)",
        (Recompute::Full, false, _) => "2sbh (full recompute: the layer input)",
        (_, true, true) => "sbh/t (34 + 5as/h) (TP + SP)",
        (_, false, true) => "sbh (10 + 24/t + 5as/(ht)) (TP)",
        (_, true, false) => "34 sbh/t (TP + SP, no score matrices)",
        (_, false, false) => "sbh (10 + 24/t) (no score matrices)",
    }
}

/// Every term of `c`, estimate first, then headroom. The estimate terms add up to
/// `c.memory.total`, all of them to `c.memory.total + c.headroom.total()`.
pub fn terms(setup: &TrainSetup, c: &Candidate) -> Vec<Term> {
    let l = &c.layout;
    let m = &c.memory;
    let model = &setup.model;
    let counts = model.param_counts();
    let bytes = setup.precision.state_bytes(setup.optimizer);
    let psi = l.params_per_gpu(&counts, model.tied_embeddings).round() as u64;
    let n = l.shard_degree();
    let psi_text = if l.tp * l.pp > 1 {
        format!(
            "psi = {} (this GPU's TP {} / PP {} share)",
            count(psi),
            l.tp,
            l.pp
        )
    } else {
        format!("psi = {}", count(psi))
    };
    let z3 = l.zero == ZeroStage::Parameters && n > 1;
    let gathered = if z3 {
        format!(
            "{UNITS_IN_FLIGHT} units x {} parameters x {} B x ({n} - 1) / {n} (unit: the largest \
             block or embedding on this GPU)",
            count(m.unit_params),
            bytes.weights
        )
    } else {
        "0: parameters are not sharded below ZeRO-3".to_string()
    };
    let grads_gathered = if z3 {
        format!(
            "{} parameters x {} B x ({n} - 1) / {n}",
            count(m.unit_params),
            bytes.grads
        )
    } else {
        "0: gradients are whole below ZeRO-3".to_string()
    };
    let s = setup.seq_len / l.cp.max(1);
    let cp = if l.cp > 1 {
        format!(" (sequence {} / CP {})", setup.seq_len, l.cp)
    } else {
        String::new()
    };
    let in_flight = l.pp.max(1).min(l.grad_accum.max(1));
    let pipeline = if l.pp > 1 {
        format!(
            " x {in_flight}/{} micro-batches in flight over PP stages",
            l.pp
        )
    } else {
        String::new()
    };
    let mlp = match (model.moe, model.mlp) {
        (Some(moe), _) => format!(
            "{} active experts of width {}",
            moe.active + moe.shared,
            moe.expert_ffn
        ),
        (None, Mlp::Gated) => format!("gated MLP of width {}", model.ffn),
        (None, Mlp::Plain) => format!("MLP of width {}", model.ffn),
    };
    let flash = if setup.attention == Attention::Flash && l.recompute != Recompute::Full {
        ", flash softmax statistics"
    } else {
        ""
    };
    let autocast = setup.precision.autocast();
    let casts = if !autocast {
        String::new()
    } else if matches!(l.recompute, Recompute::Full | Recompute::PerOp) {
        "; under autocast the fp32 layer input, and the 16-bit copies of the matmul weights \
         that autocast's cache holds until the forward pass ends, less the backward's \
         transients (the loss, the layer rebuilt)"
            .to_string()
    } else {
        let eager = if setup.attention == Attention::Eager && l.recompute == Recompute::None {
            ", the fp32 softmax output and the 16-bit copy of the dropped-out probabilities"
        } else {
            ""
        };
        format!(
            "; under autocast the norms' fp32 inputs, a 16-bit copy of the input for each of Q, \
             K, V and {}{eager}, and the 16-bit copies of the matmul weights (2 B a weight)",
            if model.mlp == Mlp::Gated {
                "the MLP's gate and up"
            } else {
                "the MLP's first matmul"
            },
        )
    };
    let stage = if l.pp > 1 {
        format!(", first stage of ceil({} / {}) layers", model.layers, l.pp)
    } else {
        String::new()
    };
    let vocab = model.vocab;
    let loss_kind = setup.loss();
    let element = setup.precision.activation_bytes();
    let kept = loss_kept_bytes_per_logit(loss_kind, element);
    let loss = match loss_kind {
        Loss::Megatron => "; Megatron-LM's loss works in place".to_string(),
        Loss::Compiled => format!(
            " + the loss's backward, {}sbv/t less the layer being recomputed (the logits' gradient, written by the compiled loss's one kernel)",
            loss_bytes_per_logit(loss_kind, l.tp, element)
        ),
        Loss::Eager if l.tp > 1 => " + the loss's backward, 12sbv/t less the layer being recomputed (PyTorch's loss_parallel: a zeroed gradient, exp of the log-softmax and their sum, fp32 each)".to_string(),
        Loss::Eager => " + the loss's backward, 8sbv/t less the layer being recomputed (the log-softmax's and the logits' fp32 gradients)".to_string(),
    };
    let logits = if loss_kind == Loss::Compiled {
        "the logits the compiled loss keeps"
    } else {
        "fp32 logits"
    };
    let head = if l.pp > 1 {
        "sbh per micro-batch in flight (embedding dropout; the logits are on the last stage)"
            .to_string()
    } else {
        let projection = if l.sp && l.tp > 1 && loss_kind != Loss::Megatron {
            let norm = if autocast { 4 } else { 2 };
            format!("{norm}sbh/t + 2sbh + {kept}sbv/t with v = {vocab} (final norm input, output projection input gathered whole by PyTorch's sequence parallelism, {logits})")
        } else if autocast {
            format!("4sbh/t + 2sbh/t + {kept}sbv/t with v = {vocab} (final norm's fp32 input under autocast, output projection input, {logits})")
        } else if kept == 4.0 {
            format!(
                "4sbh/t (1 + v/h) with v = {vocab} (final norm, output projection input, {logits})"
            )
        } else {
            format!("4sbh/t + {kept}sbv/t with v = {vocab} (final norm, output projection input, {logits})")
        };
        format!("sbh (embedding dropout) + {projection}{loss}")
    };
    vec![
        Term {
            name: "params_sharded_bytes",
            label: LABELS[0].1,
            kind: TermKind::Estimate,
            bytes: signed(m.params_sharded),
            formula: format!(
                "psi x W{}, {psi_text}, W = {} B",
                over(l.zero >= ZeroStage::Parameters, n),
                bytes.weights
            ),
            source: ZERO,
        },
        Term {
            name: "params_gathered_bytes",
            label: LABELS[1].1,
            kind: TermKind::Estimate,
            bytes: signed(m.params_gathered),
            formula: gathered,
            source: FSDP,
        },
        Term {
            name: "grads_bytes",
            label: LABELS[2].1,
            kind: TermKind::Estimate,
            bytes: signed(m.grads),
            formula: format!(
                "psi x G{}, G = {} B{}",
                over(l.zero >= ZeroStage::Gradients, n),
                bytes.grads + bytes.grad_accum,
                if bytes.grad_accum > 0.0 {
                    " (with the accumulation buffer)"
                } else {
                    ""
                }
            ),
            source: ZERO,
        },
        Term {
            name: "grads_gathered_bytes",
            label: LABELS[3].1,
            kind: TermKind::Estimate,
            bytes: signed(m.grads_gathered),
            formula: grads_gathered,
            source: FSDP,
        },
        Term {
            name: "optimizer_bytes",
            label: LABELS[4].1,
            kind: TermKind::Estimate,
            bytes: signed(m.optimizer),
            formula: format!(
                "psi x K{}, K = {} B (master copy {} + optimizer moments {})",
                over(l.zero >= ZeroStage::Optimizer, n),
                bytes.master + bytes.optimizer,
                bytes.master,
                bytes.optimizer
            ),
            source: ZERO,
        },
        Term {
            name: "activations_layers_bytes",
            label: LABELS[5].1,
            kind: TermKind::Estimate,
            bytes: signed(m.activations_layers),
            formula: format!(
                "{} x L = {} layers{pipeline}, s = {s}{cp}, b = {}, h = {}, a = {}, t = {}",
                table_2_row(l, setup.attention),
                model.layers,
                l.micro_batch,
                model.hidden_size,
                model.heads,
                l.tp
            ),
            source: KORTHIKANTI,
        },
        Term {
            name: "activations_shape_bytes",
            label: LABELS[6].1,
            kind: TermKind::Estimate,
            bytes: m.activations_shape,
            formula: if l.recompute == Recompute::PerOp {
                format!(
                    "per-operator checkpointing keeps the block input and the outputs of Q ({} wide), \
                     V ({} wide), the {mlp}'s first matmul (and a gated MLP's last) and the \
                     attention kernel{stage}, minus the layers term (the selective row, which \
                     keeps more){casts}",
                    model.heads * model.head_dim,
                    model.kv_heads * model.head_dim
                )
            } else {
                format!(
                    "memprof's per-layer count (Q {} wide, K and V {} wide each, {mlp}{flash}{stage}) \
                     minus the layers term, which assumes K and V as wide as Q and a 4h MLP{casts}",
                    model.heads * model.head_dim,
                    model.kv_heads * model.head_dim
                )
            },
            source: if autocast { SHAPE_AUTOCAST } else { SHAPE },
        },
        Term {
            name: "activations_recompute_bytes",
            label: LABELS[7].1,
            kind: TermKind::Estimate,
            bytes: signed(m.activations_recompute),
            formula: match l.recompute {
                Recompute::Full => format!(
                    "one layer's activations without recompute, rebuilt during its backward \
                     pass{}",
                    if autocast {
                        ", with its weights' 16-bit copies"
                    } else {
                        ""
                    }
                ),
                Recompute::PerOp => format!(
                    "what one layer does not keep, rebuilt during its backward pass{}",
                    if autocast {
                        ", with its weights' 16-bit copies"
                    } else {
                        ""
                    }
                ),
                Recompute::None | Recompute::Selective => {
                    "0: no layer is recomputed whole".to_string()
                }
            },
            source: RECOMPUTE,
        },
        Term {
            name: "activations_head_bytes",
            label: LABELS[8].1,
            kind: TermKind::Estimate,
            bytes: signed(m.activations_head),
            formula: head,
            source: if loss_kind == Loss::Compiled {
                HEAD_COMPILED
            } else {
                HEAD
            },
        },
        Term {
            name: "context_bytes",
            label: LABELS[9].1,
            kind: TermKind::Headroom,
            bytes: signed(c.headroom.context),
            formula: "fixed per GPU".to_string(),
            source: CONTEXT,
        },
        Term {
            name: "comm_buffers_bytes",
            label: LABELS[10].1,
            kind: TermKind::Headroom,
            bytes: signed(c.headroom.comm),
            formula: if c.layout.gpus() > 1 {
                "fixed per GPU of a multi-GPU job".to_string()
            } else {
                "0: one GPU talks to no other".to_string()
            },
            source: COMM,
        },
        Term {
            name: "fragmentation_bytes",
            label: LABELS[11].1,
            kind: TermKind::Headroom,
            bytes: signed(c.headroom.fragmentation),
            formula: format!(
                "{:.0}% of the estimate",
                setup.headroom.fragmentation * 100.0
            ),
            source: FRAGMENTATION,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::builtin;
    use crate::plan::recipe::{Optimizer, Precision};
    use crate::plan::search::{search, SearchSpace};
    use crate::plan::train::Headroom;

    fn setup(model: &str, seq: u64) -> TrainSetup {
        TrainSetup {
            model: builtin::find(model).expect("built-in"),
            precision: Precision::Mixed,
            optimizer: Optimizer::AdamW,
            seq_len: seq,
            attention: Attention::Flash,
            compiled_loss: false,
            gpu_memory: 80 << 30,
            headroom: Headroom::default(),
        }
    }

    /// On every layout of a search, the estimate terms add up to the total and all terms to
    /// the total plus headroom, for a dense model, a tied GPT and a pipeline.
    #[test]
    fn the_parts_add_up_to_the_total() {
        for (name, gpus, seq) in [
            ("llama-3-8b", 8, 4096),
            ("gpt3-175b", 64, 2048),
            ("llama-3.1-70b", 32, 8192),
        ] {
            let s = setup(name, seq);
            let space = SearchSpace {
                gpus,
                sp: true,
                micro_batch: 1,
                ..SearchSpace::default()
            };
            let plan = search(&s, &space, usize::MAX).expect("a plan");
            assert!(plan.candidates.len() > 10, "{name}");
            for c in &plan.candidates {
                let all = terms(&s, c);
                let estimate: i64 = all
                    .iter()
                    .filter(|t| t.kind == TermKind::Estimate)
                    .map(|t| t.bytes)
                    .sum();
                let everything: i64 = all.iter().map(|t| t.bytes).sum();
                assert_eq!(estimate, signed(c.memory.total), "{name} {:?}", c.layout);
                assert_eq!(
                    everything,
                    signed(c.memory.total + c.headroom.total()),
                    "{name}"
                );
                assert!(all
                    .iter()
                    .all(|t| !t.formula.is_empty() && !t.source.is_empty()));
            }
        }
    }

    /// ZeRO-3 names its unit: Llama-3-8B's largest unit on one GPU is the 525M-parameter
    /// embedding, two of which are gathered.
    #[test]
    fn zero_3_names_the_unit() {
        let s = setup("llama-3-8b", 4096);
        let space = SearchSpace {
            gpus: 8,
            tp: Some(1),
            pp: Some(1),
            cp: Some(1),
            zero: Some(ZeroStage::Parameters),
            recompute: Some(Recompute::Selective),
            sp: true,
            micro_batch: 1,
            ..SearchSpace::default()
        };
        let plan = search(&s, &space, 1).expect("a plan");
        let c = &plan.candidates[0];
        assert_eq!(c.memory.unit_params, 128_256 * 4096);
        let all = terms(&s, c);
        let gathered = all
            .iter()
            .find(|t| t.name == "params_gathered_bytes")
            .expect("a term");
        assert!(
            gathered.formula.contains("525.3M parameters"),
            "{}",
            gathered.formula
        );
        assert_eq!(gathered.bytes, signed(2 * 2 * 128_256 * 4096 * 7 / 8));
    }
}
