//! Bytes per parameter of each training recipe (precision and optimizer), split into the parts
//! that ZeRO / FSDP shard at different stages. Figures: `reference/planner-math.md` §1.1.

use serde::Serialize;

/// A precision recipe: what each parameter costs before the optimizer's moments are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precision {
    /// fp32 weights and gradients.
    Fp32,
    /// bf16 or fp16 weights and gradients with fp32 master weights (ZeRO's 2 + 2 + 12).
    Mixed,
    /// Mixed, plus an fp32 gradient-accumulation buffer (the Playbook's 20 B/param).
    Bf16Fp32Accum,
    /// Megatron-LM bf16 params with fp32 main grads (18 B/param, 6 + 12/d distributed).
    MegatronBf16,
    /// Megatron-LM fp16 params and grads with fp32 main params and grads (20, 4 + 16/d).
    MegatronFp16,
    /// Transformer Engine FP8: fp32 weights and gradients, FP8 only in the matmuls.
    TeFp8,
    /// FP8-LM O3: FP8 weights and grads, fp16 accumulated grads and master, FP8/fp16 moments.
    Fp8LmO3,
    /// DeepSeek-V3: FP8 weights, bf16 grads and moments, fp32 master and grad accumulation.
    DeepSeekV3Fp8,
    /// Nanotron FP8: FP8 weights, grads and moments, bf16 master, fp32 grad accumulation.
    NanotronFp8,
    /// PyTorch's autocast (`torch.autocast` with fp16 or bf16, the Hugging Face Trainer's
    /// `fp16` / `bf16`): fp32 weights, gradients and moments as fp32 training, the matmuls in
    /// 16 bits with their own 16-bit copies of their inputs and weights (counted with the
    /// activations, `activations::ActivationSettings::autocast`).
    Autocast,
}

/// The optimizer, which sets the state kept per parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    /// Adam / AdamW: first and second moments.
    AdamW,
    /// bitsandbytes 8-bit Adam: 1-byte moments with an fp32 absmax per 2048-element block.
    AdamW8bit,
    /// SGD with momentum: one moment.
    Sgd,
}

/// bitsandbytes' block-wise quantization block (Dettmers et al. 2021).
const BNB_BLOCK: f64 = 2048.0;

/// Bytes per parameter, by what shards them: ZeRO-1 shards `master` and `optimizer`, ZeRO-2
/// also `grads` and `grad_accum`, ZeRO-3 also `weights`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct StateBytes {
    /// The model's weights in their stored precision.
    pub weights: f64,
    /// The gradients the backward pass writes.
    pub grads: f64,
    /// A gradient-accumulation buffer kept across micro-batches, when the recipe has one.
    pub grad_accum: f64,
    /// fp32 (or fp16) master weights and master gradients kept by the optimizer.
    pub master: f64,
    /// Optimizer moments.
    pub optimizer: f64,
}

impl StateBytes {
    pub fn total(&self) -> f64 {
        self.weights + self.grads + self.grad_accum + self.master + self.optimizer
    }
}

