//! `memprof plan fit`: the largest micro-batch and sequence length that fit a capacity, on a
//! built trace whose answer is known and on real training snapshots, checked against a replay
//! of the trace scaled by the answer.

use crate::categories::oom_in_attention;
use crate::util::{
    add_stack, memprof, model_snapshot, module_to_stack, real_fixtures, stderr, stdout,
    write_snapshot, Scratch,
};
use memprof::analysis::categories::{split_trace, CategoryRules};
use memprof::model::{Action, StackTable};
use memprof::plan::fit::SCALING;
use memprof::sim::replay::{prepare, recorded_config, run_scaled, DeviceTrace};
use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn fit_json(args: &[&str], code: i32) -> Value {
    let mut all = vec!["plan", "fit", "--json"];
    all.extend_from_slice(args);
    let out = memprof(&all);
    assert_eq!(out.status.code(), Some(code), "{all:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// Four 16 MiB parameters, then 30 MiB activations until a 512 MiB device runs out: 14 fit
/// and the 15th fails. Taking each activation as one sample of a micro-batch of 15 and each
/// as 1000 tokens' worth, the true answers are known: 14 samples (64 + 14 x 30 = 484 MiB), and
/// 933 tokens (the 15 requests shrink to 28 MiB each, 484 MiB; at 934 they round up to 30 MiB
/// again); on a 1 GiB device 32 samples (64 + 32 x 30 = 1024 MiB).
#[test]
fn a_built_trace_gives_its_known_answer() {
    let dir = Scratch::new("plan_fit");
    let file = dir.join("oom.pickle");
    oom_in_attention(&file, 512 * MIB);
    let f = file.display().to_string();
    let common = [
        "--cuda-context",
        "0",
        "--micro-batch",
        "15",
        "--seq-len",
        "1000",
    ];
    let mut args = vec![f.as_str(), "--capacity", "512MiB"];
    args.extend_from_slice(&common);
    let doc = fit_json(&args, 1);
    assert_eq!(doc["at_oom"], true, "{doc}");
    assert_eq!(doc["fixed_bytes"], 64 * MIB);
    assert_eq!(doc["scaling_bytes"], 15 * 30 * MIB);
    assert_eq!(doc["micro_batch"]["largest"], 14, "{doc}");
    assert_eq!(doc["seq_len"]["largest"], 933, "{doc}");
    assert_eq!(doc["micro_batch"]["spare_bytes"], 28 * MIB);
    assert_eq!(
        doc["summary"],
        "at micro-batch 14 instead of 15 this run fits with 28.00 MiB to spare"
    );
    let mut args = vec![f.as_str(), "--capacity", "1GiB"];
    args.extend_from_slice(&common);
    let doc = fit_json(&args, 0);
    assert_eq!(doc["micro_batch"]["largest"], 32, "{doc}");
    assert_eq!(doc["micro_batch"]["spare_bytes"], 0);
    // Text names the split and the answer.
    let mut args = vec!["plan", "fit", f.as_str(), "--capacity", "512MiB"];
    args.extend_from_slice(&common);
    let text = stdout(&memprof(&args));
    assert!(text.contains("at the OOM"), "{text}");
    assert!(
        text.contains("micro-batch: at most 14 (the run used 15"),
        "{text}"
    );
    // Bad input: one line, exit 2.
    let out = memprof(&[
        "plan",
        "fit",
        f.as_str(),
        "--capacity",
        "1GiB",
        "--micro-batch",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).trim_end().lines().count(), 1);
}

/// A whole step that does not run out: four 16 MiB parameters, a forward pass of ten 30 MiB
/// activations (one per sample of a micro-batch of 10) freed in backward, then AdamW's two
/// 160 MiB moments, made by its `_init_group` and kept. The activations limit growth; the true
/// answers: on 512 MiB, 14 samples (64 + 10 x 42 = 484 MiB; 15 need 64 + 10 x 45 = 514), the
/// optimizer's 64 + 320 = 384 MiB fitting after the cached activations are released; on 380
/// MiB, none, since what does not grow already needs 384.
#[test]
fn a_built_step_whose_optimizer_does_not_grow_gives_its_known_answer() {
    let torch = "/usr/lib/python3.11/site-packages/torch";
    let mut stacks = StackTable::default();
    let module = format!("{torch}/nn/modules/module.py");
    let adamw = format!("{torch}/optim/adamw.py");
    let to = module_to_stack(&mut stacks, &module);
    let mut stack = |frames: &[(&str, &str)]| add_stack(&mut stacks, frames);
    let forward = stack(&[
        ("/w/model.py", "forward"),
        (&module, "_call_impl"),
        ("/w/train.py", "main"),
    ]);
    let state = stack(&[
        (&adamw, "_init_group"),
        (&adamw, "step"),
        ("/w/train.py", "main"),
    ]);
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(None));
    let mut entries = Vec::new();
    let mut take = |a: &mut CachingAllocator, stack| {
        for mut e in a.take_events() {
            if e.action() == Action::Alloc {
                e.stack = stack;
            }
            entries.push(e);
        }
    };
    for _ in 0..4 {
        a.malloc(16 * MIB, 0).expect("no limit");
        take(&mut a, to);
    }
    let activations: Vec<u64> = (0..10)
        .map(|_| {
            let x = a.malloc(30 * MIB, 0).expect("no limit");
            take(&mut a, forward);
            x
        })
        .collect();
    for x in activations {
        a.free(x).expect("allocated");
    }
    take(&mut a, None);
    for _ in 0..2 {
        a.malloc(160 * MIB, 0).expect("no limit");
        take(&mut a, state);
    }
    let layout = a.layout(0);
    let dir = Scratch::new("plan_fit_step");
    let file = dir.join("step.pickle");
    write_snapshot(&model_snapshot(entries, layout, stacks, None), &file);
    let f = file.display().to_string();
    let ask = |capacity: &str, code: i32| {
        fit_json(
            &[
                f.as_str(),
                "--capacity",
                capacity,
                "--cuda-context",
                "0",
                "--micro-batch",
                "10",
            ],
            code,
        )
    };
    let doc = ask("512MiB", 0);
    assert_eq!(doc["at_oom"], false, "{doc}");
    assert_eq!(doc["scaling_bytes"], 10 * 30 * MIB, "{doc}");
    assert_eq!(doc["fixed_bytes"], 64 * MIB, "{doc}");
    assert_eq!(doc["fixed_peak_bytes"], 384 * MIB, "{doc}");
    assert_eq!(doc["micro_batch"]["largest"], 14, "{doc}");
    assert_eq!(doc["micro_batch"]["spare_bytes"], 28 * MIB, "{doc}");
    let doc = ask("380MiB", 1);
    assert_eq!(doc["recorded_fits"], false, "{doc}");
    assert_eq!(doc["micro_batch"]["largest"], 0, "{doc}");
}

/// The real training snapshots beside the repository (two cs336 transformer steps with AdamW,
/// one whose peak is in backward, and a convolutional network's training loop): each answer,
/// the micro-batch and the sequence length, is checked against the trace replayed here with
/// its growing allocations scaled by the answer, which fits the budget, and by one more, which
/// does not.
#[test]
fn real_training_snapshots_agree_with_a_scaled_replay() {
    let Some(dir) = real_fixtures() else { return };
    for (name, capacity, micro_batch, seq_len) in [
        (
            "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle",
            80u64 << 30,
            4u64,
            128u64,
        ),
        (
            "silmont2000__assignment2-systems__mem_snapshot.pickle",
            4 << 30,
            8,
            256,
        ),
        ("JasperSolt__EoR_NN__snapshot.pickle", 1 << 30, 4, 512),
    ] {
        let path = dir.join(name);
        let p = path.display().to_string();
        let cap = capacity.to_string();
        let mb = micro_batch.to_string();
        let seq = seq_len.to_string();
        let out = memprof(&[
            "plan",
            "fit",
            "--json",
            &p,
            "--capacity",
            &cap,
            "--cuda-context",
            "0",
            "--micro-batch",
            &mb,
            "--seq-len",
            &seq,
        ]);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{name}: {}",
            stderr(&out)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let grows = doc["scaling_bytes"].as_u64().expect("bytes");
        let fixed = doc["fixed_bytes"].as_u64().expect("bytes");
        assert!(grows > 0 && fixed > 0, "{name}: {doc}");
        // Replay the trace here, scaled by the answer and by one more.
        let bytes = std::fs::read(&path).expect("readable");
        let snapshot = memprof::source::torch_snapshot::read(&bytes[..])
            .expect("a snapshot")
            .snapshot;
        let split = split_trace(
            &snapshot,
            0,
            &CategoryRules::default(),
            |c| SCALING.contains(&c),
            |_, _| None,
        );
        let (config, _) = recorded_config(&snapshot);
        let trace = DeviceTrace::of(&snapshot, 0);
        let prepared = prepare(&trace, &config, None);
        let replay = |factor: f64| {
            run_scaled(&prepared, &config, Some(capacity), |e| {
                let grows = split.entry_category[e]
                    .is_some_and(|c| SCALING.contains(&split.names[c].as_str()));
                if grows {
                    factor
                } else {
                    1.0
                }
            })
        };
        for (setting, given) in [("micro_batch", micro_batch), ("seq_len", seq_len)] {
            let answer = &doc[setting];
            let n = answer["largest"].as_u64().expect("an answer");
            assert!(n >= 1, "{name} {setting}: {doc}");
            let at = replay(n as f64 / given as f64);
            assert!(at.oom.is_none(), "{name}: {setting} {n} should fit");
            assert_eq!(
                at.peak_reserved_bytes, answer["replay_peak_reserved_bytes"],
                "{name} {setting}"
            );
            assert_eq!(
                answer["spare_bytes"].as_i64(),
                Some(capacity as i64 - at.peak_reserved_bytes as i64),
                "{name} {setting}"
            );
            assert!(
                replay((n + 1) as f64 / given as f64).oom.is_some(),
                "{name}: {setting} {} should not fit",
                n + 1
            );
        }
    }
}
