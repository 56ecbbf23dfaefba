//! Training memory per GPU for one layout: model states, activations, the headroom kept for
//! the CUDA context and allocator fragmentation, whether it fits, and what a step costs.

use super::activations::{activation_memory, ActivationSettings, Attention, Loss};
use super::cost::{step_cost, CostInputs, StepCost};
use super::layout::Layout;
use super::model::ModelConfig;
use super::recipe::{Optimizer, Precision};
use super::states::model_states;
use super::verdict::Verdict;

/// Memory kept free besides the estimate: the CUDA context and library workspaces, the
/// communication libraries' buffers when a job spans GPUs (NCCL keeps `NCCL_BUFFSIZE`, 4 MiB by
/// default, per channel and peer of each communicator), and a fraction of the estimate for the
/// caching allocator's fragmentation (5-10% with expandable segments, more without). A layout
/// is ranked first only when it fits with all of it kept free (`plan::verdict`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    pub context_bytes: u64,
    /// Counted when the job has more than one GPU.
    pub comm_bytes: u64,
    pub fragmentation: f64,
}

impl Default for Headroom {
    fn default() -> Self {
        Headroom {
            context_bytes: 1 << 30,
            comm_bytes: 1 << 30,
            fragmentation: 0.10,
        }
    }
}

impl Headroom {
    /// Bytes to keep free next to an estimate of `total` bytes on one of `gpus` GPUs.
    pub fn bytes_for(&self, total: u64, gpus: u64) -> HeadroomBytes {
        HeadroomBytes {
            context: self.context_bytes,
            comm: if gpus > 1 { self.comm_bytes } else { 0 },
            fragmentation: (total as f64 * self.fragmentation).round() as u64,
        }
    }
}

/// What is fixed for every candidate: the model, precision and hardware.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainSetup {
    pub model: ModelConfig,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub seq_len: u64,
    pub attention: Attention,
    /// The loss runs under `torch.compile` (ignored with the Megatron-LM recipes, whose loss
    /// is their own).
    pub compiled_loss: bool,
    pub gpu_memory: u64,
    pub headroom: Headroom,
}

impl TrainSetup {
    /// How the loss is computed: Megatron-LM's with its recipes, else PyTorch's, compiled or
    /// eager.
    pub fn loss(&self) -> Loss {
        if self.precision.fused_loss() {
            Loss::Megatron
        } else if self.compiled_loss {
            Loss::Compiled
        } else {
            Loss::Eager
        }
    }
}

/// Per-GPU bytes of a candidate, by term (each rounded to whole bytes on its own, so the terms
/// add up to `total` exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryBreakdown {
    /// This GPU's share of the weights.
    pub params_sharded: u64,
    /// ZeRO-3 / FSDP: other GPUs' weights all-gathered for the units in flight.
    pub params_gathered: u64,
    /// Gradients (and the accumulation buffer), sharded from ZeRO-2.
    pub grads: u64,
    /// ZeRO-3 / FSDP: a unit's full gradient before its reduce-scatter.
    pub grads_gathered: u64,
    pub optimizer: u64,
    /// Parameters of one ZeRO-3 / FSDP unit, as assumed by the gathered terms (0 otherwise).
    pub unit_params: u64,
    /// The transformer layers by the published per-layer formula.
    pub activations_layers: u64,
    /// This model's layer shapes against that formula (negative when it stores less); under
    /// autocast also its fp32 and 16-bit copies and its matmul weights' 16-bit copies.
    pub activations_shape: i64,
    /// One layer rebuilt during full recompute's backward pass.
    pub activations_recompute: u64,
    /// Embedding output, final norm, output-projection input and fp32 logits.
    pub activations_head: u64,
    /// The sum of every term above (headroom not included).
    pub total: u64,
}

impl MemoryBreakdown {
    /// Weights on the GPU, sharded and gathered.
    pub fn params(&self) -> u64 {
        self.params_sharded + self.params_gathered
    }

