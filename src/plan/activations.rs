//! Activation memory per GPU after Korthikanti et al. 2022 ("Reducing Activation Recomputation
//! in Large Transformer Models"), generalised to GQA, gated and MoE MLPs: per-layer bytes under
//! tensor / sequence / context parallelism, none / selective / full recompute, eager or flash
//! attention, PyTorch's autocast, and the first pipeline stage of a 1F1B schedule.
//! `reference/planner-math.md` §2.

use super::model::{Mlp, ModelConfig};
use serde::Serialize;

/// What the backward pass recomputes instead of storing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    None,
    /// The attention core (scores, softmax, dropout): Korthikanti's selective recompute.
    Selective,
    /// Every layer from its input (activation checkpointing per layer).
    Full,
    /// Per operator, as torchtitan's `selective_ac_option = "op"`: the outputs of every other
    /// matmul of a block (Q, V, the MLP's first and last) and of the attention kernel are kept,
    /// everything else is recomputed from the block input. Not searched: name it.
    #[serde(rename = "per-op")]
    PerOp,
}

impl Recompute {
    /// The policies `plan train` searches when `--recompute` is not given.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];
}

/// How the attention core runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attention {
    /// Fused attention: no s x s matrices, only fp32 softmax statistics (4 bytes per head and
    /// query).
    Flash,
    /// Materialised scores, softmax and dropout: 5 a s^2 b bytes per layer.
    Eager,
}

/// How the loss over the logits is computed, which sets what its backward holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// PyTorch's `cross_entropy` on fp32 logits, run eagerly: the log-softmax is kept (4 B a
    /// logit) and its backward holds its gradient and the logits' beside it.
    Eager,
    /// The same function under `torch.compile`: Inductor keeps the 16-bit logits it was given
    /// and writes their 16-bit gradient in one fused kernel, without the fp32 copies (2 B a
    /// logit kept and 2 B of gradient, about the 4.4 B a logit PyTorch measured; the sources
    /// are in docs/plan-accuracy.md).
    Compiled,
    /// Megatron-LM's vocab-parallel cross entropy, in place on its saved softmax. It also
    /// marks Megatron-LM's head under sequence parallelism, which keeps the output
    /// projection's input sharded where PyTorch's keeps it gathered.
    Megatron,
}

/// The settings activation memory depends on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationSettings {
    pub seq_len: u64,
    pub micro_batch: u64,
    pub tp: u64,
    /// Sequence parallelism: the parts TP replicates are split along the sequence instead.
    pub sp: bool,
    pub cp: u64,
    pub pp: u64,
    /// Micro-batches per step (gradient accumulation); 1F1B keeps min(pp, this) in flight.
    pub micro_batches: u64,
    pub recompute: Recompute,
    pub attention: Attention,
    /// Bytes of an activation element (2 for 16-bit training; the formulas' unit).
    pub element_bytes: f64,
    pub loss: Loss,
    /// PyTorch's autocast over fp32 weights (`torch.autocast`, the Hugging Face Trainer's
    /// `fp16` / `bf16`): matmuls run and save their inputs in 16 bits (`element_bytes` 2), the
    /// ops on autocast's float32 list (layer norm, softmax, the loss) in fp32, so the residual
    /// stream stays fp32; each matmul saves its own 16-bit copy of its input and of its weight.
    pub autocast: bool,
}

impl ActivationSettings {
    /// One GPU, one micro-batch, 16-bit elements, no recompute, flash attention and PyTorch's
    /// eager loss: the plain single-GPU step that the other settings start from.
    pub fn one_gpu(seq_len: u64, micro_batch: u64) -> ActivationSettings {
        ActivationSettings {
            seq_len,
            micro_batch,
            tp: 1,
            sp: false,
            cp: 1,
            pp: 1,
            micro_batches: 1,
            recompute: Recompute::None,
            attention: Attention::Flash,
            element_bytes: 2.0,
            loss: Loss::Eager,
            autocast: false,
        }
    }
}

/// Activation bytes on the first pipeline stage, by term.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct ActivationMemory {
    /// The transformer blocks by the published per-layer formula (Korthikanti et al. 2022
    /// Table 2, the Playbook's figures): `published_per_layer` x L x min(m, p) / p.
    pub layers: f64,
    /// What this model's layers store beyond (or short of) that formula: its attention layout
    /// (GQA / MQA key-value widths), its MLP (gated, MoE, its real width), flash attention's
    /// softmax statistics, and a first stage of ceil(L / p) layers. Negative when the model
    /// stores less than the formula assumes.
    pub shape: f64,
    /// Embedding dropout masks (s b h per micro-batch in flight).
    pub embedding: f64,
    /// Final norm, output projection input and fp32 logits for the loss (only when one stage
    /// holds them).
    pub output: f64,
    /// One layer's activations rebuilt during the backward pass of full recompute.
    pub recompute_peak: f64,
    /// The loss's backward beyond the kept logits: PyTorch's eager `cross_entropy` holds the
    /// log-softmax's gradient and the logits' gradient (fp32 each, 8sbv/t) beside it, 12sbv/t
    /// under TP's `loss_parallel`; compiled, the 16-bit gradient (`loss_bytes_per_logit`). It
    /// happens before any layer is recomputed, so only what exceeds `recompute_peak` counts.
    pub loss: f64,
    /// Under autocast, the 16-bit copies of the matmul weights (`weight_casts`): saved for
    /// backward, or with full or per-operator recompute held in autocast's cache until the
    /// forward pass ends, so then only what exceeds the backward's `recompute_peak` and `loss`.
    pub weight_casts: f64,
}

