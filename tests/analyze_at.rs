//! `analyze --at MOMENT`: on the shipped fixtures and real snapshots, the figures at each
//! named moment are the account's (as `analyze --json` lists its moments), the categories at
//! the peak, the OOM and the dump are the account's (in requested bytes, and in allocated
//! bytes adding up to the allocated bytes there where it knows them), an entry the account
//! names nothing at
//! gives requested and reserved bytes with the block figures unknown, and a bad moment is one
//! line and exit 2.

use crate::util::{fixture, memprof, real_fixtures, stderr, stdout};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn json(args: &[&str]) -> Value {
    let out = memprof(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON")
}

fn at(file: &Path, moment: &str) -> Value {
    let f = file.display().to_string();
    json(&["analyze", "--json", "--at", moment, &f])
}

fn files() -> Vec<PathBuf> {
    let mut files = vec![
        fixture("snapshots/demo_oom.pickle"),
        fixture("snapshots/v2_11_full.pickle"),
        fixture("snapshots/segments_only.pickle"),
    ];
    // The real snapshots at the top of the folder, and three more: an OOM, a long trace and
    // an optimizer step.
    if let Some(dir) = real_fixtures() {
        for e in std::fs::read_dir(&dir).expect("readable").flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pickle") {
                files.push(p);
            }
        }
        files.extend(
            [
                "hlinander__equivariant-posteriors__oom_snapshot_new.pickle",
                "Maphsge4__select_n__snapshot_1f2f548.pickle",
                "HugePandaCoder__octree-nca-groupeq__my_snapshot_e67173f.pickle",
            ]
            .iter()
            .map(|f| dir.join("more").join(f))
            .filter(|p| p.is_file()),
        );
    }
    files.sort();
    files
}

/// The device `device` of an `--at` document.
fn device(doc: &Value, device: &Value) -> Value {
    doc["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device"] == *device)
        .cloned()
        .unwrap_or_else(|| panic!("device {device} in {doc}"))
}

#[test]
fn named_moments_give_the_accounts_figures_on_every_file() {
    for file in files() {
        let name = file.display().to_string();
        let account = json(&["analyze", "--json", &name]);
        let mut docs = std::collections::BTreeMap::new();
        for d in account["inputs"][0]["devices"].as_array().expect("devices") {
            let moments = d["moments"].as_array().expect("moments");
            let has = |kind: &str| moments.iter().any(|m| m["kind"] == kind);
            if !has("dump") || d["categories"].is_null() {
                continue;
            }
            let checks = [
                ("peak", "peak_requested", "at_peak", "at_peak_allocated"),
                ("peak-reserved", "peak_reserved", "", ""),
                ("peak-allocated", "peak_allocated", "", ""),
                ("oom", "oom", "at_oom", "at_oom_allocated"),
                ("dump", "dump", "at_dump", "at_dump"),
            ];
            for (asked, kind, categories, allocated) in checks {
                let Some(m) = moments.iter().rev().find(|m| m["kind"] == kind) else {
                    continue;
                };
                let doc = docs
                    .entry(asked)
                    .or_insert_with(|| at(&file, asked))
                    .clone();
                let got = device(&doc, &d["device"]);
                assert_eq!(got["moment"]["kind"], kind, "{name} {asked}");
                assert_eq!(got["moment"]["entry"], m["entry"], "{name} {asked}");
                // The moment's own figures, completed by those of other moments at its entry.
                for (k, v) in m["figures"].as_object().expect("figures") {
                    if !v.is_null() {
                        assert_eq!(&got["figures"][k], v, "{name} {asked} {k}");
                    }
                }
                if !categories.is_empty() {
                    assert_eq!(
                        got["categories"], d["categories"][categories],
                        "{name} {asked}: the account's categories"
                    );
                    assert_eq!(
                        got["allocated_categories"], d["categories"][allocated],
                        "{name} {asked}: the account's categories in allocated bytes"
                    );
                }
                // In allocated bytes exactly where those are known, adding up to them.
                let in_blocks = got["allocated_categories"].as_array().map(|list| {
                    list.iter()
                        .map(|c| c["bytes"].as_u64().unwrap_or(0))
                        .sum::<u64>()
                });
                assert_eq!(
                    in_blocks,
                    got["figures"]["allocated_bytes"].as_u64(),
                    "{name} {asked}: the categories add up to the allocated bytes"
                );
                if kind == "peak_requested" {
                    assert_eq!(
                        got["top_sites"], d["top_sites"],
                        "{name}: the account's top sites at the peak"
                    );
                }
            }
        }
    }
}

#[test]
fn an_entry_between_moments_and_bad_moments() {
    let file = fixture("snapshots/demo_oom.pickle");
    let doc = at(&file, "100");
    let d = &doc["devices"][0];
    assert_eq!(doc["kind"], "memprof_analyze_at");
    assert_eq!(d["moment"]["kind"], "entry");
    assert_eq!(d["moment"]["entry"], 100);
    let requested = d["figures"]["requested_bytes"].as_u64().expect("known");
    assert!(d["figures"]["reserved_bytes"].as_u64().expect("known") >= requested);
    for unknown in [
        "allocated_bytes",
        "active_bytes",
        "largest_free_block_bytes",
    ] {
        assert!(
            d["figures"][unknown].is_null(),
            "{unknown} is not known here"
        );
    }
    let categories: u64 = (d["categories"].as_array().expect("categories").iter())
        .map(|c| c["bytes"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        categories, requested,
        "the categories add up to what is live"
    );
    assert!(d["allocated_categories"].is_null(), "not known here");
    // The same entry by its time.
    let seconds = d["moment"]["seconds"]
        .as_f64()
        .expect("the trace has times");
    let by_time = at(&file, &format!("{seconds}s"));
    assert!(by_time["devices"][0]["moment"]["entry"].as_u64() >= Some(100));
    let f = file.display().to_string();
    for bad in ["noon", "99999", "2.5"] {
        let out = memprof(&["analyze", "--json", "--at", bad, &f]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        assert_eq!(stderr(&out).trim().lines().count(), 1, "{bad}: one line");
        assert!(stdout(&out).is_empty());
    }
    let no_trace = fixture("snapshots/segments_only.pickle")
        .display()
        .to_string();
    let out = memprof(&["analyze", "--json", "--at", "peak", &no_trace]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no trace"), "{}", stderr(&out));
}
