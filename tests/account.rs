//! One account, told the same way everywhere: on every real snapshot (and the repository's
//! snapshot fixtures), each figure that `analyze` (text and JSON), `diagnose` (text and JSON),
//! the HTML report, `view`'s state at the same moment and the comparison table show is the same
//! figure, at the same moment, on the one time axis of the input.

use crate::util::{fixture, memprof, real_fixtures, stdout, Scratch};
use memprof::model::Bytes;
use memprof::report::view_state::ViewStateReport;
use memprof::source::torch_snapshot;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The real snapshots (when present) and the repository's snapshot fixtures.
pub fn inputs() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![fixture("snapshots")];
    if let Some(real) = real_fixtures() {
        dirs.push(real.join("more"));
        dirs.push(real);
    }
    for dir in dirs {
        for e in std::fs::read_dir(&dir).expect("readable").flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pickle" || x == "pkl") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

fn json(args: &[&str]) -> Value {
    let out = memprof(args);
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn bytes(v: &Value) -> Option<String> {
    v.as_u64().map(|b| Bytes(b).to_string())
}

/// The moment of `kind` in a device's account.
fn moment<'a>(d: &'a Value, kind: &str) -> Option<&'a Value> {
    d["moments"].as_array()?.iter().find(|m| m["kind"] == kind)
}

