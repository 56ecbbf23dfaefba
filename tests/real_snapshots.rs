//! The real snapshots in `../shared/fixtures/real/` (never copied into the repo): numbers
//! against `fixtures/real_expected.json`, computed by PyTorch's own `_memory_viz.py stats` and
//! by `fixtures/gen/expected_stats.py`.

use crate::util::{analyze_json, devices, fixture, real_fixtures};
use serde_json::Value;

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(fixture("real_expected.json")).expect("real_expected.json"))
        .expect("JSON")
}

#[test]
fn real_snapshots_match_python_and_memory_viz() {
    let Some(dir) = real_fixtures() else {
        eprintln!("../shared/fixtures/real is absent here: real-snapshot checks skipped");
        return;
    };
    let expected = expected();
    let files = expected["files"].as_object().expect("files");
    assert!(!files.is_empty());
    for (name, want) in files {
        let path = dir.join(name);
        if !path.exists() {
            eprintln!("{name} is absent: skipped");
            continue;
        }
        let doc = analyze_json(&[path]);
        let got = &devices(&doc)[0];
        let w = &want["devices"][0];
        for key in ["reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes", "segments", "blocks"] {
            assert_eq!(got[key], w[key], "{name}: {key}");
        }
        for key in ["internal_bytes", "external_bytes", "largest_free_block_bytes"] {
            assert_eq!(got["fragmentation"][key], w[key], "{name}: {key}");
        }
        for (key, wkey) in [
            ("entries", "trace_entries"),
            ("peak_active_bytes", "peak_active_bytes"),
            ("peak_entry_index", "peak_entry_index"),
            ("peak_time_us", "peak_time_us"),
        ] {
            assert_eq!(got["trace"][key], w[wkey], "{name}: {key}");
        }
        assert_eq!(got["trace"]["inconsistencies"], 0, "{name}: trace replays cleanly");
        // PyTorch's `_memory_viz.py stats`: total_reserved is the segment total and
        // total_allocated is the requested total of active blocks.
        let viz = &want["memory_viz_bytes"];
        assert_eq!(got["reserved_bytes"], viz["total_reserved_bytes"], "{name}: memory_viz reserved");
        assert_eq!(got["segments"], viz["segments"], "{name}: memory_viz segments");
    }
}

#[test]
fn several_ranks_are_compared_and_the_heaviest_named() {
    let Some(dir) = real_fixtures() else {
        eprintln!("../shared/fixtures/real is absent here: skipped");
        return;
    };
    let a = dir.join("silmont2000__assignment2-systems__mem_snapshot.pickle");
    let b = dir.join("JasperSolt__EoR_NN__snapshot.pickle");
    let doc = analyze_json(&[a.clone(), b.clone()]);
    assert_eq!(doc["inputs"].as_array().map(Vec::len), Some(2));
    let out = crate::util::memprof(&["analyze", &a.display().to_string(), &b.display().to_string()]);
    let text = crate::util::stdout(&out);
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("heaviest: ") && first.contains("silmont2000"), "{first}");
}