impl ActivationMemory {
    pub fn total(&self) -> f64 {
        self.layers + self.shape + self.head() + self.recompute_peak + self.weight_casts
    }

    /// The LM head's share: embedding output, logits and loss.
    pub fn head(&self) -> f64 {
        self.embedding + self.output + self.loss
    }
}

impl ActivationSettings {
    /// Sequence length each GPU holds after context parallelism.
    fn local_seq(&self) -> f64 {
        self.seq_len as f64 / self.cp.max(1) as f64
    }

    /// Micro-batches the first 1F1B stage holds at its peak.
    fn in_flight(&self) -> f64 {
        self.pp.max(1).min(self.micro_batches.max(1)) as f64
    }
}

/// Stored activation bytes of one transformer layer for one micro-batch.
///
/// With `t` = TP, 16-bit elements and an MHA / GeLU 4h MLP this is Korthikanti's Table 2:
/// `sbh(10 + 24/t + 5as/(ht))`, with SP `sbh/t (34 + 5as/h)`, selective drops the `5as/h`
/// term, and full recompute stores the `2sbh` layer input. Under autocast (`autocast_replicated`)
/// the norm inputs, the layer input and the eager softmax output are fp32, and each projection
/// saves its own 16-bit copy of its input.
pub fn per_layer(model: &ModelConfig, s: &ActivationSettings, recompute: Recompute) -> f64 {
    let seq = s.local_seq();
    let b = s.micro_batch as f64;
    let h = model.hidden_size as f64;
    let t = s.tp.max(1) as f64;
    let scale = s.element_bytes / 2.0;
    let sbh = seq * b * h;
    if recompute == Recompute::Full {
        // The layer input; under autocast the fp32 residual stream.
        let stored = if s.autocast {
            4.0 * sbh
        } else {
            2.0 * sbh * scale
        };
        return if s.sp { stored / t } else { stored };
    }
    if recompute == Recompute::PerOp {
        return per_op_layer(model, s);
    }
    // Norm inputs (4), attention and MLP inputs (2 + 2), two dropout masks (1 + 1).
    let replicated = if s.autocast {
        autocast_replicated(model) * sbh
    } else {
        10.0 * sbh
    };
    let q = (model.heads * model.head_dim) as f64;
    let kv = (model.kv_heads * model.head_dim) as f64;
    // Q, K, V and the output projection's input.
    let attention = 2.0 * seq * b * (2.0 * q + 2.0 * kv);
    let ffn = match model.moe {
        None => model.ffn as f64,
        Some(m) => ((m.active + m.shared) * m.expert_ffn) as f64,
    };
    // Plain: activation input and second matmul input; gated: gate, up and their product.
    let mlp = match model.mlp {
        Mlp::Plain => 4.0 * seq * b * ffn,
        Mlp::Gated => 6.0 * seq * b * ffn,
    };
    let a = model.heads as f64;
    let core = match (recompute, s.attention) {
        (Recompute::Selective, _) => 0.0,
        // Under autocast softmax is on the float32 list: its output (4), the dropout mask (1)
        // and the 16-bit copy of the dropout output that the second matmul casts and saves (2).
        (_, Attention::Eager) if s.autocast => 7.0 * a * seq * s.seq_len as f64 * b,
        // Softmax output (2), dropout mask (1) and dropout output (2) per score; keys span
        // the whole sequence under context parallelism.
        (_, Attention::Eager) => 5.0 * a * seq * s.seq_len as f64 * b,
        // fp32 log-sum-exp per head and query, independent of the element size.
        (_, Attention::Flash) => 4.0 * a * seq * b / scale,
    };
    let split = attention + mlp + core;
    let bytes = if s.sp {
        (replicated + split) / t
    } else {
        replicated + split / t
    };
    if s.autocast {
        // Autocast's terms are bytes already: its matmuls work in 16 bits.
        bytes
    } else {
        bytes * scale
    }
}

