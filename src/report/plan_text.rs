//! Human text of the planners' reports.

use crate::model::{count, Bytes};
use crate::plan::activations::Recompute;
use crate::plan::calibrate::CalibrationReport;
use crate::plan::compare::{comparisons, megatron_side_by_side};
use crate::plan::deepspeed::Version;
use crate::plan::explain::{label, terms, TermKind};
use crate::plan::fit::{one_line, Answer, FitReport};
use crate::plan::kv::KvSettings;
use crate::plan::pack::PackReport;
use crate::plan::search::{describe, explain, rules, runner_up, seconds, Plan};
use crate::plan::train::{Candidate, TrainSetup};
use crate::plan::verdict::Verdict;
use crate::report::plan_json::{
    BudgetJson, CheckpointJson, KvJson, PackJson, SimJson, SolveJson, WorkloadJson,
};
use crate::report::plot::CandidateBar;
use crate::report::terminal_text::terminal_text;
use std::fmt::Write;

fn recompute_name(l: &crate::plan::layout::Layout) -> &'static str {
    match l.recompute {
        crate::plan::activations::Recompute::None => "none",
        crate::plan::activations::Recompute::Selective => "selective",
        crate::plan::activations::Recompute::Full => "full",
        crate::plan::activations::Recompute::PerOp => "per-op",
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
            "per-op" => "per-op recompute",
            _ => "full recompute",
        }
        .to_string(),
        params: c.memory.params(),
        grads: c.memory.all_grads(),
        optimizer: c.memory.optimizer,
        activations: c.memory.activations(),
        headroom: c.headroom.total(),
        fits: c.fits,
    }
}

/// Signed bytes: `-1.50 GiB` for a negative term.
fn signed_bytes(x: i128) -> String {
    let size = Bytes(u64::try_from(x.unsigned_abs()).unwrap_or(u64::MAX));
    if x < 0 {
        format!("-{size}")
    } else {
        size.to_string()
    }
}

/// The terms of one candidate with their formulas and sources (`--explain`).
fn explain_terms(out: &mut String, setup: &TrainSetup, index: usize, c: &Candidate) {
    let _ = writeln!(
        out,
        "\nHow candidate {index} is counted ({}), per GPU:",
        describe(&c.layout)
    );
    let mut headroom_started = false;
    for t in terms(setup, c) {
        if t.kind == TermKind::Headroom && !headroom_started {
            headroom_started = true;
            let _ = writeln!(
                out,
                "  {:<38} {:>11}",
                "estimate",
                Bytes(c.memory.total).to_string()
            );
        }
        let _ = writeln!(
            out,
            "  {:<38} {:>11}  {}\n  {:<38} {:>11}  source: {}",
            t.label,
            signed_bytes(i128::from(t.bytes)),
            t.formula,
            "",
            "",
            t.source
        );
    }
    let _ = writeln!(
        out,
        "  {:<38} {:>11}  (estimate plus headroom, against {} per GPU)",
        "required",
        Bytes(c.memory.total + c.headroom.total()).to_string(),
        Bytes(setup.gpu_memory)
    );
}

/// "1.26 GiB more" / "1.26 GiB less" / "the same".
fn more_or_less(difference: i128) -> String {
    let size = Bytes(u64::try_from(difference.unsigned_abs()).unwrap_or(u64::MAX));
    match difference.signum() {
        1 => format!("{size} more"),
        -1 => format!("{size} less"),
        _ => "the same".to_string(),
    }
}

/// Megatron-LM's terms beside memprof's, with the reason for each difference.
fn megatron_lines(out: &mut String, setup: &TrainSetup, c: &Candidate) {
    let Some(rows) = megatron_side_by_side(setup, c) else {
        return;
    };
    let _ = writeln!(
        out,
        "  {:<34} {:>11} {:>11}  why they differ",
        "term", "Megatron", "memprof"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "  {:<34} {:>11} {:>11}  {} [{}]",
            r.term,
            Bytes(r.megatron_bytes).to_string(),
            Bytes(r.memprof_bytes).to_string(),
            r.reason,
            r.formula
        );
    }
}

