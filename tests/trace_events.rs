//! A checker of Chrome/Perfetto trace-event JSON, written from the Trace Event Format rules and
//! what Perfetto's JSON importer does with them, and its run on the Perfetto export of every
//! committed fixture and every real snapshot. What it holds a trace to:
//!
//! - the top level is an object with a `traceEvents` list; `displayTimeUnit`, when present,
//!   is "ms" or "ns"; `otherData` is an object of strings whose `ts...` keys say what `ts`
//!   counts (microseconds, or the entry index of a trace without times);
//! - every event has a one-letter `ph` of the format, a string `name`, integer `pid` and `tid`,
//!   and `pid` > 0 (Perfetto takes pid 0 for the idle process);
//! - every event but metadata has a number `ts` >= 0; `X` has a `dur` >= 0; `B` and `E` pair
//!   up per thread, innermost first, and none stays open;
//! - metadata (`M`) is `process_name`/`thread_name` with a string `args.name`, or
//!   `process_sort_index`/`thread_sort_index` with an integer `args.sort_index`;
//! - counters (`C`) carry numeric `args`; Perfetto names each track "NAME KEY", so that name
//!   must not repeat the key's word ("active bytes bytes"); each track's `ts` never goes back,
//!   and no two samples of a track share a `ts` (the first would draw with zero width);
//! - instants (`i`/`I`) have a scope `s` of "g", "p" or "t" when given, and per thread their
//!   `ts` never goes back;
//! - a process that holds tracks is named by a `process_name` event.

use crate::export::{all_real_snapshots, export, scratch};
use crate::util::fixture;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const PHASES: &str = "BEXiIPCbnesftNODMVvRcl";