/// Bytes per `sbh` a layer keeps outside TP's column-parallel split under autocast, where the
/// published formula has 10: the two norms' fp32 inputs (8: layer norm is on autocast's float32
/// list, and the residual stream they read stays fp32 because the weights are), a 16-bit copy
/// of the attention input for each of Q, K and V (6: autocast caches casts of weights only, so
/// each projection casts its input anew) and of the MLP input for each matmul that reads it (2,
/// or 4 for a gated MLP's gate and up), and the two dropout masks (2). Counted as separate
/// projections, as Hugging Face's BERT and Llama and torchtitan's Llama build them; a model
/// that fuses Q, K and V into one matmul casts that input once.
fn autocast_replicated(model: &ModelConfig) -> f64 {
    let mlp_inputs = match model.mlp {
        Mlp::Plain => 2.0,
        Mlp::Gated => 4.0,
    };
    8.0 + 6.0 + mlp_inputs + 2.0
}

/// Parameters of one transformer layer's matmuls on this GPU (its TP share): what autocast
/// casts to 16 bits for the forward pass (every weight and bias of the blocks but the norms',
/// which run in fp32; every expert of an MoE layer).
fn matmul_params_per_layer(model: &ModelConfig, tp: f64) -> f64 {
    let counts = model.param_counts();
    let norm = model.norm.params_per_channel() * model.hidden_size;
    let norms = (2 * model.layers + model.cross_attention_layers) * norm;
    counts.blocks.saturating_sub(norms) as f64 / model.layers.max(1) as f64 / tp
}

/// One layer's stored bytes under torchtitan's per-operator selective checkpointing
/// (`torchtitan/parallelisms/parallelize_llama.py`, `_apply_ac_to_transformer_block` with
/// `selective_ac_option = "op"`: `mm` and the attention kernels are saved, "except every second
/// mm" of a block): the block input, the outputs of the odd-numbered matmuls in
/// call order (Q of Q/K/V/O, V, the MLP's first: gate for a gated MLP, up otherwise, and for a
/// gated MLP its last) and the attention kernel's output with its fp32 log-sum-exp. Tensor
/// parallelism splits the column-parallel outputs; sequence parallelism also the block input and
/// the MLP's last output.
fn per_op_layer(model: &ModelConfig, s: &ActivationSettings) -> f64 {
    let seq = s.local_seq();
    let b = s.micro_batch as f64;
    let h = model.hidden_size as f64;
    let t = s.tp.max(1) as f64;
    let q = (model.heads * model.head_dim) as f64;
    let kv = (model.kv_heads * model.head_dim) as f64;
    let ffn = match model.moe {
        None => model.ffn as f64,
        Some(m) => ((m.active + m.shared) * m.expert_ffn) as f64,
    };
    // Q, V, the MLP's first matmul and the attention output are column-parallel.
    let split = q + kv + ffn + q;
    // The block input, and a gated MLP's last matmul (the 7th of Q, K, V, O, gate, up, down).
    let replicated = match model.mlp {
        Mlp::Gated => 2.0 * h,
        Mlp::Plain => h,
    };
    let replicated = if s.sp { replicated / t } else { replicated };
    let lse = 4.0 * model.heads as f64 / t * seq * b;
    if s.autocast {
        // The block input is the fp32 residual stream: 2 bytes more than a 16-bit one.
        let input = if s.sp { h / t } else { h };
        return 2.0 * seq * b * (split / t + replicated) + 2.0 * seq * b * input + lse;
    }
    s.element_bytes * seq * b * (split / t + replicated) + lse
}

/// Korthikanti et al. 2022, Table 2: one layer's stored bytes per GPU for one micro-batch, as
/// published and as the Playbook plots it: `sbh(10 + 24/t + 5as/(ht))`, with SP
/// `sbh/t (34 + 5as/h)`, selective recompute without the `5as/h` term, full recompute the
/// `2sbh` layer input. The formula assumes multi-head attention and a 4h GeLU MLP whatever the
/// model has (`per_layer` counts the model's own shapes). Flash attention stores no score
/// matrices, so it takes the selective row (the Playbook: "most people using FlashAttention
/// are already making use of selective recomputation"); context parallelism divides by c as
/// in the Playbook's CP figures. Written from the table, apart from `per_layer`, so the two
/// check each other.
pub fn published_per_layer(
    model: &ModelConfig,
    s: &ActivationSettings,
    recompute: Recompute,
) -> f64 {
    let seq = s.local_seq();
    let b = s.micro_batch as f64;
    let h = model.hidden_size as f64;
    let t = s.tp.max(1) as f64;
    let sbh = seq * b * h;
    let bytes = if recompute == Recompute::Full {
        if s.sp {
            2.0 * sbh / t
        } else {
            2.0 * sbh
        }
    } else {
        // Per-operator checkpointing has no published row: the selective one stands for it.
        let scores = if recompute == Recompute::None && s.attention == Attention::Eager {
            5.0 * model.heads as f64 * seq * s.seq_len as f64 * b
        } else {
            0.0
        };
        if s.sp {
            (34.0 * sbh + scores) / t
        } else {
            10.0 * sbh + (24.0 * sbh + scores) / t
        }
    };
    bytes * s.element_bytes / 2.0
}

