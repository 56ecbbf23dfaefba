//! Megatron-LM's `theoretical_memory_usage.py` (NVIDIA/Megatron-LM @ 00caa53a), ported with
//! its quirks so memprof can print the figure Megatron users see: weights and optimizer of the
//! most loaded shard, and activations by its two paths (sequence parallel + selective
//! recompute, and the rest, with a 1.05 overhead factor and no final division by TP).
//! No GQA or SwiGLU adjustment of activations, and CP is ignored, as in the original.
//! `reference/planner-math.md` §1.4 and §2.2.

use super::model::{Mlp, ModelConfig, Norm};

/// The arguments `theoretical_memory_usage` reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MegatronArgs {
    pub hidden: u64,
    pub layers: u64,
    pub heads: u64,
    /// `num_query_groups` (GQA); equal to `heads` for MHA.
    pub query_groups: u64,
    pub kv_channels: u64,
    pub ffn: u64,
    pub swiglu: bool,
    pub rmsnorm: bool,
    /// Vocabulary padded as Megatron pads it.
    pub vocab: u64,
    pub untie_embeddings: bool,
    pub tp: u64,
    pub pp: u64,
    pub dp: u64,
    pub distributed_optimizer: bool,
    pub seq: u64,
    pub micro_batch: u64,
    pub sequence_parallel: bool,
    /// `recompute_granularity == 'selective'`.
    pub selective: bool,
    pub num_microbatches: Option<u64>,
    /// Virtual pipeline stages per rank (interleaved schedule).
    pub virtual_stages: Option<u64>,
}

impl MegatronArgs {
    /// The arguments for a model config and a layout.
    pub fn from_model(model: &ModelConfig, tp: u64, pp: u64, dp: u64) -> MegatronArgs {
        MegatronArgs {
            hidden: model.hidden_size,
            layers: model.layers,
            heads: model.heads,
            query_groups: model.kv_heads,
            kv_channels: model.head_dim,
            ffn: model.ffn,
            swiglu: model.mlp == Mlp::Gated,
            rmsnorm: model.norm == Norm::RmsNorm,
            vocab: model.vocab,
            untie_embeddings: !model.tied_embeddings,
            tp,
            pp,
            dp,
            distributed_optimizer: false,
            seq: 2048,
            micro_batch: 1,
            sequence_parallel: tp > 1,
            selective: true,
            num_microbatches: None,
            virtual_stages: None,
        }
    }
}

/// `compute_weight_and_optimizer_memory`: bytes on the most loaded shard.
pub fn weight_and_optimizer_memory(a: &MegatronArgs) -> f64 {
    let h = a.hidden as f64;
    let heads = a.heads as f64;
    let groups = a.query_groups as f64;
    let norm = if a.rmsnorm { 1.0 } else { 2.0 };
    let self_attn = 2.0 * h * h * ((1.0 + groups / heads) * (a.kv_channels as f64 * heads) / h);
    let gated = if a.swiglu { 1.5 } else { 1.0 };
    let layer = 2.0 * h * (a.ffn as f64 * gated + norm) + self_attn;
    let block = layer * a.layers as f64 + norm * h;
    let embedding = h * a.vocab as f64;
    let (tp, pp) = (a.tp.max(1) as f64, a.pp.max(1) as f64);
    let mut shard = (block / pp + embedding) / tp;
    if a.untie_embeddings && a.pp <= 1 {
        shard += embedding / tp;
    }
    let bytes_per_param = if a.distributed_optimizer {
        6.0 + 12.0 / a.dp.max(1) as f64
    } else {
        18.0
    };
    shard * bytes_per_param
}