impl Precision {
    /// Bytes of one activation element under this recipe (the activation formulas assume 2).
    pub fn activation_bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            _ => 2.0,
        }
    }

    /// Whether the forward pass runs under PyTorch's autocast over fp32 weights.
    pub fn autocast(self) -> bool {
        self == Precision::Autocast
    }

    /// Whether the recipe's framework computes the loss in place on its saved softmax
    /// (Megatron-LM's vocab-parallel cross entropy) rather than with PyTorch's `cross_entropy`.
    pub fn fused_loss(self) -> bool {
        matches!(self, Precision::MegatronBf16 | Precision::MegatronFp16)
    }

    /// State bytes per parameter with `optimizer`.
    pub fn state_bytes(self, optimizer: Optimizer) -> StateBytes {
        // (weights, grads, grad_accum, master, Adam moments) per the table in §1.1.
        let (weights, grads, grad_accum, master, adam) = match self {
            Precision::Fp32 | Precision::TeFp8 | Precision::Autocast => (4.0, 4.0, 0.0, 0.0, 8.0),
            Precision::Mixed => (2.0, 2.0, 0.0, 4.0, 8.0),
            Precision::Bf16Fp32Accum => (2.0, 2.0, 4.0, 4.0, 8.0),
            Precision::MegatronBf16 => (2.0, 4.0, 0.0, 4.0, 8.0),
            // The fp32 main grads live with the optimizer (sharded by the distributed optimizer).
            Precision::MegatronFp16 => (2.0, 2.0, 0.0, 8.0, 8.0),
            Precision::Fp8LmO3 => (1.0, 1.0, 2.0, 2.0, 3.0),
            Precision::DeepSeekV3Fp8 => (1.0, 2.0, 4.0, 4.0, 4.0),
            Precision::NanotronFp8 => (1.0, 1.0, 4.0, 2.0, 2.0),
        };
        let optimizer = match optimizer {
            Optimizer::AdamW => adam,
            Optimizer::Sgd => adam / 2.0,
            Optimizer::AdamW8bit => 2.0 * (1.0 + 4.0 / BNB_BLOCK),
        };
        StateBytes {
            weights,
            grads,
            grad_accum,
            master,
            optimizer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(p: Precision) -> f64 {
        p.state_bytes(Optimizer::AdamW).total()
    }

    #[test]
    fn bytes_per_param_match_the_playbook_and_zero() {
        // ZeRO (Rajbhandari et al. 2020) §3.1: mixed precision Adam is 2 + 2 + 12 = 16.
        assert_eq!(total(Precision::Mixed), 16.0);
        // Ultra-Scale Playbook: fp32 + Adam 16; bf16 with fp32 grad accumulation 20.
        assert_eq!(total(Precision::Fp32), 16.0);
        assert_eq!(total(Precision::Bf16Fp32Accum), 20.0);
        // Playbook FP8 table: TE 16, FP8-LM O3 9, DeepSeek-V3 15, Nanotron 10.
        assert_eq!(total(Precision::TeFp8), 16.0);
        assert_eq!(total(Precision::Fp8LmO3), 9.0);
        assert_eq!(total(Precision::DeepSeekV3Fp8), 15.0);
        assert_eq!(total(Precision::NanotronFp8), 10.0);
        // Megatron-LM README, distributed optimizer table (non-distributed column).
        assert_eq!(total(Precision::MegatronBf16), 18.0);
        assert_eq!(total(Precision::MegatronFp16), 20.0);
    }

    /// Autocast keeps fp32 training's states (PyTorch's AMP examples step an fp32 model); its
    /// 16-bit copies of the weights are counted with the activations.
    #[test]
    fn autocast_keeps_fp32_states_and_16_bit_activations() {
        assert_eq!(
            Precision::Autocast.state_bytes(Optimizer::AdamW),
            Precision::Fp32.state_bytes(Optimizer::AdamW)
        );
        assert_eq!(total(Precision::Autocast), 16.0);
        assert_eq!(Precision::Autocast.activation_bytes(), 2.0);
        assert!(Precision::Autocast.autocast() && !Precision::Mixed.autocast());
        assert!(!Precision::Autocast.fused_loss());
    }

    #[test]
    fn eight_bit_adam_is_about_ten_bytes() {
        // Dettmers et al. 2021: 1 + 1 byte moments plus 4 B absmax per 2048 elements.
        let b = Precision::Mixed.state_bytes(Optimizer::AdamW8bit).total();
        assert!((b - 10.004).abs() < 0.0005, "{b}");
    }

    #[test]
    fn playbook_model_state_totals() {
        // Ultra-Scale Playbook table: 1B / 7B / 70B / 405B at 16 B/param and 20 with fp32
        // gradient accumulation, in GB = 1e9.
        for (params, gb16, gb20) in [
            (1e9, 16.0, 20.0),
            (7e9, 112.0, 140.0),
            (70e9, 1120.0, 1400.0),
            (405e9, 6480.0, 8100.0),
        ] {
            assert_eq!(params * total(Precision::Mixed) / 1e9, gb16);
            assert_eq!(params * total(Precision::Bf16Fp32Accum) / 1e9, gb20);
        }
    }
}
