//! Human text of the planners' reports.

use crate::model::{count, Bytes};
use crate::plan::compare::comparisons;
use crate::plan::deepspeed::Version;
use crate::plan::kv::{Budget, KvPool, KvSettings};
use crate::plan::pack::PackReport;
use crate::plan::search::{explain, Plan};
use crate::plan::train::{Candidate, TrainSetup};
use crate::report::plan_json::{CheckpointJson, PackJson, SimJson, WorkloadJson};
use crate::report::plot::CandidateBar;
use std::fmt::Write;

fn recompute_name(l: &crate::plan::layout::Layout) -> &'static str {
    match l.recompute {
        crate::plan::activations::Recompute::None => "none",
        crate::plan::activations::Recompute::Selective => "selective",
        crate::plan::activations::Recompute::Full => "full",
    }
}

/// One candidate as a bar of the planners' chart, named the way the table names it.
pub fn candidate_bar(c: &Candidate) -> CandidateBar {
    let l = &c.layout;
    let cp = if l.cp > 1 {
        format!(" cp{}", l.cp)
    } else {
        String::new()
    };
    CandidateBar {
        layout: format!("dp{} tp{} pp{}{cp}", l.dp, l.tp, l.pp),
        setting: format!("ZeRO-{}, mb {}", l.zero.number(), l.micro_batch),
        recompute: match recompute_name(l) {
            "none" => "no recompute",
            "selective" => "sel. recompute",
            _ => "full recompute",
        }
        .to_string(),
        params: c.memory.params,
        grads: c.memory.grads,
        optimizer: c.memory.optimizer,
        activations: c.memory.activations,
        headroom: c.headroom,
        fits: c.fits,
    }
}

/// `plan train` as text: the setup, a table of candidates, and the recommendation.
pub fn train(setup: &TrainSetup, gpus: u64, plan: &Plan, deepspeed: Version) -> String {
    let counts = setup.model.param_counts();
    let mut out = String::new();
    let active = if counts.active != counts.total {
        format!(" ({:.2}B active)", counts.active as f64 / 1e9)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "model {}: {:.2}B parameters{active}, {} layers, hidden {}, {} heads ({} KV)",
        setup.model.name,
        counts.total as f64 / 1e9,
        setup.model.layers,
        setup.model.hidden_size,
        setup.model.heads,
        setup.model.kv_heads,
    );
    let _ = writeln!(
        out,
        "{} of {}, sequence {}; headroom per GPU: {} for the CUDA context plus {:.0}% of the \
         estimate for allocator fragmentation",
        count(gpus, "GPU", "GPUs"),
        Bytes(setup.gpu_memory),
        setup.seq_len,
        Bytes(setup.headroom.context_bytes),
        setup.headroom.fragmentation * 100.0,
    );
    let _ = writeln!(
        out,
        "{} evaluated, {} fit{}",
        count(plan.evaluated as u64, "layout", "layouts"),
        plan.fitting,
        if plan.fitting > 0 {
            ""
        } else {
            " (showing the smallest)"
        }
    );
    let _ = writeln!(
        out,
        "\n  #   dp  tp  pp  cp zero recompute  mb x acc     params      grads  optimizer  activations      total  fits  comm/step"
    );
    for (i, c) in plan.candidates.iter().enumerate() {
        let l = &c.layout;
        let mark = if plan.recommended == Some(i) {
            '*'
        } else {
            ' '
        };
        let _ = writeln!(
            out,
            "{mark}{i:>2} {:>4} {:>3} {:>3} {:>3} {:>4} {:<10} {:>3} x {:<4} {:>10} {:>10} {:>10} {:>12} {:>10}  {:<4} {:>10}",
            l.dp,
            l.tp,
            l.pp,
            l.cp,
            l.zero.number(),
            recompute_name(l),
            l.micro_batch,
            l.grad_accum,
            Bytes(c.memory.params).to_string(),
            Bytes(c.memory.grads).to_string(),
            Bytes(c.memory.optimizer).to_string(),
            Bytes(c.memory.activations).to_string(),
            Bytes(c.memory.total).to_string(),
            if c.fits { "yes" } else { "no" },
            Bytes(c.cost.comm_bytes.round() as u64).to_string(),
        );
    }
    let _ = writeln!(out, "\n{}", explain(plan, setup));
    let shown = plan.recommended.or(if plan.candidates.is_empty() {
        None
    } else {
        Some(0)
    });
    if let Some(c) = shown.and_then(|i| plan.candidates.get(i)) {
        for cmp in comparisons(setup, c, deepspeed) {
            let _ = writeln!(
                out,
                "For comparison, {} gives {} per GPU ({}; memprof: {}).",
                cmp.source,
                Bytes(cmp.bytes),
                cmp.covers,
                Bytes(cmp.memprof_bytes)
            );
        }
    }
    out
}

