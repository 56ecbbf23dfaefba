//! The real snapshots in `../shared/fixtures/real/` (read from there, never copied into the
//! repo), against `fixtures/real_expected.json`: values computed by
//! `fixtures/gen/expected_stats.py` and the sums PyTorch's own `_memory_viz.py stats` prints.

use crate::util::{
    analyze_json, assert_devices_match, devices, fixture, real_fixtures, repo, skip,
};
use serde_json::Value;
use std::process::Command;

fn expected() -> Value {
    serde_json::from_slice(
        &std::fs::read(fixture("real_expected.json")).expect("real_expected.json"),
    )
    .expect("JSON")
}

/// `_memory_viz.py stats` sums over all devices: reserved, "allocated" (the requested bytes
/// of allocated blocks) and internal fragmentation.
fn assert_memory_viz_agrees(name: &str, doc: &Value, viz: &Value) {
    let sum = |f: &dyn Fn(&Value) -> u64| devices(doc).iter().map(f).sum::<u64>();
    let reserved = sum(&|d| d["reserved_bytes"].as_u64().unwrap_or(0));
    let requested = sum(&|d| d["requested_bytes"].as_u64().unwrap_or(0));
    let internal = sum(&|d| d["fragmentation"]["internal_bytes"].as_u64().unwrap_or(0));
    let segments = sum(&|d| d["segments"].as_u64().unwrap_or(0));
    assert_eq!(
        Some(reserved),
        viz["total_reserved_bytes"].as_u64(),
        "{name}: total_reserved"
    );
    assert_eq!(
        Some(requested),
        viz["total_allocated_bytes"].as_u64(),
        "{name}: total_allocated"
    );
    assert_eq!(
        Some(internal),
        viz["free_internal_bytes"].as_u64(),
        "{name}: internal"
    );
    assert_eq!(Some(segments), viz["segments"].as_u64(), "{name}: segments");
}

#[test]
fn real_snapshots_match_python_and_memory_viz() {
    let Some(dir) = real_fixtures() else {
        return;
    };
    let expected = expected();
    let mut checked = 0;
    for (name, want) in expected.as_object().expect("object") {
        if !name.ends_with(".pickle") || name.starts_with("snapshots/") {
            continue;
        }
        let path = dir.join(name);
        if !path.exists() {
            skip(&format!(
                "the real snapshot {name}: not among the real snapshots here, see \
                 fixtures/README.md"
            ));
            continue;
        }
        let doc = analyze_json(&[path]);
        assert_devices_match(
            name,
            devices(&doc),
            want["devices"].as_array().expect("devices"),
        );
        assert_memory_viz_agrees(name, &doc, &want["memory_viz_bytes"]);
        checked += 1;
    }
    assert!(checked > 0 || std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0) == 0);
}

#[test]
fn committed_fixtures_agree_with_memory_viz() {
    let expected = expected();
    for (name, want) in expected.as_object().expect("object") {
        let Some(rel) = name.strip_prefix("snapshots/") else {
            continue;
        };
        let doc = analyze_json(&[fixture(&format!("snapshots/{rel}"))]);
        assert_memory_viz_agrees(name, &doc, &want["memory_viz_bytes"]);
    }
}

#[test]
fn generated_multi_device_oom_snapshot() {
    let generator = repo().join("../shared/tools/gen_snapshot.py");
    if !generator.exists() {
        skip(
            "the snapshot generator of the project's shared tools: not in this repository, see \
             fixtures/README.md",
        );
        return;
    }
    let want = &expected()["gen_snapshot_steps3_devices2_oom"];
    let out = std::env::temp_dir().join(format!("memprof-gen-{}.pickle", std::process::id()));
    let status = Command::new("python3")
        .arg(&generator)
        .arg(&out)
        .args(["--steps", "3", "--devices", "2", "--oom"])
        .status()
        .expect("python3 runs");
    assert!(status.success());
    let doc = analyze_json(std::slice::from_ref(&out));
    std::fs::remove_file(&out).ok();
    assert_devices_match(
        "gen_snapshot",
        devices(&doc),
        want["devices"].as_array().expect("devices"),
    );
    for d in devices(&doc) {
        assert!(
            d["oom"].is_object(),
            "device {}: the generated oom entry is reported",
            d["device"]
        );
    }
}

#[test]
fn several_ranks_are_compared_and_the_heaviest_named() {
    let Some(dir) = real_fixtures() else {
        return;
    };
    let a = dir.join("silmont2000__assignment2-systems__mem_snapshot.pickle");
    let b = dir.join("JasperSolt__EoR_NN__snapshot.pickle");
    let doc = analyze_json(&[a.clone(), b.clone()]);
    assert_eq!(doc["inputs"].as_array().map(Vec::len), Some(2));
    let out = crate::util::memprof(&[
        "analyze",
        &a.display().to_string(),
        &b.display().to_string(),
    ]);
    let text = crate::util::stdout(&out);
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("outlier: ") && first.contains("silmont2000"),
        "{first}"
    );
    assert_eq!(
        doc["comparison"]["outlier"]["input"].as_str(),
        Some(a.display().to_string().as_str())
    );
}
