//! `memprof plan ...` end to end: the JSON contract of `design/CLI.md`, fixed settings,
//! searches, and bad input (exit 2 with one line).

use crate::util::{
    fixture, memprof, model_snapshot, real_fixtures, repo, stderr, stdout, write_snapshot, Scratch,
    Within,
};
use serde_json::Value;

fn json(args: &[&str]) -> Value {
    let out = memprof(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

fn fails_with_one_line(args: &[&str], needle: &str) {
    let out = memprof(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: {err}");
}

/// The published peaks the planner is checked against (fixtures/examples/measured_peaks.json).
fn measured_peaks() -> Value {
    let text = std::fs::read_to_string(repo().join("fixtures/examples/measured_peaks.json"))
        .expect("the measured peaks");
    serde_json::from_str(&text).expect("JSON")
}

/// The `memprof` arguments a published peak's run is planned with.
fn peak_args(p: &Value) -> Vec<&str> {
    p["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// `args` run with `--json`; a run's own settings need not fit the planner's answer (exit 1).
fn planned(args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let run = memprof(&args);
    assert!(
        matches!(run.status.code(), Some(0 | 1)),
        "{args:?}: {}",
        stderr(&run)
    );
    serde_json::from_slice(&run.stdout).expect("JSON")
}

/// What the allocator reserves for the first candidate of a `plan train` answer, with the CUDA
/// context when `context` (nvidia-smi's figure holds it).
fn train_bytes(out: &Value, context: bool) -> u64 {
    let m = &out["candidates"][0]["memory"];
    ["total_bytes", "fragmentation_bytes", "context_bytes"][..if context { 3 } else { 2 }]
        .iter()
        .map(|k| m[k].as_u64().expect("bytes"))
        .sum::<u64>()
}

const TRAIN_8B: [&str; 11] = [
    "plan",
    "train",
    "--model",
    "llama-3-8b",
    "--gpus",
    "8",
    "--gpu-memory",
    "80GiB",
    "--seq-len",
    "4096",
    "--micro-batch",
];

#[test]
fn plan_train_json_has_the_contract_shape() {
    let mut args = TRAIN_8B.to_vec();
    args.extend(["1", "--json"]);
    let doc = json(&args);
    assert_eq!(doc["schema_version"], 2);
    assert_eq!(doc["model"]["params"], 8_030_261_248u64);
    let candidates = doc["candidates"].as_array().expect("candidates");
    assert!(!candidates.is_empty());
    assert_eq!(doc["recommended"], 0);
    for c in candidates {
        for key in [
            "dp",
            "tp",
            "pp",
            "cp",
            "zero",
            "micro_batch",
            "grad_accum",
            "comm_bytes_per_step",
        ] {
            assert!(c[key].is_u64(), "{key}: {c}");
        }
        assert!(
            ["none", "selective", "full"].contains(&c["recompute"].as_str().expect("recompute"))
        );
        let m = &c["memory"];
        let parts: u64 = [
            "params_bytes",
            "grads_bytes",
            "grads_gathered_bytes",
            "optimizer_bytes",
            "activations_bytes",
        ]
        .iter()
        .map(|k| m[k].as_u64().expect("bytes"))
        .sum();
        assert_eq!(m["total_bytes"].as_u64(), Some(parts));
        assert_eq!(c["fits"], true);
        let product: u64 = ["dp", "tp", "pp", "cp"]
            .iter()
            .map(|k| c[k].as_u64().unwrap_or(0))
            .product();
        assert_eq!(product, 8);
    }
}

#[test]
fn plan_train_evaluates_fixed_settings() {
    let mut args = TRAIN_8B.to_vec();
    args.extend([
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--cp",
        "1",
        "--zero",
        "0",
        "--recompute",
        "none",
        "--json",
    ]);
    let doc = json(&args);
    let candidates = doc["candidates"].as_array().expect("candidates");
    assert_eq!(candidates.len(), 1);
    // 8.03B x 16 B/param of replicated model states cannot fit 80 GiB.
    assert_eq!(candidates[0]["fits"], false);
    assert_eq!(
        candidates[0]["memory"]["params_bytes"],
        2 * 8_030_261_248u64
    );
    assert_eq!(doc["recommended"], Value::Null);
}

#[test]
fn plan_train_text_explains_the_choice() {
    let mut args = TRAIN_8B.to_vec();
    args.push("2");
    let out = memprof(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("Recommended: dp "), "{text}");
    assert!(text.contains("headroom"), "{text}");
}

/// `plan train` of llama-3-8b on one GPU of `memory`, sequences of `seq` tokens, with `more`
/// arguments.
fn one_gpu_seq(memory: &str, seq: &str, more: &[&str]) -> std::process::Output {
    let mut args = vec![
        "plan",
        "train",
        "--model",
        "llama-3-8b",
        "--gpus",
        "1",
        "--gpu-memory",
        memory,
        "--seq-len",
        seq,
        "--micro-batch",
        "1",
    ];
    args.extend(more);
    memprof(&args)
}

fn one_gpu(memory: &str, more: &[&str]) -> std::process::Output {
    one_gpu_seq(memory, "4096", more)
}

#[test]
fn plan_train_on_one_gpu_shows_zero_stages_only_where_they_differ() {
    let out = one_gpu("80GiB", &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let candidates = doc["candidates"].as_array().expect("candidates");
    // One rank shards nothing: every stage is stage 0's figures, so one row per recompute.
    let rows: Vec<(&Value, &Value)> = candidates
        .iter()
        .map(|c| (&c["zero"], &c["recompute"]))
        .collect();
    assert_eq!(
        rows,
        [
            (&Value::from(0), &Value::from("full")),
            (&Value::from(0), &Value::from("selective")),
            (&Value::from(0), &Value::from("none")),
        ],
        "{doc}"
    );
    let text = stdout(&one_gpu("80GiB", &[]));
    assert!(
        text.contains("\n1 GPU of 80.00 GiB, sequence 4096;"),
        "{text}"
    );
    assert!(text.contains("12 layouts evaluated, 0 fit"), "{text}");
    // On 8 GPUs the stages shard, and differ: all four are candidates.
    let doc = json(&[TRAIN_8B.as_slice(), &["1", "--json", "--top", "100"]].concat());
    let mut stages: Vec<u64> = doc["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter_map(|c| c["zero"].as_u64())
        .collect();
    stages.sort_unstable();
    stages.dedup();
    assert_eq!(stages, [0, 1, 2, 3], "{doc}");
}

#[test]
fn nothing_fits_advice_names_the_optimizer_when_its_states_dominate() {
    // 8.03B parameters: 89.75 GiB of AdamW states and fp32 master weights, 123.26 GiB in all.
    let text = stdout(&one_gpu("80GiB", &[]));
    let advice = text
        .lines()
        .find(|l| l.starts_with("Nothing fits:"))
        .expect("the advice");
    assert!(
        advice.contains(
            "optimizer states are most of it (89.75 GiB): --optimizer adamw8bit (8-bit AdamW \
             states) needs "
        ),
        "{advice}"
    );
    assert!(
        advice.contains(", --optimizer sgd (SGD's one momentum) needs "),
        "{advice}"
    );
    assert!(
        advice.ends_with("; or add GPUs, shorten the sequence or lower the micro-batch."),
        "{advice}"
    );
    // Where 8-bit states make the smallest layout fit, the advice says so.
    let text = stdout(&one_gpu("120GiB", &[]));
    assert!(text.contains("12 layouts evaluated, 0 fit"), "{text}");
    assert!(text.contains("(8-bit AdamW states) needs 81."), "{text}");
    assert!(text.contains(", which fits"), "{text}");
    // Activations the largest part, or already the fewest states: no optimizer advice.
    for (seq, more) in [
        ("65536", &["--recompute", "none"][..]),
        ("4096", &["--optimizer", "adamw8bit"][..]),
    ] {
        let text = stdout(&one_gpu_seq("16GiB", seq, more));
        let advice = text
            .lines()
            .find(|l| l.starts_with("Nothing fits:"))
            .expect("the advice");
        assert!(!advice.contains("--optimizer"), "{more:?}: {advice}");
    }
}

#[test]
fn plan_train_reads_a_config_json() {
    let dir = std::env::temp_dir().join(format!("memprof-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        r#"{"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
          "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-05,
          "tie_word_embeddings": false, "vocab_size": 32000}"#,
    )
    .expect("write config");
    let p = path.display().to_string();
    let doc = json(&[
        "plan",
        "train",
        "--model",
        &p,
        "--gpus",
        "16",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--micro-batch",
        "1",
        "--json",
    ]);
    assert!(doc["model"]["params"].as_u64() > doc["model"]["active_params"].as_u64());
    std::fs::write(&path, "{\"hidden_size\": 4096}").expect("write config");
    fails_with_one_line(
        &[
            "plan",
            "train",
            "--model",
            &p,
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            "--seq-len",
            "1",
            "--micro-batch",
            "1",
        ],
        "missing num_hidden_layers",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plan_train_bad_input_exits_2() {
    let base = [
        "plan",
        "train",
        "--gpus",
        "8",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--micro-batch",
        "1",
    ];
    let mut unknown = base.to_vec();
    unknown.extend(["--model", "no-such-model"]);
    fails_with_one_line(&unknown, "not a built-in model");
    let mut bad_tp = base.to_vec();
    bad_tp.extend(["--model", "llama-3-8b", "--tp", "3"]);
    fails_with_one_line(&bad_tp, "no layout of 8 GPUs");
    let bad_size = [
        "plan",
        "train",
        "--model",
        "llama-3-8b",
        "--gpus",
        "8",
        "--gpu-memory",
        "lots",
        "--seq-len",
        "4096",
        "--micro-batch",
        "1",
    ];
    assert_eq!(memprof(&bad_size).status.code(), Some(2));
}

#[test]
fn plan_kv_json_sizes_the_pool_like_vllm() {
    // reference/planner-math.md §3.3 worked check: Llama-3-8B bf16, block 16, 50 GiB.
    let doc = json(&[
        "plan",
        "kv",
        "--model",
        "llama-3-8b",
        "--kv-memory",
        "50GiB",
        "--max-model-len",
        "8192",
        "--json",
    ]);
    assert_eq!(doc["kv_bytes_per_token"], 131_072);
    assert_eq!(doc["block_bytes"], 2 << 20);
    assert_eq!(doc["num_blocks"], 25_600);
    assert_eq!(doc["max_tokens"], 409_600);
    assert_eq!(doc["max_concurrent_sequences"], 50);
    let tp = json(&[
        "plan",
        "kv",
        "--model",
        "llama-3-70b",
        "--gpu-memory",
        "80GiB",
        "--tp",
        "4",
        "--dtype",
        "fp8",
        "--json",
    ]);
    assert_eq!(tp["kv_bytes_per_token"], 327_680 / 2 / 4);
}

#[test]
fn plan_kv_text_and_errors() {
    let out = memprof(&[
        "plan",
        "kv",
        "--model",
        "mistral-7b",
        "--gpu-memory",
        "24GiB",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("KV per token per GPU: 128.00 KiB"));
    // No room is an answer, not an error: exit 1 with the verdict, and plurals that agree.
    let out = memprof(&[
        "plan",
        "kv",
        "--model",
        "llama-3-70b",
        "--gpu-memory",
        "80GiB",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("does not fit: the weights"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("nothing is left for the KV cache"));
    let one = memprof(&[
        "plan",
        "kv",
        "--model",
        "llama-3-70b",
        "--gpu-memory",
        "80GiB",
        "--tp",
        "2",
        "--max-model-len",
        "131072",
        "--max-num-seqs",
        "4",
    ]);
    assert_eq!(one.status.code(), Some(1), "{}", stderr(&one));
    let text = stdout(&one);
    assert!(!text.contains(" 1 sequences"), "{text}");
    assert!(text.contains("4 sequences fit at most"), "{text}");
    fails_with_one_line(
        &[
            "plan",
            "kv",
            "--model",
            "llama-3-8b",
            "--gpu-memory",
            "80GiB",
            "--max-num-seqs",
            "0",
        ],
        "--max-num-seqs",
    );
    fails_with_one_line(
        &["plan", "kv", "--model", "t5-large", "--kv-memory", "1GiB"],
        "encoder-decoder",
    );
    fails_with_one_line(
        &[
            "plan",
            "kv",
            "--model",
            "llama-3-8b",
            "--gpu-memory",
            "80GiB",
            "--utilization",
            "2",
        ],
        "--utilization",
    );
}

/// A file `name` holding `text`, in a scratch directory removed when it is dropped.
fn temp_file(name: &str, text: &str) -> Within {
    let dir = Scratch::new("plan");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    Within::new(dir, path)
}

#[test]
fn plan_pack_json_has_the_contract_shape() {
    // HF blog "Packing with Flash Attention": lengths 4, 8, 5, 11 flatten to 28 tokens.
    let path = temp_file("lengths.txt", "4\n8\n5\n11\n");
    let p = path.display().to_string();
    let doc = json(&["plan", "pack", "--lengths", &p, "--max-len", "16", "--json"]);
    assert_eq!(doc["sequences"], 4);
    assert_eq!(doc["tokens"], 28);
    assert_eq!(doc["padded"]["batches"], 4);
    assert_eq!(doc["padded"]["padding_fraction"], 1.0 - 28.0 / 64.0);
    assert!(doc["bucketed"]["edges"].is_array());
    assert!(doc["bucketed"]["padding_fraction"].is_f64());
    assert_eq!(doc["packed"]["bins"], 2);
    assert_eq!(doc["packed"]["efficiency"], 28.0 / 32.0);
    assert_eq!(doc["lower_bound_bins"], 2);
}

#[test]
fn plan_pack_reads_jsonl_and_reports_bad_lines() {
    let path = temp_file(
        "data.jsonl",
        "{\"input_ids\": [1, 2, 3]}\n{\"length\": 9}\n{\"text\": \"no length\"}\n",
    );
    let p = path.display().to_string();
    fails_with_one_line(
        &["plan", "pack", "--lengths", &p, "--max-len", "8"],
        "line 3",
    );
    let good = temp_file(
        "good.jsonl",
        "{\"input_ids\": [1, 2, 3]}\n{\"length\": 9}\n",
    );
    let g = good.display().to_string();
    let out = memprof(&[
        "plan",
        "pack",
        "--lengths",
        &g,
        "--max-len",
        "8",
        "--model",
        "llama-3-8b",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("1 longer sequences truncated"), "{text}");
    assert!(text.contains("activations"), "{text}");
    fails_with_one_line(
        &[
            "plan",
            "pack",
            "--lengths",
            "/no/such/file",
            "--max-len",
            "8",
        ],
        "cannot open",
    );
}

#[test]
fn plan_checkpoint_finds_the_cheapest_plan_under_a_budget() {
    let doc = json(&[
        "plan",
        "checkpoint",
        "--model",
        "llama-3-8b",
        "--seq-len",
        "8192",
        "--budget",
        "30GiB",
        "--json",
    ]);
    let names: Vec<&str> = doc["strategies"]
        .as_array()
        .expect("strategies")
        .iter()
        .map(|s| s["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["none", "selective", "full", "sqrt_n"]);
    let optimal = &doc["optimal"];
    assert!(optimal["activation_bytes"].as_u64() <= Some(30 << 30));
    let chosen = ["store", "selective", "full"]
        .iter()
        .map(|k| optimal[k].as_array().expect("indices").len())
        .sum::<usize>();
    assert_eq!(chosen, 32);
    let out = memprof(&[
        "plan",
        "checkpoint",
        "--model",
        "llama-3-8b",
        "--seq-len",
        "8192",
        "--budget",
        "1MiB",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("Nothing fits"));
}

#[test]
fn plan_kv_workload_compares_paged_and_contiguous() {
    let mut lines = String::new();
    for i in 0..200u64 {
        lines.push_str(&format!(
            "{{\"arrival\": {}, \"prompt\": {}, \"output\": {}}}\n",
            i / 4,
            100 + (i * 37) % 300,
            50 + (i * 53) % 200
        ));
    }
    let path = temp_file("workload.jsonl", &lines);
    let p = path.display().to_string();
    let doc = json(&[
        "plan",
        "kv",
        "--model",
        "llama-3-8b",
        "--kv-memory",
        "2GiB",
        "--max-model-len",
        "2048",
        "--workload",
        &p,
        "--json",
    ]);
    let w = &doc["workload"];
    assert_eq!(w["requests"], 200);
    for policy in ["paged", "contiguous"] {
        assert_eq!(w[policy]["completed"], 200, "{policy}");
        assert!(w[policy]["series"]
            .as_array()
            .is_some_and(|s| !s.is_empty()));
    }
    let util = |p: &str| w[p]["utilization"].as_f64().expect("utilization");
    assert!(util("paged") > util("contiguous"));
    assert!(w["paged"]["max_concurrency"].as_u64() > w["contiguous"]["max_concurrency"].as_u64());
    let bad = temp_file("bad.jsonl", "{\"prompt\": 3}\n");
    let b = bad.display().to_string();
    fails_with_one_line(
        &[
            "plan",
            "kv",
            "--model",
            "llama-3-8b",
            "--kv-memory",
            "1GiB",
            "--workload",
            &b,
        ],
        "line 1",
    );
}

#[test]
fn plan_checkpoint_takes_measured_layers() {
    let mut layers = Vec::new();
    for i in 0..12 {
        let stored = if i % 3 == 0 { 400 } else { 100 };
        layers.push(format!(
            "{{\"name\": \"block.{i}\", \"stored_bytes\": {stored}, \"input_bytes\": 10, \"forward_cost\": 1.0}}"
        ));
    }
    let path = temp_file("layers.json", &format!("[{}]", layers.join(",")));
    let p = path.display().to_string();
    // Storing all: 4 x 400 + 8 x 100 = 2400 bytes; 1500 forces recompute of the big layers.
    let doc = json(&[
        "plan",
        "checkpoint",
        "--layers",
        &p,
        "--budget",
        "1500",
        "--json",
    ]);
    assert_eq!(doc["layers"], 12);
    let optimal = &doc["optimal"];
    assert!(optimal["activation_bytes"].as_u64() <= Some(1500));
    let full: Vec<u64> = optimal["full"]
        .as_array()
        .expect("full")
        .iter()
        .filter_map(Value::as_u64)
        .collect();
    assert!(full.iter().all(|i| i % 3 == 0), "{full:?}");
    let tight = json(&[
        "plan",
        "checkpoint",
        "--layers",
        &p,
        "--budget",
        "10",
        "--json",
    ]);
    assert_eq!(tight["layers"], 12);
    assert_eq!(tight["optimal"], Value::Null);
    assert_eq!(
        memprof(&["plan", "checkpoint", "--budget", "1GiB"])
            .status
            .code(),
        Some(2)
    );
    let bad = temp_file("bad-layers.json", "[{\"stored_bytes\": 1}]");
    let b = bad.display().to_string();
    fails_with_one_line(
        &["plan", "checkpoint", "--layers", &b, "--budget", "1GiB"],
        "missing field `input_bytes`",
    );
}

/// The estimate terms of a candidate, by name.
fn term(c: &Value, name: &str) -> i64 {
    c["terms"]
        .as_array()
        .expect("terms")
        .iter()
        .find(|t| t["name"] == name)
        .and_then(|t| t["bytes"].as_i64())
        .unwrap_or_else(|| panic!("no term {name}: {c}"))
}

/// Every candidate of a search: the estimate terms add up to `total_bytes`, all terms to
/// `required_bytes`, each term equals its field in `memory`, and each carries a formula and
/// a source.
#[test]
fn plan_train_terms_add_up_to_the_total() {
    let mut args = TRAIN_8B.to_vec();
    args.extend(["1", "--top", "100", "--json"]);
    let doc = json(&args);
    let candidates = doc["candidates"].as_array().expect("candidates");
    assert!(candidates.len() > 20);
    let mut zero_3 = 0;
    for c in candidates {
        let terms = c["terms"].as_array().expect("terms");
        let sum = |kind: Option<&str>| -> i64 {
            terms
                .iter()
                .filter(|t| kind.is_none_or(|k| t["kind"] == k))
                .map(|t| t["bytes"].as_i64().expect("bytes"))
                .sum()
        };
        let m = &c["memory"];
        assert_eq!(
            Some(sum(Some("estimate"))),
            m["total_bytes"].as_i64(),
            "{c}"
        );
        assert_eq!(Some(sum(None)), m["required_bytes"].as_i64(), "{c}");
        for t in terms {
            let name = t["name"].as_str().expect("name");
            assert_eq!(m[name].as_i64(), t["bytes"].as_i64(), "{name}");
            assert!(!t["formula"].as_str().unwrap_or("").is_empty(), "{name}");
            assert!(!t["source"].as_str().unwrap_or("").is_empty(), "{name}");
        }
        let published = c["published"].as_array().expect("published");
        let zero = &published[0];
        assert!(zero["source"]
            .as_str()
            .unwrap_or("")
            .starts_with("ZeRO paper"));
        let sharded =
            term(c, "params_sharded_bytes") + term(c, "grads_bytes") + term(c, "optimizer_bytes");
        let paper = zero["bytes"].as_i64().expect("bytes");
        assert!((sharded - paper).abs() <= 2, "{sharded} vs {paper}");
        let layers = &published[1];
        assert_eq!(
            layers["bytes"].as_i64(),
            Some(term(c, "activations_layers_bytes"))
        );
        let sharded_over = c["dp"].as_u64().unwrap_or(0) * c["cp"].as_u64().unwrap_or(0);
        if c["zero"] == 3 && sharded_over > 1 {
            zero_3 += 1;
            assert!(term(c, "params_gathered_bytes") > 0);
            assert!(m["fsdp_unit_params"].as_u64() > Some(0));
        }
    }
    assert!(zero_3 > 0);
}

fn fixed_train(model: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "plan", "train", "--model", model, "--tp", "1", "--pp", "1", "--cp", "1", "--json",
    ];
    args.extend_from_slice(extra);
    let doc = json(&args);
    doc["candidates"][0].clone()
}

/// ZeRO paper Figure 1 (Psi = 7.5B, N_d = 64, mixed-precision Adam, GB = 1e9): 31.4 / 16.6 /
/// 1.9 GB for stages 1 / 2 / 3, in the published figure and in the sum of the three sharded
/// terms; ZeRO-3's gathered units come on top, named.
#[test]
fn zero_paper_figure_1_from_the_terms() {
    for (zero, want) in [
        ("1", 31_406_250_000i64),
        ("2", 16_640_625_000),
        ("3", 1_875_000_000),
    ] {
        let c = fixed_train(
            "llama-2-7b",
            &[
                "--params",
                "7.5e9",
                "--gpus",
                "64",
                "--gpu-memory",
                "80GiB",
                "--seq-len",
                "2048",
                "--micro-batch",
                "1",
                "--zero",
                zero,
                "--recompute",
                "full",
            ],
        );
        let sharded = term(&c, "params_sharded_bytes")
            + term(&c, "grads_bytes")
            + term(&c, "optimizer_bytes");
        assert!((sharded - want).abs() <= 2, "ZeRO-{zero}: {sharded}");
        assert_eq!(
            c["published"][0]["bytes"].as_i64(),
            Some(want),
            "ZeRO-{zero}"
        );
        let gathered = term(&c, "params_gathered_bytes") + term(&c, "grads_gathered_bytes");
        assert_eq!(gathered > 0, zero == "3", "ZeRO-{zero}");
        let memprof = c["published"][0]["memprof_bytes"].as_i64().expect("bytes");
        assert!((memprof - want - gathered).abs() <= 2, "ZeRO-{zero}");
    }
}

/// Ultra-Scale Playbook `memory-recomputation`, Llama-3.1-8B, s = 4096, bs 1, selective:
/// 34 s h L + s h = 17.016 GiB, from the layers term plus the embedding's s h, on the real
/// model (GQA, SwiGLU), whose own shapes go to the shape term.
#[test]
fn playbook_activations_from_the_layers_term() {
    let c = fixed_train(
        "llama-3.1-8b",
        &[
            "--gpus",
            "1",
            "--gpu-memory",
            "141GB",
            "--seq-len",
            "4096",
            "--micro-batch",
            "1",
            "--zero",
            "0",
            "--recompute",
            "selective",
        ],
    );
    let layers = term(&c, "activations_layers_bytes");
    assert_eq!(layers, 34 * 4096 * 4096 * 32);
    let gib = (layers + 4096 * 4096) as f64 / (1u64 << 30) as f64;
    assert_eq!((gib * 1000.0).round() / 1000.0, 17.016);
    assert!(term(&c, "activations_shape_bytes") > 0);
    assert!(term(&c, "activations_head_bytes") > 4096 * 4096);
    assert_eq!(c["published"][1]["bytes"].as_i64(), Some(layers));
}

#[test]
fn plan_train_explain_names_every_term_and_source() {
    let mut args = TRAIN_8B.to_vec();
    args.extend(["1", "--zero", "3", "--explain"]);
    let out = memprof(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for needle in [
        "How candidate 0 is counted",
        "weights gathered for ZeRO-3 units",
        "source: Rajbhandari et al. 2020",
        "source: Korthikanti et al. 2022, Table 2",
        "ZeRO paper (Rajbhandari et al. 2020):",
        "memprof adds",
        "required",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}

/// `plan kv --model M --dtype D` without a memory size: the per-token and per-block bytes
/// (Llama-3-8B fp8: 64 KiB a token, 1 MiB a 16-token block), and null pool fields in JSON.
#[test]
fn plan_kv_without_memory_prints_per_token_and_block() {
    let out = memprof(&["plan", "kv", "--model", "llama-3-8b", "--dtype", "fp8"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("KV per token per GPU: 64.00 KiB (65536 B); per block: 1.00 MiB"),
        "{text}"
    );
    let doc = json(&["plan", "kv", "--model", "llama-3.1-405b", "--json"]);
    assert_eq!(doc["kv_bytes_per_token"], 516_096);
    assert_eq!(doc["block_bytes"], 516_096 * 16);
    assert_eq!(doc["num_blocks"], Value::Null);
    assert_eq!(doc["max_concurrent_sequences"], Value::Null);
    assert!(doc.get("solve").is_none());
}

/// Flags vLLM's engine arguments accept (`vllm serve --help`, EngineArgs) and SGLang's
/// server arguments, as checked in their docs; the solve must print no other.
const VLLM_FLAGS: [&str; 9] = [
    "--gpu-memory-utilization",
    "--kv-cache-memory-bytes",
    "--max-model-len",
    "--max-num-seqs",
    "--tensor-parallel-size",
    "--kv-cache-dtype",
    "--block-size",
    "--enforce-eager",
    "--max-num-batched-tokens",
];
const SGLANG_FLAGS: [&str; 7] = [
    "--mem-fraction-static",
    "--max-total-tokens",
    "--context-length",
    "--max-running-requests",
    "--tp-size",
    "--kv-cache-dtype",
    "--disable-cuda-graph",
];

fn flag_value(flags: &Value, name: &str) -> Option<String> {
    let list: Vec<&str> = flags.as_array()?.iter().filter_map(Value::as_str).collect();
    let i = list.iter().position(|f| *f == name)?;
    list.get(i + 1).map(|v| v.to_string())
}

/// Both directions: the most sequences at a length, then the longest length at that many
/// sequences, and both given as a check; the flags are the engines' own names with the
/// solved values.
#[test]
fn plan_kv_solves_both_directions() {
    let base = [
        "plan",
        "kv",
        "--model",
        "llama-3.1-8b",
        "--gpu-memory",
        "80GiB",
        "--json",
    ];
    let mut by_len = base.to_vec();
    by_len.extend(["--max-model-len", "32768"]);
    let doc = json(&by_len);
    let s = &doc["solve"];
    assert_eq!(s["fits"], true);
    let seqs = s["max_num_seqs"].as_u64().expect("seqs");
    assert!(seqs > 0);
    let available = doc["budget"]["kv_available_bytes"].as_u64().expect("bytes");
    let budget = &doc["budget"];
    let used: u64 = [
        "weights_bytes",
        "activation_peak_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
    ]
    .iter()
    .map(|k| budget[k].as_u64().expect("bytes"))
    .sum();
    assert_eq!(
        used + available,
        budget["budget_bytes"].as_u64().expect("bytes")
    );
    // 32768 tokens = 2048 blocks of 2 MiB; one more sequence would not fit.
    let blocks = available / (2 << 20);
    assert_eq!(seqs, blocks / 2048);
    assert_eq!(s["kv_cache_bytes"].as_u64(), Some(seqs * 2048 * (2 << 20)));
    for (engine, known) in [("vllm", &VLLM_FLAGS[..]), ("sglang", &SGLANG_FLAGS[..])] {
        for f in s["flags"][engine]
            .as_array()
            .expect("flags")
            .iter()
            .filter_map(Value::as_str)
        {
            assert!(!f.starts_with("--") || known.contains(&f), "{engine}: {f}");
        }
    }
    let vllm = &s["flags"]["vllm"];
    assert_eq!(
        flag_value(vllm, "--max-model-len").as_deref(),
        Some("32768")
    );
    assert_eq!(flag_value(vllm, "--max-num-seqs"), Some(seqs.to_string()));
    assert_eq!(
        flag_value(vllm, "--kv-cache-memory-bytes"),
        s["kv_cache_bytes"].as_u64().map(|b| b.to_string())
    );
    assert_eq!(
        flag_value(&s["flags"]["sglang"], "--max-total-tokens"),
        Some((seqs * 32768).to_string())
    );
    let seqs_text = seqs.to_string();
    let mut by_seqs = base.to_vec();
    by_seqs.extend(["--max-num-seqs", &seqs_text]);
    let back = json(&by_seqs);
    assert!(back["solve"]["max_model_len"].as_u64() >= Some(32768));
    let more = (seqs + 1).to_string();
    let mut check = by_len.clone();
    check.extend(["--max-num-seqs", &more]);
    // Not fitting is a finding: exit 1, with the same document.
    let out = memprof(&check);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let over: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(over["solve"]["fits"], false);
    // Over the utilization budget but within the GPU: tight.
    assert_eq!(over["solve"]["verdict"], "tight");
    assert_eq!(over["solve"]["largest_max_num_seqs"].as_u64(), Some(seqs));
    assert!(over["solve"]["flags"]["vllm"]
        .as_array()
        .is_some_and(Vec::is_empty));
    let mut text_args = by_len.clone();
    text_args.retain(|a| *a != "--json");
    let out = memprof(&text_args);
    let text = stdout(&out);
    assert!(
        text.contains("vLLM flags:   --gpu-memory-utilization 0.9 --kv-cache-memory-bytes"),
        "{text}"
    );
    assert!(
        text.contains("SGLang flags: --mem-fraction-static"),
        "{text}"
    );
}

/// With a workload, the paged pool at several max_num_seqs settings: the worst-case answer
/// first, each with its preemptions and the concurrency reached; short requests reach more
/// than the worst case allows.
#[test]
fn plan_kv_workload_per_setting() {
    let mut lines = String::new();
    for i in 0..300u64 {
        lines.push_str(&format!(
            "{{\"arrival\": {}, \"prompt\": {}, \"output\": {}}}\n",
            i / 10,
            200 + (i * 37) % 300,
            100 + (i * 53) % 200
        ));
    }
    let path = temp_file("mix.jsonl", &lines);
    let p = path.display().to_string();
    let doc = json(&[
        "plan",
        "kv",
        "--model",
        "llama-3-8b",
        "--gpu-memory",
        "24GiB",
        "--max-model-len",
        "8192",
        "--workload",
        &p,
        "--json",
    ]);
    let worst = doc["solve"]["max_num_seqs"].as_u64().expect("seqs");
    let settings = doc["workload"]["settings"].as_array().expect("settings");
    assert!(settings.len() >= 2);
    assert_eq!(settings[0]["max_num_seqs"].as_u64(), Some(worst));
    for s in settings {
        assert_eq!(s["completed"], 300);
        assert!(s["max_concurrency"].as_u64() <= s["max_num_seqs"].as_u64());
        assert!(s["preemptions"].is_u64());
    }
    let reached = |s: &Value| s["max_concurrency"].as_u64().unwrap_or(0);
    assert!(settings.iter().any(|s| reached(s) > worst), "{settings:?}");
    let out = memprof(&[
        "plan",
        "kv",
        "--model",
        "llama-3-8b",
        "--gpu-memory",
        "24GiB",
        "--max-model-len",
        "8192",
        "--workload",
        &p,
    ]);
    let text = stdout(&out);
    assert!(
        text.contains("the paged pool at each max_num_seqs"),
        "{text}"
    );
}

/// Published measured peaks (`fixtures/examples/measured_peaks.json`) against memprof: the
/// page `docs/plan-accuracy.md` shows the table this test computes, and the median and worst
/// relative errors may not grow past today's.
#[test]
fn published_measured_peaks_accuracy() {
    const MEDIAN_AT_MOST: f64 = 0.043;
    const WORST_AT_MOST: f64 = 0.161;
    let doc = measured_peaks();
    let page = std::fs::read_to_string(repo().join("docs/plan-accuracy.md")).expect("the page");
    let gib = (1u64 << 30) as f64;
    let mut errors = Vec::new();
    for p in doc["peaks"].as_array().expect("peaks") {
        let id = p["id"].as_str().expect("id");
        assert!(
            !p["source"].as_str().unwrap_or("").is_empty(),
            "{id}: no source"
        );
        // Only the run's terms are compared.
        let out = planned(&peak_args(p));
        let bytes = match p["estimate"].as_str() {
            Some(kind @ ("train_reserved" | "train_device_used")) => {
                train_bytes(&out, kind == "train_device_used")
            }
            Some("serve_non_kv") => {
                let b = &out["budget"];
                [
                    "weights_bytes",
                    "activation_peak_bytes",
                    "non_torch_bytes",
                    "cuda_graph_bytes",
                ]
                .iter()
                .map(|k| b[k].as_u64().expect("bytes"))
                .sum::<u64>()
            }
            // SGLang's "mem usage" after loading the weights.
            Some("serve_weights") => out["budget"]["weights_bytes"].as_u64().expect("bytes"),
            other => panic!("{id}: unknown estimate {other:?}"),
        };
        let measured = p["measured_gib"].as_f64().expect("measured");
        let estimate = bytes as f64 / gib;
        let error = (estimate - measured) / measured;
        let row = format!(
            "| `{id}` | {measured:.2} | {estimate:.2} | {:+.1}% |",
            error * 100.0
        );
        assert!(page.contains(&row), "docs/plan-accuracy.md lacks {row}");
        errors.push(error.abs());
    }
    errors.sort_by(f64::total_cmp);
    let n = errors.len();
    assert!(n >= 24, "{n} peaks");
    let ids: Vec<&str> = doc["peaks"]
        .as_array()
        .expect("peaks")
        .iter()
        .filter_map(|p| p["id"].as_str())
        .collect();
    // Training and serving both, from more than one framework each.
    for prefix in ["torchtitan-", "hf-", "vllm-", "sglang-"] {
        assert!(
            ids.iter().any(|i| i.starts_with(prefix)),
            "no {prefix} peak"
        );
    }
    let median = if n % 2 == 0 {
        (errors[n / 2 - 1] + errors[n / 2]) / 2.0
    } else {
        errors[n / 2]
    };
    let worst = errors[n - 1];
    let summary = format!(
        "Over {n} published peaks: median {:.1}%, worst {:.1}%.",
        median * 100.0,
        worst * 100.0
    );
    assert!(
        page.contains(&summary),
        "docs/plan-accuracy.md lacks {summary}"
    );
    assert!(median <= MEDIAN_AT_MOST, "median error grew: {summary}");
    assert!(worst <= WORST_AT_MOST, "worst error grew: {summary}");
}

/// The Hugging Face guide's bert-large runs with gradient checkpointing
/// (fixtures/examples/measured_peaks.json) used more memory under fp16 autocast (7275 MiB) than
/// in fp32 (6775 MiB): autocast's 16-bit copies of the weights outlast the few activations
/// checkpointing keeps. `--precision amp-fp16` gives that order; the 16-bit recipe (`fp16`,
/// 16-bit activations and no weight copies) gives the other.
#[test]
fn autocast_with_checkpointing_needs_more_than_fp32_as_measured() {
    let doc = measured_peaks();
    let peak = |id: &str| {
        doc["peaks"]
            .as_array()
            .expect("peaks")
            .iter()
            .find(|p| p["id"] == id)
            .cloned()
            .expect("a peak")
    };
    let used = |args: &[&str]| train_bytes(&planned(args), true);
    let fp32 = peak("hf-bert-large-b1x4-fp32-ckpt");
    let amp = peak("hf-bert-large-b1x4-fp16-ckpt");
    assert!(amp["measured_gib"].as_f64() > fp32["measured_gib"].as_f64());
    let amp_args = peak_args(&amp);
    assert!(amp_args.contains(&"amp-fp16"), "{amp_args:?}");
    let fp32_bytes = used(&peak_args(&fp32));
    assert!(used(&amp_args) > fp32_bytes);
    let sixteen_bit: Vec<&str> = amp_args
        .iter()
        .map(|&a| if a == "amp-fp16" { "fp16" } else { a })
        .collect();
    assert!(used(&sixteen_bit) < fp32_bytes);
}

/// SGLang's log of Qwen3-14B (xorbitsai/inference issue #3481, in
/// fixtures/examples/measured_peaks.json) says "KV Cache is allocated. #tokens: 91749, K size:
/// 7.00 GB, V size: 7.00 GB" (GiB): `plan kv`'s bytes a token for that config give the same.
#[test]
fn plan_kv_per_token_matches_sglangs_logged_cache() {
    let doc = json(&[
        "plan",
        "kv",
        "--model",
        "fixtures/examples/qwen3-14b/config.json",
        "--kv-memory",
        "16GiB",
        "--json",
    ]);
    let per_token = doc["kv_bytes_per_token"].as_u64().expect("bytes");
    let k_gib = (91749 * per_token / 2) as f64 / (1u64 << 30) as f64;
    assert_eq!(format!("{k_gib:.2}"), "7.00", "{per_token}");
}

/// `--loss compiled` (the loss under torch.compile) keeps the 16-bit logits and one 16-bit
/// gradient where the eager loss keeps fp32 logits and two fp32 gradients: 8 bytes a logit
/// less in the head term, nothing else changes, the explanation says so, and the Megatron-LM
/// recipes, whose loss is their own, refuse it.
#[test]
fn compiled_loss_keeps_less_in_the_head() {
    let run = |loss: &str| {
        let mut args = vec![
            "plan",
            "train",
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "32",
            "--gpu-memory",
            "140GiB",
            "--seq-len",
            "8192",
            "--micro-batch",
            "2",
            "--tp",
            "1",
            "--pp",
            "1",
            "--cp",
            "1",
            "--zero",
            "3",
            "--recompute",
            "none",
            "--json",
        ];
        args.extend(["--loss", loss]);
        json(&args)
    };
    let eager = run("eager");
    let compiled = run("compiled");
    let m = |doc: &Value, k: &str| doc["candidates"][0]["memory"][k].as_i64().expect(k);
    let logits = 8192 * 2 * 128256;
    assert_eq!(
        m(&eager, "activations_head_bytes") - m(&compiled, "activations_head_bytes"),
        8 * logits
    );
    for k in [
        "activations_layers_bytes",
        "activations_shape_bytes",
        "activations_recompute_bytes",
        "params_sharded_bytes",
        "optimizer_bytes",
    ] {
        assert_eq!(m(&eager, k), m(&compiled, k), "{k}");
    }
    let text = stdout(&memprof(&[
        "plan",
        "train",
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--micro-batch",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--loss",
        "compiled",
        "--explain",
    ]));
    assert!(
        text.contains("the logits the compiled loss keeps"),
        "{text}"
    );
    fails_with_one_line(
        &[
            "plan",
            "train",
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            "--seq-len",
            "4096",
            "--micro-batch",
            "1",
            "--precision",
            "megatron-bf16",
            "--loss",
            "compiled",
        ],
        "--loss compiled",
    );
}

/// `--recompute per-op` (torchtitan's per-operator checkpointing) is named in the table, the
/// JSON and the explanation, keeps less than Korthikanti's selective recompute, and rebuilds the
/// rest of a layer in backward.
#[test]
fn per_op_recompute_is_named_and_keeps_less_than_selective() {
    let run = |recompute: &str| {
        json(&[
            "plan",
            "train",
            "--model",
            "llama-3.1-8b",
            "--gpus",
            "8",
            "--gpu-memory",
            "96GiB",
            "--seq-len",
            "8192",
            "--micro-batch",
            "2",
            "--tp",
            "1",
            "--pp",
            "1",
            "--cp",
            "1",
            "--zero",
            "3",
            "--recompute",
            recompute,
            "--json",
        ])
    };
    let op = run("per-op");
    let selective = run("selective");
    let c = &op["candidates"][0];
    assert_eq!(c["recompute"], "per-op");
    let kept = |doc: &Value| {
        let m = &doc["candidates"][0]["memory"];
        m["activations_layers_bytes"].as_i64().expect("bytes")
            + m["activations_shape_bytes"].as_i64().expect("bytes")
    };
    assert!(kept(&op) * 2 < kept(&selective));
    assert!(
        c["memory"]["activations_recompute_bytes"]
            .as_u64()
            .expect("bytes")
            > 0
    );
}

/// Writes two generated steps of Llama 3.1 8B at sequence 1024, micro-batch 1, no recompute:
/// 1 GiB of weights, then each step's layers keep `scale` times the formula's per-layer bytes
/// and its head what the formula gives, all freed in backward; 2 GiB of optimizer states come
/// between the steps and stay. Returns the path and the formula for that run.
fn calibration_snapshot(
    dir: &std::path::Path,
    scale: f64,
) -> (
    std::path::PathBuf,
    memprof::plan::activations::ActivationMemory,
) {
    use memprof::model::{Action, StackTable, StreamIndex, TraceEntry};
    use memprof::plan::activations::{activation_memory, ActivationSettings};
    let model = memprof::plan::builtin::find("llama-3.1-8b").expect("built-in");
    let formula = activation_memory(&model, &ActivationSettings::one_gpu(1024, 1));
    let per_layer = formula.layers + formula.shape + formula.recompute_peak;
    let per_layer = (scale * per_layer / model.layers as f64).round() as u64;
    let s = StreamIndex(0);
    let mut entries = Vec::new();
    let mut addr = 0x7f00_0000_0000u64;
    let mut alloc = |size: u64, entries: &mut Vec<TraceEntry>| {
        entries.push(TraceEntry::new(Action::Alloc, Some(addr), size, s));
        addr += size.next_multiple_of(1 << 21);
        addr - size.next_multiple_of(1 << 21)
    };
    alloc(1 << 30, &mut entries);
    for step in 0..2 {
        if step == 1 {
            alloc(2 << 30, &mut entries);
        }
        let kept: Vec<(u64, u64)> = std::iter::repeat_n(per_layer, model.layers as usize)
            .chain(std::iter::once(formula.head().round() as u64))
            .map(|size| (alloc(size, &mut entries), size))
            .collect();
        // Backward frees the activations.
        for &(a, size) in kept.iter().rev() {
            entries.push(TraceEntry::new(Action::FreeRequested, Some(a), size, s));
            entries.push(TraceEntry::new(Action::FreeCompleted, Some(a), size, s));
        }
    }
    let snapshot = model_snapshot(entries, Vec::new(), StackTable::default(), None);
    let path = dir.join("step.pickle");
    write_snapshot(&snapshot, &path);
    (path, formula)
}

/// `--calibrate` on a generated step whose layers keep 1.25 times the formula: the fit finds
/// 1.25, the text shows the measured configuration first, and the first candidate's
/// per-layer activations are scaled by it while its head stays the formula's.
#[test]
fn calibrate_recovers_a_known_coefficient_from_a_snapshot() {
    let dir = Scratch::new("calibrate");
    let (path, _) = calibration_snapshot(&dir, 1.25);
    let path = path.display().to_string();
    let args = [
        "plan",
        "train",
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "8192",
        "--micro-batch",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--cp",
        "1",
        "--zero",
        "3",
        "--recompute",
        "none",
        "--calibrate",
        &path,
        "--calibrate-seq-len",
        "1024",
        "--calibrate-micro-batch",
        "1",
    ];
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let doc = json(&with_json);
    let c = &doc["calibration"];
    let k = c["coefficient"].as_f64().expect("coefficient");
    assert!((k - 1.25).abs() < 1e-6, "{c}");
    assert_eq!(c["measured_seq_len"], 1024);
    let m = &doc["candidates"][0]["memory"];
    let head = m["activations_head_bytes"].as_f64().expect("bytes");
    let layers = [
        "activations_layers_bytes",
        "activations_shape_bytes",
        "activations_recompute_bytes",
    ]
    .iter()
    .map(|k| m[k].as_f64().expect("bytes"))
    .sum::<f64>();
    let calibrated = c["calibrated_activations_bytes"].as_f64().expect("bytes");
    assert!(
        (calibrated - (head + 1.25 * layers)).abs() < 4.0,
        "{calibrated} {head} {layers}"
    );
    let total = m["total_bytes"].as_f64().expect("bytes");
    let grown = c["calibrated_total_bytes"].as_f64().expect("bytes") - total;
    assert!((grown - 0.25 * layers).abs() < 4.0, "{grown}");

    let text = stdout(&memprof(&args));
    assert!(text.starts_with("Calibration from "), "{text}");
    assert!(text.contains("per-layer coefficient 1.250"), "{text}");
    assert!(!text.contains("far from 1"), "{text}");
    let at = |needle: &str| text.find(needle).expect(needle);
    assert!(at("Calibration") < at(" evaluated, "));
}

/// A snapshot of another model (demo_oom is no Llama 3 8B step at sequence 1024) gives a
/// coefficient far from 1, and the text says what to check.
#[test]
fn calibrate_doubts_a_coefficient_far_from_one() {
    let path = fixture("snapshots/demo_oom.pickle").display().to_string();
    let out = memprof(&[
        "plan",
        "train",
        "--model",
        "llama-3-8b",
        "--gpus",
        "1",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "1024",
        "--micro-batch",
        "1",
        "--calibrate",
        &path,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            ")\n  far from 1: check that the snapshot is a training step of this model with these \
             sizes, precision, attention and recompute\nCandidate 0 calibrated: "
        ),
        "{text}"
    );
}

/// A snapshot without a trace cannot calibrate: one line naming the flag and the file, exit 2.
#[test]
fn calibrate_refuses_a_snapshot_without_a_trace() {
    let path = fixture("snapshots/segments_only.pickle")
        .display()
        .to_string();
    let out = memprof(&[
        "plan",
        "train",
        "--model",
        "llama-3.1-8b",
        "--gpus",
        "8",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--micro-batch",
        "1",
        "--calibrate",
        &path,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--calibrate") && err.contains("segments_only.pickle"),
        "{err}"
    );
    assert!(err.contains("no allocation trace"), "{err}");
}

/// A real snapshot whose model is known: kkaitlyn111/cs336-a2-systems profiles one full
/// training step of the CS336 "2.7b" Transformer (`get_model_config` in
/// `cs336_systems/benchmark.py`: d_model 2560, d_ff 10240, 32 layers, 32 heads; vocabulary
/// 10000, batch 4; context 128 by the file's name) in fp32 (its sbh-sized blocks are 4 x 128 x
/// 2560 x 4 bytes) with hand-written attention. The step's activations come out 1.37 times
/// memprof's formula for eager attention: its attention keeps more s x s matrices than
/// Korthikanti et al. count.
#[test]
fn calibrate_on_a_real_cs336_training_step() {
    let Some(real) = real_fixtures() else { return };
    let snapshot = real.join("kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle");
    let dir = Scratch::new("calibrate-real");
    let config = dir.join("config.json");
    std::fs::write(
        &config,
        r#"{"model_type": "llama", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 10000,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": false}"#,
    )
    .expect("writable");
    let doc = json(&[
        "plan",
        "train",
        "--model",
        &config.display().to_string(),
        "--gpus",
        "1",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "128",
        "--micro-batch",
        "4",
        "--tp",
        "1",
        "--pp",
        "1",
        "--cp",
        "1",
        "--zero",
        "0",
        "--recompute",
        "none",
        "--attention",
        "eager",
        "--precision",
        "fp32",
        "--calibrate",
        &snapshot.display().to_string(),
        "--json",
    ]);
    let c = &doc["calibration"];
    assert_eq!(c["measured_bytes"], 5_834_549_264u64, "{c}");
    let k = c["coefficient"].as_f64().expect("coefficient");
    assert!((k - 1.375).abs() < 0.001, "{c}");
}
