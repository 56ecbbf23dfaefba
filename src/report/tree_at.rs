//! The caller-first tree of what is live on one device at a resolved moment, with frames
//! labelled as every output labels them (the user's files relative to their common folder,
//! installed packages by module): `memprof tree`, the HTML report and `view` draw this one tree.

use crate::account::{Figure, Resolved};
use crate::analysis::live_tree::{
    by_stack_of_allocated, by_stack_of_blocks, by_stack_of_live, tree, Node,
};
use crate::model::{Replay, Snapshot};
use crate::report::site_identity::Normalizer;
use crate::sim::block_sizes::BlockSizes;

/// A tree and the figure its bytes are.
#[derive(Clone, Debug)]
pub struct TreeAt {
    /// `AllocatedBytes`: block sizes, and the root holds the account's `allocated_bytes` at
    /// that moment; `RequestedBytes`: the root holds its `requested_bytes`.
    pub figure: Figure,
    pub root: Node,
}

/// The tree of `device` at `at`, cut at `depth` levels and `min_share` of the root. Sizes are
/// block sizes where the account knows the allocated bytes there (always at the dump; in the
/// trace where the allocator replay's `blocks` reproduce them), else requested sizes.
pub fn tree_at(
    snapshot: &Snapshot,
    device: u32,
    at: &Resolved,
    blocks: Option<&BlockSizes>,
    depth: usize,
    min_share: f64,
) -> TreeAt {
    let entries = snapshot.timeline.device(device as usize);
    let segments: Vec<_> = snapshot.device_segments(device).collect();
    let (figure, by_stack) = if at.is_dump() {
        (
            Figure::AllocatedBytes,
            by_stack_of_blocks(segments.iter().copied()),
        )
    } else {
        let mut replay = Replay::new(entries, segments.iter().copied());
        if let Some(e) = at.entry {
            replay.run_through(e);
        }
        let allocated = at.figures.and_then(|f| f.allocated_bytes);
        let in_blocks = allocated
            .zip(blocks)
            .map(|(a, b)| (a, by_stack_of_allocated(replay.live(), b, at.entry)))
            .filter(|(a, by)| by.values().fold(0u64, |t, b| t.saturating_add(*b)) == *a);
        match in_blocks {
            Some((_, by)) => (Figure::AllocatedBytes, by),
            None => (Figure::RequestedBytes, by_stack_of_live(replay.live())),
        }
    };
    let labels: Vec<String> = by_stack
        .keys()
        .flatten()
        .flat_map(|id| crate::analysis::shown_stack(&snapshot.stacks, *id, false).frames)
        .collect();
    let normalizer = Normalizer::of(labels.iter().map(String::as_str));
    let root = tree(
        &snapshot.stacks,
        &by_stack,
        &format!("device {device}"),
        &|f| normalizer.label(f),
        depth,
        min_share,
    );
    TreeAt { figure, root }
}