/// Every way `trace` breaks the rules above, one line each (empty when it keeps them).
pub fn violations(trace: &Value) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(top) = trace.as_object() else {
        return vec!["the document is not an object".into()];
    };
    if let Some(unit) = top.get("displayTimeUnit") {
        if unit != "ms" && unit != "ns" {
            bad.push(format!("displayTimeUnit {unit} is not \"ms\" or \"ns\""));
        }
    }
    match top.get("otherData").and_then(Value::as_object) {
        None => bad.push("no otherData object saying what ts counts".into()),
        Some(other) => {
            if let Some((k, v)) = other.iter().find(|(_, v)| !v.is_string()) {
                bad.push(format!("otherData.{k} is {v}, not a string"));
            }
            // Perfetto takes ts as microseconds; a ts that counts something else must say so.
            let says_unit = other
                .iter()
                .filter(|(k, _)| k.starts_with("ts"))
                .filter_map(|(_, v)| v.as_str())
                .any(|v| v.contains("microseconds") || v.contains("entry index"));
            if !says_unit {
                bad.push("otherData does not say what ts counts".into());
            }
        }
    }
    let Some(events) = top.get("traceEvents").and_then(Value::as_array) else {
        bad.push("no traceEvents list".into());
        return bad;
    };
    let mut counter_ts: BTreeMap<(i64, String), f64> = BTreeMap::new();
    let mut instant_ts: BTreeMap<(i64, i64), f64> = BTreeMap::new();
    let mut open: BTreeMap<(i64, i64), Vec<String>> = BTreeMap::new();
    let mut named: BTreeSet<i64> = BTreeSet::new();
    let mut used: BTreeSet<i64> = BTreeSet::new();
    for (i, e) in events.iter().enumerate() {
        let at = format!("event {i}");
        let ph = e["ph"].as_str().unwrap_or("");
        if ph.chars().count() != 1 || !PHASES.contains(ph) {
            bad.push(format!("{at}: ph {} is not a phase", e["ph"]));
            continue;
        }
        let Some(name) = e["name"].as_str() else {
            bad.push(format!("{at}: no string name"));
            continue;
        };
        let (Some(pid), Some(tid)) = (e["pid"].as_i64(), e["tid"].as_i64()) else {
            bad.push(format!("{at} ({name}): pid and tid must be integers"));
            continue;
        };
        if pid <= 0 {
            bad.push(format!("{at} ({name}): pid {pid}, Perfetto wants pid > 0"));
        }
        if ph == "M" {
            match name {
                "process_name" | "thread_name" if e["args"]["name"].is_string() => {
                    if name == "process_name" {
                        named.insert(pid);
                    }
                }
                "process_sort_index" | "thread_sort_index" if e["args"]["sort_index"].is_i64() => {}
                _ => bad.push(format!("{at}: metadata {name} with args {}", e["args"])),
            }
            continue;
        }
        used.insert(pid);
        let ts = match e["ts"].as_f64() {
            Some(ts) if ts >= 0.0 => ts,
            _ => {
                bad.push(format!(
                    "{at} ({name}): ts {} is not a number >= 0",
                    e["ts"]
                ));
                continue;
            }
        };
        match ph {
            "C" => {
                let Some(args) = e["args"].as_object().filter(|a| !a.is_empty()) else {
                    bad.push(format!("{at} ({name}): a counter without args"));
                    continue;
                };
                for (key, value) in args {
                    if !value.is_number() {
                        bad.push(format!("{at} ({name}): counter value {key} = {value}"));
                    }
                    let last_word = name.rsplit(' ').next().unwrap_or(name);
                    if last_word == key {
                        bad.push(format!("{at}: the track reads \"{name} {key}\""));
                    }
                    let track = (pid, format!("{name} {key}"));
                    match counter_ts.get(&track) {
                        Some(&last) if ts < last => bad.push(format!(
                            "{at}: track {:?} goes back from {last} to {ts}",
                            track.1
                        )),
                        Some(&last) if ts == last => bad.push(format!(
                            "{at}: track {:?} has two samples at {ts} (zero width)",
                            track.1
                        )),
                        _ => {}
                    }
                    counter_ts.insert(track, ts);
                }
            }
            "i" | "I" => {
                if let Some(s) = e.get("s") {
                    if !matches!(s.as_str(), Some("g" | "p" | "t")) {
                        bad.push(format!("{at} ({name}): instant scope {s}"));
                    }
                }
                let last = instant_ts.entry((pid, tid)).or_insert(ts);
                if ts < *last {
                    bad.push(format!(
                        "{at} ({name}): instants go back from {last} to {ts}"
                    ));
                }
                *last = ts;
            }
            "X" if !e["dur"].as_f64().is_some_and(|d| d >= 0.0) => {
                bad.push(format!("{at} ({name}): X without a dur >= 0"));
            }
            "B" => open.entry((pid, tid)).or_default().push(name.to_string()),
            "E" if open.entry((pid, tid)).or_default().pop().is_none() => {
                bad.push(format!("{at} ({name}): E without a B on its thread"));
            }
            _ => {}
        }
    }
    for ((pid, tid), names) in open {
        if !names.is_empty() {
            bad.push(format!("pid {pid} tid {tid}: B without E: {names:?}"));
        }
    }
    for pid in used.difference(&named) {
        bad.push(format!("pid {pid} has events but no process_name"));
    }
    bad
}

