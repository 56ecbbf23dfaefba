//! Estimated time of a training step, for ranking layouts, as a sum of named terms:
//! compute (6 FLOPs per parameter and token plus the attention core), the pipeline bubble at
//! the micro-batch count the global batch allows ((p - 1) / m of the compute; Narayanan et al.
//! 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
//! §2.2), recompute (the forward FLOPs done again), TP collectives on the critical path inside
//! or across a node, CP key/value exchange, PP point-to-point transfers, and the data-parallel
//! or sharded-gradient traffic that the last micro-batch's backward pass does not hide.
//!
//! Hardware figures (a DGX H100 node, NVIDIA's datasheet): 8 GPUs per node, NVLink 4 at
//! 450 GB/s per direction per GPU inside a node, one 400 Gb/s ConnectX-7 NIC (50 GB/s) per GPU
//! across nodes; 400 TFLOP/s sustained, about 40% of the 989 TFLOP/s dense bf16 peak. Used only
//! to order candidates, never shown as a promise of speed.

use super::activations::Recompute;
use super::layout::Layout;
use super::model::{ModelConfig, ParamCounts};
use super::recipe::StateBytes;
use super::states::ZeroStage;

pub const GPUS_PER_NODE: u64 = 8;
pub const INTRA_NODE_BYTES_PER_S: f64 = 450e9;
pub const INTER_NODE_BYTES_PER_S: f64 = 50e9;
pub const SUSTAINED_FLOPS: f64 = 400e12;

/// The estimated cost of one optimizer step on one GPU, by term (seconds).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StepCost {
    /// Bytes this GPU sends in collectives and pipeline transfers per step.
    pub comm_bytes: f64,
    /// Forward and backward FLOPs without recompute.
    pub train_flops: f64,
    /// Extra forward FLOPs spent recomputing.
    pub recompute_flops: f64,
    /// Idle fraction of the 1F1B schedule: (pp - 1) / micro-batches.
    pub bubble: f64,
    /// Forward and backward compute.
    pub compute_s: f64,
    /// Pipeline idle time: `bubble` x (compute + recompute).
    pub bubble_s: f64,
    pub recompute_s: f64,
    /// Tensor-parallel collectives (not overlapped).
    pub tp_s: f64,
    /// Context-parallel key/value exchange (not overlapped).
    pub cp_s: f64,
    /// Pipeline activations and their gradients between stages.
    pub pp_s: f64,
    /// Data-parallel / sharded traffic left after what backward hides.
    pub dp_s: f64,
    /// The sum of the terms.
    pub step_s: f64,
    /// Estimated step time divided by the samples the step trains on.
    pub seconds_per_sample: f64,
}

impl StepCost {
    /// Recompute FLOPs as a fraction of the step's training FLOPs.
    pub fn recompute_fraction(&self) -> f64 {
        if self.train_flops > 0.0 {
            self.recompute_flops / self.train_flops
        } else {
            0.0
        }
    }

    /// The terms by name, in the order they are printed.
    pub fn terms(&self) -> [(&'static str, f64); 7] {
        [
            ("compute", self.compute_s),
            ("pipeline bubble", self.bubble_s),
            ("recompute", self.recompute_s),
            ("TP communication", self.tp_s),
            ("CP communication", self.cp_s),
            ("PP transfers", self.pp_s),
            ("DP / sharded-gradient traffic", self.dp_s),
        ]
    }
}

/// Bytes each member sends in a ring all-reduce of `x` bytes over `n` GPUs.
fn all_reduce(x: f64, n: u64) -> f64 {
    2.0 * gather(x, n)
}

/// Bytes each member sends in a ring all-gather or reduce-scatter of `x` bytes.
fn gather(x: f64, n: u64) -> f64 {
    let n = n.max(1) as f64;
    x * (n - 1.0) / n
}

fn link(span: u64) -> f64 {
    if span <= GPUS_PER_NODE {
        INTRA_NODE_BYTES_PER_S
    } else {
        INTER_NODE_BYTES_PER_S
    }
}

/// Forward FLOPs of one transformer layer on one GPU for a micro-batch, and the attention
/// core's share of them: 2 FLOPs per active parameter and token, plus QK^T and AV
/// (4 b s_local s a d), split by TP; CP splits the queries.
pub fn layer_forward_flops(
    model: &ModelConfig,
    counts: &ParamCounts,
    seq_len: u64,
    cp: u64,
    micro_batch: u64,
    tp: u64,
) -> (f64, f64) {
    let tp = tp.max(1) as f64;
    let seq = seq_len as f64;
    let local_seq = seq / cp.max(1) as f64;
    let b = micro_batch as f64;
    let active_blocks = counts
        .active
        .saturating_sub(counts.total.saturating_sub(counts.blocks));
    let layer_params = active_blocks as f64 / model.layers.max(1) as f64;
    let q = (model.heads * model.head_dim) as f64;
    let core = 4.0 * b * local_seq * seq * q / tp;
    (2.0 * b * local_seq * layer_params / tp + core, core)
}

/// What `step_cost` needs besides the layout.
pub struct CostInputs<'a> {
    pub model: &'a ModelConfig,
    pub counts: &'a ParamCounts,
    pub state: &'a StateBytes,
    pub seq_len: u64,
    pub element_bytes: f64,
    /// Parameters on this GPU.
    pub params: f64,
}

