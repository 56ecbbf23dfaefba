//! `memprof attach PID` in NVML mode, on the fake NVML: the `--json` series of the process's
//! device memory, the dashboard in tmux until the process ends, and the refusals.

use crate::attach_shim::Guard;
use crate::nvml_fake::{fake_nvml, GONE_PID};
use crate::util::{memprof, skip, stderr, stdout};
use crate::view_tmux::Tmux;
use serde_json::Value;
use std::process::Command;

/// NVML reports host PIDs, so NVML mode needs the host's PID namespace (memprof refuses it in
/// a container); says so where the tests run in another one.
fn in_host_pid_namespace() -> bool {
    let host = memprof::source::gpu::ProcView::system().host_namespace();
    if !host {
        skip("needs the host's PID namespace (NVML mode is refused in a container)");
    }
    host
}

#[test]
fn attach_json_follows_one_process_per_device() {
    if !in_host_pid_namespace() {
        return;
    }
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
    // Our own process: attaching to PID 1 is refused earlier for a user other than root.
    let own = std::process::id().to_string();
    let out = memprof(&["attach", &own, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs --duration SECS"),
        "{}",
        stderr(&out)
    );
    let out = memprof(&["attach", &own]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is an interactive dashboard and needs a terminal"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn attach_in_tmux_without_the_shim_samples_nvml_and_says_what_it_cannot_see() {
    if !in_host_pid_namespace() {
        return;
    }
    let dir = fake_nvml("attach-tmux");
    // A process of ours that holds memory on device 0, growing, and ends when the test kills it.
    let mut sleeper = Guard(Command::new("sleep").arg("60").spawn().expect("sleep runs"));
    let pid = sleeper.0.id();
    let scenario = dir.join("attach.txt");
    std::fs::write(
        &scenario,
        format!(
            "device 1000000000 0 1000000000 0 0 GPU-a A\n\
             process 0 {pid} compute 1048576 1048576\n"
        ),
    )
    .expect("write the scenario");
    let runtime = dir.join("runtime");
    std::fs::create_dir_all(&runtime).expect("runtime dir");
    let command = format!(
        "sh -c 'LD_LIBRARY_PATH={dir} FAKE_NVML_SCENARIO={scenario} XDG_RUNTIME_DIR={runtime} {memprof} attach {pid} --interval 0.2; echo \"exit=$?\"; echo end-of-check; sleep 60'",
        dir = dir.display(),
        scenario = scenario.display(),
        runtime = runtime.display(),
        memprof = env!("CARGO_BIN_EXE_memprof"),
    );
    let Some(tmux) = Tmux::start(&command, 100, 30) else {
        return;
    };
    let screen = tmux.wait_text("What NVML cannot see");
    assert!(screen.contains("NVML (driver 550.54.15)"), "{screen}");
    assert!(
        screen.contains(&format!("no memprof shim in PID {pid}")),
        "{screen}"
    );
    tmux.wait_text("peak 3.00 MiB");
    let _ = sleeper.0.kill();
    let _ = sleeper.0.wait();
    tmux.wait_text(&format!("process {pid} has ended"));
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
}
