//! The breakdowns of live memory add up to the account's figure: on every real snapshot and
//! every snapshot fixture, at each moment of the account where it knows the allocated bytes
//! (the peaks, the OOM, the dump), the categories (`analyze`'s at the peak and the OOM,
//! `analyze --at`'s at that moment) and the root of the tree hold exactly those allocated bytes;
//! where it does not know them, they are requested bytes and hold the requested bytes.

use crate::account::inputs;
use crate::util::fixture;
use memprof::account::at::state_at;
use memprof::account::{self, DeviceReport, Figure, MomentKind, MomentQuery, TimeAxis};
use memprof::analysis::categories::{CategoryBytes, CategoryRules, Classifier};
use memprof::diagnose::Origin;
use memprof::model::Snapshot;
use memprof::report::tree_at::tree_at;
use memprof::source::torch_snapshot;
use std::path::Path;

fn sum(list: &[CategoryBytes]) -> u64 {
    list.iter().map(|c| c.bytes).sum()
}

/// How many moments of each figure one file had.
#[derive(Default)]
struct Checked {
    allocated: usize,
    requested: usize,
}

/// Checks every moment of device `d` of `snapshot`.
fn check_device(
    name: &str,
    snapshot: &Snapshot,
    axis: TimeAxis,
    d: &DeviceReport,
    checked: &mut Checked,
) {
    let device = d.analysis.device;
    let entries = snapshot.timeline.device(device as usize);
    let a = &d.account;
    let blocks = d.analysis.block_sizes();
    let rules = CategoryRules::default();
    let mut classifier = Classifier::new(snapshot, device, &rules);
    for m in &a.moments {
        let query = match m.entry {
            Some(e) => MomentQuery::Entry(e),
            None => MomentQuery::Named(m.kind),
        };
        let at = a
            .resolve(query, entries, axis)
            .expect("the account's moment");
        let here = format!("{name}: device {device}: {:?} at {:?}", m.kind, m.entry);
        let state = state_at(snapshot, device, a, blocks, &at, &mut classifier, 1);
        let tree = tree_at(snapshot, device, &at, blocks, 1, 0.0);
        // The account's figures there, with the requested bytes the trace gives at any entry.
        let figures = state.figures;
        assert_eq!(
            figures.allocated_bytes,
            a.figures_of(m).allocated_bytes,
            "{here}"
        );
        match figures.allocated_bytes {
            Some(allocated) => {
                checked.allocated += 1;
                let categories = state
                    .allocated_categories
                    .unwrap_or_else(|| panic!("{here}: categories in allocated bytes"));
                assert_eq!(sum(&categories), allocated, "{here}: categories");
                assert_eq!(tree.figure, Figure::AllocatedBytes, "{here}: the tree");
                assert_eq!(tree.root.inclusive_bytes, allocated, "{here}: the tree");
            }
            None => {
                checked.requested += 1;
                assert!(state.allocated_categories.is_none(), "{here}");
                let requested = figures.requested_bytes.expect("known at an entry");
                assert_eq!(sum(&state.categories), requested, "{here}: categories");
                assert_eq!(tree.figure, Figure::RequestedBytes, "{here}: the tree");
                assert_eq!(tree.root.inclusive_bytes, requested, "{here}: the tree");
            }
        }
    }
    // `analyze`'s own categories at the peak and the OOM.
    let Some(c) = &d.analysis.categories else {
        return;
    };
    let peak = a.moment(MomentKind::PeakRequested);
    let known = peak.and_then(|m| a.figures_of(m).allocated_bytes);
    assert_eq!(
        c.at_peak_allocated.as_deref().map(sum),
        known,
        "{name}: device {device}: at the peak"
    );
    let oom = d.analysis.oom.as_ref().map(|o| o.entry_index);
    let known = oom.and_then(|i| a.figures_at(Some(i))?.allocated_bytes);
    assert_eq!(
        c.at_oom_allocated.as_deref().map(sum),
        known,
        "{name}: device {device}: at the OOM"
    );
}

/// The snapshot at `path` and its account.
fn read_with_account(path: &Path) -> (Snapshot, account::InputAccount) {
    let snapshot = torch_snapshot::read(std::fs::File::open(path).expect("opens"))
        .expect("parses")
        .snapshot;
    let rules = CategoryRules::default();
    let input = account::build(
        &snapshot,
        &account::Options::new(1, &rules, Origin::TorchSnapshot),
    );
    (snapshot, input)
}

fn check(path: &Path) -> Checked {
    let name = path.display().to_string();
    let (snapshot, input) = read_with_account(path);
    let mut checked = Checked::default();
    for d in &input.devices {
        check_device(&name, &snapshot, input.axis, d, &mut checked);
    }
    checked
}

#[test]
fn categories_and_trees_add_up_to_the_accounts_figure_at_every_moment() {
    let mut allocated = 0;
    for file in inputs() {
        let checked = check(&file);
        println!(
            "{}: {} moments in allocated bytes, {} in requested bytes",
            file.display(),
            checked.allocated,
            checked.requested
        );
        allocated += checked.allocated;
    }
    assert!(allocated > 0, "some moment knows its allocated bytes");
}

/// A trace whose frees wait on another stream: at the peak of requested bytes, blocks freed by
/// the program but not yet reusable are requested bytes (alive in the trace) and not allocated
/// bytes, and the categories there leave them out.
#[test]
fn frees_pending_on_another_stream_are_not_allocated() {
    let (_, input) = read_with_account(&fixture("snapshots/pending_free.pickle"));
    let d = &input.devices[0];
    let peak = d.account.moment(MomentKind::PeakRequested).expect("a peak");
    let f = d.account.figures_of(peak);
    let (allocated, requested) = (f.allocated_bytes.expect("known"), f.requested_bytes);
    assert!(
        Some(allocated) < requested,
        "{f:?}: frees are pending at the peak"
    );
    let c = d.analysis.categories.as_ref().expect("categories");
    let in_blocks = c.at_peak_allocated.as_deref().expect("known");
    assert_eq!(sum(in_blocks), allocated);
    let count = |l: &[CategoryBytes]| l.iter().map(|c| c.count).sum::<usize>();
    assert!(
        count(in_blocks) < count(&c.at_peak),
        "the pending ones are left out"
    );
}