/// The published formulas' figures beside memprof's.
fn published_lines(out: &mut String, setup: &TrainSetup, c: &Candidate, deepspeed: Version) {
    for cmp in comparisons(setup, c, deepspeed) {
        if cmp.terms.is_empty() {
            let _ = writeln!(
                out,
                "{}: {} of {} per GPU; memprof counts {} ({}).",
                cmp.source,
                Bytes(cmp.bytes),
                cmp.covers,
                Bytes(cmp.memprof_bytes),
                more_or_less(cmp.difference())
            );
            if cmp.source.starts_with("Megatron") {
                megatron_lines(out, setup, c);
            }
            continue;
        }
        let terms: Vec<&str> = cmp.terms.iter().map(|n| label(n)).collect();
        let additions: Vec<String> = cmp
            .additions
            .iter()
            .filter_map(|n| {
                let bytes = term_bytes(c, n);
                (bytes != 0)
                    .then(|| format!("{} for {}", signed_bytes(i128::from(bytes)), label(n)))
            })
            .collect();
        let added = if additions.is_empty() {
            "memprof adds nothing to it".to_string()
        } else {
            format!("memprof adds {}", additions.join(" and "))
        };
        let _ = writeln!(
            out,
            "{}: {} of {} per GPU = memprof's {}; {added}, {} in all.",
            cmp.source,
            Bytes(cmp.bytes),
            cmp.covers,
            terms.join(" + "),
            Bytes(cmp.memprof_bytes),
        );
    }
}

/// The bytes of the term called `name` on `c`.
fn term_bytes(c: &Candidate, name: &str) -> i64 {
    let m = &c.memory;
    let u = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
    match name {
        "params_sharded_bytes" => u(m.params_sharded),
        "params_gathered_bytes" => u(m.params_gathered),
        "grads_bytes" => u(m.grads),
        "grads_gathered_bytes" => u(m.grads_gathered),
        "optimizer_bytes" => u(m.optimizer),
        "activations_layers_bytes" => u(m.activations_layers),
        "activations_shape_bytes" => m.activations_shape,
        "activations_recompute_bytes" => u(m.activations_recompute),
        "activations_head_bytes" => u(m.activations_head),
        _ => 0,
    }
}

/// The per-layer coefficients a calibration takes without a word: the formulas' published
/// errors stay well inside (eager attention's extra score matrices measured 1.37).
const CALIBRATION_PLAUSIBLE: (f64, f64) = (0.5, 2.0);

/// `plan train --calibrate`: the measured configuration's formula against the measurement,
/// then the first candidate calibrated.
pub fn calibration(r: &CalibrationReport, snapshot: &str) -> String {
    let g = |b: u64| Bytes(b).to_string();
    let recompute = match r.measured_recompute {
        Recompute::None => "no recompute",
        Recompute::Selective => "selective recompute",
        Recompute::Full => "full recompute",
        Recompute::PerOp => "per-operator recompute",
    };
    // A coefficient this far from 1 says more about the run than about the formula.
    let doubt = if (CALIBRATION_PLAUSIBLE.0..=CALIBRATION_PLAUSIBLE.1).contains(&r.coefficient) {
        ""
    } else {
        "  far from 1: check that the snapshot is a training step of this model with these sizes, \
         precision, attention and recompute\n"
    };
    format!(
        "Calibration from {} (device {}, {}): {}, sequence {}, micro-batch {}, \
         {recompute}, one GPU\n  measured  {:>10}  most live at once of what the trace frees\n  formula   {:>10}  \
         = {} embedding and LM head + {} per-layer terms\n  per-layer coefficient {:.3} \
         (measured less the head, over the formula's per-layer terms)\n{doubt}Candidate {} calibrated: \
         activations {} by formula, {} calibrated; estimate {}, with headroom {} of {}: {}\n\n",
        terminal_text(snapshot),
        r.device,
        count(r.trace_entries as u64, "trace entry", "trace entries"),
        terminal_text(&r.measured_model),
        r.measured_seq_len,
        r.measured_micro_batch,
        g(r.measured_bytes),
        g(r.formula_bytes),
        g(r.formula_head_bytes),
        g(r.formula_layers_bytes),
        r.coefficient,
        r.candidate,
        g(r.formula_activations_bytes),
        g(r.calibrated_activations_bytes),
        g(r.calibrated_total_bytes),
        g(r.calibrated_required_bytes),
        g(r.gpu_memory_bytes),
        if r.fits { "fits" } else { "does not fit" },
    )
}

