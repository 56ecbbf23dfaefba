//! Parse and analyze throughput on real snapshots and on generated ones, and the purpose-built
//! decoder against `serde-pickle` on the same bytes (the measurement behind the choice of
//! decoder; see `src/source/pickle/mod.rs`).
//!
//! Generated inputs come from `../shared/tools/gen_snapshot.py` (needs python3); real ones from
//! `../shared/fixtures/real/`. Missing inputs are skipped with a note. `many_device_lists` is
//! the shape of a 200 KB pickle that took 21 s: 300k device trace lists, one list object
//! holding one OOM entry, written once and referenced by every device. `many_ooms` is the shape
//! of a 576 KB snapshot whose diagnosis took 5.6 s: one trace of 16,000 `oom` entries, each
//! replayed under every setting the diagnosis tries; its time per entry stays flat as the
//! trace doubles.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use memprof::analysis::analyze_snapshot;
use memprof::diagnose::{classify_ooms, Origin};
use memprof::source::pickle::{decode, KeepAll};
use memprof::source::torch_snapshot;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../tests/scale_input.rs"]
mod scale_input;
use scale_input::{many_ooms, shared_oom_lists};

fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared")
}

/// A generated snapshot of `steps` steps, made once and kept under target/.
fn generated(steps: u32) -> Option<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data");
    std::fs::create_dir_all(&dir).ok()?;
    let path = dir.join(format!("gen_steps{steps}.pickle"));
    if !path.exists() {
        let status = Command::new("python3")
            .arg(shared().join("tools/gen_snapshot.py"))
            .arg(&path)
            .args(["--steps", &steps.to_string()])
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
    }
    Some((format!("gen_steps{steps}"), std::fs::read(&path).ok()?))
}

fn inputs() -> Vec<(String, Vec<u8>)> {
    let mut inputs = Vec::new();
    if let Ok(dir) = std::fs::read_dir(shared().join("fixtures/real")) {
        let mut paths: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "pickle"))
            .collect();
        paths.sort();
        for p in paths {
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let short = name.split("__").next().unwrap_or(&name).to_string();
            if let Ok(bytes) = std::fs::read(&p) {
                inputs.push((format!("real_{short}"), bytes));
            }
        }
    } else {
        eprintln!("../shared/fixtures/real is absent: real snapshots skipped");
    }
    match generated(100) {
        Some(g) => inputs.push(g),
        None => eprintln!("python3 or gen_snapshot.py unavailable: generated snapshot skipped"),
    }
    inputs
}

fn parse(c: &mut Criterion) {
    let inputs = inputs();
    let mut group = c.benchmark_group("parse");
    group.sample_size(10);
    for (name, bytes) in &inputs {
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("memprof_decode", name),
            bytes,
            |b, bytes| b.iter(|| decode(&bytes[..], &mut KeepAll).map(|(doc, _)| doc).is_ok()),
        );
        group.bench_with_input(
            BenchmarkId::new("serde_pickle_value", name),
            bytes,
            |b, bytes| {
                b.iter(|| {
                    serde_pickle::value_from_slice(bytes, serde_pickle::DeOptions::new()).is_ok()
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("snapshot_read", name),
            bytes,
            |b, bytes| b.iter(|| torch_snapshot::read(&bytes[..]).is_ok()),
        );
    }
    group.finish();

    let mut group = c.benchmark_group("analyze");
    group.sample_size(10);
    for (name, bytes) in &inputs {
        let Ok(parsed) = torch_snapshot::read(&bytes[..]) else {
            continue;
        };
        let entries: usize = (0..parsed.snapshot.timeline.device_count())
            .map(|d| parsed.snapshot.timeline.device(d).len())
            .sum();
        group.throughput(Throughput::Elements(entries.max(1) as u64));
        group.bench_with_input(
            BenchmarkId::new("all_devices", name),
            &parsed,
            |b, parsed| b.iter(|| analyze_snapshot(&parsed.snapshot, 10, None).len()),
        );
    }
    group.finish();
}

/// What `analyze` does with a snapshot: read, analyze every device, classify every OOM.
fn analyze_classified(bytes: &[u8]) -> usize {
    let Ok(parsed) = torch_snapshot::read(bytes) else {
        return 0;
    };
    let snapshot = &parsed.snapshot;
    let devices = analyze_snapshot(snapshot, 10, None);
    classify_ooms(snapshot, Origin::TorchSnapshot, devices)
        .iter()
        .filter(|d| d.oom.as_ref().is_some_and(|o| o.diagnosis.is_some()))
        .count()
}

fn many_device_lists(c: &mut Criterion) {
    const LISTS: usize = 300_000;
    let Ok(bytes) = shared_oom_lists(LISTS, 1 << 30) else {
        eprintln!("the many-lists pickle could not be written: skipped");
        return;
    };
    assert_eq!(
        analyze_classified(&bytes),
        LISTS,
        "every device's OOM is classified"
    );
    let mut group = c.benchmark_group("many_device_lists");
    group.sample_size(10);
    group.throughput(Throughput::Elements(LISTS as u64));
    group.bench_with_input(
        BenchmarkId::new("read_analyze_classify", LISTS),
        &bytes,
        |b, bytes| b.iter(|| analyze_classified(bytes)),
    );
    group.finish();
}

/// What `diagnose` does with a snapshot of one device: read, replay, and the diagnosis of its
/// last OOM with the remedies' replays.
fn diagnose_one(bytes: &[u8]) -> usize {
    use memprof::analysis::version::VersionRange;
    use memprof::diagnose::remedies::Recorded;
    use memprof::diagnose::{diagnose_device, Depth};
    use memprof::sim::replay::{self, DeviceTrace};
    let Ok(parsed) = torch_snapshot::read(bytes) else {
        return 0;
    };
    let snapshot = &parsed.snapshot;
    let (config, _) = replay::recorded_config(snapshot);
    let recorded = Recorded {
        config: &config,
        conf: snapshot.alloc_conf(),
        version: VersionRange::default(),
    };
    DeviceTrace::all(snapshot)
        .iter()
        .filter_map(|trace| {
            let prepared = replay::prepare(trace, &config, None);
            diagnose_device(snapshot, &prepared, &recorded, None, Depth::WithRemedies)
        })
        .count()
}

fn many_ooms_in_one_trace(c: &mut Criterion) {
    let mut group = c.benchmark_group("many_ooms");
    group.sample_size(10);
    for ooms in [4_000, 8_000, 16_000] {
        let Ok(bytes) = many_ooms(ooms, 1 << 30) else {
            eprintln!("the many-OOMs pickle could not be written: skipped");
            return;
        };
        assert_eq!(diagnose_one(&bytes), 1, "the last OOM is diagnosed");
        group.throughput(Throughput::Elements(ooms as u64));
        group.bench_with_input(
            BenchmarkId::new("read_diagnose", ooms),
            &bytes,
            |b, bytes| b.iter(|| diagnose_one(bytes)),
        );
    }
    group.finish();
}

criterion_group!(benches, parse, many_device_lists, many_ooms_in_one_trace);
criterion_main!(benches);
