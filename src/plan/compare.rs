//! What other tools' formulas say for a candidate, printed next to memprof's estimate so users
//! can reconcile the numbers they already know: DeepSpeed's ZeRO-2/3 model-state estimators
//! (either release's ZeRO-2 formula) and Megatron-LM's theoretical memory.

use super::activations::Recompute;
use super::cost::GPUS_PER_NODE;
use super::deepspeed::{self, Cluster, Offload, Version};
use super::megatron::{self, MegatronArgs};
use super::states::ZeroStage;
use super::train::{Candidate, TrainSetup};

/// One comparison figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub source: &'static str,
    /// What the figure covers.
    pub covers: &'static str,
    pub bytes: u64,
    /// memprof's estimate of the same thing.
    pub memprof_bytes: u64,
}

/// The figures that apply to `candidate`: DeepSpeed's for ZeRO-2/3 without model
/// parallelism, Megatron's for DP / distributed optimizer.
pub fn comparisons(
    setup: &TrainSetup,
    candidate: &Candidate,
    deepspeed_version: Version,
) -> Vec<Comparison> {
    let l = &candidate.layout;
    let counts = setup.model.param_counts();
    let mut out = Vec::new();
    let gpus = l.dp * l.cp;
    if l.tp == 1 && l.pp == 1 && l.zero >= ZeroStage::Gradients {
        let per_node = gpus.min(GPUS_PER_NODE);
        let cluster = Cluster {
            nodes: gpus.div_ceil(per_node).max(1),
            gpus_per_node: per_node.max(1),
            buffer_factor: 1.5,
        };
        let estimate = if l.zero == ZeroStage::Gradients {
            deepspeed::zero2(counts.total, &cluster, false, deepspeed_version)
        } else {
            deepspeed::zero3(
                counts.total,
                counts.largest_module,
                &cluster,
                Offload::None,
                true,
            )
        };
        out.push(Comparison {
            source: "DeepSpeed estimate_zero_model_states_mem_needs",
            covers: "model states",
            bytes: estimate.gpu,
            memprof_bytes: candidate.memory.params
                + candidate.memory.grads
                + candidate.memory.optimizer,
        });
    }
    if l.zero <= ZeroStage::Optimizer && l.cp == 1 {
        let mut a = MegatronArgs::from_model(&setup.model, l.tp, l.pp, l.dp);
        a.distributed_optimizer = l.zero == ZeroStage::Optimizer;
        a.seq = setup.seq_len;
        a.micro_batch = l.micro_batch;
        a.sequence_parallel = l.sp && l.tp > 1;
        a.selective = l.recompute == Recompute::Selective;
        a.num_microbatches = Some(l.grad_accum);
        out.push(Comparison {
            source: "Megatron-LM theoretical_memory_usage",
            covers: "weights + optimizer + activations",
            bytes: (megatron::weight_and_optimizer_memory(&a) + megatron::activation_memory(&a))
                .round() as u64,
            memprof_bytes: candidate.memory.total,
        });
    }
    out
}
