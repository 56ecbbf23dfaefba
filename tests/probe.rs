//! `memprof probe` through cudarc on the fake libcuda of `kernels/fake_cuda`, built as a current
//! driver, as an old one without the VMM API, and not at all.

use crate::util::{repo, skip, stderr, stdout, Scratch};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The fake driver compiled into a fresh directory (as `libcuda.so.1` and `libcuda.so`, the
/// first name cudarc tries), with extra `cc` flags.
fn fake_cuda(name: &str, flags: &[&str]) -> Scratch {
    let dir = Scratch::new(&format!("fake-cuda-probe-{name}"));
    let out = Command::new("cc")
        .args([
            "-O1",
            "-Wall",
            "-Werror",
            "-shared",
            "-fPIC",
            "-Wl,-Bsymbolic",
        ])
        .args(flags)
        .args(["-Wl,-soname,libcuda.so.1", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(repo().join("kernels/fake_cuda/fake_cuda.c"))
        .arg("-lpthread")
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::copy(dir.join("libcuda.so.1"), dir.join("libcuda.so")).expect("copy");
    dir
}

fn probe(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memprof"))
        .arg("probe")
        .args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("FAKE_CUDA_CAPACITY", "3000000")
        .env("FAKE_CUDA_GRANULARITY", "65536")
        .env("FAKE_CUDA_DRIVER_VERSION", "12020")
        .output()
        .expect("memprof runs")
}

#[test]
fn probe_reports_what_the_driver_says() {
    let dir = fake_cuda("current", &[]);
    let out = probe(&dir, &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(
        doc,
        json!({
            "driver_version": "12.2",
            "devices": [{
                "ordinal": 0,
                "name": "Fake CUDA Device",
                "free": 3000000,
                "total": 3000000,
                "vmm_granularity": 65536,
                "vmm_granularity_recommended": 65536
            }]
        })
    );
    let out = probe(&dir, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "CUDA driver 12.2 (1 device)\ndevice 0: Fake CUDA Device\n  memory: 2.86 MiB free of 2.86 MiB\n  VMM granularity: 64.00 KiB (recommended 64.00 KiB)\n"
    );
}

#[test]
fn an_old_driver_has_no_granularity_and_a_missing_one_is_exit_2() {
    let dir = fake_cuda("old", &["-DFAKE_CUDA_OLD_DRIVER"]);
    let out = probe(&dir, &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(doc["devices"][0]["vmm_granularity"], Value::Null);
    assert_eq!(doc["devices"][0]["total"], 3000000);
    assert!(stdout(&probe(&dir, &[])).contains("VMM granularity: not supported"));

    let empty = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-cuda-here");
    std::fs::create_dir_all(&empty).expect("temp dir");
    let out = probe(&empty, &[]);
    if out.status.code() == Some(0) {
        skip("the no-driver case needs a machine without libcuda, and this one has it");
        return;
    }
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "memprof: error: cannot load libcuda.so.1 (the CUDA driver); is the NVIDIA driver installed?\n"
    );
}
