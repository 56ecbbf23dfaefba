//! `memprof diagnose`: the cause of each OOM fixture (snapshots and one log per PyTorch message
//! format), remedies replayed through the simulator, and the exit codes 0 / 1 / 2.

use crate::util::{fixture, memprof, stderr, stdout, Scratch, Within};
use serde_json::Value;

fn diagnose_json(args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["diagnose", "--json"];
    all.extend_from_slice(args);
    let out = memprof(&all);
    let doc = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
    (out.status.code(), doc)
}

fn one_diagnosis(args: &[&str]) -> Value {
    let (code, doc) = diagnose_json(args);
    assert_eq!(code, Some(0), "{args:?}");
    assert_eq!(doc["schema_version"], 2);
    let all = doc["diagnoses"].as_array().expect("diagnoses");
    assert_eq!(all.len(), 1, "{args:?}");
    all[0].clone()
}

fn path(rel: &str) -> String {
    fixture(rel).display().to_string()
}

#[test]
fn diagnose_demo_oom_is_fragmentation_and_expandable_segments_fixes_it() {
    let file = path("snapshots/demo_oom.pickle");
    let d = one_diagnosis(&[&file, "--capacity", "25386352640"]);
    assert_eq!(d["cause"], "fragmentation");
    assert_eq!(d["entry_index"], 1648);
    assert_eq!(d["request_bytes"], 4330947584u64);
    assert_eq!(d["largest_free_block_bytes"], 2573991936u64);
    assert_eq!(d["device_free_bytes"], 4160028672u64);
    let evidence = d["evidence"].as_str().expect("evidence");
    assert!(evidence.contains("2.40 GiB") && evidence.contains("4.03 GiB"));
    assert_eq!(d["sites"][0]["frame"], "/home/user/model.py:140:forward");
    // The failing request and the sites holding the most, each with the library call it made.
    assert_eq!(d["sites"][0]["via"], "torch.nn.modules.linear.forward");
    assert_eq!(d["sites"][3]["frame"], "/home/user/train.py:104:train_step");
    assert_eq!(d["sites"][3]["via"], "torch.optim.adamw.step");
    let remedies = d["remedies"].as_array().expect("remedies");
    assert_eq!(remedies[0]["kind"], "alloc_conf");
    assert_eq!(remedies[0]["alloc_conf"], "expandable_segments:True");
    assert_eq!(remedies[0]["env"], "PYTORCH_CUDA_ALLOC_CONF");
    assert_eq!(remedies[0]["changed"][0]["key"], "expandable_segments");
    assert_eq!(remedies[0]["verified"], true);
    assert_eq!(remedies[0]["oom_avoided"], true);
    assert!(remedies[0]["new_peak_reserved_bytes"].as_u64().is_some());
    let allocated = remedies[0]["new_peak_allocated_bytes"].as_u64();
    assert!(allocated.is_some_and(|a| a <= 25386352640), "{allocated:?}");
    // No site keeps tensors across the recorded iterations: nothing to free earlier.
    assert!(remedies.iter().all(|r| r["kind"] != "free_earlier"));
    // The figures of the OOM are those of that moment, replayed.
    assert_eq!(d["at_oom"]["largest_free_block_bytes"], 2573991936u64);
    assert_eq!(d["at_oom"]["device_free_bytes"], 4160028672u64);
    // Garbage collection was replayed and does not help: tried, apart from the fixes.
    let tried = d["tried"].as_array().expect("tried");
    assert!(tried.iter().all(|r| r["oom_avoided"] == false), "{tried:?}");
    assert!(tried.iter().any(|r| r["alloc_conf"]
        .as_str()
        .is_some_and(|c| c.contains("garbage_collection_threshold:0.8"))));
    let text = stdout(&memprof(&["diagnose", &file]));
    assert!(
        text.contains("OUT OF MEMORY at entry 1648: a request of 4.03 GiB failed (fragmentation)"),
        "{text}"
    );
    assert!(
        text.contains(
            "1. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n       no OOM in replay"
        ),
        "{text}"
    );
}

#[test]
fn diagnose_oom_fixture_is_exhaustion_at_the_growing_site() {
    let d = one_diagnosis(&[&path("snapshots/oom.pickle")]);
    assert_eq!(d["cause"], "exhaustion");
    assert_eq!(d["request_bytes"], 702546432u64);
    assert_eq!(d["sites"][0]["frame"], "/home/user/model.py:150:grow_cache");
    assert_eq!(d["sites"][1]["frame"], "/home/user/model.py:150:grow_cache");
    // No setting avoids it: the cut leads, with its size and the sites to cut from.
    let remedies = d["remedies"].as_array().expect("remedies");
    assert_eq!(remedies[0]["kind"], "reduce_live");
    assert_eq!(remedies[0]["verified"], false);
    // The request (670 MiB and 512 bytes) less the 552 MiB free on the device.
    assert_eq!(remedies[0]["bytes"], 123732480u64);
    assert_eq!(
        remedies[0]["sites"][0]["frame"],
        "/home/user/model.py:150:grow_cache"
    );
    assert_eq!(d["tried"].as_array().map(Vec::len), Some(4));
    let text = stdout(&memprof(&["diagnose", &path("snapshots/oom.pickle")]));
    let second = text.lines().nth(1).unwrap_or_default();
    assert_eq!(
        second,
        "  No allocator setting avoids this OOM in replay (4 tried, below): cut live memory at \
         the failing request by at least 118.00 MiB."
    );
}