/// Bytes per logit the loss keeps from its forward pass for its backward.
///
/// Eager, the fp32 log-softmax (4 B); compiled, the logits as the model made them
/// (`element_bytes`); Megatron-LM's loss, its fp32 softmax (4 B), which its backward reuses.
pub fn loss_kept_bytes_per_logit(loss: Loss, element_bytes: f64) -> f64 {
    match loss {
        Loss::Compiled => element_bytes,
        Loss::Eager | Loss::Megatron => 4.0,
    }
}

/// Bytes per logit the loss's backward holds beside what it kept.
///
/// Eager at TP 1 PyTorch's fused `log_softmax` backward holds the incoming gradient and its
/// result (8 B). With the vocabulary split across TP ranks, PyTorch's
/// `torch.distributed.tensor.parallel.loss_parallel` (its `_nll_loss_and_log_softmax_backward`;
/// torchtitan enables it whenever TP > 1) builds `(grad_input + exp(x)) * grad_output` from a
/// zeroed `grad_input`: that, `exp(x)` and their sum are alive at once (12 B). Compiled, the
/// one kernel writes the logits' gradient in their own element type (`element_bytes`).
/// Megatron-LM's works in place (0).
pub fn loss_bytes_per_logit(loss: Loss, tp: u64, element_bytes: f64) -> f64 {
    match loss {
        Loss::Eager if tp > 1 => 12.0,
        Loss::Eager => 8.0,
        Loss::Compiled => element_bytes,
        Loss::Megatron => 0.0,
    }
}

