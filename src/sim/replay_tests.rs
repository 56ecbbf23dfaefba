//! Replay tests: hand-made traces for each replay rule, and validation on the real
//! snapshots in `../shared/fixtures/real/` when present.

use super::*;
use crate::source::torch_snapshot;
use std::path::PathBuf;

fn real_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/real");
    dir.is_dir().then_some(dir)
}

fn validate_file(path: &std::path::Path) -> Vec<Prepared> {
    let file = std::fs::File::open(path).expect("opens");
    let parsed = torch_snapshot::read(std::io::BufReader::new(file)).expect("parses");
    let snapshot = parsed.snapshot;
    let config = recorded_config(&snapshot).expect("recorded settings parse");
    DeviceTrace::all(&snapshot)
        .iter()
        .map(|t| prepare(t, &config, None))
        .collect()
}

#[test]
fn real_snapshots_print() {
    let Some(dir) = real_dir() else { return };
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("lists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    names.sort();
    for path in names {
        for p in validate_file(&path) {
            eprintln!(
                "{} dev {}: alloc {:?} seg_alloc {:?} seg_free {:?} peak rec {} sim {} issues {:?} {:?} first {:?}",
                path.display(),
                p.device,
                p.validation.alloc,
                p.validation.segment_alloc,
                p.validation.segment_free,
                p.recorded_peak_reserved_bytes,
                p.recorded_run.peak_reserved_bytes,
                p.issues.first(),
                p.recorded_run.issues.first(),
                p.validation.first_mismatch
            );
        }
    }
}