    /// Gradients on the GPU, sharded and gathered.
    pub fn all_grads(&self) -> u64 {
        self.grads + self.grads_gathered
    }

    /// Every activation term.
    pub fn activations(&self) -> u64 {
        let signed = (self.activations_layers + self.activations_recompute + self.activations_head)
            as i128
            + i128::from(self.activations_shape);
        u64::try_from(signed.max(0)).unwrap_or(u64::MAX)
    }
}

/// The memory kept free next to a candidate's estimate, by term.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct HeadroomBytes {
    pub context: u64,
    pub comm: u64,
    pub fragmentation: u64,
}

impl HeadroomBytes {
    pub fn total(&self) -> u64 {
        self.context + self.comm + self.fragmentation
    }
}

/// One evaluated layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub layout: Layout,
    pub memory: MemoryBreakdown,
    /// Bytes kept free next to `memory.total`.
    pub headroom: HeadroomBytes,
    /// `verdict == Verdict::Fit`.
    pub fits: bool,
    pub verdict: Verdict,
    pub cost: StepCost,
}

impl Candidate {
    /// GPU memory left after the estimate and the headroom (negative when it does not fit).
    pub fn spare_bytes(&self, gpu_memory: u64) -> i128 {
        gpu_memory as i128 - self.memory.total as i128 - self.headroom.total() as i128
    }
}

fn bytes(x: f64) -> u64 {
    // Estimates are non-negative and far below u64::MAX; `as` saturates either way.
    x.round() as u64
}

/// What activation memory depends on, for `layout` of `setup`.
pub fn activation_settings(setup: &TrainSetup, layout: &Layout) -> ActivationSettings {
    ActivationSettings {
        seq_len: setup.seq_len,
        micro_batch: layout.micro_batch,
        tp: layout.tp,
        sp: layout.sp && layout.tp > 1,
        cp: layout.cp,
        pp: layout.pp,
        micro_batches: layout.grad_accum,
        recompute: layout.recompute,
        attention: setup.attention,
        element_bytes: setup.precision.activation_bytes(),
        loss: setup.loss(),
        autocast: setup.precision.autocast(),
    }
}

/// Evaluates `layout` for `setup`.
pub fn evaluate(setup: &TrainSetup, layout: &Layout) -> Candidate {
    let model = &setup.model;
    let counts = model.param_counts();
    let state = setup.precision.state_bytes(setup.optimizer);
    let params = layout.params_per_gpu(&counts, model.tied_embeddings);
    let states = model_states(
        params,
        &state,
        layout.zero,
        layout.shard_degree(),
        layout.fsdp_unit(&counts),
    );
    let element_bytes = setup.precision.activation_bytes();
    let activations = activation_memory(model, &activation_settings(setup, layout));
    let mut memory = MemoryBreakdown {
        params_sharded: bytes(states.params_sharded),
        params_gathered: bytes(states.params_gathered),
        grads: bytes(states.grads),
        grads_gathered: bytes(states.grads_gathered),
        optimizer: bytes(states.optimizer),
        unit_params: bytes(states.unit_params),
        activations_layers: bytes(activations.layers),
        activations_shape: (activations.shape + activations.weight_casts).round() as i64,
        activations_recompute: bytes(activations.recompute_peak),
        activations_head: bytes(activations.head()),
        total: 0,
    };
    memory.total = memory.params() + memory.all_grads() + memory.optimizer + memory.activations();
    let headroom = setup.headroom.bytes_for(memory.total, layout.gpus());
    let verdict = Verdict::judge(memory.total, headroom.total(), setup.gpu_memory);
    let cost = step_cost(
        &CostInputs {
            model,
            counts: &counts,
            state: &state,
            seq_len: setup.seq_len,
            element_bytes,
            params,
        },
        layout,
    );
    Candidate {
        layout: *layout,
        memory,
        headroom,
        fits: verdict == Verdict::Fit,
        verdict,
        cost,
    }
}
