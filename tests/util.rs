//! Helpers: paths of fixtures and a runner for the built binary.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(rel: &str) -> PathBuf {
    repo().join("fixtures").join(rel)
}

/// `../shared/fixtures/real`, when this checkout has it.
pub fn real_fixtures() -> Option<PathBuf> {
    let dir = repo().join("../shared/fixtures/real");
    dir.is_dir().then_some(dir)
}

pub fn memprof(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(args)
        .output()
        .expect("the memprof binary runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `memprof analyze --json FILE...`, asserts success, returns the document.
pub fn analyze_json(files: &[PathBuf]) -> Value {
    let mut args = vec!["analyze".to_string(), "--json".to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = memprof(&refs);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

/// The device entries of the first input of an analyze document.
pub fn devices(doc: &Value) -> &Vec<Value> {
    doc["inputs"][0]["devices"].as_array().expect("devices is a list")
}
