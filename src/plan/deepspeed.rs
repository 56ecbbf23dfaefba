//! DeepSpeed's model-state estimators (`estimate_zero2_model_states_mem_needs`,
//! `estimate_zero3_model_states_mem_needs`), ported with their integer arithmetic, so users
//! can compare memprof's figures with the numbers DeepSpeed prints. The ZeRO-2 GPU formula
//! changed between releases; `Version` picks one. `reference/planner-math.md` §1.3.

/// Which DeepSpeed release's ZeRO-2 formula to follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// microsoft/DeepSpeed and its docs: `4 P + 16 P / gpus`.
    Legacy,
    /// deepspeedai/DeepSpeed today: `2 P + 18 P / gpus`.
    Current,
}

/// The cluster and options both estimators take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cluster {
    pub nodes: u64,
    pub gpus_per_node: u64,
    /// DeepSpeed's `additional_buffer_factor` (1.5 by default).
    pub buffer_factor: f64,
}

/// Estimated bytes per CPU (node) and per GPU, as DeepSpeed returns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub cpu: u64,
    pub gpu: u64,
}

/// Where ZeRO-3 offloads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    None,
    Optimizer,
    ParamsAndOptimizer,
}

/// `estimate_zero2_model_states_mem_needs(total_params, ...)`.
pub fn zero2(params: u64, cluster: &Cluster, cpu_offload: bool, version: Version) -> Estimate {
    let gpus = cluster.nodes * cluster.gpus_per_node;
    let p = params as f64;
    let abf = cluster.buffer_factor;
    if cpu_offload {
        Estimate {
            gpu: 2 * params,
            cpu: (p * (4 * gpus).max(16) as f64 * abf) as u64,
        }
    } else {
        let gpu = match version {
            Version::Legacy => 4 * params + (16.0 * p / gpus as f64) as u64,
            Version::Current => 2 * params + (18.0 * p / gpus as f64) as u64,
        };
        Estimate {
            gpu,
            cpu: (p * 4.0 * cluster.gpus_per_node as f64 * abf) as u64,
        }
    }
}

/// `estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, ...)`.
pub fn zero3(
    params: u64,
    largest_layer: u64,
    cluster: &Cluster,
    offload: Offload,
    zero_init: bool,
) -> Estimate {
    let gpus = (cluster.nodes * cluster.gpus_per_node) as f64;
    let gpn = cluster.gpus_per_node as f64;
    let gpus_factor = 1.0 / cluster.nodes as f64;
    let abf = cluster.buffer_factor;
    let p = params as f64;
    let largest = 4 * largest_layer;
    let cpu = |zero_init_factor: f64, floor_factor: f64| -> u64 {
        if zero_init {
            (p * zero_init_factor * gpus_factor * abf) as u64
        } else {
            (p * (4.0 * gpn).max(floor_factor * gpus_factor) * abf) as u64
        }
    };
    match offload {
        Offload::ParamsAndOptimizer => Estimate {
            gpu: largest,
            cpu: cpu(18.0, 18.0),
        },
        Offload::Optimizer => Estimate {
            gpu: largest + (2.0 * p / gpus) as u64,
            cpu: cpu(16.0, 16.0),
        },
        Offload::None => Estimate {
            gpu: largest + (18.0 * p / gpus) as u64,
            cpu: if zero_init {
                (largest_layer as f64 * 4.0 * gpn * abf) as u64
            } else {
                (p * 4.0 * gpn * abf) as u64
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::builtin;

    const ONE_NODE_OF_8: Cluster = Cluster {
        nodes: 1,
        gpus_per_node: 8,
        buffer_factor: 1.5,
    };

    /// DeepSpeed prints bytes / 2**30 with two decimals and labels it "GB".
    fn gb(bytes: u64) -> String {
        format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
    }

    /// DeepSpeed docs (`docs/code-docs/source/memory.rst`), ZeRO-2 with 2851e6 parameters on
    /// one node of 8 GPUs: offload 127.45 CPU / 5.31 GPU; no offload 127.45 / 15.93 (the
    /// docs' 15.93 is the legacy formula; the current code gives 11.28).
    #[test]
    fn zero2_docs_example() {
        let p = 2_851_000_000;
        let offload = zero2(p, &ONE_NODE_OF_8, true, Version::Legacy);
        assert_eq!(
            (gb(offload.cpu), gb(offload.gpu)),
            ("127.45".into(), "5.31".into())
        );
        let legacy = zero2(p, &ONE_NODE_OF_8, false, Version::Legacy);
        assert_eq!(
            (gb(legacy.cpu), gb(legacy.gpu)),
            ("127.45".into(), "15.93".into())
        );
        let current = zero2(p, &ONE_NODE_OF_8, false, Version::Current);
        assert_eq!(gb(current.gpu), "11.28");
    }

    /// DeepSpeed docs, ZeRO-3 with 2851e6 parameters, largest layer 32e6, 8 GPUs.
    #[test]
    fn zero3_docs_table() {
        let cases = [
            (Offload::ParamsAndOptimizer, true, "71.69", "0.12"),
            (Offload::ParamsAndOptimizer, false, "127.45", "0.12"),
            (Offload::Optimizer, true, "63.72", "0.78"),
            (Offload::Optimizer, false, "127.45", "0.78"),
            (Offload::None, true, "1.43", "6.09"),
            (Offload::None, false, "127.45", "6.09"),
        ];
        for (offload, zero_init, cpu, gpu) in cases {
            let e = zero3(
                2_851_000_000,
                32_000_000,
                &ONE_NODE_OF_8,
                offload,
                zero_init,
            );
            assert_eq!(
                (gb(e.cpu), gb(e.gpu)),
                (cpu.into(), gpu.into()),
                "{offload:?} {zero_init}"
            );
        }
    }

    /// DeepSpeed docs, t5-large hand example (737.67M parameters, largest layer 32.90M, 4
    /// GPUs), MiB via `>> 20`: largest layer 125, no offload 3291, offload params and
    /// optimizer 125, offload optimizer 477. Parameters come from the built-in t5-large.
    #[test]
    fn zero3_t5_large_example() {
        let counts = builtin::find("t5-large").expect("built-in").param_counts();
        let cluster = Cluster {
            nodes: 1,
            gpus_per_node: 4,
            buffer_factor: 1.5,
        };
        let mib =
            |offload| zero3(counts.total, counts.largest_module, &cluster, offload, true).gpu >> 20;
        assert_eq!((4 * counts.largest_module) >> 20, 125);
        assert_eq!(mib(Offload::None), 3291);
        assert_eq!(mib(Offload::ParamsAndOptimizer), 125);
        assert_eq!(mib(Offload::Optimizer), 477);
    }
}
