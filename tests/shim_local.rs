//! A driver loaded in a local scope: `kernels/workloads/local_driver.c`, a library linked against
//! the fake `libcuda.so.1`, is loaded with `dlopen(RTLD_LOCAL)` by a C program
//! (`load_local.c`) and by Python's `ctypes`, as extension modules are. Its driver calls bind to
//! the shim's exports, whose real driver is not in the global scope. Under `memprof run` every
//! call must succeed with the results it has without the shim, and be recorded.

use crate::shim_preload::{cc_with_driver, check, kernels, runtime_dir, shim};
use crate::util::{have, repo};
use memprof_wire::{decode_recording, Kind, FLAG_LOOKED_UP};
use std::path::Path;
use std::process::{Command, Output};

/// Runs `program` (with `args`) in `dir`, under `memprof run -o local.memprof` or bare.
fn run(dir: &Path, program: &str, args: &[&Path], recorded: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memprof"));
    if recorded {
        cmd.args(["run", "-o", "local.memprof", "--", program])
            .env("MEMPROF_SHIM", shim());
    } else {
        cmd = Command::new(program);
    }
    cmd.args(args)
        .current_dir(dir)
        .env("XDG_RUNTIME_DIR", runtime_dir(dir))
        .env_remove("MEMPROF_OUT")
        .env_remove("LD_PRELOAD")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("runs")
}

/// The lines the library printed about its calls.
fn calls(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Runs `program` bare and recorded; both succeed with the same output, and the recording holds
/// the four allocation calls (one through the `cuGetProcAddress_v2` pointer).
fn same_with_and_without_the_shim(dir: &Path, program: &str, args: &[&Path]) {
    let bare = run(dir, program, args, false);
    check(&format!("{program} without the shim"), &bare);
    let recorded = run(dir, program, args, true);
    check(&format!("memprof run {program}"), &recorded);
    let lines = calls(&bare);
    assert_eq!(lines.len(), 7, "{lines:?}");
    assert_eq!(lines.last().map(String::as_str), Some("result 0"));
    assert_eq!(calls(&recorded), lines, "the shim changed a result");

    let path = dir.join("local.memprof");
    let recording = decode_recording(&std::fs::read(&path).expect("recorded")).expect("decodes");
    let seen: Vec<(Kind, u64, bool)> = recording
        .records
        .iter()
        .map(|r| (r.kind, r.size, r.flags & FLAG_LOOKED_UP != 0))
        .collect();
    assert_eq!(
        seen,
        [
            (Kind::Alloc, 4096, false),
            (Kind::MemGetInfo, 1 << 30, false),
            (Kind::Alloc, 8192, true),
            (Kind::Free, 0, false),
            (Kind::Free, 0, false),
        ]
    );
    // The value each call line ends with: the pointer, or the free memory.
    let value = |i: usize| {
        lines[i]
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert_eq!(Some(recording.records[1].aux), value(1), "free memory");
    let made: Vec<Option<u64>> = [0, 2, 3, 4]
        .iter()
        .map(|&i| Some(recording.records[i].ptr))
        .collect();
    let printed: Vec<Option<u64>> = [0, 3, 4, 5].iter().map(|&i| value(i)).collect();
    assert_eq!(made, printed, "the allocations and frees the library made");
    std::fs::remove_file(&path).expect("removed");
}

/// The fake driver, the library and the C loader in a fresh directory.
fn build(name: &str) -> crate::util::Scratch {
    let dir = kernels(name);
    let src = repo().join("kernels/workloads");
    let lib = dir.join("liblocal_driver.so");
    cc_with_driver(
        &dir,
        &["-O1", "-shared", "-fPIC"],
        &src.join("local_driver.c"),
        &lib,
        &[],
    );
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(dir.join("load_local"))
        .arg(src.join("load_local.c"))
        .arg("-ldl")
        .output()
        .expect("cc runs");
    check("cc load_local.c", &out);
    dir
}

#[test]
fn a_driver_in_a_local_scope_works_and_is_recorded_from_c() {
    let dir = build("local-c");
    let loader = dir.join("load_local");
    let loader = loader.to_str().expect("utf-8 path");
    same_with_and_without_the_shim(&dir, loader, &[&dir.join("liblocal_driver.so")]);
}

#[test]
fn a_driver_in_a_local_scope_works_and_is_recorded_from_python_ctypes() {
    if !have("python3") {
        return;
    }
    let dir = build("local-py");
    let script = dir.join("load_local.py");
    // ctypes.CDLL loads with RTLD_LOCAL unless told otherwise.
    std::fs::write(
        &script,
        "import ctypes, sys\n\
         lib = ctypes.CDLL(sys.argv[1])\n\
         result = lib.local_calls()\n\
         print(f'result {result}')\n\
         sys.exit(0 if result == 0 else 1)\n",
    )
    .expect("written");
    same_with_and_without_the_shim(&dir, "python3", &[&script, &dir.join("liblocal_driver.so")]);
}
