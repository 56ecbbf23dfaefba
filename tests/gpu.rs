//! Checks that need a real NVIDIA GPU, its driver and NVML (and, for the last, PyTorch with
//! CUDA). Ignored by default so CI without a GPU stays green; on a GPU machine run
//! `cargo test --release --test main -- --ignored gpu::` (scripts/gpu-check.sh runs the same
//! steps from release binaries, for a machine that cannot build).

use crate::util::{memprof, repo, stderr, stdout};
use memprof::source::gpu::{open_nvml, SystemClock};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn json(args: &[&str]) -> Value {
    let out = memprof(args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("one JSON document")
}

#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn probe_reads_the_real_driver() {
    let doc = json(&["probe", "--json"]);
    let devices = doc["devices"].as_array().expect("devices");
    assert!(!devices.is_empty(), "{doc}");
    for d in devices {
        let (free, total) = (d["free"].as_u64(), d["total"].as_u64());
        assert!(
            matches!((free, total), (Some(f), Some(t)) if f <= t && t > 0),
            "{d}"
        );
        // Every driver with the VMM API (CUDA 10.2+) has a granularity of 2 MiB or more.
        assert!(
            d["vmm_granularity"].as_u64().is_some_and(|g| g >= 2 << 20),
            "{d}"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and NVML (libnvidia-ml.so.1)"]
fn nvml_sees_every_device_with_its_memory() {
    let mut sampler = open_nvml(Box::new(SystemClock)).expect("NVML opens");
    let sample = sampler.sample().expect("a sample");
    assert!(!sample.devices.is_empty());
    for d in &sample.devices {
        let (total, used) = (d.total.expect("total"), d.used.expect("used"));
        assert!(used <= total && total.0 > 0, "{d:?}");
        assert!(d.name.is_some() && d.uuid.is_some(), "{d:?}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU, its driver and PyTorch with CUDA"]
fn a_torch_run_under_the_shim_and_its_snapshot_agree() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-torch-run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (recording, snapshot) = (dir.join("train.memprof"), dir.join("train.pickle"));
    let shim = PathBuf::from(env!("CARGO_BIN_EXE_memprof")).with_file_name("libmemprof_shim.so");
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .env("MEMPROF_SHIM", &shim)
        .arg("run")
        .arg("-o")
        .arg(&recording)
        .args(["--", "python3"])
        .arg(repo().join("kernels/gpu/torch_train.py"))
        .arg("--snapshot")
        .arg(&snapshot)
        .output()
        .expect("memprof run");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // The allocator's reserved memory comes from driver calls the shim saw: the recording's
    // peak is at least the snapshot's (cuBLAS and NCCL may add their own allocations).
    let peak =
        |doc: &Value| doc["inputs"][0]["devices"][0]["trace"]["peak_reserved_bytes"].as_u64();
    let from_snapshot = peak(&json(&[
        "analyze",
        "--json",
        &snapshot.display().to_string(),
    ]));
    let from_recording = peak(&json(&[
        "analyze",
        "--json",
        &recording.display().to_string(),
    ]));
    assert!(
        matches!((from_snapshot, from_recording), (Some(s), Some(r)) if s > 0 && r >= s),
        "snapshot {from_snapshot:?}, recording {from_recording:?}"
    );
    // A real trace replays exactly.
    let validate = json(&[
        "simulate",
        &snapshot.display().to_string(),
        "--validate",
        "--json",
    ]);
    let device = &validate["validate"]["devices"][0];
    assert_eq!(
        device["alloc_address_matches"], device["alloc_events"],
        "{device}"
    );
    assert_eq!(
        device["segment_alloc_matches"], device["segment_alloc_events"],
        "{device}"
    );
    assert_eq!(device["final_layout_matches"], true, "{device}");
}
