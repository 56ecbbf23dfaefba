//! Model-state memory per GPU (weights, gradients, optimizer) under data-parallel sharding:
//! DDP, ZeRO-1/2/3, FSDP (full shard = ZeRO-3, grad-op = ZeRO-2) and hybrid sharding, after
//! tensor and pipeline parallelism have split the model. `reference/planner-math.md` §1.2-1.5.

use super::recipe::StateBytes;

/// What ZeRO / FSDP shards across the data-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ZeroStage {
    /// Plain data parallelism (DDP with `gradient_as_bucket_view`, FSDP `NO_SHARD`).
    None,
    /// Optimizer states (Megatron's distributed optimizer).
    Optimizer,
    /// Optimizer states and gradients (FSDP `SHARD_GRAD_OP`).
    Gradients,
    /// Optimizer states, gradients and parameters (FSDP `FULL_SHARD`).
    Parameters,
}

impl ZeroStage {
    pub const ALL: [ZeroStage; 4] = [
        ZeroStage::None,
        ZeroStage::Optimizer,
        ZeroStage::Gradients,
        ZeroStage::Parameters,
    ];

    /// The stage number `--zero` takes.
    pub fn number(self) -> u8 {
        match self {
            ZeroStage::None => 0,
            ZeroStage::Optimizer => 1,
            ZeroStage::Gradients => 2,
            ZeroStage::Parameters => 3,
        }
    }

    pub fn from_number(n: u8) -> Option<ZeroStage> {
        ZeroStage::ALL.into_iter().find(|s| s.number() == n)
    }
}

/// Model-state bytes on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StateMemory {
    /// Weights, plus the gathered working set under ZeRO-3.
    pub params: f64,
    /// Gradients and the gradient-accumulation buffer.
    pub grads: f64,
    /// Master copies and optimizer moments.
    pub optimizer: f64,
}

impl StateMemory {
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer
    }
}

