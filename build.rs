//! Builds the recording shim (`crates/memprof-shim`, `libmemprof_shim.so`) so that the `memprof`
//! binary carries it (`src/cli/shim_file.rs` writes it out on first use of `memprof run`).
//!
//! Why embed it: `cargo install --path .` and the Python wheel install one file, the binary;
//! a shim that must be copied beside it by hand is a step users miss, and an install step run
//! once goes stale when the binary is upgraded. A binary that carries its own shim always
//! preloads the shim it was built with. Cargo's artifact dependencies (which would let the
//! binary depend on the cdylib directly) are unstable, so this script runs a nested `cargo
//! build -p memprof-shim`:
//! - with its own `--target-dir` under `OUT_DIR`, so it never waits on the lock of the build
//!   that runs this script;
//! - for the same target and profile (`release` for optimized builds), with the same
//!   `CARGO_ENCODED_RUSTFLAGS` (which carry `.cargo/config.toml`'s `-C force-frame-pointers=yes`
//!   on x86_64; added here if missing: the shim's stack walk needs frame pointers);
//! - with `--locked` / `--offline` / `--frozen` when the build that runs this script was given
//!   them (read from its command line) or `CARGO_NET_OFFLINE` says so;
//! - without `RUSTC_WORKSPACE_WRAPPER` (clippy runs build scripts: the shim is linted by the
//!   outer clippy run, not a second time here), without debug info and incremental state (the
//!   shim's stack walk needs frame pointers, not DWARF; the binary stays small: 0.8 MB of shim
//!   instead of 8 MB in a dev build).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    for path in [
        "crates/memprof-shim",
        "crates/memprof-wire",
        "Cargo.lock",
        ".cargo/config.toml",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-env-changed=CARGO_NET_OFFLINE");

    let target = env::var("TARGET").expect("TARGET");
    let release = env::var("PROFILE").is_ok_and(|p| p == "release");
    let profile = if release { "release" } else { "dev" };
    let target_dir = out_dir.join("shim-target");

    let mut flags: Vec<String> = env::var("CARGO_ENCODED_RUSTFLAGS")
        .unwrap_or_default()
        .split('\x1f')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect();
    if target.starts_with("x86_64") && !flags.iter().any(|f| f.contains("force-frame-pointers")) {
        flags.extend(["-C".into(), "force-frame-pointers=yes".into()]);
    }

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&manifest)
        .args(["build", "--quiet", "-p", "memprof-shim", "--lib"])
        .args(["--profile", profile, "--target", &target, "--target-dir"])
        .arg(&target_dir)
        .args(["--config", &format!("profile.{profile}.debug=false")])
        .args([
            "--config",
            &format!("profile.{profile}.strip=\"debuginfo\""),
        ])
        .args(["--config", &format!("profile.{profile}.incremental=false")])
        // The shim runs inside the profiled program: its hooks stay fast in debug builds too.
        // Set here, not as a profile override in Cargo.toml, which `cargo install` (building
        // the memprof package alone) warns matches no package.
        .args(["--config", "profile.dev.opt-level=2"])
        .args(outer_flags())
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR");
    let status = cmd.status().expect("running cargo to build the shim");
    assert!(
        status.success(),
        "building the recording shim failed: `cargo build -p memprof-shim` ({status})"
    );
    let dir = if release { "release" } else { "debug" };
    let built = target_dir
        .join(&target)
        .join(dir)
        .join("libmemprof_shim.so");
    assert!(built.is_file(), "{} was not built", built.display());
    let embedded = out_dir.join("libmemprof_shim.so");
    std::fs::copy(&built, &embedded).expect("copying the shim into OUT_DIR");
    let bytes = std::fs::read(&embedded).expect("reading the built shim");
    println!(
        "cargo:rustc-env=MEMPROF_EMBEDDED_SHIM={}",
        embedded.display()
    );
    println!(
        "cargo:rustc-env=MEMPROF_EMBEDDED_SHIM_HASH={:016x}",
        fnv1a(&bytes)
    );
}

/// The 64-bit FNV-1a hash of `bytes`: names the shim's file in the cache, so that binaries of
/// different builds never write over each other's (not a security measure: the cache folder is
/// the user's own, mode 0700, and the file is compared byte for byte before use).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `--locked`, `--offline` and `--frozen` where the cargo that runs this script was given them
/// (its command line, as `/proc` shows it: cargo does not pass them to build scripts), and
/// `--offline` where `CARGO_NET_OFFLINE` is true.
fn outer_flags() -> Vec<&'static str> {
    let parent = std::os::unix::process::parent_id();
    let cmdline = std::fs::read(Path::new("/proc").join(parent.to_string()).join("cmdline"))
        .unwrap_or_default();
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let mut out: Vec<&'static str> = ["--locked", "--offline", "--frozen"]
        .into_iter()
        .filter(|flag| args.contains(&flag.as_bytes()))
        .collect();
    if env::var("CARGO_NET_OFFLINE").is_ok_and(|v| v == "true") && !out.contains(&"--offline") {
        out.push("--offline");
    }
    out
}
