//! Site identity in `diff` and `gate`: a real snapshot compared with a copy of itself whose
//! frames moved as an edit or another checkout moves them reads as no change, and a real pair
//! of runs that differ lists changes that add up to the total.

use crate::util::{memprof, real_file, stdout, Scratch};
use memprof::model::Frame;
use memprof::source::torch_snapshot;
use serde_json::Value;
use std::path::Path;

const REAL: &str = "silmont2000__assignment2-systems__mem_snapshot.pickle";

/// Writes a copy of the real snapshot at `from` with `edit` applied to every frame.
fn edited_copy(from: &Path, to: &Path, edit: impl FnMut(&mut Frame)) {
    let bytes = std::fs::read(from).expect("readable");
    let mut parsed = torch_snapshot::read(&bytes[..]).expect("parses");
    parsed.snapshot.stacks.map_frames(edit);
    let file = std::fs::File::create(to).expect("writable");
    memprof::report::export::torch_snapshot::write(
        &parsed.snapshot,
        &parsed.keys,
        std::io::BufWriter::new(file),
    )
    .expect("written");
}

fn diff_json(before: &Path, after: &Path) -> Value {
    let out = memprof(&[
        "diff",
        "--json",
        &before.display().to_string(),
        &after.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", crate::util::stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON")
}

/// No site grew, shrank, appeared or disappeared, and nothing else changed.
fn assert_no_change(doc: &Value, what: &str) {
    for d in doc["devices"].as_array().expect("devices") {
        for kind in ["grew", "shrank", "appeared", "disappeared"] {
            assert_eq!(d[kind], Value::Array(vec![]), "{what}: {kind} in {d}");
        }
        assert_eq!(d["total_change_bytes"], 0, "{what}");
        assert_eq!(d["everything_else_bytes"], 0, "{what}");
    }
}

/// Gate against a baseline of the original: passes, and lists no site that grew.
fn assert_gate_passes(original: &Path, copy: &Path, dir: &Path) {
    let base = dir.join("base.json");
    let write = memprof(&[
        "gate",
        &original.display().to_string(),
        "--write-baseline",
        &base.display().to_string(),
    ]);
    assert_eq!(write.status.code(), Some(0));
    let out = memprof(&[
        "gate",
        &copy.display().to_string(),
        "--baseline",
        &base.display().to_string(),
        "--max-increase",
        "0%",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("grew"), "{text}");
}

#[test]
fn frames_shifted_by_an_edit_are_the_same_sites() {
    let Some(real) = real_file(REAL) else { return };
    let dir = Scratch::new("shifted");
    let copy = dir.join("shifted.pickle");
    // Three lines inserted above `custom_softmax`: its frames move down by three.
    let mut moved = 0;
    edited_copy(&real, &copy, |f| {
        if f.name == "custom_softmax" && f.filename.ends_with(".py") {
            f.line += 3;
            moved += 1;
        }
    });
    assert!(moved > 0, "the snapshot has custom_softmax frames");
    let doc = diff_json(&real, &copy);
    assert_no_change(&doc, "shifted");
    assert_gate_passes(&real, &copy, &dir);
}

#[test]
fn another_checkout_folder_is_the_same_sites() {
    let Some(real) = real_file(REAL) else { return };
    let dir = Scratch::new("checkout");
    let copy = dir.join("checkout.pickle");
    let mut moved = 0;
    edited_copy(&real, &copy, |f| {
        if let Some(rest) = f.filename.strip_prefix("/root/autodl-tmp/") {
            f.filename = format!("/home/ci/work/clone-2/{rest}");
            moved += 1;
        }
    });
    assert!(moved > 0, "the snapshot has frames under /root/autodl-tmp");
    let doc = diff_json(&real, &copy);
    assert_no_change(&doc, "checkout");
    assert_gate_passes(&real, &copy, &dir);
}

/// A real pair of runs one commit apart: the listed deltas and everything else add up to the
/// total change, and the total is the change of the peak.
#[test]
fn listed_changes_add_up_to_the_total_on_a_real_pair() {
    let pair = [
        "more/Yiyi-philosophy__LLM-inference__1.3b_snapshot_23d4f52.pickle",
        "more/Yiyi-philosophy__LLM-inference__1.3b_snapshot_6a8eab0.pickle",
    ];
    let (Some(before), Some(after)) = (real_file(pair[0]), real_file(pair[1])) else {
        return;
    };
    let out = memprof(&[
        "diff",
        "--json",
        &before.display().to_string(),
        &after.display().to_string(),
    ]);
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    for d in doc["devices"].as_array().expect("devices") {
        let total =
            d["after_bytes"].as_i64().expect("bytes") - d["before_bytes"].as_i64().expect("bytes");
        assert_eq!(d["total_change_bytes"].as_i64(), Some(total));
        let listed: i64 = ["grew", "shrank", "appeared", "disappeared"]
            .iter()
            .flat_map(|k| d[k].as_array().expect("a list"))
            .map(|s| {
                s["after_bytes"].as_i64().expect("bytes")
                    - s["before_bytes"].as_i64().expect("bytes")
            })
            .sum();
        assert_eq!(
            listed + d["everything_else_bytes"].as_i64().expect("bytes"),
            total,
            "{d}"
        );
    }
}
