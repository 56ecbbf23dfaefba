//! Read throughput of a memprof recording against a PyTorch snapshot pickle of about the same
//! size, each read from its file the way `memprof analyze` reads it (both through the reader
//! that reads ahead on another thread). Prints the median of
//! a few reads of each, in MB/s, and their ratio.
//!
//! Inputs are generated once under target/bench-data/ (needs python3): the recording by
//! `benches/gen_recording.py`, the pickle by `../shared/tools/gen_snapshot.py`. Their size is
//! `MEMPROF_BENCH_MB` (default 100); `benches/recording_rss.sh` measures peak memory on 500 MB.

use memprof::source::prefetch::{Prefetch, PrefetchReader};
use memprof::source::{recording, torch_snapshot};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Reads of each input; the median is reported.
const RUNS: usize = 5;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-data")
}

/// Runs a generator script writing `path` unless it exists; `None` when it could not.
fn generate(path: &Path, script: &Path, args: &[String]) -> Option<PathBuf> {
    if !path.exists() {
        let status = Command::new("python3")
            .arg(script)
            .arg(path)
            .args(args)
            .status()
            .ok()?;
        if !status.success() {
            return None;
        }
    }
    Some(path.to_path_buf())
}

/// A generated snapshot pickle of at least `mb` MB: steps are added until it is big enough.
fn snapshot_of(mb: u64) -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/gen_snapshot.py");
    let mut steps = 100u64;
    loop {
        let path = data_dir().join(format!("gen_steps{steps}.pickle"));
        generate(&path, &script, &["--steps".into(), steps.to_string()])?;
        let size = std::fs::metadata(&path).ok()?.len();
        if size >= mb * 1_000_000 * 9 / 10 {
            return Some(path);
        }
        // Grow in proportion, with a margin (the pickle's size is close to linear in steps).
        steps = steps * (mb * 1_000_000 + 1) / size.max(1) + 1;
    }
}

/// Median seconds of `RUNS` calls of `read`.
fn median(mut read: impl FnMut() -> bool) -> f64 {
    let mut times: Vec<f64> = (0..RUNS)
        .map(|_| {
            let start = Instant::now();
            assert!(read(), "the input is readable");
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[RUNS / 2]
}

fn main() {
    let mb: u64 = std::env::var("MEMPROF_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    if std::fs::create_dir_all(data_dir()).is_err() {
        eprintln!("target/bench-data cannot be made: skipped");
        return;
    }
    let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/gen_recording.py");
    let recording_path = data_dir().join(format!("gen_{mb}mb.memprof"));
    let (Some(rec), Some(pickle)) = (
        generate(&recording_path, &generator, &[mb.to_string()]),
        snapshot_of(mb),
    ) else {
        eprintln!("python3 or a generator is unavailable: skipped");
        return;
    };
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len()) as f64 / 1e6;
    let (rec_mb, pickle_mb) = (size(&rec), size(&pickle));
    let rec_s = median(|| {
        File::open(&rec).is_ok_and(|f| recording::read_from(PrefetchReader::new(f)).is_ok())
    });
    let pickle_s = median(|| {
        File::open(&pickle).is_ok_and(|f| torch_snapshot::read(Prefetch::new(f)).is_ok())
    });
    let (rec_rate, pickle_rate) = (rec_mb / rec_s, pickle_mb / pickle_s);
    println!(
        "recording {rec_mb:.1} MB: median {rec_s:.3} s, {rec_rate:.0} MB/s ({})",
        rec.display()
    );
    println!(
        "snapshot  {pickle_mb:.1} MB: median {pickle_s:.3} s, {pickle_rate:.0} MB/s ({})",
        pickle.display()
    );
    println!(
        "recording / snapshot throughput: {:.2}",
        rec_rate / pickle_rate
    );
}
