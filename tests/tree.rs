//! `memprof tree`: on every real snapshot, the root of the tree at the default moment (the
//! OOM, else the peak) and at the dump holds the account's allocated bytes then (its requested
//! bytes where it does not know the allocated ones, and the tree says so), every node's
//! inclusive bytes are its self bytes plus its children's when nothing is cut, and the SVG is
//! well-formed XML.

use crate::util::{fixture, have, memprof, real_fixtures, skip, stderr, stdout, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn tree_json(file: &Path, extra: &[&str]) -> Value {
    let f = file.display().to_string();
    let mut args = vec!["tree", "--json", f.as_str()];
    args.extend_from_slice(extra);
    let out = memprof(&args);
    assert_eq!(out.status.code(), Some(0), "{f}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON")
}

/// Inclusive = self + children, at every node with nothing cut below it.
fn assert_adds_up(n: &Value, file: &Path) {
    let children = n["children"].as_array().expect("children");
    if n.get("hidden_children").is_some() {
        return;
    }
    let below: u64 = children
        .iter()
        .map(|c| c["inclusive_bytes"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        n["inclusive_bytes"].as_u64(),
        Some(n["self_bytes"].as_u64().unwrap_or(0) + below),
        "{}: {}",
        file.display(),
        n["name"]
    );
    children.iter().for_each(|c| assert_adds_up(c, file));
}

fn real_and_fixture_files() -> Vec<PathBuf> {
    let mut files = vec![
        fixture("snapshots/demo_oom.pickle"),
        fixture("snapshots/v2_11_full.pickle"),
    ];
    if let Some(dir) = real_fixtures() {
        for d in [dir.clone(), dir.join("more")] {
            for e in std::fs::read_dir(&d).expect("readable").flatten() {
                let p = e.path();
                if matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("pickle" | "pkl")
                ) {
                    files.push(p);
                }
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_root_holds_the_accounts_figure_on_every_file() {
    for file in real_and_fixture_files() {
        for at in [&[][..], &["--at", "dump"][..]] {
            let mut extra = at.to_vec();
            // 40 levels: serde_json reads nesting 128 deep, two a level.
            extra.extend(["--depth", "40", "--min-share", "0"]);
            let doc = tree_json(&file, &extra);
            for d in doc["devices"].as_array().expect("devices") {
                let root = &d["tree"];
                // Allocated bytes wherever the account knows them.
                let figure = if d["allocated_bytes"].is_null() {
                    "requested_bytes"
                } else {
                    "allocated_bytes"
                };
                assert_eq!(d["figure"], figure, "{} {at:?}", file.display());
                assert_eq!(
                    root["inclusive_bytes"],
                    d[figure],
                    "{} {at:?}: the root against the account",
                    file.display()
                );
                assert_adds_up(root, &file);
            }
        }
    }
}

#[test]
fn cuts_moments_and_the_svg() {
    let file = fixture("snapshots/demo_oom.pickle");
    let full = tree_json(&file, &["--depth", "40", "--min-share", "0"]);
    let cut = tree_json(&file, &["--depth", "2", "--min-share", "10%"]);
    let (f, c) = (&full["devices"][0], &cut["devices"][0]);
    assert_eq!(f["moment"]["kind"], "oom", "the OOM by default");
    assert_eq!(c["tree"]["inclusive_bytes"], f["tree"]["inclusive_bytes"]);
    let mut deepest = 0;
    fn depth(n: &Value, d: usize, deepest: &mut usize, min: f64) {
        *deepest = (*deepest).max(d);
        for ch in n["children"].as_array().into_iter().flatten() {
            assert!(ch["share"].as_f64().unwrap_or(0.0) >= min, "{ch}");
            depth(ch, d + 1, deepest, min);
        }
    }
    depth(&c["tree"], 0, &mut deepest, 0.1);
    assert_eq!(deepest, 2);
    let entry = tree_json(&file, &["--at", "entry 100"]);
    assert_eq!(entry["devices"][0]["moment"]["entry"], 100);
    let bad = memprof(&["tree", &file.display().to_string(), "--at", "noon"]);
    assert_eq!(bad.status.code(), Some(2));
    if !have("xmllint") {
        skip("tree SVG well-formedness: xmllint is not installed");
        return;
    }
    let dir = Scratch::new("tree-svg");
    let svg = dir.join("tree.svg");
    let out = memprof(&[
        "tree",
        &file.display().to_string(),
        "--svg",
        &svg.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let check = std::process::Command::new("xmllint")
        .args(["--noout", &svg.display().to_string()])
        .output()
        .expect("xmllint runs");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let text = std::fs::read_to_string(&svg).expect("written");
    assert!(
        text.contains("train.py:96:train_step"),
        "the frames are drawn"
    );
}

/// The HTML report's tree of each device has the root of `memprof tree --json`'s (the same
/// default moment, the same requested bytes), its `<details>` close, and frame names are
/// escaped.
#[test]
fn the_report_holds_the_same_tree() {
    let mut files = vec![fixture("snapshots/demo_oom.pickle")];
    if let Some(dir) = real_fixtures() {
        files.push(dir.join("kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle"));
        files.push(dir.join("more/hlinander__equivariant-posteriors__oom_snapshot_new.pickle"));
    }
    let scratch = Scratch::new("tree-report");
    for file in files.into_iter().filter(|f| f.is_file()) {
        let html = scratch.join("report.html");
        let f = file.display().to_string();
        let out = memprof(&["report", &f, "-o", &html.display().to_string()]);
        assert_eq!(out.status.code(), Some(0), "{f}: {}", stderr(&out));
        let page = std::fs::read_to_string(&html).expect("written");
        let roots: Vec<u64> = page
            .split("<div class=\"tree\" data-root-bytes=\"")
            .skip(1)
            .map(|s| {
                s.split('"')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("bytes")
            })
            .collect();
        let doc = tree_json(&file, &[]);
        let expected: Vec<u64> = (doc["devices"].as_array().expect("devices").iter())
            .filter_map(|d| d["tree"]["inclusive_bytes"].as_u64())
            .filter(|&b| b > 0)
            .collect();
        assert!(!expected.is_empty(), "{f}: a tree to compare");
        assert_eq!(
            roots, expected,
            "{f}: the report's trees against tree --json"
        );
        let section = &page[page.find("class=\"tree\"").expect("a tree")..];
        let section = &section[..section.find("</div>\n<h3").unwrap_or(section.len())];
        assert_eq!(
            section.matches("<details").count(),
            section.matches("</details>").count(),
            "{f}: every node closes"
        );
        assert!(
            !section.contains("<module>"),
            "{f}: frame names are escaped"
        );
    }
}
