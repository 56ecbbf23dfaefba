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

/// Model-state bytes on one GPU, by term. `params_sharded + grads + optimizer` is the ZeRO
/// paper's figure; the two `*_gathered` terms are what ZeRO-3 / FSDP `FULL_SHARD` hold on top
/// while a unit is being computed.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StateMemory {
    /// This GPU's share of the weights (all of them below ZeRO-3).
    pub params_sharded: f64,
    /// ZeRO-3: the other GPUs' shares of the units all-gathered at once (the unit being
    /// computed and the one prefetched), in the weight precision.
    pub params_gathered: f64,
    /// Gradients and the gradient-accumulation buffer, sharded from ZeRO-2.
    pub grads: f64,
    /// ZeRO-3: the unit's full gradient before it is reduce-scattered.
    pub grads_gathered: f64,
    /// Master copies and optimizer moments.
    pub optimizer: f64,
    /// Parameters of the ZeRO-3 / FSDP unit the gathered terms assume (0 below ZeRO-3).
    pub unit_params: f64,
}

impl StateMemory {
    pub fn total(&self) -> f64 {
        self.params_sharded
            + self.params_gathered
            + self.grads
            + self.grads_gathered
            + self.optimizer
    }
}

/// Units all-gathered at once under ZeRO-3 / FSDP: the one being computed and the one
/// prefetched (FSDP's backward prefetch, DeepSpeed's prefetch bucket).
pub const UNITS_IN_FLIGHT: f64 = 2.0;

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
        params_sharded: shard(stage >= ZeroStage::Parameters, bytes.weights),
        grads: shard(grads_sharded, bytes.grads) + shard(grads_sharded, bytes.grad_accum),
        optimizer: shard(
            stage >= ZeroStage::Optimizer,
            bytes.master + bytes.optimizer,
        ),
        ..StateMemory::default()
    };
    if stage == ZeroStage::Parameters {
        let remote = (n - 1.0) / n;
        let whole = params * bytes.weights;
        let gathered = (UNITS_IN_FLIGHT * unit * bytes.weights).min(whole);
        let grad = (unit * bytes.grads).min(whole - gathered);
        memory.params_gathered = gathered * remote;
        memory.grads_gathered = grad * remote;
        memory.unit_params = unit;
    }
    memory
}

/// The ZeRO paper's per-GPU model states (Rajbhandari et al. 2020, section 5, Figure 1 and
/// Table 1): `(W + G + K) psi` replicated, `P_os` shards K, `P_os+g` also G, `P_os+g+p` also
/// W, with W, G and K this recipe's bytes per parameter (the paper's mixed-precision Adam is
/// W = G = 2, K = 12). Written from the paper's formulas, apart from `model_states`, so the two
/// check each other.
pub fn zero_paper(params: f64, bytes: &StateBytes, stage: ZeroStage, group: u64) -> f64 {
    let n = group.max(1) as f64;
    let w = bytes.weights;
    let g = bytes.grads + bytes.grad_accum;
    let k = bytes.master + bytes.optimizer;
    params
        * match stage {
            ZeroStage::None => w + g + k,
            ZeroStage::Optimizer => w + g + k / n,
            ZeroStage::Gradients => w + (g + k) / n,
            ZeroStage::Parameters => (w + g + k) / n,
        }
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

    /// The paper's figure is the sum of three named terms for every stage and recipe, and
    /// ZeRO-3's gathered units are the only addition: 7.5B on 64 GPUs, mixed-precision Adam,
    /// is the paper's 1.875 GB plus two 100M-parameter bf16 units and one unit's gradient,
    /// 63/64 of each held for other GPUs.
    #[test]
    fn zero_paper_is_the_sharded_terms() {
        use crate::plan::recipe::Optimizer::{AdamW, AdamW8bit, Sgd};
        let recipes = [
            Precision::Mixed,
            Precision::Fp32,
            Precision::Bf16Fp32Accum,
            Precision::MegatronBf16,
            Precision::NanotronFp8,
        ];
        for precision in recipes {
            for optimizer in [AdamW, Sgd, AdamW8bit] {
                let bytes = precision.state_bytes(optimizer);
                for stage in ZeroStage::ALL {
                    for n in [1u64, 8, 64] {
                        let m = model_states(7.5e9, &bytes, stage, n, 1e8);
                        let paper = zero_paper(7.5e9, &bytes, stage, n);
                        let sharded = m.params_sharded + m.grads + m.optimizer;
                        assert!((sharded - paper).abs() <= paper * 1e-12, "{stage:?} {n}");
                        let added = m.total() - sharded;
                        if stage == ZeroStage::Parameters && n > 1 {
                            let remote = (n as f64 - 1.0) / n as f64;
                            let want = (2.0 * bytes.weights + bytes.grads) * 1e8 * remote;
                            assert!((added - want).abs() < 1.0, "{precision:?} {n}");
                        } else {
                            assert_eq!(added, 0.0, "{precision:?} {stage:?} {n}");
                        }
                    }
                }
            }
        }
        let bytes = Precision::Mixed.state_bytes(AdamW);
        let z3 = model_states(7.5e9, &bytes, ZeroStage::Parameters, 64, 1e8);
        assert_eq!(
            zero_paper(7.5e9, &bytes, ZeroStage::Parameters, 64),
            1.875e9
        );
        assert_eq!(z3.unit_params, 1e8);
        assert_eq!(z3.params_gathered, 2.0 * 2.0 * 1e8 * 63.0 / 64.0);
        assert_eq!(z3.grads_gathered, 2.0 * 1e8 * 63.0 / 64.0);
    }
}