/// Megatron's activation figure by term, each with the path's scaling already applied, so
/// the terms add up to what `report_theoretical_memory` prints.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationTerms {
    /// `compute_activation_memory` (sequence parallel and selective recompute) rather than
    /// `compute_activation_memory_without_sp`.
    pub sp_path: bool,
    /// Bytes per transformer layer before the schedule's factor: s b h (18 + 4 ffn / h) on
    /// the SP path, s b h (10 + 24 / t) on the other.
    pub per_layer: f64,
    /// The schedule's factor: 1 + (p - 1) / (p v) interleaved, min(1, m / p) for 1F1B.
    pub schedule: f64,
    /// Every layer's activations (first stage, micro-batches in flight).
    pub layers: f64,
    /// Input ids (8 s b p), embedding dropout (s b h p) and, with one stage, the output layer
    /// and loss.
    pub embedding_and_output: f64,
    /// The other path's 5% for "optimizer and miscellaneous temporaries".
    pub overhead: f64,
}

impl ActivationTerms {
    pub fn total(&self) -> f64 {
        self.layers + self.embedding_and_output + self.overhead
    }
}

/// `compute_activation_memory` or `compute_activation_memory_without_sp`, as
/// `report_theoretical_memory` picks: the first only when sequence parallelism and selective
/// recompute are both on.
pub fn activation_terms(a: &MegatronArgs) -> ActivationTerms {
    let (s, b, h) = (a.seq as f64, a.micro_batch as f64, a.hidden as f64);
    let (tp, p) = (a.tp.max(1) as f64, a.pp.max(1));
    let pf = p as f64;
    let v = a.vocab as f64;
    let sp_path = a.sequence_parallel && a.selective;
    let per_layer = if sp_path {
        s * b * h * (18.0 + 4.0 * a.ffn as f64 / h)
    } else {
        s * b * h * (10.0 + 24.0 / tp)
    };
    let schedule = match (a.virtual_stages, a.num_microbatches) {
        (Some(vpp), _) => 1.0 + (pf - 1.0) / (pf * vpp as f64),
        (None, Some(m)) if p > 1 => (m as f64 / pf).min(1.0),
        _ => 1.0,
    };
    let layers = per_layer * a.layers as f64 * schedule;
    let embedding = (8.0 * s * b * pf + s * b * h * pf) * schedule;
    if sp_path {
        let output = if p == 1 {
            s * b * h * 4.0 * (1.0 + v / h)
        } else {
            0.0
        };
        ActivationTerms {
            sp_path,
            per_layer,
            schedule,
            layers: layers / tp,
            embedding_and_output: (embedding + output) / tp,
            overhead: 0.0,
        }
    } else {
        let output = if p == 1 {
            (s * b * v / tp + s * b * h) * 2.0
        } else {
            0.0
        };
        ActivationTerms {
            sp_path,
            per_layer,
            schedule,
            layers,
            embedding_and_output: embedding + output,
            overhead: 0.05 * (layers + embedding + output),
        }
    }
}

