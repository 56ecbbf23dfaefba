//! Replay tests: validation on the real snapshots in `../shared/fixtures/real/` (when
//! present) and on the committed synthetic fixtures, and traces that contradict themselves.

use super::*;
use crate::model::{BlockState, PoolKind, StreamIndex};
use crate::source::torch_snapshot;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn pickles(dir: &Path) -> Vec<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    names.retain(|p| p.extension().is_some_and(|x| x == "pickle"));
    names.sort();
    names
}

fn validate_file(path: &Path) -> Vec<Prepared> {
    let file = std::fs::File::open(path).expect("opens");
    let parsed = torch_snapshot::read(std::io::BufReader::new(file)).expect("parses");
    let snapshot = parsed.snapshot;
    let (config, warning) = recorded_config(&snapshot);
    assert_eq!(warning, None);
    DeviceTrace::all(&snapshot)
        .iter()
        .map(|t| prepare(t, &config, None))
        .collect()
}

fn assert_reproduced(name: &str, p: &Prepared) {
    let v = &p.validation;
    assert!(v.all_match(), "{name} device {}: {:?}", p.device, v);
    for t in [
        v.alloc,
        v.segment_alloc,
        v.segment_free,
        v.segment_map,
        v.segment_unmap,
        v.oom,
    ] {
        assert_eq!(t.events, t.matches, "{name}");
    }
    assert_eq!(
        p.recorded_run.peak_reserved_bytes, p.recorded_peak_reserved_bytes,
        "{name}: peak reserved"
    );
    assert!(p.issues.is_empty(), "{name}: {:?}", p.issues);
    assert!(
        p.recorded_run.issues.is_empty(),
        "{name}: {:?}",
        p.recorded_run.issues
    );
}

#[test]
fn every_decision_of_the_real_snapshots_is_reproduced() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/real");
    let files = pickles(&dir);
    if files.is_empty() {
        eprintln!("../shared/fixtures/real is absent here: real-snapshot validation skipped");
    }
    for path in files {
        let name = path.display().to_string();
        for p in validate_file(&path) {
            assert!(p.validation.alloc.events > 0, "{name}");
            assert_reproduced(&name, &p);
        }
    }
}

#[test]
fn synthetic_fixtures_replay_retries_ooms_pending_and_expandable() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/snapshots");
    for path in pickles(&dir) {
        let name = path.display().to_string();
        for p in validate_file(&path) {
            if name.ends_with("private_pool.pickle") {
                // Entries do not say which private pool they used (rule 10).
                let m = p.validation.first_mismatch.as_ref().expect("a mismatch");
                assert!(m.reason.contains("private-pool"), "{}", m.reason);
                continue;
            }
            assert_reproduced(&name, &p);
            if name.ends_with("oom.pickle") {
                assert_eq!(p.capacity_source, CapacitySource::Inferred);
                assert_eq!(
                    p.validation.oom,
                    Tally {
                        events: 1,
                        matches: 1
                    }
                );
                assert!(p.recorded_run.oom.is_some());
            }
        }
    }
}

fn entry(action: Action, addr: u64, size: u64) -> TraceEntry {
    TraceEntry::new(action, Some(addr), size, StreamIndex(0))
}

#[test]
fn contradictions_are_issues_with_the_entry_index() {
    let entries = [
        entry(Action::SegmentAlloc, 0x1000_0000, 2 * MIB),
        entry(Action::Alloc, 0x1000_0000, 100),
        entry(Action::FreeRequested, 0x1000_0000, 100),
        entry(Action::FreeCompleted, 0x1000_0000, 100),
        entry(Action::FreeRequested, 0x1000_0000, 100),
        entry(Action::FreeCompleted, 0x1000_0000, 100),
        entry(Action::FreeRequested, 0x5000, 8),
        entry(Action::FreeCompleted, 0x5000, 8),
    ];
    let segment = Segment {
        device: 0,
        address: 0x1000_0000,
        total_size: 2 * MIB,
        stream: 0,
        pool: PoolKind::Small,
        pool_id: (0, 0),
        is_expandable: false,
        stack: None,
        blocks: vec![crate::model::Block {
            address: 0x1000_0000,
            size: 2 * MIB,
            requested_size: 100,
            state: BlockState::Inactive,
            stack: None,
        }],
    };
    let trace = DeviceTrace {
        device: 0,
        entries: &entries,
        streams: vec![0],
        segments: vec![segment],
    };
    let p = prepare(&trace, &AllocatorConfig::default(), None);
    let all: Vec<usize> = p
        .issues
        .iter()
        .chain(&p.recorded_run.issues)
        .map(|i| i.entry_index)
        .collect();
    assert!(!all.is_empty());
    assert!(all.iter().all(|&i| i < entries.len()));
    assert_eq!(
        p.validation.alloc,
        Tally {
            events: 1,
            matches: 1
        }
    );
}

#[test]
fn what_if_replays_the_same_requests() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/snapshots");
    let prepared = validate_file(&dir.join("v2_11_full.pickle"));
    let p = &prepared[0];
    let same = run(p, &AllocatorConfig::default().clone(), p.capacity);
    assert!(same.peak_reserved_bytes > 0);
    let expandable = run(
        p,
        &AllocatorConfig::parse("expandable_segments:True").expect("valid"),
        None,
    );
    assert!(expandable.peak_reserved_bytes <= same.peak_reserved_bytes + 20 * MIB);
    // Capacity below the peak: the model runs out of memory at some entry.
    let tight = run(
        p,
        &AllocatorConfig::default(),
        Some(p.recorded_peak_reserved_bytes / 2),
    );
    assert!(tight.oom.is_some());
}
