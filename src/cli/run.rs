//! `memprof run [-o OUT.memprof] [--torch] -- CMD...`: runs CMD with the recording shim
//! preloaded, passes its exit code through and prints a short summary of the recording on
//! stderr. `--torch` also puts a Python start-up hook on CMD's `PYTHONPATH` (`torch_hook.rs`)
//! that turns on PyTorch's memory history and dumps a snapshot next to the recording when the
//! program runs out of memory.
//!
//! `--live` is not built yet and is refused.

use super::torch_hook::{snapshot_pattern, snapshots_written, TorchHook};
use super::unbuilt::RunArgs;
use super::Outcome;
use anyhow::{bail, Context};
use memprof_wire::{decode_recording, Kind, Recording};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the recording goes without `-o`.
const DEFAULT_OUT: &str = "memprof-run.memprof";
/// File name of the shim next to the `memprof` binary.
const SHIM_NAME: &str = "libmemprof_shim.so";

pub fn run(args: &RunArgs) -> anyhow::Result<Outcome> {
    if args.live {
        bail!("`memprof run --live` is not built yet in this version; plain `memprof run` is");
    }
    let shim = find_shim()?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    // Absolute, so a command that changes directory still records here.
    let out =
        std::path::absolute(&out).with_context(|| format!("cannot resolve {}", out.display()))?;
    // A stale recording must not be taken for this run's when CMD makes no CUDA call.
    match std::fs::remove_file(&out) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot replace {}", out.display())),
    }
    let Some((program, rest)) = args.command.split_first() else {
        bail!("no command to run");
    };
    let mut preload = OsString::from(shim.as_os_str());
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(" ");
        preload.push(existing);
    }
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LD_PRELOAD", preload)
        .env("MEMPROF_OUT", &out);
    let hook = if args.torch {
        // Snapshots of an earlier run must not be taken for this one's.
        for stale in snapshots_written(&out) {
            std::fs::remove_file(&stale)
                .with_context(|| format!("cannot replace {}", stale.display()))?;
        }
        let hook = TorchHook::create()?;
        command
            .env(
                "PYTHONPATH",
                hook.python_path(std::env::var_os("PYTHONPATH")),
            )
            .env("MEMPROF_TORCH_SNAPSHOT", snapshot_pattern(&out));
        Some(hook)
    } else {
        None
    };
    let status = command
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    drop(hook);
    eprintln!("memprof: {}", summary(&out));
    if args.torch {
        let written = snapshots_written(&out);
        if written.is_empty() {
            eprintln!("memprof: no PyTorch out-of-memory snapshot was written");
        }
        for snapshot in written {
            eprintln!(
                "memprof: PyTorch snapshot at out-of-memory: {}",
                snapshot.display()
            );
        }
    }
    let code = match status.code() {
        Some(code) => code,
        None => {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        }
    };
    Ok(if code == 0 {
        Outcome::Ok
    } else {
        Outcome::Exit(code.clamp(0, 255) as u8)
    })
}

/// `MEMPROF_SHIM`, else the shim next to this binary.
fn find_shim() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MEMPROF_SHIM") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("MEMPROF_SHIM names {}, which is not a file", path.display());
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("cannot find the memprof binary")?;
    let path = exe.with_file_name(SHIM_NAME);
    if !path.is_file() {
        bail!(
            "the recording shim {} is missing; build it (`cargo build -p memprof-shim`) or set \
             MEMPROF_SHIM",
            path.display()
        );
    }
    Ok(path)
}

/// One line about the recording.
fn summary(path: &Path) -> String {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(_) => {
            return format!(
                "no recording written to {} (no CUDA memory calls seen)",
                path.display()
            )
        }
    };
    match decode_recording(&bytes) {
        Ok(recording) => {
            let s = Summary::of(&recording);
            let mut dropped = match recording.dropped {
                Some(0) => String::new(),
                Some(n) => format!(", {n} events dropped"),
                None => ", recording cut short".to_string(),
            };
            if recording.delayed > 0 {
                dropped.push_str(&format!(
                    ", {} events delayed (the program waited for the writer)",
                    recording.delayed
                ));
            }
            format!(
                "recorded {} calls to {} ({} allocations, {} frees, {} out-of-memory); peak live \
                 device memory {} bytes{dropped}",
                recording.records.len(),
                path.display(),
                s.allocations,
                s.frees,
                s.ooms,
                s.peak
            )
        }
        Err(e) => format!("cannot read the recording {}: {e}", path.display()),
    }
}

/// Counts and peak of live driver allocations (device allocations and physical VMM memory;
/// managed memory and reserved address space are not device memory and are left out of the peak).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub allocations: u64,
    pub frees: u64,
    pub ooms: u64,
    pub peak: u64,
}

impl Summary {
    pub fn of(recording: &Recording) -> Summary {
        let mut s = Summary::default();
        let mut live: HashMap<(bool, u64), u64> = HashMap::new();
        let mut current = 0u64;
        for r in &recording.records {
            if r.is_oom() {
                s.ooms += 1;
            }
            if r.result != 0 {
                continue;
            }
            match r.kind {
                Kind::AllocManaged => s.allocations += 1,
                Kind::Alloc | Kind::AllocAsync | Kind::AllocPitch | Kind::AllocFromPoolAsync => {
                    s.allocations += 1;
                    current += r.size;
                    live.insert((false, r.ptr), r.size);
                }
                Kind::VmmCreate => {
                    s.allocations += 1;
                    current += r.size;
                    live.insert((true, r.aux), r.size);
                }
                Kind::Free | Kind::FreeAsync => {
                    s.frees += 1;
                    current -= live.remove(&(false, r.ptr)).unwrap_or(0);
                }
                Kind::VmmRelease => {
                    s.frees += 1;
                    current -= live.remove(&(true, r.aux)).unwrap_or(0);
                }
                _ => {}
            }
            s.peak = s.peak.max(current);
        }
        s
    }
}