/// Estimated cost of a step under `layout`.
pub fn step_cost(inp: &CostInputs, layout: &Layout) -> StepCost {
    let model = inp.model;
    let m = layout.grad_accum.max(1) as f64;
    let t = layout.tp.max(1);
    let tf = t as f64;
    let seq = inp.seq_len as f64;
    let local_seq = seq / layout.cp.max(1) as f64;
    let b = layout.micro_batch as f64;
    let h = model.hidden_size as f64;
    let layers_here = model.layers.div_ceil(layout.pp.max(1)) as f64;
    let spans = layout.spans();
    let p = inp.params;
    let (w, g) = (inp.state.weights, inp.state.grads);

    // Data parallel: gradient reduction and (ZeRO) parameter gathers.
    let n = layout.shard_degree();
    let dp_bytes = match layout.zero {
        ZeroStage::None => all_reduce(p * g, n),
        ZeroStage::Optimizer => gather(p * g, n) + gather(p * w, n),
        ZeroStage::Gradients => m * gather(p * g, n) + gather(p * w, n),
        ZeroStage::Parameters => m * (2.0 * gather(p * w, n) + gather(p * g, n)),
    };
    let replicas = (layout.dp * layout.cp) / n.max(1);
    let hybrid_bytes = all_reduce(p * g / n.max(1) as f64, replicas);
    let shard_span = if replicas > 1 {
        n * layout.tp * layout.pp
    } else {
        spans.dp
    };

    // Tensor parallel: two all-reduces (or all-gather + reduce-scatter with SP) forward and
    // two backward per layer; full recompute repeats the forward ones.
    let activation = local_seq * b * h * inp.element_bytes;
    let tp_collectives = if layout.recompute == Recompute::Full {
        6.0
    } else {
        4.0
    };
    let tp_bytes = if t > 1 {
        m * layers_here * tp_collectives * all_reduce(activation, t)
    } else {
        0.0
    };

    // Context parallel: gather the other ranks' keys and values forward, again backward, and
    // reduce-scatter their gradients.
    let kv = (model.kv_heads * model.head_dim) as f64;
    let kv_bytes = 2.0 * seq * b * kv * inp.element_bytes / tf;
    let cp_passes = if layout.recompute == Recompute::Full {
        4.0
    } else {
        3.0
    };
    let cp_bytes = m * layers_here * cp_passes * gather(kv_bytes, layout.cp);

    // Pipeline: one activation forward and one gradient backward per micro-batch.
    let pp_bytes = if layout.pp > 1 {
        let boundary = if layout.sp {
            activation / tf
        } else {
            activation
        };
        m * 2.0 * boundary
    } else {
        0.0
    };

    let (layer_fwd, core_fwd) = layer_forward_flops(
        model,
        inp.counts,
        inp.seq_len,
        layout.cp,
        layout.micro_batch,
        t,
    );
    // The output projection: on the last stage, which with its L/p layers is the slowest
    // (the first stage's embedding lookup costs next to nothing).
    let logits_fwd = 2.0 * b * local_seq * h * model.vocab as f64 / tf;
    let fwd = layers_here * layer_fwd + logits_fwd;
    let train_flops = 3.0 * fwd * m;
    let recompute_flops = m
        * layers_here
        * match layout.recompute {
            Recompute::None => 0.0,
            Recompute::Selective => core_fwd,
            Recompute::Full => layer_fwd,
            // K, O and the MLP's middle matmul, not the attention kernel.
            Recompute::PerOp => (layer_fwd - core_fwd) / 2.0,
        };
    let bubble = (layout.pp.max(1) - 1) as f64 / m;
    let compute_s = train_flops / SUSTAINED_FLOPS;
    let recompute_s = recompute_flops / SUSTAINED_FLOPS;
    let bubble_s = bubble * (compute_s + recompute_s);
    let tp_s = tp_bytes / link(spans.tp);
    let cp_s = cp_bytes / link(spans.cp);
    let pp_s = pp_bytes / link(spans.pp);
    // Gradient reduction runs bucket by bucket under the last micro-batch's backward pass
    // (PyTorch DDP and FSDP, Megatron's overlap_grad_reduce); ZeRO-3's gathers are prefetched
    // under every micro-batch's compute. Only what exceeds that window is on the step's path.
    let dp_total = dp_bytes / link(shard_span) + hybrid_bytes / INTER_NODE_BYTES_PER_S;
    let window = if layout.zero == ZeroStage::Parameters {
        compute_s + recompute_s
    } else {
        (compute_s + recompute_s) / m * 2.0 / 3.0
    };
    let dp_s = (dp_total - window).max(0.0);
    let step_s = compute_s + bubble_s + recompute_s + tp_s + cp_s + pp_s + dp_s;
    let samples = b * layout.dp as f64 * m;
    StepCost {
        comm_bytes: dp_bytes + hybrid_bytes + tp_bytes + cp_bytes + pp_bytes,
        train_flops,
        recompute_flops,
        bubble,
        compute_s,
        bubble_s,
        recompute_s,
        tp_s,
        cp_s,
        pp_s,
        dp_s,
        step_s,
        seconds_per_sample: step_s / samples,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Korthikanti et al. 2022: for GPT-3 175B at s = 2048 selective recompute costs 2.7% in
    /// FLOPs, the attention core's share of a layer's forward, s / (6h + s).
    #[test]
    fn gpt3_attention_core_share() {
        let model = crate::plan::builtin::find("gpt3-175b").expect("built-in");
        let counts = model.param_counts();
        let (layer, core) = layer_forward_flops(&model, &counts, 2048, 1, 1, 1);
        assert_eq!((core / layer * 1000.0).round() / 10.0, 2.7);
    }

    #[test]
    fn ring_volumes() {
        assert_eq!(all_reduce(100.0, 4), 150.0);
        assert_eq!(gather(100.0, 4), 75.0);
        assert_eq!(all_reduce(100.0, 1), 0.0);
    }
}
