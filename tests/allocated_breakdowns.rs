//! Scratch check of the block sizes against the account's allocated bytes.

use crate::util::{fixture, real_fixtures};
use memprof::account::{self, MomentKind};
use memprof::analysis::categories::CategoryRules;
use memprof::diagnose::Origin;
use memprof::model::Replay;
use memprof::source::torch_snapshot;
use std::path::PathBuf;

fn inputs() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![fixture("snapshots")];
    if let Some(real) = real_fixtures() {
        dirs.push(real.join("more"));
        dirs.push(real);
    }
    for dir in dirs {
        for e in std::fs::read_dir(&dir).expect("readable").flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pickle" || x == "pkl") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn scratch_block_sums() {
    for path in inputs() {
        let snapshot = torch_snapshot::read(std::fs::File::open(&path).expect("opens"))
            .expect("parses")
            .snapshot;
        let rules = CategoryRules::default();
        let input = account::build(
            &snapshot,
            &account::Options {
                top: 1,
                only: None,
                rules: &rules,
                origin: Origin::TorchSnapshot,
                capacity: None,
            },
        );
        for d in &input.devices {
            let device = d.analysis.device;
            let entries = snapshot.timeline.device(device as usize);
            for m in &d.account.moments {
                if m.kind == MomentKind::Dump {
                    continue;
                }
                let Some(allocated) = m.figures.allocated_bytes else {
                    println!(
                        "{} dev {device} {:?} at {:?}: unknown",
                        path.display(),
                        m.kind,
                        m.entry
                    );
                    continue;
                };
                let blocks = &d.analysis.replayed.as_ref().expect("replayed").blocks;
                let mut replay = Replay::new(entries, snapshot.device_segments(device));
                if let Some(e) = m.entry {
                    replay.run_through(e);
                }
                let sum: u64 = replay
                    .live()
                    .iter()
                    .filter_map(|(a, l)| blocks.allocated(a, l, m.entry))
                    .sum();
                println!(
                    "{} dev {device} {:?} at {:?}: allocated {allocated} blocks {sum} requested {} {}",
                    path.display(),
                    m.kind,
                    m.entry,
                    replay.live().total(),
                    if sum == allocated { "OK" } else { "MISMATCH" }
                );
            }
        }
    }
}
