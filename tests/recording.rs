//! memprof recordings as input: `kernels/workloads/peak_oom.c` runs on the fake driver under
//! the shim, and `analyze`, `diagnose`, `gate` and `export` read its recording with the figures
//! the workload's calls imply; `export --to torch-snapshot` round-trips through `analyze` and
//! Python's `pickle` (and `--to json` / `perfetto` work); version-1 and -2 recordings still read;
//! `simulate` refuses; damaged recordings fail with one line or warn; a program ending with
//! `_exit` / `_Exit` still gets its whole recording; `MEMPROF_LISTEN=0` opens no socket.

use crate::shim_preload::{kernels, shim};
use crate::util::{analyze_json, memprof, repo, stderr, stdout, Scratch};
use memprof_wire::{decode_recording, Kind, Recording};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const CAPACITY: u64 = 1_048_576;
/// The fake driver's capacity without `FAKE_CUDA_CAPACITY` (1 GiB).
const CAPACITY_DEFAULT: u64 = 1 << 30;

/// Runs peak_oom (with `arg`) under the shim; returns its directory (kept while the caller
/// holds it), the recording's path and its records.
fn record(name: &str, arg: Option<&str>) -> (Scratch, PathBuf, Recording) {
    record_with(name, arg, &[])
}

/// `record` with more environment variables.
fn record_with(
    name: &str,
    arg: Option<&str>,
    env: &[(&str, &str)],
) -> (Scratch, PathBuf, Recording) {
    let dir = kernels(name);
    let out = dir.join("peak_oom.memprof");
    let mut cmd = Command::new(dir.join("peak_oom"));
    cmd.args(arg)
        .env("FAKE_CUDA_CAPACITY", CAPACITY.to_string())
        .env("MEMPROF_OUT", &out)
        .env("LD_PRELOAD", shim())
        .envs(env.iter().copied());
    let status = cmd.status().expect("peak_oom runs");
    assert!(status.success(), "peak_oom {arg:?}: {status}");
    let bytes = std::fs::read(&out).expect("the recording was written");
    let recording = decode_recording(&bytes).expect("the recording decodes");
    (dir, out, recording)
}

/// The pointers of the successful cuMemAlloc calls, in order (a, b, c).
fn allocations(r: &Recording) -> Vec<u64> {
    r.records
        .iter()
        .filter(|x| x.kind == Kind::Alloc && x.result == 0)
        .map(|x| x.ptr)
        .collect()
}

#[test]
fn analyze_reads_a_recording_with_the_figures_its_calls_imply() {
    let (_dir, path, recording) = record("analyze", None);
    assert_eq!(recording.dropped, Some(0));
    let doc = analyze_json(std::slice::from_ref(&path));
    let input = &doc["inputs"][0];
    let process = &input["process"];
    assert_eq!(process["pid"], recording.header.pid);
    let program = path.with_file_name("peak_oom").display().to_string();
    assert_eq!(process["command"], serde_json::json!([program]));
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    assert_eq!(process["host"], host.trim());
    // Entry times are wall clock: the peak lies after the start, and both are recent.
    let start = process["start_time_us"].as_i64().expect("a start time");
    let peak = input["devices"][0]["trace"]["peak_time_us"]
        .as_i64()
        .expect("a peak time");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64;
    assert!(
        start <= peak && peak <= now && now - start < 600_000_000,
        "{start} {peak} {now}"
    );
    assert_eq!(input["kind"], "memprof_recording");
    assert_eq!(input["format"], "recording");
    assert_eq!(input["warnings"], serde_json::json!([]));
    let devices = input["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    // Left alive: c (200000) and one 32768-byte mapping.
    for field in [
        "reserved_bytes",
        "allocated_bytes",
        "active_bytes",
        "requested_bytes",
    ] {
        assert_eq!(d[field], 232_768, "{field}");
    }
    assert_eq!(
        (d["segments"].as_u64(), d["blocks"].as_u64()),
        (Some(2), Some(2))
    );
    // The peak: b + c and both 65536-byte mappings, before the unmap.
    assert_eq!(d["trace"]["peak_active_bytes"], 631_072);
    assert_eq!(d["trace"]["peak_reserved_bytes"], 631_072);
    assert_eq!(d["trace"]["inconsistencies"], 0);
    let actions = &d["trace"]["actions"];
    for (action, n) in [
        ("segment_alloc", 3),
        ("alloc", 6),
        ("free_completed", 4),
        ("segment_free", 2),
        ("segment_map", 3),
        ("segment_unmap", 2),
        ("oom", 1),
    ] {
        assert_eq!(actions[action], n, "{action}");
    }
    let oom = &d["oom"];
    assert_eq!(oom["request_bytes"], 600_000);
    assert_eq!(oom["device_free_bytes"], CAPACITY - 500_000);
    let diagnosis = &oom["diagnosis"];
    assert_eq!(diagnosis["cause"], "exhaustion");
    assert_eq!(diagnosis["reserved_bytes"], 500_000);
    assert_eq!(diagnosis["total_bytes"], CAPACITY);
    assert_eq!(diagnosis["largest_free_block_bytes"], Value::Null);
    assert_eq!(allocations(&recording).len(), 3);

    let out = memprof(&["analyze", &path.display().to_string()]);
    let text = stdout(&out);
    for line in [
        "memprof recording of driver calls, 1 device)",
        &format!(
            "  process {} on {}: {program}",
            recording.header.pid,
            host.trim()
        ),
        "(largest free block not visible in driver calls)",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
}

/// Removes every `seconds` (a time on the input's axis) from a JSON value.
fn drop_seconds(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.remove("seconds");
            map.values_mut().for_each(drop_seconds);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_seconds),
        _ => {}
    }
}