/// `plan kv` as text.
pub fn kv(model: &str, settings: &KvSettings, budget: Budget, pool: &KvPool) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {model}, KV cache {}, TP {}, block {} tokens",
        settings.dtype.name(),
        settings.tp,
        settings.block_size
    );
    let _ = writeln!(
        out,
        "KV per token per GPU: {} ({} B); per block: {}",
        Bytes(pool.kv_bytes_per_token),
        pool.kv_bytes_per_token,
        Bytes(pool.block_bytes)
    );
    match budget {
        Budget::KvMemory(bytes) => {
            let _ = writeln!(out, "pool memory: {} (given)", Bytes(bytes));
        }
        Budget::Gpu {
            memory,
            utilization,
        } => {
            let _ = writeln!(
                out,
                "pool memory: {} = {:.0}% of {} less {} of weights (an upper bound: vLLM also \
                 subtracts its profiled activation peak and non-torch memory)",
                Bytes(pool.available_bytes),
                utilization * 100.0,
                Bytes(memory),
                Bytes(pool.weights_bytes)
            );
        }
    }
    let _ = writeln!(
        out,
        "blocks: {}, tokens: {}",
        pool.num_blocks, pool.max_tokens
    );
    match (pool.max_model_len, pool.max_concurrent_sequences) {
        (Some(len), Some(n)) => {
            let _ = writeln!(out, "full-length ({len}-token) sequences at once: {n}");
        }
        _ => {
            let _ = writeln!(
                out,
                "full-length sequences at once: unknown (give --max-model-len)"
            );
        }
    }
    out
}

fn activation_note(bytes: Option<u64>) -> String {
    bytes.map_or_else(String::new, |b| format!(", activations {}", Bytes(b)))
}

/// `plan pack` as text.
pub fn pack(r: &PackReport, doc: &PackJson) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} sequences, {} tokens, max length {}{}",
        r.sequences,
        r.tokens,
        doc.max_len,
        if r.truncated > 0 {
            format!(" ({} longer sequences truncated)", r.truncated)
        } else {
            String::new()
        }
    );
    let p = &doc.padded;
    let _ = writeln!(
        out,
        "pad to max:  {:>10} batches, padding {:>5.1}%, micro-batch {} tokens{}",
        p.batches,
        p.padding_fraction * 100.0,
        p.micro_batch_tokens,
        activation_note(p.micro_batch_activation_bytes)
    );
    let b = &doc.bucketed;
    let edges: Vec<String> = b.edges.iter().map(u64::to_string).collect();
    let _ = writeln!(
        out,
        "bucketed:    {:>10} batches, padding {:>5.1}%, largest micro-batch {} tokens{}; edges {}",
        b.batches,
        b.padding_fraction * 100.0,
        b.micro_batch_tokens,
        activation_note(b.micro_batch_activation_bytes),
        edges.join(", ")
    );
    let k = &doc.packed;
    let _ = writeln!(
        out,
        "packed:      {:>10} batches, padding {:>5.1}%, micro-batch {} tokens{}; {} bins by {} \
         (lower bound {}, efficiency {:.2}%)",
        k.batches,
        k.padding_fraction * 100.0,
        k.micro_batch_tokens,
        activation_note(k.micro_batch_activation_bytes),
        k.bins,
        k.algorithm,
        r.lower_bound_bins,
        k.efficiency * 100.0
    );
    let speedup = if k.padding_fraction < 1.0 && p.padding_fraction < 1.0 {
        (1.0 - k.padding_fraction) / (1.0 - p.padding_fraction)
    } else {
        1.0
    };
    let _ = writeln!(
        out,
        "packing needs {:.2}x fewer token slots than padding to max; padding-free (varlen) \
         attention would need exactly {} tokens",
        speedup, r.tokens
    );
    out
}

/// Layer indices as ranges: `0-3, 7, 9-11`.
fn ranges(indices: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let start = indices[i];
        let mut end = start;
        while i + 1 < indices.len() && indices[i + 1] == end + 1 {
            i += 1;
            end = indices[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

/// `plan checkpoint` as text.
pub fn checkpoint(doc: &CheckpointJson) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {}, activation budget {}\n\n  strategy    activations  extra compute  fits",
        doc.model,
        Bytes(doc.budget_bytes)
    );
    for s in &doc.strategies {
        let _ = writeln!(
            out,
            "  {:<10} {:>12} {:>13.1}%  {}",
            s.name,
            Bytes(s.activation_bytes).to_string(),
            s.recompute_flops_fraction * 100.0,
            if s.fits { "yes" } else { "no" }
        );
    }
    match &doc.optimal {
        Some(o) => {
            let _ = writeln!(
                out,
                "  {:<10} {:>12} {:>13.1}%  yes\n\nOptimal: store layers {}; selective \
                 recompute {}; full recompute {}.",
                "optimal",
                Bytes(o.activation_bytes).to_string(),
                o.recompute_flops_fraction * 100.0,
                ranges(&o.store),
                ranges(&o.selective),
                ranges(&o.full)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "\nNothing fits: even full recompute needs more than the budget; shorten the \
                 sequence, lower the micro-batch or add tensor / context parallelism."
            );
        }
    }
    out
}

fn sim_line(name: &str, s: &SimJson) -> String {
    format!(
        "  {name:<11} {:>8} {:>9} {:>11} {:>9.1} {:>8} {:>11.1}% {:>7.1}%\n",
        s.steps,
        s.completed,
        s.preemptions,
        s.mean_concurrency,
        s.max_concurrency,
        s.utilization * 100.0,
        s.waste_fraction * 100.0
    )
}

/// The `--workload` simulation as text.
pub fn workload(w: &WorkloadJson) -> String {
    let mut out = format!(
        "\nworkload: {} requests; contiguous reserves {} tokens each\n  policy         steps completed preemptions mean conc max conc utilization   waste\n",
        w.requests, w.reservation_tokens
    );
    out.push_str(&sim_line("paged", &w.paged));
    out.push_str(&sim_line("contiguous", &w.contiguous));
    for (name, s) in [("paged", &w.paged), ("contiguous", &w.contiguous)] {
        if s.rejected > 0 {
            let _ = writeln!(
                out,
                "  {name}: {} requests can never fit the pool",
                s.rejected
            );
        }
    }
    out
}