/// Checks one file through every output.
fn check(path: &Path, scratch: &Scratch) {
    let file = path.display().to_string();
    let analyze = json(&["analyze", "--json", &file]);
    let input = &analyze["inputs"][0];
    let devices = input["devices"].as_array().expect("devices");
    let diagnose = json(&["diagnose", "--json", &file]);
    let analyze_text = stdout(&memprof(&["analyze", &file]));
    let diagnose_text = stdout(&memprof(&["diagnose", &file]));
    let html = scratch.join("report.html");
    let out = memprof(&["report", &file, "-o", &html.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{file}: report");
    let page = std::fs::read_to_string(&html).expect("the report");
    assert_eq!(
        diagnose["time_origin_us"], input["time_origin_us"],
        "{file}"
    );
    // The gate's baseline keeps each device's account: its peaks, else the dump's figures.
    let baseline = scratch.join("baseline.json");
    let out = memprof(&[
        "gate",
        &file,
        "--write-baseline",
        &baseline.display().to_string(),
    ]);
    // (A file without devices has nothing to gate: one line and exit 2.)
    let gated = if devices.is_empty() { 2 } else { 0 };
    assert_eq!(out.status.code(), Some(gated), "{file}: gate");
    let measurements: Value = match std::fs::read_to_string(&baseline) {
        Ok(text) if gated == 0 => {
            serde_json::from_str::<Value>(&text).expect("JSON")["measurements"].clone()
        }
        _ => Value::Array(Vec::new()),
    };
    let gate_text = stdout(&memprof(&["gate", &file, "--limit", "1B"]));
    for m in measurements.as_array().expect("measurements") {
        let d = devices
            .iter()
            .find(|d| d["device"] == m["device"])
            .expect("a measured device");
        let dump = &moment(d, "dump").expect("a dump moment")["figures"];
        let peaks = &d["peaks"];
        let known = !peaks["requested"]["bytes"].is_null();
        let (active, reserved) = if known {
            (&peaks["requested"]["bytes"], &peaks["reserved"]["bytes"])
        } else {
            (&dump["requested_bytes"], &dump["reserved_bytes"])
        };
        assert_eq!(&m["peak_active_bytes"], active, "{file}: gate");
        assert_eq!(&m["peak_reserved_bytes"], reserved, "{file}: gate");
        assert_eq!(m["peak_known"].as_bool().unwrap_or(true), known, "{file}");
        // The gate's text names the figure with analyze's words: "peak requested".
        let shown = bytes(active).expect("a figure");
        let label = if known {
            "peak requested"
        } else {
            "requested at the dump (no trace, peak not known)"
        };
        let line = format!("device {}: {label} {shown}", m["device"]);
        assert!(gate_text.contains(&line), "{file}: {line:?}\n{gate_text}");
    }
    let origin = input["time_origin_us"].as_i64();
    let snapshot = torch_snapshot::read(std::fs::File::open(path).expect("opens"))
        .expect("parses")
        .snapshot;
    for d in devices {
        let device = d["device"].as_u64().expect("device");
        // diagnose's account of the device is analyze's, field for field.
        let other = diagnose["devices"]
            .as_array()
            .and_then(|all| all.iter().find(|x| x["device"] == device))
            .unwrap_or_else(|| panic!("{file}: device {device} in diagnose"));
        for field in ["moments", "peaks", "pools", "findings"] {
            assert_eq!(d[field], other[field], "{file}: device {device}: {field}");
        }
        // Every moment's time is on the input's axis.
        let entries = snapshot.timeline.device(device as usize);
        for m in d["moments"].as_array().expect("moments") {
            let (Some(entry), Some(seconds)) = (m["entry"].as_u64(), m["seconds"].as_f64()) else {
                continue;
            };
            let time = entries[entry as usize].time_us().expect("a timed entry");
            let expected = (time - origin.expect("an origin")) as f64 / 1e6;
            assert!((seconds - expected).abs() < 1e-6, "{file}: {m}");
        }
        // A twin's text names the device it copies instead of repeating its figures.
        let twin = format!("device {device}: the same trace and segments as device");
        if analyze_text.contains(&twin) {
            continue;
        }
        // The dump's figures, as analyze's text and the report print them.
        let dump = moment(d, "dump").expect("a dump moment");
        let f = &dump["figures"];
        for (label, value) in [
            ("    reserved      ", &f["reserved_bytes"]),
            ("    allocated     ", &f["allocated_bytes"]),
            ("    cached free   ", &f["cached_free_bytes"]),
        ] {
            let shown = bytes(value).expect("known at the dump");
            let line = format!("{label}{shown:>11}");
            assert!(
                analyze_text.contains(&line),
                "{file}: {line:?}\n{analyze_text}"
            );
            assert!(page.contains(&line), "{file}: the report lacks {line:?}");
        }
        // The peaks, with their moments, in the text.
        let peak = &d["peaks"]["requested"];
        if let (Some(shown), Some(entry)) = (bytes(&peak["bytes"]), peak["entry"].as_u64()) {
            let mut line = format!("    peak requested {shown:>10}  at entry {entry} of ");
            if let Some(s) = peak["seconds"].as_f64() {
                line = format!("{line}{}, {s:.3} s", entries.len());
            }
            assert!(
                analyze_text.contains(&line),
                "{file}: {line:?}\n{analyze_text}"
            );
            assert!(page.contains(&line), "{file}: the report lacks {line:?}");
            // view's state at that entry shows the same figures.
            let view =
                ViewStateReport::new(file.clone(), &snapshot, device as u32, entry as usize, 5);
            let at = moment(d, "peak_requested").expect("the peak's moment");
            assert_eq!(
                serde_json::to_value(view.figures).expect("serializes")["requested_bytes"],
                at["figures"]["requested_bytes"],
                "{file}: view at the peak"
            );
        }
        // The OOM's figures: analyze's text, diagnose's text and view at that entry agree.
        if let Some(oom) = moment(d, "oom") {
            let f = &oom["figures"];
            let words = |v: &Value| bytes(v).unwrap_or_else(|| "not known".to_string());
            let line = format!(
                "at the OOM: reserved {}, allocated {}, requested {}, active {}, cached free {}",
                words(&f["reserved_bytes"]),
                words(&f["allocated_bytes"]),
                words(&f["requested_bytes"]),
                words(&f["active_bytes"]),
                words(&f["cached_free_bytes"])
            );
            let last_oom = d["oom"]["entry_index"] == oom["entry"];
            if last_oom {
                assert!(
                    analyze_text.contains(&line),
                    "{file}: {line:?}\n{analyze_text}"
                );
                assert!(
                    diagnose_text.contains(&line),
                    "{file}: {line:?}\n{diagnose_text}"
                );
            }
            let entry = oom["entry"].as_u64().expect("an entry") as usize;
            let view = ViewStateReport::new(file.clone(), &snapshot, device as u32, entry, 5);
            let shown = serde_json::to_value(view.figures).expect("serializes");
            for k in [
                "requested_bytes",
                "reserved_bytes",
                "allocated_bytes",
                "cached_free_bytes",
            ] {
                assert_eq!(shown[k], f[k], "{file}: view at the OOM: {k}");
            }
        }
    }
    // The comparison table shows each device's account.
    if let Some(rows) = analyze["comparison"]["peaks"].as_array() {
        for row in rows {
            let d = devices
                .iter()
                .find(|d| d["device"] == row["device"])
                .expect("a compared device");
            assert_eq!(
                row["peak_active_bytes"], d["peaks"]["requested"]["bytes"],
                "{file}"
            );
            assert_eq!(
                row["peak_reserved_bytes"], d["peaks"]["reserved"]["bytes"],
                "{file}"
            );
        }
    }
}

#[test]
fn every_output_tells_each_files_one_account() {
    let scratch = Scratch::new("account");
    let files = inputs();
    assert!(!files.is_empty());
    for file in &files {
        check(file, &scratch);
    }
}

#[test]
fn at_each_moment_the_blocks_hold_at_least_their_requests() {
    for file in inputs() {
        let doc = json(&["analyze", "--json", &file.display().to_string()]);
        for d in doc["inputs"][0]["devices"].as_array().expect("devices") {
            for m in d["moments"].as_array().expect("moments") {
                let f = &m["figures"];
                let (Some(active), Some(requested)) =
                    (f["active_bytes"].as_u64(), f["requested_bytes"].as_u64())
                else {
                    continue;
                };
                // Active blocks (allocated and pending free) are at least what was asked of
                // them, and reserved holds them all.
                assert!(active >= requested, "{}: {m}", file.display());
                let reserved = f["reserved_bytes"].as_u64().expect("reserved");
                assert!(reserved >= active, "{}: {m}", file.display());
                let allocated = f["allocated_bytes"].as_u64().expect("allocated");
                assert!(active >= allocated, "{}: {m}", file.display());
            }
        }
    }
}

#[test]
fn a_private_pools_free_blocks_are_its_own() {
    let file = fixture("snapshots/private_pool.pickle")
        .display()
        .to_string();
    let doc = json(&["analyze", "--json", &file]);
    let pools = doc["inputs"][0]["devices"][0]["pools"]
        .as_array()
        .expect("pools")
        .clone();
    assert_eq!(pools.len(), 2, "{pools:?}");
    assert_eq!(pools[0]["id"], serde_json::json!([0, 0]));
    let free: u64 = pools
        .iter()
        .map(|p| p["cached_free_bytes"].as_u64().expect("free"))
        .sum();
    let dump = moment(&doc["inputs"][0]["devices"][0], "dump").expect("dump");
    assert_eq!(Some(free), dump["figures"]["cached_free_bytes"].as_u64());
    let text = stdout(&memprof(&["analyze", &file]));
    for line in [
        "    default pool    68.00 MiB  reserved, 56.08 MiB allocated, 11.92 MiB cached free",
        "    pool (1,2)      24.00 MiB  reserved, 1.00 MiB allocated, 23.00 MiB cached free",
        "    pool (1,2) holds 24.00 MiB reserved, 1.00 MiB allocated; its 23.00 MiB cached free \
         serves only that pool's requests",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    let text = stdout(&memprof(&["diagnose", &file]));
    assert!(
        text.contains("its 23.00 MiB cached free serves only that pool's requests"),
        "{text}"
    );
}

#[test]
fn comparisons_compare_only_what_is_known_and_only_ranks() {
    // Two files without a trace: their peaks are not known, so nothing is called balanced.
    let scratch = Scratch::new("compare-unknown");
    let copy = scratch.join("segments_only_2.pickle");
    std::fs::copy(fixture("snapshots/segments_only.pickle"), &copy).expect("copies");
    let one = fixture("snapshots/segments_only.pickle")
        .display()
        .to_string();
    let text = stdout(&memprof(&["analyze", &one, &copy.display().to_string()]));
    assert!(
        text.starts_with(
            "no comparison of peaks: fewer than two devices have a trace that tells their peak"
        ),
        "{text}"
    );
    assert!(!text.contains("balanced"), "{text}");
    assert!(text.contains("      not known      not known"), "{text}");
    let doc = json(&["analyze", "--json", &one, &copy.display().to_string()]);
    assert_eq!(doc["comparison"]["outlier"], Value::Null);
    assert_eq!(
        doc["comparison"]["peaks"][0]["peak_active_bytes"],
        Value::Null
    );
    // A recording and the snapshot joined with it are one run, not two ranks.
    let text = stdout(&memprof(&[
        "analyze",
        &fixture("recordings/ledger.memprof").display().to_string(),
        &fixture("recordings/ledger.oom-857.pickle")
            .display()
            .to_string(),
    ]));
    assert!(!text.contains("outlier"), "{text}");
    assert!(!text.contains("balanced"), "{text}");
}

#[test]
fn a_device_without_pressure_is_not_headed_as_one_with_it() {
    let file = fixture("snapshots/multi_device.pickle")
        .display()
        .to_string();
    let text = stdout(&memprof(&["diagnose", &file]));
    assert!(text.contains("device 0: no allocator pressure"), "{text}");
    assert!(
        !text.lines().any(|l| l.ends_with(": allocator pressure")),
        "{text}"
    );
}