#[test]
fn version_1_and_2_recordings_read_with_the_same_figures() {
    // Without stacks, as version 1 has none.
    let (_dir, path, _) = record_with("v1", None, &[("MEMPROF_STACKS", "0")]);
    let figures = |file: &Path| {
        let doc = analyze_json(&[file.to_path_buf()]);
        let input = &doc["inputs"][0];
        let mut devices = input["devices"].clone();
        // Only times differ: version 1 has no wall clock.
        devices[0]["trace"]["peak_time_us"] = Value::Null;
        devices[0]["trace"]["peak_offset_us"] = Value::Null;
        devices[0]["oom"]["time_us"] = Value::Null;
        drop_seconds(&mut devices);
        for f in devices[0]["findings"].as_array_mut().expect("findings") {
            let sentence = f["sentence"].as_str().unwrap_or_default();
            f["sentence"] = Value::from(sentence.replace(", 0.000 s", ""));
        }
        (devices, input["process"].clone())
    };
    let (now, process) = figures(&path);
    let (old, old_process) = figures(&crate::util::fixture("recordings/peak_oom_v1.memprof"));
    assert_eq!(old, now);
    // Version 2 (before stacks, written by that version's shim) reads the same, with its process.
    let (v2, v2_process) = figures(&crate::util::fixture("recordings/peak_oom_v2.memprof"));
    assert_eq!(v2, now);
    assert!(v2_process["host"].is_string());
    assert!(process["host"].is_string());
    assert_eq!(old_process["host"], Value::Null);
    assert_eq!(
        old_process["command"],
        serde_json::Value::Null,
        "not recorded, not empty"
    );
    assert!(old_process["pid"].is_u64());
}