/// `plan train` as text: the setup, a table of candidates, the recommendation, the published
/// formulas' figures for it, and with `explain` every term with its formula and source.
pub fn train(
    setup: &TrainSetup,
    gpus: u64,
    plan: &Plan,
    deepspeed: Version,
    show_terms: bool,
) -> String {
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
        shown(&setup.model.name),
        counts.total as f64 / 1e9,
        setup.model.layers,
        setup.model.hidden_size,
        setup.model.heads,
        setup.model.kv_heads,
    );
    let _ = writeln!(
        out,
        "{} of {}, sequence {}; headroom per GPU: {} for the CUDA context{} plus {:.0}% of the \
         estimate for allocator fragmentation",
        count(gpus, "GPU", "GPUs"),
        Bytes(setup.gpu_memory),
        setup.seq_len,
        Bytes(setup.headroom.context_bytes),
        if gpus > 1 {
            format!(
                ", {} for communication buffers",
                Bytes(setup.headroom.comm_bytes)
            )
        } else {
            String::new()
        },
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
        "\n  #   dp  tp  pp  cp zero recompute  mb x acc     params      grads  optimizer  activations      total  fits   est. step"
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
            "{mark}{i:>2} {:>4} {:>3} {:>3} {:>3} {:>4} {:<10} {:>3} x {:<4} {:>10} {:>10} {:>10} {:>12} {:>10}  {:<5} {:>10}",
            l.dp,
            l.tp,
            l.pp,
            l.cp,
            l.zero.number(),
            recompute_name(l),
            l.micro_batch,
            l.grad_accum,
            Bytes(c.memory.params()).to_string(),
            Bytes(c.memory.all_grads()).to_string(),
            Bytes(c.memory.optimizer).to_string(),
            Bytes(c.memory.activations()).to_string(),
            Bytes(c.memory.total).to_string(),
            match c.verdict {
                Verdict::Fit => "yes",
                Verdict::Tight => "tight",
                Verdict::NoFit => "no",
            },
            seconds(c.cost.step_s),
        );
    }
    let _ = writeln!(out, "\n{}", explain(plan, setup));
    if let Some(line) = runner_up(plan) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(best) = plan.recommended.and_then(|i| plan.candidates.get(i)) {
        let _ = writeln!(out, "{}", rules(best));
    }
    let shown = plan.recommended.or(if plan.candidates.is_empty() {
        None
    } else {
        Some(0)
    });
    if let Some((i, c)) = shown.and_then(|i| plan.candidates.get(i).map(|c| (i, c))) {
        published_lines(&mut out, setup, c, deepspeed);
        if show_terms {
            explain_terms(&mut out, setup, i, c);
        }
    }
    out
}

