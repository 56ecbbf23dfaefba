//! `memprof attach PID --json --duration SECS` in NVML mode, on the fake NVML: the series of
//! the process's device memory, and the refusals.

use crate::nvml_fake::{fake_nvml, GONE_PID};
use crate::util::{memprof, stderr, stdout};
use serde_json::Value;
use std::process::Command;

#[test]
fn attach_json_follows_one_process_per_device() {
    let dir = fake_nvml("attach");
    let own = std::process::id();
    let scenario = dir.join("attach.txt");
    std::fs::write(
        &scenario,
        format!(
            "device 1000000000 0 1000000000 0 0 GPU-a A\n\
             device 1000000000 0 1000000000 0 0 GPU-b B\n\
             process 0 {own} compute 1048576 4096\n\
             process 0 {GONE_PID} compute 999\n\
             process 1 {own} graphics na\n"
        ),
    )
    .expect("write the scenario");
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args([
            "attach",
            &own.to_string(),
            "--json",
            "--duration",
            "1",
            "--interval",
            "0.2",
        ])
        .env("LD_LIBRARY_PATH", &dir)
        .env("FAKE_NVML_SCENARIO", &scenario)
        .output()
        .expect("memprof runs");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).expect("one JSON document");
    assert_eq!(doc["kind"], "memprof_attach");
    assert_eq!(doc["mode"], "nvml");
    assert_eq!(doc["pid"], own);
    assert_eq!(doc["source"], "NVML (driver 550.54.15)");
    let samples = doc["samples"].as_array().expect("samples");
    assert!(
        (2..=6).contains(&samples.len()),
        "{} samples",
        samples.len()
    );
    let mut expected = 1_048_576;
    for sample in samples {
        let devices = sample["devices"].as_array().expect("devices");
        assert_eq!(devices.len(), 2, "{sample}");
        assert_eq!(devices[0]["index"], 0);
        assert_eq!(devices[0]["uuid"], "GPU-a");
        assert_eq!(devices[0]["used"], expected, "grows 4096 a sample");
        assert_eq!(devices[1]["index"], 1);
        assert_eq!(devices[1]["used"], Value::Null, "NVML would not say");
        expected += 4096;
    }
    let peak = doc["peak"].as_array().expect("peak");
    assert_eq!(peak.len(), 1);
    assert_eq!(peak[0]["used"], expected - 4096);
    assert_eq!(peak[0]["time_ms"], samples[samples.len() - 1]["time_ms"]);
}

#[test]
fn attach_refuses_what_it_cannot_do() {
    let out = memprof(&["attach", &GONE_PID.to_string(), "--json", "--duration", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        format!("memprof: error: no process with PID {GONE_PID}\n")
    );
    let out = memprof(&["attach", "1", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs --duration SECS"),
        "{}",
        stderr(&out)
    );
    let own = std::process::id().to_string();
    let out = memprof(&["attach", &own]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is an interactive dashboard and needs a terminal"),
        "{}",
        stderr(&out)
    );
}