fn check(source: &Path, out: &Path) {
    export(source, "perfetto", out);
    let trace: Value =
        serde_json::from_slice(&std::fs::read(out).expect("written")).expect("valid JSON");
    let bad = violations(&trace);
    assert!(
        bad.is_empty(),
        "{}: {} violations, the first: {:#?}",
        source.display(),
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}

#[test]
fn perfetto_exports_of_every_fixture_and_real_snapshot_keep_the_rules() {
    let dir = scratch("trace-events");
    let out = dir.join("trace.json");
    for name in crate::util::FIXTURES {
        check(&fixture(&format!("snapshots/{name}.pickle")), &out);
    }
    check(&fixture("recordings/peak_oom_v2.memprof"), &out);
    for file in all_real_snapshots() {
        check(&file, &out);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_checker_catches_what_perfetto_reads_wrong() {
    let good = serde_json::json!({
        "otherData": {"ts": "microseconds from the first entry"},
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "GPU 0"}},
            {"ph": "C", "name": "active", "pid": 1, "tid": 0, "ts": 0, "args": {"bytes": 1}},
            {"ph": "C", "name": "active", "pid": 1, "tid": 0, "ts": 1, "args": {"bytes": 2}},
            {"ph": "B", "name": "step", "pid": 1, "tid": 0, "ts": 1},
            {"ph": "E", "name": "step", "pid": 1, "tid": 0, "ts": 2},
        ]
    });
    assert_eq!(violations(&good), Vec::<String>::new());
    let bad = serde_json::json!({
        "traceEvents": [
            {"ph": "C", "name": "active bytes", "pid": 0, "tid": 0, "ts": 5, "args": {"bytes": 1}},
            {"ph": "C", "name": "active bytes", "pid": 0, "tid": 0, "ts": 5, "args": {"bytes": 2}},
            {"ph": "C", "name": "active bytes", "pid": 0, "tid": 0, "ts": 4, "args": {"bytes": 3}},
            {"ph": "B", "name": "step", "pid": 1, "tid": 0, "ts": 1},
        ]
    });
    let found = violations(&bad).join("\n");
    for want in [
        "no otherData",
        "pid 0, Perfetto wants pid > 0",
        "reads \"active bytes bytes\"",
        "two samples at 5",
        "goes back from 5 to 4",
        "B without E",
        "pid 0 has events but no process_name",
    ] {
        assert!(found.contains(want), "{want:?} not in:\n{found}");
    }
}

/// The export's markers are the account's moments: each moment at an entry is an instant of
/// its name on its device, at its time on the one axis, with the account's figures.
#[test]
fn perfetto_markers_are_the_accounts_moments() {
    let dir = scratch("trace-markers");
    let out = dir.join("trace.json");
    let mut files: Vec<std::path::PathBuf> = ["demo_oom", "v2_11_full", "multi_device"]
        .iter()
        .map(|n| fixture(&format!("snapshots/{n}.pickle")))
        .collect();
    files.extend(all_real_snapshots().into_iter().take(6));
    let name = |kind: &str| match kind {
        "peak_requested" => "peak requested",
        "peak_allocated" => "peak allocated",
        "peak_reserved" => "peak reserved",
        "oom" => "OOM",
        "oom_retry" => "OOM retry",
        "empty_cache" => "empty_cache()",
        other => panic!("a moment of kind {other} at an entry"),
    };
    let mut marked = 0;
    for file in &files {
        export(file, "perfetto", &out);
        let trace: Value =
            serde_json::from_slice(&std::fs::read(&out).expect("written")).expect("JSON");
        let events = trace["traceEvents"].as_array().expect("events");
        let analyzed = crate::util::memprof(&["analyze", "--json", &file.display().to_string()]);
        let analyzed: Value = serde_json::from_slice(&analyzed.stdout).expect("analyze JSON");
        for d in analyzed["inputs"][0]["devices"]
            .as_array()
            .expect("devices")
        {
            let pid = d["device"].as_u64().expect("device") + 1;
            for m in d["moments"].as_array().expect("moments") {
                let Some(entry) = m["entry"].as_u64() else {
                    continue;
                };
                let kind = m["kind"].as_str().expect("kind");
                let found = events.iter().find(|e| {
                    e["ph"] == "i"
                        && e["pid"] == pid
                        && e["name"] == name(kind)
                        && e["args"]["entry"] == entry
                });
                let e = found.unwrap_or_else(|| panic!("{}: no marker for {m}", file.display()));
                assert_eq!(e["args"]["figures"], m["figures"], "{}", file.display());
                if let Some(seconds) = m["seconds"].as_f64() {
                    let ts = e["ts"].as_f64().expect("ts");
                    assert!((ts / 1e6 - seconds).abs() < 1e-6, "{}: {m}", file.display());
                }
                marked += 1;
            }
        }
    }
    assert!(marked > 0, "no moment was marked");
    let _ = std::fs::remove_dir_all(&dir);
}