/// Text from a file (a model's folder name) with control characters escaped, so it cannot
/// drive the terminal.
fn shown(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// `plan kv` as text: per-token and per-block bytes always; with a memory size the pool; with
/// `--gpu-memory` the budget by term, the solve and the flags to pass.
pub fn kv(model: &str, settings: &KvSettings, kv_memory: Option<u64>, doc: &KvJson) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "model {}, KV cache {}, TP {}, block {} tokens",
        shown(model),
        settings.dtype.name(),
        settings.tp,
        settings.block_size
    );
    let _ = writeln!(
        out,
        "KV per token per GPU: {} ({} B); per block: {}",
        Bytes(doc.kv_bytes_per_token),
        doc.kv_bytes_per_token,
        Bytes(doc.block_bytes)
    );
    if let Some(b) = &doc.budget {
        let _ = writeln!(
            out,
            "budget: {} = {}% of {}",
            Bytes(b.budget_bytes),
            b.utilization * 100.0,
            Bytes(b.gpu_memory_bytes)
        );
        for t in &b.terms {
            let _ = writeln!(
                out,
                "  {:<30} {:>11}  {} ({})",
                label_of_serve_term(t.name),
                Bytes(t.bytes).to_string(),
                t.formula,
                t.source
            );
        }
        let _ = writeln!(
            out,
            "  {:<30} {:>11}  what is left",
            "KV cache",
            Bytes(b.kv_available_bytes).to_string()
        );
    } else if let Some(bytes) = kv_memory {
        let _ = writeln!(out, "pool memory: {} (given)", Bytes(bytes));
    }
    match (doc.num_blocks, doc.max_tokens) {
        (Some(blocks), Some(tokens)) => {
            let _ = writeln!(out, "blocks: {blocks}, tokens: {tokens}");
        }
        _ => {
            let _ = writeln!(
                out,
                "give --gpu-memory SIZE (or --kv-memory SIZE) to size the pool and solve for \
                 --max-model-len / --max-num-seqs"
            );
            return out;
        }
    }
    if doc.solve.is_none() {
        match (doc.max_model_len, doc.max_concurrent_sequences) {
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
    }
    if let Some(s) = &doc.solve {
        solve_lines(&mut out, doc.budget.as_ref(), s);
    }
    out
}

fn label_of_serve_term(name: &str) -> &str {
    match name {
        "weights_bytes" => "weights",
        "activation_peak_bytes" => "profile-run activation peak",
        "non_torch_bytes" => "non-PyTorch memory",
        "cuda_graph_bytes" => "CUDA-graph pool",
        other => other,
    }
}