#[test]
fn diagnose_a_snapshot_without_oom_reports_pressure_and_exits_0() {
    let (code, doc) = diagnose_json(&[&path("snapshots/expandable.pickle")]);
    assert_eq!(code, Some(0));
    assert_eq!(doc["diagnoses"], serde_json::json!([]));
    let p = &doc["devices"][0]["pressure"];
    assert_eq!(p["oom_retries"], 0);
    assert_eq!(p["empty_cache_bursts"], 2);
    let text = stdout(&memprof(&[
        "diagnose",
        &path("snapshots/expandable.pickle"),
    ]));
    assert!(
        text.contains("2 calls to torch.cuda.empty_cache() (not OOM retries), from /home/user/train.py:125:main"),
        "{text}"
    );
    // --fail-on-oom: 1 only where an OOM is found.
    let out = memprof(&[
        "diagnose",
        "--fail-on-oom",
        &path("snapshots/expandable.pickle"),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let out = memprof(&["diagnose", "--fail-on-oom", &path("snapshots/oom.pickle")]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn diagnose_every_log_format() {
    let cases = [
        ("logs/torch2_0_fragmentation.log", "fragmentation", 0),
        (
            "logs/torch2_1_outside_allocator.log",
            "outside_allocator",
            0,
        ),
        ("logs/torch2_2_exhaustion.log", "exhaustion", 1),
        (
            "logs/torch2_5_private_pools_oversized.log",
            "oversized_request",
            3,
        ),
        ("logs/torch2_11_fragmentation.log", "fragmentation", 0),
    ];
    for (log, cause, device) in cases {
        let d = one_diagnosis(&["--log", &path(log)]);
        assert_eq!(d["cause"], cause, "{log}");
        assert_eq!(d["device"], device, "{log}");
        assert_eq!(d["entry_index"], Value::Null, "{log}");
        assert!(d["remedies"]
            .as_array()
            .is_some_and(|r| r.iter().all(|r| r["verified"] == false)));
    }
    let d = one_diagnosis(&["--log", &path("logs/torch2_5_private_pools_oversized.log")]);
    // 18.50 GiB allocated (private pools included) + 200.00 MiB unallocated.
    assert_eq!(
        d["reserved_bytes"],
        (18.5 * 1073741824.0) as u64 + 200 * 1048576
    );
    let text = stdout(&memprof(&[
        "diagnose",
        "--log",
        &path("logs/torch2_1_outside_allocator.log"),
    ]));
    assert!(
        text.contains("6.52 GiB held outside the allocator"),
        "{text}"
    );
}

#[test]
fn diagnose_exit_codes() {
    let out = memprof(&["diagnose", "--log", &path("logs/no_oom.log")]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("no out-of-memory error found"));
    let out = memprof(&["diagnose", &path("snapshots/v2_1_basic.pickle")]);
    assert_eq!(out.status.code(), Some(0));
    let errors: [&[&str]; 6] = [
        &["diagnose", "x.pickle", "--capacity", "lots"],
        &["diagnose"],
        &["diagnose", "missing.pickle"],
        &["diagnose", "--log", "missing.log"],
        &["diagnose", "x.pickle", "--log", "y.log"],
        &["diagnose", "--log", "y.log", "--capacity", "80GiB"],
    ];
    for args in errors {
        let out = memprof(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!stderr(&out).is_empty(), "{args:?}");
    }
    let out = memprof(&["diagnose", &path("invalid/random.bin")]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn analyze_reports_the_diagnosis_without_remedies() {
    let out = memprof(&["analyze", "--json", &path("snapshots/demo_oom.pickle")]);
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("json");
    let oom = &doc["inputs"][0]["devices"][0]["oom"];
    assert_eq!(oom["entry_index"], 1648);
    assert_eq!(oom["diagnosis"]["cause"], "fragmentation");
    assert_eq!(oom["diagnosis"]["remedies"], serde_json::json!([]));
}

/// The accumulating-list program of `fixtures/README.md` ("Generated OOM snapshots"), driven
/// through memprof's allocator model with 100 MiB, written as a snapshot pickle into a
/// temporary directory (never committed). No iteration markers: the loop is found from the
/// repeating allocations.
fn accumulating_snapshot_file() -> Within {
    use memprof::model::StackTable;
    use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
    const MIB: u64 = 1 << 20;
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(Some(100 * MIB)));
    for _ in 0..7 {
        let t = a.malloc(20 * MIB, 0).expect("the temporary fits");
        if a.malloc(12 * MIB, 0).is_err() {
            break;
        }
        a.free(t).expect("allocated");
    }
    let snapshot =
        crate::util::model_snapshot(a.take_events(), a.layout(0), StackTable::default(), None);
    let dir = Scratch::new("diagnose");
    let path = dir.join("accumulating.pickle");
    crate::util::write_snapshot(&snapshot, &path);
    Within::new(dir, path)
}

#[test]
fn diagnose_growth_and_free_the_accumulated_tensors_earlier() {
    let file = accumulating_snapshot_file();
    let file = file.display().to_string();
    let d = one_diagnosis(&[&file]);
    assert_eq!(d["cause"], "growth", "{}", d["evidence"]);
    let remedies = d["remedies"].as_array().expect("remedies");
    let first = &remedies[0];
    assert!(first["action"]
        .as_str()
        .is_some_and(|a| a.starts_with("free the 6 tensors (72.00 MiB)")));
    assert_eq!(first["verified"], true);
    assert_eq!(first["oom_avoided"], true);
    assert_eq!(first["new_peak_allocated_bytes"], 32u64 << 20);
    assert_eq!(first["kind"], "free_earlier");
    assert_eq!(first["sites"][0]["bytes"], 72u64 << 20);
    let text = stdout(&memprof(&["diagnose", &file]));
    assert!(text.contains("failed (growth)"), "{text}");
    assert!(text.contains("frees    72.00 MiB"), "{text}");
}

/// An OOM of the `ledger` fixture's process caused by memory outside the allocator: with the
/// recording `run --torch` wrote beside the snapshot, diagnose names the library and the CUDA
/// context holding it.
#[test]
fn an_oom_outside_the_allocator_names_the_library_from_the_recording_beside_it() {
    if !crate::util::have("python3") {
        return;
    }
    let dir = Scratch::new("diagnose-ledger");
    let recording = dir.join("train.memprof");
    std::fs::copy(fixture("recordings/ledger.memprof"), &recording).expect("copied");
    let snapshot = dir.join("train.oom-857.pickle");
    // The fixture's snapshot with a request of 20 MiB that failed with 10 MiB free.
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import pickle, sys\n\
             s = pickle.load(open(sys.argv[1], 'rb'))\n\
             s['device_traces'][0].append({'action': 'oom', 'size': 20 << 20, \
             'device_free': 10 << 20, 'stream': 0, 'time_us': 200, 'frames': []})\n\
             pickle.dump(s, open(sys.argv[2], 'wb'), protocol=4)\n",
        )
        .arg(fixture("recordings/ledger.oom-857.pickle"))
        .arg(&snapshot)
        .output()
        .expect("python3 runs");
    assert!(made.status.success(), "{}", stderr(&made));
    let shown = snapshot.display().to_string();
    let d = one_diagnosis(&[&shown, "--capacity", "400MiB"]);
    assert_eq!(d["cause"], "outside_allocator", "{d}");
    let held = format!(
        "at the end of {}: libfakenccl.so 8.00 MiB, the CUDA context 312.00 MiB",
        recording.display()
    );
    assert!(
        d["evidence"].as_str().unwrap_or_default().contains(&held),
        "{d}"
    );
    let remedy = d["remedies"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["kind"] == "outside_allocator"))
        .expect("a remedy outside the allocator");
    assert!(
        remedy["action"]
            .as_str()
            .unwrap_or_default()
            .contains(&held),
        "{remedy}"
    );
    // Without the recording beside it, the diagnosis cannot name them.
    std::fs::remove_file(&recording).expect("removed");
    let d = one_diagnosis(&[&shown, "--capacity", "400MiB"]);
    assert!(!d["evidence"]
        .as_str()
        .unwrap_or_default()
        .contains("libfakenccl"));
}

/// `memprof ARGS`, failing the test (not hanging it) when it has not ended within a minute.
fn memprof_within_a_minute(args: &[&str]) -> std::process::Output {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("memprof runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("waits").is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            panic!("memprof {args:?} hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("ended")
}

fn mkfifo(path: &std::path::Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path");
    // SAFETY: `name` is a NUL-terminated path that lives across the call.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A FIFO where the recording or snapshot beside an input would be is not opened: reading it
/// would wait for a writer forever.
#[test]
fn a_fifo_beside_the_input_is_passed_over_without_hanging() {
    let dir = Scratch::new("diagnose-fifo-beside");
    // A recording whose snapshot beside it is a FIFO.
    let recording = dir.join("train.memprof");
    std::fs::copy(fixture("recordings/ledger.memprof"), &recording).expect("copied");
    mkfifo(&dir.join("train.oom-857.pickle"));
    let out = memprof_within_a_minute(&["analyze", &recording.display().to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A snapshot whose recording beside it is a FIFO, with an OOM outside the allocator (the
    // case that looks for it).
    let other = Scratch::new("diagnose-fifo-recording");
    let snapshot = other.join("train.oom-857.pickle");
    if !crate::util::have("python3") {
        return;
    }
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import pickle, sys\n\
             s = pickle.load(open(sys.argv[1], 'rb'))\n\
             s['device_traces'][0].append({'action': 'oom', 'size': 20 << 20, \
             'device_free': 10 << 20, 'stream': 0, 'time_us': 200, 'frames': []})\n\
             pickle.dump(s, open(sys.argv[2], 'wb'), protocol=4)\n",
        )
        .arg(fixture("recordings/ledger.oom-857.pickle"))
        .arg(&snapshot)
        .output()
        .expect("python3 runs");
    assert!(made.status.success(), "{}", stderr(&made));
    mkfifo(&other.join("train.memprof"));
    let out = memprof_within_a_minute(&[
        "diagnose",
        &snapshot.display().to_string(),
        "--capacity",
        "400MiB",
    ]);
    assert!(out.status.code().is_some_and(|c| c < 2), "{}", stderr(&out));
}

/// `diagnose --micro-batch N` on an OOM with a trace says what would have fit, in one line,
/// and that line is `plan fit`'s answer at the capacity the remedies were replayed under.
#[test]
fn diagnose_says_what_micro_batch_would_have_fit() {
    let file = path("snapshots/demo_oom.pickle");
    let (code, doc) = diagnose_json(&[&file, "--micro-batch", "4"]);
    assert_eq!(code, Some(0));
    let fits = doc["would_fit"].as_array().expect("would_fit");
    assert_eq!(fits.len(), 1, "{fits:?}");
    let largest = fits[0]["largest_micro_batch"].as_u64().expect("largest");
    assert!((1..4).contains(&largest), "{largest}");
    let line = fits[0]["line"].as_str().expect("line");
    assert!(
        line.starts_with(&format!(
            "at micro-batch {largest} instead of 4 this run fits with"
        )),
        "{line}"
    );
    let capacity = doc["diagnoses"][0]["replay_capacity_bytes"]
        .as_u64()
        .expect("replayed")
        .to_string();
    let device = fits[0]["device"].as_u64().expect("device").to_string();
    let out = memprof(&[
        "plan",
        "fit",
        &file,
        "--capacity",
        &capacity,
        "--cuda-context",
        "0",
        "--micro-batch",
        "4",
        "--device",
        &device,
        "--json",
    ]);
    let fit: Value = serde_json::from_str(&stdout(&out)).expect("plan fit JSON");
    assert_eq!(
        fit["micro_batch"]["largest"].as_u64(),
        Some(largest),
        "{fit}"
    );
    let text = stdout(&memprof(&["diagnose", &file, "--micro-batch", "4"]));
    assert!(
        text.contains(&format!("  what would have fit: {line}\n")),
        "{text}"
    );
    // Without the micro-batch nothing is said about it.
    let (_, plain) = diagnose_json(&[&file]);
    assert!(plain.get("would_fit").is_none(), "{plain}");
    assert!(!stdout(&memprof(&["diagnose", &file])).contains("what would have fit"));
}

/// The same on the real snapshots that hold an OOM in their trace: every replayed OOM gets its
/// line. Skipped, saying so, where the real snapshots are absent or none holds an `oom` entry.
#[test]
fn diagnose_what_would_have_fit_on_real_ooms() {
    let Some(dir) = crate::util::real_fixtures() else {
        return;
    };
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    for d in [dir.clone(), dir.join("more")] {
        if let Ok(rd) = std::fs::read_dir(&d) {
            files.extend(
                rd.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl")),
            );
        }
    }
    let mut checked = 0;
    for f in &files {
        let shown = f.display().to_string();
        let (_, doc) = diagnose_json(&[&shown, "--micro-batch", "2"]);
        let replayed: Vec<u64> = doc["diagnoses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["replay_capacity_bytes"].is_u64())
            .filter_map(|d| d["device"].as_u64())
            .collect();
        if replayed.is_empty() {
            continue;
        }
        let lines = doc["would_fit"].as_array().cloned().unwrap_or_default();
        for device in replayed {
            assert!(
                lines.iter().any(|w| w["device"].as_u64() == Some(device)),
                "{shown}: device {device} has no line"
            );
        }
        checked += 1;
    }
    if checked == 0 {
        crate::util::skip("no real snapshot here holds a replayed OOM in its trace");
    }
}
