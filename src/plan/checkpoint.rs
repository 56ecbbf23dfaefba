//! Checkpoint selection: which layers to store, recompute selectively (the attention core) or
//! recompute fully (from the layer input) so activations fit a memory budget with the least
//! extra compute. A multiple-choice knapsack solved by dynamic programming over memory saved,
//! in units of 1/20000 of what must be saved (rounding down, so a plan it returns always
//! fits; it is optimal up to that rounding), once per candidate size of the largest fully
//! recomputed layer (its activations are rebuilt during backward; at most `MAX_CAPS` sizes
//! are tried). The result is never worse than a uniform strategy that fits. Compared with
//! storing everything, selective and full recompute everywhere, and Chen et al.'s sqrt(n)
//! segments. `reference/planner-math.md` §2.4-2.6.

use super::activations::{activation_memory, per_layer, ActivationSettings, Recompute};
use super::cost::layer_forward_flops;
use super::model::ModelConfig;

/// What to do with one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Store,
    Selective,
    Full,
}

/// Memory and compute of one layer's three options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerCost {
    /// Activations stored without recompute.
    pub stored: f64,
    /// Activations stored with selective recompute.
    pub selective: f64,
    /// The layer input kept under full recompute.
    pub input: f64,
    /// Extra FLOPs of selective recompute (the attention core's forward).
    pub selective_flops: f64,
    /// Extra FLOPs of full recompute (the layer's forward).
    pub full_flops: f64,
}

/// Memory and extra compute of a strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct Strategy {
    pub name: &'static str,
    /// Peak activation bytes, including the fixed part and the rebuilt layer.
    pub bytes: f64,
    pub extra_flops: f64,
    pub fits: bool,
}

/// The optimal plan under the budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimal {
    pub choices: Vec<Choice>,
    pub bytes: f64,
    pub extra_flops: f64,
}

/// Everything `plan checkpoint` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointPlan {
    pub layers: usize,
    pub budget: f64,
    pub strategies: Vec<Strategy>,
    /// `None` when even full recompute does not fit.
    pub optimal: Option<Optimal>,
}

/// The layers of a model config (all alike), the activations outside them (embedding
/// dropout, logits), and the forward plus backward FLOPs of the step without recompute.
pub fn layers_from_model(
    model: &ModelConfig,
    s: &ActivationSettings,
) -> (Vec<LayerCost>, f64, f64) {
    let counts = model.param_counts();
    let (layer_flops, core_flops) =
        layer_forward_flops(model, &counts, s.seq_len, s.cp, s.micro_batch, s.tp);
    let layer = LayerCost {
        stored: per_layer(model, s, Recompute::None),
        selective: per_layer(model, s, Recompute::Selective),
        input: per_layer(model, s, Recompute::Full),
        selective_flops: core_flops,
        full_flops: layer_flops,
    };
    let other = activation_memory(
        model,
        &ActivationSettings {
            recompute: Recompute::None,
            ..*s
        },
    );
    let fixed = other.head();
    let n = model.layers as usize;
    (vec![layer; n], fixed, 3.0 * layer_flops * n as f64)
}

/// Largest number of memory units the dynamic programme tracks.
const UNITS: f64 = 20_000.0;

/// Most sizes of the largest fully recomputed layer tried (quantiles beyond that).
pub const MAX_CAPS: usize = 16;

fn peak(layers: &[LayerCost], choices: &[Choice], fixed: f64) -> f64 {
    let mut bytes = fixed;
    let mut rebuilt: f64 = 0.0;
    for (l, c) in layers.iter().zip(choices) {
        bytes += match c {
            Choice::Store => l.stored,
            Choice::Selective => l.selective,
            Choice::Full => {
                rebuilt = rebuilt.max(l.stored);
                l.input
            }
        };
    }
    bytes + rebuilt
}

fn extra(layers: &[LayerCost], choices: &[Choice]) -> f64 {
    layers
        .iter()
        .zip(choices)
        .map(|(l, c)| match c {
            Choice::Store => 0.0,
            Choice::Selective => l.selective_flops,
            Choice::Full => l.full_flops,
        })
        .sum()
}