/// Model states of a GPU holding `params` parameters (its TP / PP shard), sharded `group` ways
/// (DP x CP, or the shard group of hybrid sharding). Under ZeRO-3 the GPU also holds the
/// gathered working set: `unit` parameters being computed plus one prefetched, in the weight
/// precision, and that unit's unsharded gradient; never more than the whole shard's weights,
/// and only the part that lives on other GPUs.
pub fn model_states(
    params: f64,
    bytes: &StateBytes,
    stage: ZeroStage,
    group: u64,
    unit: f64,
) -> StateMemory {
    let n = group.max(1) as f64;
    let shard = |stage_shards: bool, b: f64| {
        if stage_shards {
            params * b / n
        } else {
            params * b
        }
    };
    let grads_sharded = stage >= ZeroStage::Gradients;
    let mut memory = StateMemory {
        params: shard(stage >= ZeroStage::Parameters, bytes.weights),
        grads: shard(grads_sharded, bytes.grads) + shard(grads_sharded, bytes.grad_accum),
        optimizer: shard(
            stage >= ZeroStage::Optimizer,
            bytes.master + bytes.optimizer,
        ),
    };
    if stage == ZeroStage::Parameters {
        let working = (2.0 * unit * bytes.weights + unit * bytes.grads).min(params * bytes.weights);
        memory.params += working * (n - 1.0) / n;
    }
    memory
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::recipe::{Optimizer, Precision};

    fn per_device_gb(params: f64, stage: ZeroStage, n: u64) -> f64 {
        let bytes = Precision::Mixed.state_bytes(Optimizer::AdamW);
        model_states(params, &bytes, stage, n, 0.0).total() / 1e9
    }

    /// Rajbhandari et al. 2020 (ZeRO), Table 1: per-device GB (1e9) for P_os, P_os+g,
    /// P_os+g+p. The paper truncates some cells (513.5 -> 513, 4187.5 -> 4187), so each figure
    /// must equal the formula truncated or rounded to the printed digits.
    #[test]
    fn zero_paper_table_1() {
        let rows: [(u64, [[f64; 3]; 3]); 6] = [
            (
                1,
                [
                    [120.0, 120.0, 120.0],
                    [2048.0, 2048.0, 2048.0],
                    [16000.0, 16000.0, 16000.0],
                ],
            ),
            (
                4,
                [
                    [52.5, 41.3, 30.0],
                    [896.0, 704.0, 512.0],
                    [7000.0, 5500.0, 4000.0],
                ],
            ),
            (
                16,
                [
                    [35.6, 21.6, 7.5],
                    [608.0, 368.0, 128.0],
                    [4750.0, 2875.0, 1000.0],
                ],
            ),
            (
                64,
                [
                    [31.4, 16.6, 1.88],
                    [536.0, 284.0, 32.0],
                    [4187.0, 2218.0, 250.0],
                ],
            ),
            (
                256,
                [
                    [30.4, 15.4, 0.47],
                    [518.0, 263.0, 8.0],
                    [4046.0, 2054.0, 62.5],
                ],
            ),
            (
                1024,
                [
                    [30.1, 15.1, 0.12],
                    [513.0, 257.0, 2.0],
                    [4011.0, 2013.0, 15.6],
                ],
            ),
        ];
        let models = [7.5e9, 128e9, 1e12];
        let stages = [
            ZeroStage::Optimizer,
            ZeroStage::Gradients,
            ZeroStage::Parameters,
        ];
        for (n, cells) in rows {
            for (params, row) in models.iter().zip(cells) {
                for (stage, want) in stages.iter().zip(row) {
                    let got = per_device_gb(*params, *stage, n);
                    let text = want.to_string();
                    let decimals = text.split('.').nth(1).map_or(0, str::len) as i32;
                    let scale = 10f64.powi(decimals);
                    let rounded = (got * scale).round() / scale;
                    let truncated = (got * scale).trunc() / scale;
                    assert!(
                        rounded == want || truncated == want,
                        "psi={params} n={n} {stage:?}: got {got}, paper {want}"
                    );
                }
            }
        }
    }

    /// ZeRO paper Figure 1: 7.5B on 64 GPUs, 120 / 31.4 / 16.6 / 1.9 GB.
    #[test]
    fn zero_paper_figure_1() {
        let gb = |stage| (per_device_gb(7.5e9, stage, 64) * 10.0).round() / 10.0;
        assert_eq!(gb(ZeroStage::None), 120.0);
        assert_eq!(gb(ZeroStage::Optimizer), 31.4);
        assert_eq!(gb(ZeroStage::Gradients), 16.6);
        assert_eq!(gb(ZeroStage::Parameters), 1.9);
    }

    /// Megatron-LM README, distributed-optimizer table: bytes per parameter with the
    /// optimizer sharded over d ranks (ZeRO-1): bf16/fp32 6 + 12/d, fp16/fp16 4 + 16/d,
    /// fp32/fp32 8 + 8/d.
    #[test]
    fn megatron_distributed_optimizer_bytes() {
        for d in [1u64, 2, 8, 64] {
            let df = d as f64;
            for (precision, want) in [
                (Precision::MegatronBf16, 6.0 + 12.0 / df),
                (Precision::MegatronFp16, 4.0 + 16.0 / df),
                (Precision::Fp32, 8.0 + 8.0 / df),
            ] {
                let bytes = precision.state_bytes(Optimizer::AdamW);
                let got = model_states(1.0, &bytes, ZeroStage::Optimizer, d, 0.0).total();
                assert!((got - want).abs() < 1e-12, "{precision:?} d={d}: {got}");
            }
        }
    }

    /// Playbook: with fp32 gradient accumulation, ZeRO-2/3 add 4 psi / N_d to the gradients.
    #[test]
    fn fp32_accumulation_is_sharded_from_zero_2() {
        let bytes = Precision::Bf16Fp32Accum.state_bytes(Optimizer::AdamW);
        let z1 = model_states(1.0, &bytes, ZeroStage::Optimizer, 8, 0.0);
        let z2 = model_states(1.0, &bytes, ZeroStage::Gradients, 8, 0.0);
        assert_eq!(z1.grads, 6.0);
        assert_eq!(z2.grads, 6.0 / 8.0);
    }
}
