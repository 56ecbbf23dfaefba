//! The caller-first tree of what is live on one device at a resolved moment, with frames
//! labelled as every output labels them (the user's files relative to their common folder,
//! installed packages by module): `memprof tree`, the HTML report and `view` draw this one tree.

use crate::account::Resolved;
use crate::analysis::live_tree::{by_stack_of_blocks, by_stack_of_live, tree, Node};
use crate::model::{Replay, Snapshot};
use crate::report::site_identity::Normalizer;

/// The tree of `device` at `at`, cut at `depth` levels and `min_share` of the root. Sizes are
/// requested bytes: the root holds the account's `requested_bytes` at that moment.
pub fn tree_at(
    snapshot: &Snapshot,
    device: u32,
    at: &Resolved,
    depth: usize,
    min_share: f64,
) -> Node {
    let entries = snapshot.timeline.device(device as usize);
    let segments: Vec<_> = snapshot.device_segments(device).collect();
    let by_stack = if at.is_dump() {
        by_stack_of_blocks(segments.iter().copied())
    } else {
        let mut replay = Replay::new(entries, segments.iter().copied());
        if let Some(e) = at.entry {
            replay.run_through(e);
        }
        by_stack_of_live(replay.live())
    };
    let labels: Vec<String> = by_stack
        .keys()
        .flatten()
        .flat_map(|id| crate::analysis::shown_stack(&snapshot.stacks, *id, false).frames)
        .collect();
    let normalizer = Normalizer::of(labels.iter().map(String::as_str));
    tree(
        &snapshot.stacks,
        &by_stack,
        &format!("device {device}"),
        &|f| normalizer.label(f),
        depth,
        min_share,
    )
}
