//! The real NVML sampler (nvml-wrapper) on the fake libnvidia-ml of `kernels/fake_nvml`:
//! compiles it with `cc`, writes a scenario, and checks every figure, the `None`s for what the
//! fake does not support, and a process that grows on every sample.

use crate::util::{repo, Scratch};
use memprof::model::Bytes;
use memprof::source::gpu::{
    DeviceSample, FixedClock, GpuSampler, NvmlSampler, ProcView, ProcessSample, SampleError,
};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the fake NVML into a fresh directory `name` as `libnvidia-ml.so.1` (removed when
/// dropped).
pub fn fake_nvml(name: &str) -> Scratch {
    let dir = Scratch::new(&format!("fake-nvml-{name}"));
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC"])
        .args(["-Wl,-soname,libnvidia-ml.so.1", "-o"])
        .arg(dir.join("libnvidia-ml.so.1"))
        .arg(repo().join("kernels/fake_nvml/fake_nvml.c"))
        .arg("-lpthread")
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc fake_nvml.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A PID above the kernel's PID_MAX_LIMIT (4194304): no process has it.
pub const GONE_PID: u32 = 4_194_400;

/// Two devices with everything, one with nothing; our own process on device 0 in both the
/// compute and graphics lists, a process whose figure NVML will not give, and one on device 1
/// that grows by 4096 bytes a sample.
pub fn scenario(dir: &Path, own_pid: u32) -> PathBuf {
    let text = format!(
        "# fake NVML scenario\n\
         driver 550.54.15\n\
         device 85899345920 1073741824 84825604096 87 40 GPU-0f2b2a34-8d1c-4e0a-9a57-1b2c3d4e5f60 NVIDIA H100 80GB HBM3\n\
         device 25769803776 0 25769803776 -1 -1 - -\n\
         device -1 -1 -1 5 6 GPU-vgpu-2 GRID A100-8C\n\
         process 0 {own_pid} compute 536870912\n\
         process 0 {GONE_PID} compute na\n\
         process 0 {own_pid} graphics 536870912\n\
         process 1 {gone2} graphics 1048576 4096\n",
        gone2 = GONE_PID + 1
    );
    let path = dir.join("scenario.txt");
    std::fs::write(&path, text).expect("write the scenario");
    path
}

#[test]
fn the_nvml_sampler_reads_exactly_the_scenario() {
    let dir = fake_nvml("sampler");
    let own = std::process::id();
    // The only test in this binary that loads NVML in-process, so the only reader of this.
    std::env::set_var("FAKE_NVML_SCENARIO", scenario(&dir, own));
    let lib = dir.join("libnvidia-ml.so.1");
    let procs = ProcView::system();
    let mut sampler = NvmlSampler::open(
        Some(lib.as_os_str()),
        Box::new(FixedClock(1_700_000_000_000)),
        procs.clone(),
    )
    .expect("the fake NVML opens");
    assert_eq!(sampler.driver_version(), Some("550.54.15"));
    assert_eq!(sampler.describe(), "NVML (driver 550.54.15)");

    let first = sampler.sample().expect("a sample");
    assert_eq!(first.time_ms, 1_700_000_000_000);
    assert_eq!(
        first.devices,
        [
            DeviceSample {
                index: 0,
                name: Some("NVIDIA H100 80GB HBM3".into()),
                uuid: Some("GPU-0f2b2a34-8d1c-4e0a-9a57-1b2c3d4e5f60".into()),
                total: Some(Bytes(85_899_345_920)),
                used: Some(Bytes(1_073_741_824)),
                free: Some(Bytes(84_825_604_096)),
                utilization_gpu_percent: Some(87),
                utilization_memory_percent: Some(40),
            },
            DeviceSample {
                index: 1,
                name: None,
                uuid: None,
                total: Some(Bytes(25_769_803_776)),
                used: Some(Bytes(0)),
                free: Some(Bytes(25_769_803_776)),
                utilization_gpu_percent: None,
                utilization_memory_percent: None,
            },
            DeviceSample {
                index: 2,
                name: Some("GRID A100-8C".into()),
                uuid: Some("GPU-vgpu-2".into()),
                total: None,
                used: None,
                free: None,
                utilization_gpu_percent: Some(5),
                utilization_memory_percent: Some(6),
            },
        ]
    );
    let own_command = procs.command(own);
    if procs.host_namespace() {
        assert!(own_command.is_some(), "our own command line is readable");
    }
    let process = |pid, device, used: Option<u64>, command: Option<String>| ProcessSample {
        pid,
        device,
        used: used.map(Bytes),
        command,
    };
    assert_eq!(
        first.processes,
        [
            process(own, 0, Some(536_870_912), own_command.clone()),
            process(GONE_PID, 0, None, None),
            process(GONE_PID + 1, 1, Some(1_048_576), None),
        ]
    );

    let second = sampler.sample().expect("a second sample");
    assert_eq!(second.devices, first.devices);
    assert_eq!(second.processes[..2], first.processes[..2]);
    assert_eq!(second.processes[2].used, Some(Bytes(1_048_576 + 4096)));
}

#[test]
fn no_nvml_library_is_unavailable_not_a_crash() {
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libnvidia-ml.so.1");
    match NvmlSampler::open(
        Some(missing.as_os_str()),
        Box::new(FixedClock(0)),
        ProcView::system(),
    ) {
        Err(SampleError::Unavailable(message)) => {
            assert!(message.contains("libnvidia-ml.so.1"), "{message}");
        }
        Err(other) => panic!("expected Unavailable, got {other}"),
        Ok(_) => panic!("a missing library opened"),
    }
}