/// Activation memory of the first pipeline stage (the heaviest under 1F1B: it holds `pp`
/// micro-batches of `ceil(L / pp)` layers, so the total is per-layer x L when L divides).
pub fn activation_memory(model: &ModelConfig, s: &ActivationSettings) -> ActivationMemory {
    let pp = s.pp.max(1);
    let layers_here = model.layers.div_ceil(pp) as f64;
    let in_flight = s.in_flight();
    let t = s.tp.max(1) as f64;
    let sbh = s.local_seq() * s.micro_batch as f64 * model.hidden_size as f64;
    let stored = per_layer(model, s, s.recompute) * layers_here * in_flight;
    let published =
        published_per_layer(model, s, s.recompute) * model.layers as f64 * in_flight / pp as f64;
    let embedding = if s.sp { sbh / t } else { sbh } * in_flight;
    // Logits on this GPU (s b v / t: the vocabulary is split across TP ranks).
    let logits = sbh / model.hidden_size as f64 * model.vocab as f64 / t;
    let output = if pp == 1 {
        // Final norm input (2sbh/t), output projection input, the logits the loss keeps
        // (fp32 4sbv/t, or 16-bit 2sbv/t when it is compiled). Under
        // PyTorch's sequence parallelism the projection is a `ColwiseParallel` whose input is
        // all-gathered from sequence shards and kept whole by the matmul for backward (2sbh);
        // Megatron-LM's keeps its shard and gathers again in backward (2sbh/t).
        let projection_input = if s.sp && s.tp > 1 && s.loss != Loss::Megatron {
            2.0 * sbh
        } else {
            2.0 * sbh / t
        };
        // Under autocast the final norm's input is the fp32 residual stream.
        let norm_input = if s.autocast { 4.0 } else { 2.0 };
        norm_input * sbh / t
            + projection_input
            + loss_kept_bytes_per_logit(s.loss, s.element_bytes) * logits
    } else {
        0.0
    };
    // Under autocast each matmul casts its weight to 16 bits (2 bytes a parameter) and saves
    // the copy for backward; autocast also caches the copies until the forward pass ends.
    let layer_casts = if s.autocast {
        2.0 * matmul_params_per_layer(model, t)
    } else {
        0.0
    };
    let recompute_peak = match s.recompute {
        // The layer rebuilt casts its weights again for its backward.
        Recompute::Full => per_layer(model, s, Recompute::None) + layer_casts,
        // The block's forward is replayed for what was not kept.
        Recompute::PerOp => {
            per_layer(model, s, Recompute::None) - per_layer(model, s, Recompute::PerOp)
                + layer_casts
        }
        Recompute::None | Recompute::Selective => 0.0,
    };
    let loss = if pp == 1 {
        (loss_bytes_per_logit(s.loss, s.tp, s.element_bytes) * logits - recompute_peak).max(0.0)
    } else {
        0.0
    };
    let weight_casts = if s.autocast {
        // The output projection's weight (vocabulary x hidden / t) when this stage holds it.
        let head = if pp == 1 {
            2.0 * model.vocab as f64 * model.hidden_size as f64 / t
        } else {
            0.0
        };
        let casts = layer_casts * layers_here + head;
        match s.recompute {
            // Saved by every matmul, for each micro-batch in flight (the cache is cleared
            // when each forward pass ends).
            Recompute::None | Recompute::Selective => casts * in_flight,
            // Only in the cache, until the forward pass ends: the peak is the larger of that
            // moment and the backward's (the loss, then the layer rebuilt).
            Recompute::Full | Recompute::PerOp => (casts - recompute_peak - loss).max(0.0),
        }
    } else {
        0.0
    };
    ActivationMemory {
        layers: published,
        shape: stored - published,
        embedding,
        output,
        recompute_peak,
        loss,
        weight_casts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::builtin;
    use crate::plan::model::Norm;

    /// A GPT-shaped model (MHA, 4h GeLU MLP) as Korthikanti et al. and the Playbook assume.
    fn gpt_shape(h: u64, a: u64, layers: u64, vocab: u64) -> ModelConfig {
        ModelConfig {
            name: "gpt".into(),
            hidden_size: h,
            layers,
            cross_attention_layers: 0,
            heads: a,
            kv_heads: a,
            head_dim: h / a,
            ffn: 4 * h,
            mlp: Mlp::Plain,
            norm: Norm::LayerNorm,
            bias: true,
            vocab,
            tied_embeddings: true,
            position_embeddings: None,
            max_positions: None,
            moe: None,
            params_override: None,
        }
    }

    fn settings(seq: u64, b: u64, tp: u64, sp: bool, recompute: Recompute) -> ActivationSettings {
        ActivationSettings {
            seq_len: seq,
            micro_batch: b,
            tp,
            sp,
            cp: 1,
            pp: 1,
            micro_batches: 1,
            recompute,
            attention: Attention::Eager,
            element_bytes: 2.0,
            loss: Loss::Eager,
            autocast: false,
        }
    }

    const GIB: f64 = (1u64 << 30) as f64;

    fn round3(x: f64) -> f64 {
        (x * 1000.0).round() / 1000.0
    }

    /// Playbook `memusage_activations`, Llama-3.1-8B shape (h 4096, L 32, a 32), bs 1, bf16,
    /// no recompute: L s h (34 + 5as/h) + s h, in GiB (the plots' "GB" hold GiB).
    #[test]
    fn playbook_activations_without_recompute() {
        let model = gpt_shape(4096, 32, 32, 128256);
        for (seq, want) in [
            (1024, 9.254),
            (2048, 28.508),
            (4096, 97.016),
            (8192, 354.031),
            (16384, 1348.063),
        ] {
            let m = activation_memory(&model, &settings(seq, 1, 1, false, Recompute::None));
            assert_eq!(round3((m.layers + m.embedding) / GIB), want, "s={seq}");
        }
    }

    /// Playbook `memory-recomputation`, same shape: selective 34 s h L + s h and full
    /// 2 s h L + s h, in GiB.
    #[test]
    fn playbook_recomputation() {
        let model = gpt_shape(4096, 32, 32, 128256);
        for (seq, selective, full) in [
            (1024, 4.254, 0.254),
            (2048, 8.508, 0.508),
            (4096, 17.016, 1.016),
            (8192, 34.031, 2.031),
        ] {
            for (recompute, want) in [(Recompute::Selective, selective), (Recompute::Full, full)] {
                let m = activation_memory(&model, &settings(seq, 1, 1, false, recompute));
                assert_eq!(round3((m.layers + m.embedding) / GIB), want, "s={seq}");
            }
        }
    }

    /// Korthikanti et al. 2022 (quoted by the Playbook): for GPT-3 175B at s = 2048,
    /// selective recompute removes 70% of activation memory (5as/h = 80 of 114).
    #[test]
    fn gpt3_selective_saves_70_percent() {
        let model = gpt_shape(12288, 96, 96, 51200);
        let s = settings(2048, 1, 1, false, Recompute::None);
        let none = per_layer(&model, &s, Recompute::None);
        let selective = per_layer(&model, &s, Recompute::Selective);
        assert_eq!(((1.0 - selective / none) * 100.0).round(), 70.0);
    }

    /// Korthikanti et al. Table 2 on the Table 3 configurations (s 2048), per GPU, first
    /// stage, GB = 1e9: derived values of `reference/planner-math.md` §2.1 (regression
    /// oracles for the formulas, not measurements).
    #[test]
    fn korthikanti_table_2_on_table_3_models() {
        // (h, a, L, t, p, b): TP only, TP+SP, TP+sel, TP+SP+sel, full (2sbhL).
        let cases = [
            ((6144, 64, 48, 8, 1, 4), [63.6, 42.5, 31.4, 10.3, 4.83]),
            ((12288, 96, 96, 8, 8, 1), [55.6, 34.4, 31.4, 10.3, 4.83]),
            ((20480, 128, 105, 8, 35, 1), [92.5, 53.9, 57.3, 18.7, 8.81]),
            (
                (25600, 160, 128, 8, 64, 1),
                [140.9, 82.2, 87.2, 28.5, 13.42],
            ),
        ];
        for ((h, a, layers, t, p, b), want) in cases {
            let model = gpt_shape(h, a, layers, 51200);
            let variants = [
                (false, Recompute::None),
                (true, Recompute::None),
                (false, Recompute::Selective),
                (true, Recompute::Selective),
                (false, Recompute::Full),
            ];
            for ((sp, recompute), want) in variants.into_iter().zip(want) {
                let mut s = settings(2048, b, t, sp, recompute);
                s.pp = p;
                s.micro_batches = p;
                let got = per_layer(&model, &s, recompute) * layers as f64 / 1e9;
                let decimals = want.to_string().split('.').nth(1).map_or(0, str::len);
                let digits = 10f64.powi(decimals as i32);
                assert_eq!(
                    (got * digits).round() / digits,
                    want,
                    "h={h} {sp} {recompute:?}"
                );
                // Through the first stage of 1F1B: p micro-batches of L/p layers.
                if layers.is_multiple_of(p) {
                    let stage = activation_memory(&model, &s).layers / 1e9;
                    assert!((stage - got).abs() < 1e-9, "h={h}");
                }
            }
        }
    }

    /// Playbook CP figure, Llama-3.1-8B: activations with CP = 4 are those with CP = 1
    /// divided by 4: 352 -> 88 GiB at s = 131072 with TP = 2 (the Playbook's parallelism
    /// plots use 34 s h L, scaled by (10 + 24/t)/34 for TP without SP).
    #[test]
    fn context_parallel_divides_by_c() {
        let model = gpt_shape(4096, 32, 32, 128256);
        let mut s = settings(131072, 1, 2, false, Recompute::Selective);
        let one = activation_memory(&model, &s).layers;
        s.cp = 4;
        let four = activation_memory(&model, &s).layers;
        assert_eq!((one / GIB).round(), 352.0);
        assert_eq!((four / GIB).round(), 88.0);
    }

    #[test]
    fn flash_removes_the_quadratic_term() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let mut s = settings(8192, 1, 1, false, Recompute::None);
        let eager = per_layer(&model, &s, Recompute::None);
        s.attention = Attention::Flash;
        let flash = per_layer(&model, &s, Recompute::None);
        let selective = per_layer(&model, &s, Recompute::Selective);
        assert!(flash < eager / 3.0);
        assert!(selective < flash && flash < selective * 1.01);
    }

    /// The Playbook's figures come out of the layers term for the real Llama-3.1-8B too (GQA,
    /// SwiGLU), since the published formula reads only h, a and L; the model's own shapes go
    /// to the shape term, which is what memprof adds there.
    #[test]
    fn playbook_figures_from_the_layers_term_of_the_real_model() {
        let model = builtin::find("llama-3.1-8b").expect("built-in");
        for (seq, none, selective) in [(1024, 9.254, 4.254), (4096, 97.016, 17.016)] {
            for (recompute, want) in [(Recompute::None, none), (Recompute::Selective, selective)] {
                let m = activation_memory(&model, &settings(seq, 1, 1, false, recompute));
                assert_eq!(round3((m.layers + m.embedding) / GIB), want, "s={seq}");
                assert!(m.shape > 0.0, "s={seq} {recompute:?}");
            }
        }
    }

    /// Llama-3.1-70B (h 8192, a 64, 8 KV heads, SwiGLU 28672), s = 4096, selective: the
    /// Playbook's 34 s h L exactly in the layers term; memprof's 35.5 s h per layer (K and V
    /// at 1/8 width: -3.5 s h; three 3.5h-wide MLP tensors instead of two 4h ones: +5 s h) puts
    /// 1.5 s h L in the shape term, and the LM head (logits for 128256 tokens in fp32) in the
    /// head term.
    #[test]
    fn llama_70b_differences_are_named() {
        let model = builtin::find("llama-3.1-70b").expect("built-in");
        let m = activation_memory(&model, &settings(4096, 1, 1, false, Recompute::Selective));
        let sh = 4096.0 * 8192.0;
        assert_eq!(m.layers, 34.0 * sh * 80.0);
        assert!((m.shape - 1.5 * sh * 80.0).abs() < 1.0, "{}", m.shape);
        assert_eq!(m.embedding, sh);
        assert_eq!(m.output, 4.0 * sh * (1.0 + 128256.0 / 8192.0));
        assert_eq!(m.loss, 8.0 * 4096.0 * 128256.0);
        assert_eq!(m.head(), m.embedding + m.output + m.loss);
        let parts = m.layers + m.shape + m.head() + m.recompute_peak;
        assert_eq!(m.total(), parts);
    }

    /// torchtitan's Table 4 layout (Llama 3.1 70B, TP 8 with sequence parallelism, s 8192,
    /// b 16, full recompute): PyTorch's `loss_parallel` holds 16 bytes a logit in backward (12
    /// beyond the kept fp32 logits) and the `ColwiseParallel` output projection keeps its
    /// gathered input whole (2sbh); Megatron-LM's head (`Loss::Megatron`) keeps its shard
    /// (2sbh/t) and works in place.
    #[test]
    fn pytorch_tensor_parallel_head_keeps_more_than_megatron() {
        let model = builtin::find("llama-3.1-70b").expect("built-in");
        let mut s = settings(8192, 16, 8, true, Recompute::Full);
        s.attention = Attention::Flash;
        let sbh = 8192.0 * 16.0 * 8192.0;
        let logits = 8192.0 * 16.0 * 128256.0 / 8.0;
        let m = activation_memory(&model, &s);
        assert_eq!(m.output, 2.0 * sbh / 8.0 + 2.0 * sbh + 4.0 * logits);
        assert_eq!(m.loss, 12.0 * logits - m.recompute_peak);
        s.loss = Loss::Megatron;
        let megatron = activation_memory(&model, &s);
        assert_eq!(megatron.output, 4.0 * sbh / 8.0 + 4.0 * logits);
        assert_eq!(megatron.loss, 0.0);
        // At TP 1 the loss is PyTorch's fused log-softmax backward: 8 bytes beyond the logits.
        assert_eq!(loss_bytes_per_logit(Loss::Eager, 1, 2.0), 8.0);
    }

    /// The loss under `torch.compile` keeps the 16-bit logits (2sbv) and writes their 16-bit
    /// gradient (2sbv), where the eager loss keeps the fp32 log-softmax (4sbv) and holds two
    /// fp32 gradients beside it (8sbv): 4 bytes a logit at the loss's backward instead of 12,
    /// about the 4.4 PyTorch measured (docs/plan-accuracy.md). Llama 3.1 8B, s 8192, b 2.
    #[test]
    fn compiled_loss_keeps_the_logits_and_one_gradient_in_16_bits() {
        let model = builtin::find("llama-3.1-8b").expect("built-in");
        let mut s = settings(8192, 2, 1, false, Recompute::None);
        s.attention = Attention::Flash;
        let sbh = 8192.0 * 2.0 * 4096.0;
        let logits = 8192.0 * 2.0 * 128256.0;
        let eager = activation_memory(&model, &s);
        s.loss = Loss::Compiled;
        let compiled = activation_memory(&model, &s);
        assert_eq!(eager.output, 4.0 * sbh + 4.0 * logits);
        assert_eq!(eager.loss, 8.0 * logits);
        assert_eq!(compiled.output, 4.0 * sbh + 2.0 * logits);
        assert_eq!(compiled.loss, 2.0 * logits);
        assert_eq!(eager.head() - compiled.head(), 8.0 * logits);
        // The layers are the same either way.
        assert_eq!(eager.layers + eager.shape, compiled.layers + compiled.shape);
        // In fp32 the compiled loss keeps 4 bytes a logit and writes 4 of gradient.
        s.element_bytes = 4.0;
        let fp32 = activation_memory(&model, &s);
        assert_eq!(fp32.loss, 4.0 * logits);
    }

    /// torchtitan's per-operator policy on Llama 3.1 8B (s 8192, b 2): the block input, Q, V,
    /// the gate and down projections' outputs and the attention output in bf16, 2 x (4096 +
    /// 4096 + 1024 + 14336 + 4096 + 4096) bytes a token, plus 32 fp32 log-sum-exps; the rest of
    /// the layer is rebuilt in backward.
    #[test]
    fn per_op_keeps_every_other_matmul() {
        let model = builtin::find("llama-3.1-8b").expect("built-in");
        let mut s = settings(8192, 2, 1, false, Recompute::PerOp);
        s.attention = Attention::Flash;
        let tokens = 8192.0 * 2.0;
        let want = tokens * (2.0 * 31744.0 + 4.0 * 32.0);
        assert_eq!(per_layer(&model, &s, Recompute::PerOp), want);
        let m = activation_memory(&model, &s);
        assert_eq!(m.layers + m.shape, want * 32.0);
        let none = per_layer(&model, &s, Recompute::None);
        assert_eq!(m.recompute_peak, none - want);
        // Less than half of what Korthikanti's selective recompute keeps for this model.
        assert!(want < per_layer(&model, &s, Recompute::Selective) / 2.0);
    }

    /// bert-large's layer (h 1024, a 16, a 4h GeLU MLP, separate Q, K and V) under autocast
    /// with eager attention, s 512, b 4, op by op as Hugging Face's `BertLayer` runs: the two
    /// layer norms' fp32 inputs (8 sbh), the 16-bit copy of the input that Q, K and V each cast
    /// (6 sbh), Q, K and V (6 sbh), the output projection's input (2 sbh), the 16-bit copy of
    /// the MLP input (2 sbh), the GeLU's input and output (16 sbh) and two dropout masks (2 sbh):
    /// 42 sbh; per score the fp32 softmax output, the dropout mask and the 16-bit copy of the
    /// dropped-out probabilities that the second matmul saves (7 as^2 b). In 16 bits the same
    /// layer is Korthikanti's 34 sbh + 5 as^2 b, and the published term is that either way.
    #[test]
    fn autocast_keeps_fp32_norms_and_softmax_and_a_cast_per_projection() {
        let model = gpt_shape(1024, 16, 24, 30522);
        let mut s = settings(512, 4, 1, false, Recompute::None);
        let sbh = 512.0 * 4.0 * 1024.0;
        let scores = 16.0 * 512.0 * 512.0 * 4.0;
        assert_eq!(
            per_layer(&model, &s, Recompute::None),
            34.0 * sbh + 5.0 * scores
        );
        let sixteen_bit = activation_memory(&model, &s);
        s.autocast = true;
        assert_eq!(
            per_layer(&model, &s, Recompute::None),
            42.0 * sbh + 7.0 * scores
        );
        let autocast = activation_memory(&model, &s);
        assert_eq!(autocast.layers, sixteen_bit.layers);
        assert_eq!(autocast.shape, 24.0 * (8.0 * sbh + 2.0 * scores));
        // The final norm's input is the fp32 residual stream: 2 sbh more in the head.
        assert_eq!(autocast.output - sixteen_bit.output, 2.0 * sbh);
        // A gated MLP's gate and up cast the MLP input once each.
        let llama = builtin::find("llama-3.1-8b").expect("built-in");
        s.autocast = false;
        let gated = per_layer(&llama, &s, Recompute::Selective);
        s.autocast = true;
        let lsbh = 512.0 * 4.0 * 4096.0;
        assert_eq!(
            per_layer(&llama, &s, Recompute::Selective) - gated,
            10.0 * lsbh
        );
        // Full recompute keeps the layer input, fp32 under autocast.
        assert_eq!(per_layer(&model, &s, Recompute::Full), 4.0 * sbh);
    }

    /// Under autocast every matmul saves its 16-bit copy of its weight for backward: 2 bytes a
    /// parameter of the blocks (not of the norms) and of the output projection. With full
    /// recompute the copies live only in autocast's cache until the forward pass ends, so only
    /// what exceeds the backward's transients (the loss, the layer rebuilt with its own copies)
    /// counts; without autocast there are none.
    #[test]
    fn autocast_weight_copies_by_recompute() {
        let model = gpt_shape(1024, 16, 24, 30522);
        let h = 1024.0;
        // Q, K, V, O with biases and a 4h MLP with biases.
        let layer = 12.0 * h * h + 9.0 * h;
        let copies = 2.0 * (24.0 * layer + 30522.0 * h);
        let mut s = settings(512, 4, 1, false, Recompute::None);
        assert_eq!(activation_memory(&model, &s).weight_casts, 0.0);
        s.autocast = true;
        let m = activation_memory(&model, &s);
        assert!((m.weight_casts - copies).abs() < 1.0, "{}", m.weight_casts);
        assert_eq!(
            m.total(),
            m.layers + m.shape + m.head() + m.recompute_peak + m.weight_casts
        );
        s.recompute = Recompute::Full;
        s.micro_batch = 1;
        let full = activation_memory(&model, &s);
        let rebuilt = per_layer(&model, &s, Recompute::None) + 2.0 * layer;
        assert!((full.recompute_peak - rebuilt).abs() < 1.0);
        let transients = full.recompute_peak + full.loss;
        assert!(transients < copies);
        assert!((full.weight_casts - (copies - transients)).abs() < 1.0);
        // TP splits the copies with the weights.
        s.tp = 2;
        let tp2 = activation_memory(&model, &s);
        assert!(tp2.weight_casts < full.weight_casts);
    }

    /// `published_per_layer` is Korthikanti's Table 2 on the Table 3 configurations whatever
    /// the model's real shapes are: give it a GQA / SwiGLU model of the same h, a, L.
    #[test]
    fn published_formula_ignores_the_model_shapes() {
        let mut model = gpt_shape(12288, 96, 96, 51200);
        model.kv_heads = 8;
        model.mlp = Mlp::Gated;
        model.ffn = 3 * 12288;
        let gpt = gpt_shape(12288, 96, 96, 51200);
        for (sp, recompute) in [
            (false, Recompute::None),
            (true, Recompute::None),
            (false, Recompute::Selective),
            (true, Recompute::Selective),
            (false, Recompute::Full),
        ] {
            let s = settings(2048, 1, 8, sp, recompute);
            let published = published_per_layer(&model, &s, recompute);
            let gpt_bytes = per_layer(&gpt, &s, recompute);
            assert!(
                (published - gpt_bytes).abs() <= gpt_bytes * 1e-12,
                "{sp} {recompute:?}"
            );
            if recompute != Recompute::Full {
                let own = per_layer(&model, &s, recompute);
                assert!((published - own).abs() > own * 0.005, "{sp} {recompute:?}");
            }
        }
    }
}
