//! Training memory per GPU for one layout: model states, activations, the headroom kept for
//! the CUDA context and allocator fragmentation, whether it fits, and what a step costs.

use super::activations::{activation_memory, ActivationSettings, Attention};
use super::cost::{step_cost, CostInputs, StepCost};
use super::layout::Layout;
use super::model::ModelConfig;
use super::recipe::{Optimizer, Precision};
use super::states::model_states;

/// Memory kept free besides the estimate: the CUDA context and library workspaces, and a
/// fraction of the estimate for the caching allocator's fragmentation (5-10% with expandable
/// segments, more without; `reference/planner-math.md` §5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Headroom {
    pub context_bytes: u64,
    pub fragmentation: f64,
}

impl Default for Headroom {
    fn default() -> Self {
        Headroom {
            context_bytes: 1 << 30,
            fragmentation: 0.10,
        }
    }
}

impl Headroom {
    /// Bytes to keep free next to an estimate of `total` bytes.
    pub fn bytes_for(&self, total: u64) -> u64 {
        self.context_bytes + (total as f64 * self.fragmentation).round() as u64
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
    pub gpu_memory: u64,
    pub headroom: Headroom,
}

/// Per-GPU bytes of a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemoryBreakdown {
    pub params: u64,
    pub grads: u64,
    pub optimizer: u64,
    pub activations: u64,
    /// The sum of the four above (headroom not included).
    pub total: u64,
}

/// One evaluated layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub layout: Layout,
    pub memory: MemoryBreakdown,
    /// Bytes kept free next to `memory.total`.
    pub headroom: u64,
    pub fits: bool,
    pub cost: StepCost,
}

impl Candidate {
    /// GPU memory left after the estimate and the headroom (negative when it does not fit).
    pub fn spare_bytes(&self, gpu_memory: u64) -> i128 {
        gpu_memory as i128 - self.memory.total as i128 - self.headroom as i128
    }
}

fn bytes(x: f64) -> u64 {
    // Estimates are non-negative and far below u64::MAX; `as` saturates either way.
    x.round() as u64
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
    let settings = ActivationSettings {
        seq_len: setup.seq_len,
        micro_batch: layout.micro_batch,
        tp: layout.tp,
        sp: layout.sp && layout.tp > 1,
        cp: layout.cp,
        pp: layout.pp,
        micro_batches: layout.grad_accum,
        recompute: layout.recompute,
        attention: setup.attention,
        element_bytes,
    };
    let activations = activation_memory(model, &settings).total();
    let mut memory = MemoryBreakdown {
        params: bytes(states.params),
        grads: bytes(states.grads),
        optimizer: bytes(states.optimizer),
        activations: bytes(activations),
        total: 0,
    };
    memory.total = memory.params + memory.grads + memory.optimizer + memory.activations;
    let headroom = setup.headroom.bytes_for(memory.total);
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
        fits: memory.total.saturating_add(headroom) <= setup.gpu_memory,
        cost,
    }
}
