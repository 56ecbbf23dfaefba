//! A parallel layout of a training job (DP, TP with or without SP, PP, CP, ZeRO stage,
//! recompute, micro-batching) and the per-GPU share of the model it gives.

use super::activations::Recompute;
use super::model::ParamCounts;
use super::states::ZeroStage;
use serde::Serialize;

/// One way to lay a training step out over the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub zero: ZeroStage,
    /// Shard group of hybrid sharding (HSDP); `None` shards over all of DP x CP.
    pub shard_group: Option<u64>,
    /// Sequence parallelism alongside TP.
    pub sp: bool,
    pub recompute: Recompute,
    pub micro_batch: u64,
    /// Micro-batches per optimizer step.
    pub grad_accum: u64,
}

/// The GPUs each collective runs over, innermost first: TP, CP, PP, then DP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Spans {
    pub tp: u64,
    pub cp: u64,
    pub pp: u64,
    pub dp: u64,
}

impl Layout {
    pub fn gpus(&self) -> u64 {
        self.dp * self.tp * self.pp * self.cp
    }

    /// Degree over which ZeRO / FSDP shard model states: DP x CP (as Megatron reduces
    /// gradients), or the hybrid shard group.
    pub fn shard_degree(&self) -> u64 {
        self.shard_group.unwrap_or(self.dp * self.cp)
    }

    /// How far apart (in GPU ranks) the members of each group reach, for telling intra-node
    /// from inter-node links.
    pub fn spans(&self) -> Spans {
        Spans {
            tp: self.tp,
            cp: self.tp * self.cp,
            pp: self.tp * self.cp * self.pp,
            dp: self.gpus(),
        }
    }

    /// Parameters on the most loaded GPU: the first pipeline stage's blocks plus the input
    /// embedding and the small shared tensors, split by TP; with one stage also the untied
    /// output projection (Megatron's "most loaded shard").
    pub fn params_per_gpu(&self, counts: &ParamCounts, tied: bool) -> f64 {
        let embeddings = if tied { 1 } else { 2 } * counts.embedding;
        let other = counts.total.saturating_sub(counts.blocks + embeddings) as f64;
        let pp = self.pp.max(1) as f64;
        let tp = self.tp.max(1) as f64;
        let mut local = (counts.blocks as f64 / pp + counts.embedding as f64 + other) / tp;
        if !tied && self.pp <= 1 {
            local += counts.embedding as f64 / tp;
        }
        local
    }

    /// Parameters of the largest ZeRO-3 / FSDP unit on a GPU (one block, or the embedding).
    pub fn fsdp_unit(&self, counts: &ParamCounts) -> f64 {
        counts.per_layer.max(counts.embedding) as f64 / self.tp.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::builtin;

    fn layout(tp: u64, pp: u64) -> Layout {
        Layout {
            dp: 1,
            tp,
            pp,
            cp: 1,
            zero: ZeroStage::None,
            shard_group: None,
            sp: false,
            recompute: Recompute::None,
            micro_batch: 1,
            grad_accum: 1,
        }
    }

    #[test]
    fn one_gpu_holds_everything() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let counts = model.param_counts();
        let got = layout(1, 1).params_per_gpu(&counts, model.tied_embeddings);
        assert_eq!(got, counts.total as f64);
    }

    /// Playbook PP = 8 figure, Llama-3.1-8B: the first stage holds 1/8 of the blocks plus the
    /// whole input embedding: 2.604 GiB of bf16 parameters.
    #[test]
    fn first_stage_holds_the_embedding() {
        let model = builtin::find("llama-3.1-8b").expect("built-in");
        let counts = model.param_counts();
        let stage = layout(1, 8).params_per_gpu(&counts, model.tied_embeddings);
        let want = counts.blocks as f64 / 8.0 + counts.embedding as f64 + 4096.0;
        assert_eq!(stage, want);
        let gib = 2.0 * stage / (1u64 << 30) as f64;
        assert_eq!((gib * 1000.0).round() / 1000.0, 2.604);
    }
}