/// Least-compute choices saving at least `need` bytes, full recompute allowed only on
/// layers whose stored activations are at most `cap`.
fn knapsack(layers: &[LayerCost], need: f64, cap: Option<f64>) -> Option<Vec<Choice>> {
    if need <= 0.0 {
        return Some(vec![Choice::Store; layers.len()]);
    }
    let unit = (need / UNITS).max(1.0);
    let target = (need / unit).ceil() as usize;
    let inf = f64::INFINITY;
    let mut best = vec![inf; target + 1];
    best[0] = 0.0;
    // from[layer][u]: the choice that reached u at this layer, and the u it came from.
    let mut from: Vec<Vec<(Choice, u32)>> = Vec::with_capacity(layers.len());
    for l in layers {
        let mut options = vec![(Choice::Store, 0.0, 0.0)];
        options.push((Choice::Selective, l.stored - l.selective, l.selective_flops));
        if cap.is_some_and(|c| l.stored <= c) {
            options.push((Choice::Full, l.stored - l.input, l.full_flops));
        }
        let mut next = vec![inf; target + 1];
        let mut came = vec![(Choice::Store, 0u32); target + 1];
        for (u, &cost) in best.iter().enumerate() {
            if cost == inf {
                continue;
            }
            for &(choice, saved, flops) in &options {
                let units = (saved.max(0.0) / unit).floor() as usize;
                let v = (u + units).min(target);
                if cost + flops < next[v] {
                    next[v] = cost + flops;
                    came[v] = (choice, u as u32);
                }
            }
        }
        best = next;
        from.push(came);
    }
    if best[target] == inf {
        return None;
    }
    let mut choices = vec![Choice::Store; layers.len()];
    let mut u = target;
    for (i, came) in from.iter().enumerate().rev() {
        let (choice, prev) = came[u];
        choices[i] = choice;
        u = prev as usize;
    }
    Some(choices)
}