/// `compute_activation_memory` (and `..._without_sp`): bytes on the first stage.
pub fn activation_memory(a: &MegatronArgs) -> f64 {
    activation_terms(a).total()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::activations::{self, ActivationSettings, Attention, Loss, Recompute};
    use crate::plan::builtin;
    use crate::plan::layout::Layout;
    use crate::plan::recipe::{Optimizer, Precision};
    use crate::plan::states::{model_states, ZeroStage};

    fn gpt3(tp: u64, pp: u64, dp: u64) -> MegatronArgs {
        MegatronArgs {
            hidden: 12288,
            layers: 96,
            heads: 96,
            query_groups: 96,
            kv_channels: 128,
            ffn: 4 * 12288,
            swiglu: false,
            rmsnorm: false,
            vocab: 51200,
            untie_embeddings: false,
            tp,
            pp,
            dp,
            distributed_optimizer: false,
            seq: 2048,
            micro_batch: 1,
            sequence_parallel: true,
            selective: true,
            num_microbatches: Some(64),
            virtual_stages: None,
        }
    }

    /// The SP + selective path is Korthikanti's 34 sbh / t per layer (ffn = 4h) plus
    /// Megatron's input-ids term 8 s b p / t, on the 175B configuration of Table 3.
    #[test]
    fn sp_selective_matches_korthikanti() {
        let a = gpt3(8, 8, 8);
        let (s, b, h) = (2048.0, 1.0, 12288.0);
        let want = (34.0 * s * b * h * 96.0 + 8.0 * s * b * 8.0 + s * b * h * 8.0) / 8.0;
        assert!((activation_memory(&a) - want).abs() < 1e-3);
        // Fewer micro-batches than stages scale the first stage down (min(1, m / p)).
        let few = MegatronArgs {
            num_microbatches: Some(4),
            ..a
        };
        assert!((activation_memory(&few) - want / 2.0).abs() < 1e-3);
        // The interleaved schedule multiplies by 1 + (p - 1) / (p v).
        let vpp = MegatronArgs {
            virtual_stages: Some(2),
            ..a
        };
        assert!((activation_memory(&vpp) - want * (1.0 + 7.0 / 16.0)).abs() < 1e-3);
    }

    /// The other path: 10 + 24/t per layer, times 1.05, not divided by TP.
    #[test]
    fn without_sp_path_keeps_its_quirks() {
        let a = MegatronArgs {
            sequence_parallel: false,
            pp: 1,
            ..gpt3(8, 1, 8)
        };
        let (s, b, h, v) = (2048.0, 1.0, 12288.0, 51200.0);
        let layers = s * b * h * (10.0 + 3.0) * 96.0 + 8.0 * s * b + s * b * h;
        let want = (layers + (s * b * v / 8.0 + s * b * h) * 2.0) * 1.05;
        assert!((activation_memory(&a) - want).abs() < 1e-3);
    }

    /// Weights and optimizer of the most loaded shard agree with memprof's own accounting
    /// (Megatron bf16 recipe, 18 B/param; 6 + 12/d with the distributed optimizer) on a model
    /// without biases, where both count the same parameters (Megatron spreads the final norm
    /// over the stages, memprof keeps it on the first: a few KiB apart).
    #[test]
    fn weights_and_optimizer_match_the_planner() {
        let model = builtin::find("llama-3-70b").expect("built-in");
        let counts = model.param_counts();
        for (tp, pp, dp, dist) in [
            (1, 1, 1, false),
            (8, 1, 4, false),
            (4, 4, 8, true),
            (8, 10, 2, true),
        ] {
            let mut a = MegatronArgs::from_model(&model, tp, pp, dp);
            a.distributed_optimizer = dist;
            let layout = Layout {
                dp,
                tp,
                pp,
                cp: 1,
                zero: if dist {
                    ZeroStage::Optimizer
                } else {
                    ZeroStage::None
                },
                shard_group: None,
                sp: true,
                recompute: Recompute::Selective,
                micro_batch: 1,
                grad_accum: 1,
            };
            let params = layout.params_per_gpu(&counts, model.tied_embeddings);
            let bytes = Precision::MegatronBf16.state_bytes(Optimizer::AdamW);
            let ours = model_states(params, &bytes, layout.zero, dp, 0.0).total();
            let theirs = weight_and_optimizer_memory(&a);
            assert!(
                (ours - theirs).abs() / theirs < 1e-6,
                "tp {tp} pp {pp}: {ours} vs {theirs}"
            );
        }
    }

    /// On a GPT-shaped model the SP + selective layers equal memprof's selective estimate.
    #[test]
    fn layers_match_the_planner_on_gpt_shapes() {
        let model = builtin::find("gpt3-175b").expect("built-in");
        let a = MegatronArgs {
            pp: 1,
            num_microbatches: None,
            ..MegatronArgs::from_model(&model, 8, 1, 1)
        };
        let s = ActivationSettings {
            seq_len: 2048,
            micro_batch: 1,
            tp: 8,
            sp: true,
            cp: 1,
            pp: 1,
            micro_batches: 1,
            recompute: Recompute::Selective,
            attention: Attention::Eager,
            element_bytes: 2.0,
            loss: Loss::Eager,
            autocast: false,
        };
        let ours = activations::per_layer(&model, &s, Recompute::Selective);
        let theirs = 2048.0 * 12288.0 * 34.0 / 8.0;
        assert_eq!(ours, theirs);
        assert!(activation_memory(&a) > theirs * 96.0);
    }
}