#[test]
fn diagnose_and_gate_take_a_recording_and_simulate_refuses_it() {
    let (_dir, path, _) = record("commands", None);
    let file = path.display().to_string();
    let out = memprof(&["diagnose", "--json", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let d = &doc["diagnoses"][0];
    assert_eq!(d["cause"], "exhaustion");
    assert_eq!(d["device_free_bytes"], CAPACITY - 500_000);
    // 600000 wanted where 548576 was free: 51424 must go.
    let remedy = d["remedies"][0]["action"].as_str().expect("a remedy");
    assert!(remedy.contains("50.22 KiB"), "{remedy}");

    let out = memprof(&["simulate", &file]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("memprof recording holds driver calls"),
        "{err}"
    );

    let base = path.with_extension("baseline.json");
    let shown = base.display().to_string();
    let out = memprof(&["gate", &file, "--write-baseline", &shown]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = memprof(&["gate", &file, "--baseline", &shown, "--limit", "600000"]);
    assert_eq!(out.status.code(), Some(1), "peak 631072 is over the limit");
    assert!(stdout(&out).contains("616.28 KiB"), "{}", stdout(&out));
}

/// Loads the exported pickle with Python's own `pickle` and prints segments and trace (an
/// `oom` entry has `device_free` where the others have `addr`).
const PY_DUMP: &str = r#"
import json, pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
segs = [[g["device"], g["address"], g["total_size"], g["is_expandable"],
         [[b["size"], b["requested_size"], b["state"]] for b in g["blocks"]]]
        for g in s["segments"]]
trace = [[e["action"], e["addr"] if "addr" in e else e["device_free"], e["size"]] for e in s["device_traces"][0]]
print(json.dumps({"segments": segs, "trace": trace}))
"#;

#[test]
fn export_to_torch_snapshot_round_trips_and_python_reads_it() {
    let (_dir, path, recording) = record("export", None);
    let pickle = path.with_extension("pickle");
    let out = memprof(&[
        "export",
        &path.display().to_string(),
        "--to",
        "torch-snapshot",
        "-o",
        &pickle.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // analyze gives the same figures on both; only what the allocator model reads into them
    // differs: a snapshot's OOM and pressure are replayed through the simulator (a driver
    // free reads as a release of the cache), a recording's come from the driver calls alone.
    // The export writes each `free_completed` after its `free_requested`, as PyTorch does, so
    // it has more entries and the indices after a free move: those are compared apart.
    let figures = |file: &Path| {
        let mut doc = analyze_json(&[file.to_path_buf()]);
        let devices = &mut doc["inputs"][0]["devices"];
        let mut counts = Vec::new();
        for d in devices.as_array_mut().expect("devices") {
            d["oom"]["diagnosis"] = Value::Null;
            d["oom"]["at_oom"]["largest_free_block_bytes"] = Value::Null;
            d["pressure"] = Value::Null;
            let trace = &mut d["trace"];
            counts.push((
                trace["entries"].take(),
                trace["actions"]["free_completed"].clone(),
                trace["actions"]
                    .as_object_mut()
                    .and_then(|a| a.remove("free_requested")),
            ));
            trace["peak_entry_index"] = Value::Null;
            d["oom"]["entry_index"] = Value::Null;
            // The account's moments hold entry indices and what the simulator replayed; its
            // peaks' bytes and the dump are the same figures, compared here.
            let peaks = d["peaks"].take();
            d["peaks"] =
                serde_json::json!([peaks["requested"]["bytes"], peaks["reserved"]["bytes"]]);
            let dump = d["moments"]
                .as_array()
                .and_then(|m| m.iter().find(|m| m["kind"] == "dump"))
                .cloned()
                .expect("a dump moment");
            d["moments"] = dump;
            d["findings"] = Value::Null;
            // Lifetimes need each free's time: the export has free_requested entries the
            // recording does not.
            d["anomalies"]["lifetimes"] = Value::Null;
        }
        (devices.clone(), counts)
    };
    let ((exported, paired), (recorded, unpaired)) = (figures(&pickle), figures(&path));
    assert_eq!(exported, recorded);
    for ((entries, completed, requested), (recorded_entries, _, none)) in
        paired.into_iter().zip(unpaired)
    {
        assert_eq!(none, None, "a recording has no free_requested");
        assert_eq!(
            requested,
            Some(completed.clone()),
            "one request per completion"
        );
        let completed = completed.as_u64().expect("a count");
        assert_eq!(
            entries.as_u64(),
            recorded_entries.as_u64().map(|n| n + completed)
        );
    }

    let py = Command::new("python3")
        .args(["-c", PY_DUMP])
        .arg(&pickle)
        .current_dir(repo())
        .output()
        .expect("python3 runs");
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let got: Value = serde_json::from_slice(&py.stdout).expect("JSON");
    let [a, b, c] = allocations(&recording)[..] else {
        panic!("three successful cuMemAlloc calls");
    };
    let map1 = 0x7e00_0000_0000u64;
    let map2 = map1 + 65536;
    let kept = 0x7f00_0000_0000u64;
    let block = |size: u64| serde_json::json!([[size, size, "active_allocated"]]);
    assert_eq!(
        got["segments"],
        serde_json::json!([
            [0, c, 200_000, false, block(200_000)],
            [0, kept, 32768, true, block(32768)],
        ])
    );
    let trace = serde_json::json!([
        ["segment_alloc", a, 100_000],
        ["alloc", a, 100_000],
        ["segment_alloc", b, 300_000],
        ["alloc", b, 300_000],
        ["free_requested", a, 100_000],
        ["free_completed", a, 100_000],
        ["segment_free", a, 100_000],
        ["segment_alloc", c, 200_000],
        ["alloc", c, 200_000],
        ["oom", CAPACITY - 500_000, 600_000],
        ["segment_map", map1, 65536],
        ["alloc", map1, 65536],
        ["segment_map", map2, 65536],
        ["alloc", map2, 65536],
        ["free_requested", map1, 65536],
        ["free_completed", map1, 65536],
        ["segment_unmap", map1, 65536],
        ["free_requested", map2, 65536],
        ["free_completed", map2, 65536],
        ["segment_unmap", map2, 65536],
        ["segment_map", kept, 32768],
        ["alloc", kept, 32768],
        ["free_requested", b, 300_000],
        ["free_completed", b, 300_000],
        ["segment_free", b, 300_000],
    ]);
    assert_eq!(got["trace"], trace);
}

#[test]
fn export_to_json_and_perfetto_reads_a_recording() {
    let path = crate::util::fixture("recordings/peak_oom_v1.memprof");
    let dir = kernels("export-other");
    for (to, name) in [("json", "events.json"), ("perfetto", "trace.json")] {
        let target = dir.join(name);
        let out = memprof(&[
            "export",
            &path.display().to_string(),
            "--to",
            to,
            "-o",
            &target.display().to_string(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{to}: {}", stderr(&out));
        let doc: Value =
            serde_json::from_slice(&std::fs::read(&target).expect("written")).expect("JSON");
        if to == "json" {
            assert_eq!(doc["format"], "recording");
            assert_eq!(
                doc["devices"][0]["entries"].as_array().map(Vec::len),
                Some(21)
            );
            assert_eq!(doc["segments"].as_array().map(Vec::len), Some(2));
        } else {
            assert!(doc["traceEvents"].as_array().is_some_and(|e| !e.is_empty()));
        }
    }
}

#[test]
fn memprof_listen_0_opens_no_socket() {
    let dir = kernels("no-listen");
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).expect("runtime dir");
    let mut child = Command::new(dir.join("peak_oom"))
        .arg("wait")
        .env("FAKE_CUDA_CAPACITY", CAPACITY.to_string())
        .env("MEMPROF_OUT", dir.join("quiet.memprof"))
        .env("MEMPROF_LISTEN", "0")
        .env("LD_PRELOAD", shim())
        .env("XDG_RUNTIME_DIR", &runtime)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("peak_oom runs");
    let mut ready = String::new();
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    std::io::BufRead::read_line(&mut lines, &mut ready).expect("a line");
    assert_eq!(ready, "ready\n");
    // The shim is recording (the calls before the wait started it), but listens nowhere.
    assert!(!runtime.join("memprof").exists());
    let mut stdin = child.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut stdin, b"go\n").expect("written");
    drop(stdin);
    assert!(child.wait().expect("exits").success());
}

#[test]
fn calls_carry_the_device_of_the_current_context() {
    let dir = kernels("devices");
    let out = dir.join("devices.memprof");
    let status = Command::new(dir.join("devices"))
        .env("MEMPROF_OUT", &out)
        .env("LD_PRELOAD", shim())
        .status()
        .expect("devices runs");
    assert!(status.success(), "devices: {status}");
    let recording = decode_recording(&std::fs::read(&out).expect("written")).expect("decodes");
    let named: Vec<(Kind, u64, i32)> = recording
        .records
        .iter()
        .filter(|r| r.kind != Kind::Free)
        .map(|r| (r.kind, r.size, r.device))
        .collect();
    assert_eq!(
        named,
        [
            (Kind::Alloc, 1000, 2),
            (Kind::Alloc, 2000, 0),
            (Kind::MemGetInfo, CAPACITY_DEFAULT, 0),
            (Kind::Alloc, 3000, 1),
            (Kind::Alloc, 4000, -1),
        ]
    );
    let doc = analyze_json(std::slice::from_ref(&out));
    let input = &doc["inputs"][0];
    let peaks: Vec<(u64, u64)> = input["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .map(|d| {
            let peak = d["trace"]["peak_active_bytes"].as_u64().expect("a peak");
            (d["device"].as_u64().expect("a device"), peak)
        })
        .collect();
    // The allocation made without a current context is put on device 0, and said so.
    assert_eq!(peaks, [(0, 6000), (1, 3000), (2, 1000)]);
    let warnings = input["warnings"].to_string();
    assert!(
        warnings.contains("1 driver calls do not name their device"),
        "{warnings}"
    );
}

#[test]
fn damaged_recordings_fail_with_one_line_or_warn_and_read_what_is_there() {
    let (_dir, path, recording) = record("damaged", None);
    let bytes = std::fs::read(&path).expect("written");
    let dir = path.parent().expect("a directory");

    let bad = dir.join("bad-kind.memprof");
    let mut damaged = bytes.clone();
    let offset = recording.offsets[3];
    damaged[offset] = 0xee;
    std::fs::write(&bad, &damaged).expect("written");
    let out = memprof(&["analyze", &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        // The index counts the stack and mapping definitions before it too.
        err.contains(&format!("at byte {offset}: record "))
            && err.ends_with(" has unknown kind 238\n"),
        "{err}"
    );

    // Cut in the middle of the sixth record: five records are read, with warnings.
    let cut = dir.join("cut.memprof");
    let at = recording.offsets[5] + 40;
    std::fs::write(&cut, &bytes[..at]).expect("written");
    let doc = analyze_json(std::slice::from_ref(&cut));
    let warnings = doc["inputs"][0]["warnings"].to_string();
    assert!(warnings.contains("no trailer"), "{warnings}");
    assert!(warnings.contains("ignored 40 bytes"), "{warnings}");
    let d = &doc["inputs"][0]["devices"][0];
    // a, b, free a, c, cuMemGetInfo: b and c alive.
    assert_eq!(recording.records[4].kind, Kind::MemGetInfo);
    assert_eq!(d["reserved_bytes"], 500_000);
    assert_eq!(d["trace"]["peak_active_bytes"], 500_000);
}

/// Every cut inside the header, even inside the magic, says the recording was cut short (a
/// file cut after 5 bytes was once taken for a pickle that would run code); version 0 says the
/// header is damaged, not that a newer memprof wrote it.
#[test]
fn a_cut_or_damaged_header_says_so() {
    let (_scratch, path, _) = record("header", None);
    let bytes = std::fs::read(&path).expect("written");
    let dir = path.parent().expect("a directory");
    let refused = |name: &str, content: &[u8]| {
        let file = dir.join(name);
        std::fs::write(&file, content).expect("written");
        let out = memprof(&["analyze", &file.display().to_string()]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.contains(&file.display().to_string()), "{name}: {err}");
        assert!(!err.contains("pickle"), "{name}: {err}");
        err
    };
    for at in 1..memprof_wire::FILE_HEADER_LEN {
        let err = refused(&format!("cut{at}.memprof"), &bytes[..at]);
        assert!(
            err.contains("recording header cut short"),
            "cut at {at}: {err}"
        );
    }
    let err = refused("cut5.memprof", &bytes[..5]);
    assert!(
        err.ends_with("the file is 5 bytes, a memprof recording's header is 32\n"),
        "{err}"
    );
    let mut version_0 = bytes.clone();
    version_0[8..12].copy_from_slice(&0u32.to_le_bytes());
    let err = refused("version0.memprof", &version_0);
    assert!(err.contains("version 0 is not one memprof writes"), "{err}");
    assert!(err.contains("the header is damaged"), "{err}");
}

#[test]
fn a_program_ending_with_underscore_exit_is_flushed_with_its_trailer() {
    let (_, _, normal) = record("exit-normal", None);
    let kinds = |r: &Recording| r.records.iter().map(|x| x.kind).collect::<Vec<_>>();
    assert_eq!(normal.records.len(), 16);
    for how in ["_exit", "_Exit"] {
        let (_, _, ended) = record(&format!("exit{how}"), Some(how));
        assert_eq!(ended.dropped, Some(0), "{how}: the trailer was written");
        assert_eq!(kinds(&ended), kinds(&normal), "{how}: every call recorded");
    }
}