/// Plans recompute for `layers` with `fixed` bytes of other activations under `budget`.
pub fn plan_checkpoints(layers: &[LayerCost], fixed: f64, budget: f64) -> CheckpointPlan {
    let n = layers.len();
    let uniform = |c: Choice| vec![c; n];
    let mut strategies = Vec::new();
    for (name, choice) in [
        ("none", Choice::Store),
        ("selective", Choice::Selective),
        ("full", Choice::Full),
    ] {
        let choices = uniform(choice);
        let bytes = peak(layers, &choices, fixed);
        strategies.push(Strategy {
            name,
            bytes,
            extra_flops: extra(layers, &choices),
            fits: bytes <= budget,
        });
    }
    // Chen et al. 2016: segments of ceil(sqrt(n)) layers; keep each segment's input, rebuild
    // one segment at a time during backward.
    if n > 0 {
        let k = (n as f64).sqrt().ceil() as usize;
        let inputs: f64 = layers.chunks(k).map(|s| s[0].input).sum();
        let segment = layers
            .chunks(k)
            .map(|s| s.iter().map(|l| l.stored).sum::<f64>())
            .fold(0.0, f64::max);
        let bytes = fixed + inputs + segment;
        strategies.push(Strategy {
            name: "sqrt_n",
            bytes,
            extra_flops: layers.iter().map(|l| l.full_flops).sum(),
            fits: bytes <= budget,
        });
    }
    let store_all: f64 = fixed + layers.iter().map(|l| l.stored).sum::<f64>();
    // Candidates for the largest fully recomputed layer: none, or each distinct size.
    let mut caps: Vec<Option<f64>> = vec![None];
    let mut sizes: Vec<f64> = layers.iter().map(|l| l.stored).collect();
    sizes.sort_by(f64::total_cmp);
    sizes.dedup();
    if sizes.len() > MAX_CAPS {
        let last = sizes.len() - 1;
        sizes = (1..=MAX_CAPS).map(|q| sizes[q * last / MAX_CAPS]).collect();
    }
    caps.extend(sizes.into_iter().map(Some));
    let mut tried: Vec<Vec<Choice>> = caps
        .into_iter()
        .filter_map(|cap| {
            let need = store_all + cap.unwrap_or(0.0) - budget;
            knapsack(layers, need, cap)
        })
        .collect();
    tried.extend([Choice::Store, Choice::Selective, Choice::Full].map(uniform));
    let optimal = tried
        .into_iter()
        .map(|choices| Optimal {
            bytes: peak(layers, &choices, fixed),
            extra_flops: extra(layers, &choices),
            choices,
        })
        .filter(|o| o.bytes <= budget)
        .min_by(|a, b| a.extra_flops.total_cmp(&b.extra_flops));
    CheckpointPlan {
        layers: n,
        budget,
        strategies,
        optimal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn layer(stored: f64) -> LayerCost {
        LayerCost {
            stored,
            selective: stored * 0.3,
            input: stored * 0.05,
            selective_flops: 1.0,
            full_flops: 30.0,
        }
    }

    #[test]
    fn llama_layers_from_config() {
        use crate::plan::activations::{Attention, Loss};
        let model = crate::plan::builtin::find("llama-3-8b").expect("built-in");
        let s = ActivationSettings {
            seq_len: 4096,
            micro_batch: 1,
            tp: 1,
            sp: false,
            cp: 1,
            pp: 1,
            micro_batches: 1,
            recompute: Recompute::None,
            attention: Attention::Eager,
            element_bytes: 2.0,
            loss: Loss::Eager,
            autocast: false,
        };
        let (layers, fixed, step) = layers_from_model(&model, &s);
        assert_eq!(layers.len(), 32);
        let all = fixed + layers.iter().map(|l| l.stored).sum::<f64>();
        assert!((all - activation_memory(&model, &s).total()).abs() < 1.0);
        // A budget between selective and none: some layers stay stored, the rest are
        // recomputed selectively, and the extra compute is a small share of the step.
        let selective: f64 = fixed + layers.iter().map(|l| l.selective).sum::<f64>();
        let plan = plan_checkpoints(&layers, fixed, (all + selective) / 2.0);
        let best = plan.optimal.expect("fits");
        assert!(best.choices.contains(&Choice::Store));
        assert!(best.choices.contains(&Choice::Selective));
        assert!(best.extra_flops / step < 0.05);
    }

    #[test]
    fn ample_budget_stores_everything() {
        let layers = vec![layer(100.0); 8];
        let plan = plan_checkpoints(&layers, 10.0, 1e9);
        let best = plan.optimal.expect("fits");
        assert_eq!(best.extra_flops, 0.0);
        assert!(best.choices.iter().all(|c| *c == Choice::Store));
    }

    #[test]
    fn mixes_choices_between_the_uniform_strategies() {
        let layers = vec![layer(100.0); 10];
        // Storing all: 1000; all selective: 300; budget 650 lets half stay stored.
        let plan = plan_checkpoints(&layers, 0.0, 650.0);
        let best = plan.optimal.expect("fits");
        let selective = best
            .choices
            .iter()
            .filter(|c| **c == Choice::Selective)
            .count();
        assert_eq!(selective, 5);
        assert_eq!(best.extra_flops, 5.0);
        assert!(best.bytes <= 650.0);
    }

    #[test]
    fn infeasible_budget() {
        let layers = vec![layer(100.0); 4];
        let plan = plan_checkpoints(&layers, 0.0, 1.0);
        assert!(plan.optimal.is_none());
        assert!(plan.strategies.iter().all(|s| !s.fits));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The optimum fits and never costs more than any uniform strategy that fits.
        #[test]
        fn optimum_beats_every_fitting_baseline(
            sizes in prop::collection::vec(prop::sample::select(vec![10.0f64, 100.0, 250.0, 999.0]), 1..24),
            fixed in 0.0f64..100.0,
            share in 0.0f64..1.2,
        ) {
            let layers: Vec<LayerCost> = sizes.iter().map(|&s| layer(s)).collect();
            let total: f64 = fixed + sizes.iter().sum::<f64>();
            let plan = plan_checkpoints(&layers, fixed, total * share);
            for s in &plan.strategies {
                if s.fits {
                    let best = plan.optimal.as_ref().expect("a baseline fits");
                    prop_assert!(best.extra_flops <= s.extra_flops + 1e-9, "{} {}", s.name, best.extra_flops);
                }
            }
            if let Some(best) = &plan.optimal {
                prop_assert!(best.bytes <= plan.budget);
            }
        }
    }
}
