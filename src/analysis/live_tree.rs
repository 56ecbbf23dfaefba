//! The live memory at one moment as a caller-first tree: every live allocation's stack (noise
//! left out) from the outermost frame in, each node with the bytes at and below it (inclusive)
//! and the bytes allocated right there (self). Sizes are block sizes where the allocator's
//! blocks are known (the root then holds the account's `allocated_bytes`), else requested
//! sizes (the root holds its `requested_bytes`).

use super::sites::shown_stack;
use crate::model::{BlockState, LiveSet, Segment, StackId, StackTable};
use crate::sim::block_sizes::BlockSizes;
use rustc_hash::FxHashMap;
use serde::Serialize;

/// One node of the tree.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Node {
    pub name: String,
    pub inclusive_bytes: u64,
    pub self_bytes: u64,
    /// Of the root's inclusive bytes.
    pub share: f64,
    /// Children not shown (below `--depth`, or under `--min-share`), folded into this node's
    /// inclusive bytes.
    #[serde(skip_serializing_if = "is_zero")]
    pub hidden_children: usize,
    pub children: Vec<Node>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The tree being built: children by name.
#[derive(Default)]
struct Building {
    inclusive: u64,
    own: u64,
    children: FxHashMap<String, Building>,
}

/// Requested bytes by stack, from the live allocations of a trace replay.
pub fn by_stack_of_live(live: &LiveSet) -> FxHashMap<Option<StackId>, u64> {
    let mut by: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
    for (_, l) in live.iter() {
        let e = by.entry(l.stack).or_default();
        *e = e.saturating_add(l.size);
    }
    by
}

/// Block bytes by stack of the allocations of a trace replay that the program had not freed
/// just after entry `at` (`None`: before the first), as the allocator replay's `blocks` give
/// them.
pub fn by_stack_of_allocated(
    live: &LiveSet,
    blocks: &BlockSizes,
    at: Option<usize>,
) -> FxHashMap<Option<StackId>, u64> {
    let mut by: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
    for (addr, l) in live.iter() {
        if let Some(size) = blocks.allocated(addr, l, at) {
            let e = by.entry(l.stack).or_default();
            *e = e.saturating_add(size);
        }
    }
    by
}

/// Block bytes by stack, from the allocated blocks of a segment layout (the dump).
pub fn by_stack_of_blocks<'a>(
    segments: impl IntoIterator<Item = &'a Segment>,
) -> FxHashMap<Option<StackId>, u64> {
    let mut by: FxHashMap<Option<StackId>, u64> = FxHashMap::default();
    for b in segments.into_iter().flat_map(|s| &s.blocks) {
        if b.state == BlockState::ActiveAllocated {
            let e = by.entry(b.stack).or_default();
            *e = e.saturating_add(b.size);
        }
    }
    by
}

const NO_STACK: &str = "<no stack recorded>";

/// The tree of `by_stack`, named `root`; `label` rewrites each frame's label (to a path
/// relative to the project, say). Nodes deeper than `depth` and children under `min_share` of
/// the root are folded into their parent.
pub fn tree(
    stacks: &StackTable,
    by_stack: &FxHashMap<Option<StackId>, u64>,
    root: &str,
    label: &dyn Fn(&str) -> String,
    depth: usize,
    min_share: f64,
) -> Node {
    let mut top = Building::default();
    let mut order: Vec<_> = by_stack.iter().collect();
    order.sort_unstable_by_key(|(s, _)| **s);
    for (&stack, &bytes) in order {
        let frames: Vec<String> = match stack {
            Some(id) => shown_stack(stacks, id, false).frames,
            None => Vec::new(),
        };
        let mut path: Vec<String> = frames.iter().rev().map(|f| label(f)).collect();
        if path.is_empty() {
            path.push(NO_STACK.to_string());
        }
        let mut node = &mut top;
        node.inclusive = node.inclusive.saturating_add(bytes);
        for name in path {
            node = node.children.entry(name).or_default();
            node.inclusive = node.inclusive.saturating_add(bytes);
        }
        node.own = node.own.saturating_add(bytes);
    }
    let total = top.inclusive;
    finish(root.to_string(), top, total, depth, min_share)
}

fn finish(name: String, b: Building, total: u64, depth: usize, min_share: f64) -> Node {
    let share = |bytes: u64| {
        if total == 0 {
            0.0
        } else {
            bytes as f64 / total as f64
        }
    };
    let mut children: Vec<(String, Building)> = b.children.into_iter().collect();
    children.sort_by(|a, b| {
        b.1.inclusive
            .cmp(&a.1.inclusive)
            .then_with(|| a.0.cmp(&b.0))
    });
    let all = children.len();
    let shown: Vec<Node> = if depth == 0 {
        Vec::new()
    } else {
        children
            .into_iter()
            .filter(|(_, c)| share(c.inclusive) >= min_share && c.inclusive > 0)
            .map(|(n, c)| finish(n, c, total, depth - 1, min_share))
            .collect()
    };
    Node {
        name,
        inclusive_bytes: b.inclusive,
        self_bytes: b.own,
        share: share(b.inclusive),
        hidden_children: all - shown.len(),
        children: shown,
    }
}

/// Every node, depth first, with its depth (the root at 0).
pub fn walk(node: &Node, depth: usize, f: &mut dyn FnMut(&Node, usize)) {
    f(node, depth);
    for c in &node.children {
        walk(c, depth + 1, f);
    }
}
