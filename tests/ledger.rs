//! The whole-process ledger without a GPU: `memprof run` records a Python program playing PyTorch
//! (`kernels/workloads/torch_ledger.py`: its segments through the fake driver, a CUDA graph's
//! private pool among them) that calls a library playing NCCL (`kernels/fake_nccl`: device
//! buffers and pinned host memory) and pins host memory as PyTorch's host allocator does, while
//! the fake NVML reports the process's driver total plus a CUDA context; `analyze` must give the
//! ledger exactly, byte for byte (PyTorch's host allocator apart from the libraries' pinned
//! memory, by the snapshot's `host_segments`), with the snapshot the program wrote found by itself
//! or given, and refuse a snapshot of another process; and report the host allocator from the
//! snapshot alone.

use crate::nvml_fake::fake_nvml;
use crate::shim_preload::{check, runtime_dir, shim};
use crate::util::{have, memprof, repo, stderr, stdout};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;
/// What the fake NVML adds to the driver's total: the CUDA context.
const CONTEXT: u64 = 312 * MIB;

/// Compiles `src` (under kernels/) into `out` with `flags`.
fn cc(src: &str, out: &Path, flags: &[&str]) {
    let built = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-shared", "-fPIC"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(repo().join("kernels").join(src))
        .output()
        .expect("cc runs");
    check(&format!("cc {src}"), &built);
}

fn ledger_of(doc: &Value) -> &Value {
    &doc["inputs"][0]["ledger"]
}

#[test]
fn the_ledger_of_a_pytorch_and_nccl_process_is_exact() {
    if !have("python3") || !have("cc") {
        return;
    }
    let dir = fake_nvml("ledger");
    cc(
        "fake_cuda/fake_cuda.c",
        &dir.join("libcuda.so.1"),
        &["-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1", "-lpthread"],
    );
    let lib = format!("-L{}", dir.display());
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    cc(
        "fake_nccl/fake_nccl.c",
        &dir.join("libfakenccl.so"),
        &["-fno-omit-frame-pointer", &lib, "-l:libcuda.so.1", &rpath],
    );
    let scenario = dir.join("nvml.txt");
    std::fs::write(
        &scenario,
        "device 85899345920 1000 85899344920 0 0 GPU-fake Fake CUDA Device\n",
    )
    .expect("scenario");
    let recording = dir.join("run.memprof");
    let other = dir.join("other.pickle");
    let run = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .arg("run")
        .arg("-o")
        .arg(&recording)
        .arg("--")
        .arg("python3")
        .arg(repo().join("kernels/workloads/torch_ledger.py"))
        .arg(&*dir)
        .arg(&scenario)
        .arg(dir.join("run.oom-%p.pickle"))
        .arg(&other)
        .arg(CONTEXT.to_string())
        .env("MEMPROF_SHIM", shim())
        .env("LD_LIBRARY_PATH", &*dir)
        .env("FAKE_NVML_SCENARIO", &scenario)
        .env("XDG_RUNTIME_DIR", runtime_dir(&dir))
        .env_remove("MEMPROF_OUT")
        .env_remove("LD_PRELOAD")
        .output()
        .expect("memprof runs");
    check("memprof run python3 torch_ledger.py", &run);
    let pid = stdout(&run).trim().to_string();
    let snapshot = dir.join(format!("run.oom-{pid}.pickle"));
    let shown = recording.display().to_string();

    let nccl = |bytes: u64, count: u64| {
        json!([{"library": "libfakenccl.so", "bytes": bytes, "peak_bytes": 16 * MIB,
                "count": count}])
    };
    let pinned = json!([{"library": "libfakenccl.so", "bytes": 3 * MIB, "peak_bytes": 3 * MIB}]);
    let pools = |default: u64| {
        json!([
            {"pool": "default", "pool_id": [0, 0], "bytes": default},
            {"pool": "private", "pool_id": [1, 0], "bytes": 4 * MIB},
        ])
    };
    // Peak: 2 + 20 + 4 + 6 MiB of segments and 2 x 8 MiB of NCCL buffers; end: the 6 MiB segment
    // and one NCCL buffer freed. PyTorch's host allocator pinned 2 + 1 + 4 MiB by the peak and
    // gave the 4 MiB back before the end.
    let torch_host = |bytes: u64| json!({"bytes": bytes, "peak_bytes": 7 * MIB});
    let want = json!({
        "snapshot": snapshot.display().to_string(),
        "devices": [{
            "device": 0,
            "at_peak": {
                "device_bytes": 48 * MIB, "nvml_bytes": 48 * MIB + CONTEXT,
                "context_bytes": CONTEXT,
                "torch": {"reserved_bytes": 32 * MIB, "pools": pools(28 * MIB)},
                "outside_torch": nccl(16 * MIB, 2), "pinned_host": pinned,
                "torch_pinned_host": torch_host(7 * MIB),
                "managed_bytes": 0, "unattributed_bytes": 0,
            },
            "at_end": {
                "device_bytes": 34 * MIB, "nvml_bytes": 34 * MIB + CONTEXT,
                "context_bytes": CONTEXT,
                "torch": {"reserved_bytes": 26 * MIB, "pools": pools(22 * MIB)},
                "outside_torch": nccl(8 * MIB, 1), "pinned_host": pinned,
                "torch_pinned_host": torch_host(3 * MIB),
                "managed_bytes": 0, "unattributed_bytes": 0,
            },
        }],
    });

    // The snapshot `run --torch` would have written beside the recording is found by itself.
    let found = memprof(&["analyze", "--json", &shown]);
    assert!(found.status.success(), "{}", stderr(&found));
    let doc: Value = serde_json::from_str(&stdout(&found)).expect("JSON");
    assert_eq!(ledger_of(&doc), &want, "{}", ledger_of(&doc));

    // Given beside it, the same join.
    let given = memprof(&["analyze", "--json", &shown, &snapshot.display().to_string()]);
    assert!(given.status.success(), "{}", stderr(&given));
    let doc: Value = serde_json::from_str(&stdout(&given)).expect("JSON");
    assert_eq!(ledger_of(&doc), &want);

    let text = memprof(&["analyze", &shown]);
    let text = stdout(&text);
    assert!(text.contains("ledger of device 0 (joined with"), "{text}");
    assert!(text.contains("pinned host: libfakenccl.so"), "{text}");
    assert!(
        text.contains("pinned host: PyTorch host allocator"),
        "{text}"
    );

    // The snapshot alone: its host allocator at the dump and at its peak.
    let alone = memprof(&["analyze", "--json", &snapshot.display().to_string()]);
    assert!(alone.status.success(), "{}", stderr(&alone));
    let doc: Value = serde_json::from_str(&stdout(&alone)).expect("JSON");
    assert_eq!(
        doc["inputs"][0]["pinned_host_allocator"],
        json!({
            "segments": 2, "reserved_bytes": 3 * MIB, "allocated_bytes": 2 * MIB,
            "trace_entries": 11,
            "peak_reserved_bytes": 7 * MIB, "peak_reserved_time_us": 220,
            "peak_allocated_bytes": 7 * MIB, "peak_allocated_time_us": 221,
        })
    );

    // A snapshot of another process: refused with one line, exit 2.
    let refused = memprof(&["analyze", &shown, &other.display().to_string()]);
    assert_eq!(refused.status.code(), Some(2));
    let err = stderr(&refused);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("not of the same process"), "{err}");
}
