//! `memprof plan fit`: the largest micro-batch and sequence length that fit a capacity, on a
//! built trace whose answer is known and on real training snapshots, checked against a replay
//! of the trace scaled by the answer.

use crate::categories::oom_in_attention;
use crate::util::{memprof, real_fixtures, stderr, stdout, Scratch};
use memprof::analysis::categories::{split_trace, CategoryRules};
use memprof::plan::fit::SCALING;
use memprof::sim::replay::{prepare, recorded_config, run_scaled, DeviceTrace};
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

/// Real training steps (a cs336 transformer with AdamW, and one whose peak is in backward):
/// the answer's own replay, scaled by it, fits the budget and one more does not.
#[test]
fn real_training_snapshots_agree_with_a_scaled_replay() {
    let Some(dir) = real_fixtures() else { return };
    for (name, capacity, micro_batch) in [
        (
            "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle",
            80u64 << 30,
            4u64,
        ),
        (
            "silmont2000__assignment2-systems__mem_snapshot.pickle",
            4 << 30,
            8,
        ),
    ] {
        let path = dir.join(name);
        let p = path.display().to_string();
        let cap = capacity.to_string();
        let mb = micro_batch.to_string();
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
        ]);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{name}: {}",
            stderr(&out)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let n = doc["micro_batch"]["largest"].as_u64().expect("an answer");
        assert!(n >= 1, "{name}: {doc}");
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
        let replay = |k: u64| {
            let factor = k as f64 / micro_batch as f64;
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
        let at = replay(n);
        assert!(at.oom.is_none(), "{name}: {n} should fit");
        assert_eq!(
            at.peak_reserved_bytes,
            doc["micro_batch"]["replay_peak_reserved_bytes"]
        );
        assert!(
            replay(n + 1).oom.is_some(),
            "{name}: {} should not fit",
            n + 1
        );
    }
}