fn solve_lines(out: &mut String, budget: Option<&BudgetJson>, s: &SolveJson) {
    let seqs = |n: u64| count(n, "sequence", "sequences");
    if s.fits {
        let _ = writeln!(
            out,
            "fits: max_model_len {} with max_num_seqs {}: every sequence at full length needs {} \
             of the {} left for the cache",
            s.max_model_len,
            s.max_num_seqs,
            Bytes(s.kv_cache_bytes),
            Bytes(s.kv_available_bytes)
        );
        let _ = writeln!(out, "vLLM flags:   {}", s.flags.vllm.join(" "));
        let _ = writeln!(out, "SGLang flags: {}", s.flags.sglang.join(" "));
        if let Some(graphs) = budget.map(|b| b.cuda_graph_bytes).filter(|g| *g > 0) {
            let _ = writeln!(
                out,
                "(--kv-cache-memory-bytes and --max-total-tokens cap the cache at what the \
                 settings need; the CUDA-graph term is {}: set --cuda-graph-memory to what \
                 vLLM's startup log reports)",
                Bytes(graphs)
            );
        }
        return;
    }
    let verdict = match s.verdict {
        Verdict::Tight => "tight",
        _ => "does not fit",
    };
    if s.largest_max_num_seqs == 0 && s.largest_max_model_len == 0 {
        let _ = writeln!(
            out,
            "{verdict}: {}; raise --tp or use a larger GPU",
            match budget {
                Some(b) => format!(
                    "the weights, activation peak, non-PyTorch memory and CUDA graphs need {} of \
                     the {} budget (--utilization x --gpu-memory), so nothing is left for the \
                     KV cache",
                    Bytes(b.used_bytes),
                    Bytes(b.budget_bytes)
                ),
                None => format!(
                    "the {} given holds not one block of the KV cache",
                    Bytes(s.kv_available_bytes)
                ),
            }
        );
        return;
    }
    let _ = writeln!(
        out,
        "{verdict}: max_model_len {} with max_num_seqs {} needs {} for the cache, {} is left: \
         at {} tokens at most {} fit; {} fit at most {} tokens each",
        s.max_model_len,
        s.max_num_seqs,
        Bytes(s.kv_cache_bytes),
        Bytes(s.kv_available_bytes),
        s.max_model_len,
        seqs(s.largest_max_num_seqs),
        seqs(s.max_num_seqs.max(1)),
        s.largest_max_model_len
    );
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
        shown(&doc.model),
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
    if let Some(settings) = &w.settings {
        let _ = writeln!(
            out,
            "\nthe paged pool at each max_num_seqs (the first is the worst-case answer):\n  max_num_seqs    steps completed preemptions mean conc max conc"
        );
        for s in settings {
            let _ = writeln!(
                out,
                "  {:>12} {:>8} {:>9} {:>11} {:>9.1} {:>8}",
                s.max_num_seqs,
                s.steps,
                s.completed,
                s.preemptions,
                s.mean_concurrency,
                s.max_concurrency
            );
        }
        if let Some(best) = settings
            .iter()
            .filter(|s| s.preemptions == 0 && s.completed > 0)
            .min_by_key(|s| (s.steps, s.max_num_seqs))
        {
            let _ = writeln!(
                out,
                "  on this request mix, max_num_seqs {} finishes soonest without preemption ({} steps, {:.1} sequences running on average)",
                best.max_num_seqs, best.steps, best.mean_concurrency
            );
        }
    }
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

/// `plan fit` as text.
pub fn fit(r: &FitReport) -> String {
    let mut out = String::new();
    let moment = match (r.at_oom, r.moment_entry) {
        (true, Some(i)) => format!("at the OOM (entry {i}, with the failed request)"),
        (false, Some(i)) => format!("at entry {i}, the moment that limits growth most"),
        (_, None) => "before the trace".to_string(),
    };
    let _ = writeln!(out, "device {}, live memory {moment}:", r.device);
    for p in &r.parts {
        let _ = writeln!(
            out,
            "  {:<16} {:>11}  {}",
            p.category,
            Bytes(p.bytes).to_string(),
            if p.scales {
                "grows with micro-batch and sequence"
            } else {
                "fixed"
            }
        );
    }
    let _ = writeln!(
        out,
        "grows: {}, fixed: {}{}",
        Bytes(r.scaling_bytes),
        Bytes(r.fixed_bytes),
        r.bytes_per_token
            .map(|b| format!("; {} per token", Bytes(b.round() as u64)))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "allocator budget {} (capacity less CUDA context); the recorded run reserves {} at \
         most, {:.1}% over what it allocates{}",
        Bytes(r.budget_bytes),
        Bytes(r.recorded_peak_reserved_bytes),
        r.fragmentation * 100.0,
        if r.recorded_fits {
            ", and fits"
        } else {
            ", and does not fit"
        }
    );
    let line = |what: &str, a: &Answer, unit: &str| {
        if a.largest == 0 {
            format!(
                "{what}: none fits (what does not grow peaks at {} on its own)",
                Bytes(r.fixed_peak_bytes)
            )
        } else {
            format!(
                "{what}: at most {}{unit} (the run used {}{unit}; straight-line estimate {}), \
                 the replay reserves {} at most, {} to spare",
                a.largest,
                a.given,
                a.estimated,
                Bytes(a.replay_peak_reserved_bytes),
                Bytes(a.spare_bytes.max(0) as u64)
            )
        }
    };
    if let Some(a) = &r.micro_batch {
        let _ = writeln!(out, "{}", line("micro-batch", a, ""));
    }
    if let Some(a) = &r.seq_len {
        let _ = writeln!(out, "{}", line("sequence length", a, " tokens"));
    }
    if r.micro_batch.is_none() && r.seq_len.is_none() {
        let a = &r.factor_percent;
        let _ = writeln!(
            out,
            "the growing part may be {:.2}x what it was (give --micro-batch and --seq-len to \
             answer in those); the replay reserves {} at most, {} to spare",
            a.largest as f64 / 100.0,
            Bytes(a.replay_peak_reserved_bytes),
            Bytes(a.spare_bytes.max(0) as u64)
        );
    }
    if let Some(l) = one_line(r) {
        let _ = writeln!(out, "{l}");
    }
    out
}
