//! Who made a private pool (a CUDA-graph pool, a `torch.cuda.MemPool`, vLLM's KV cache), as
//! the stacks of its segments and blocks tell.

use crate::model::{Segment, StackId, StackTable};

/// Owners told by frame text, most specific first: (what a frame's file or function holds,
/// the owner's name).
const OWNERS: [(&str, &str); 7] = [
    ("kv_cache", "KV cache (vLLM)"),
    ("cache_engine", "KV cache (vLLM)"),
    ("model_runner", "model weights (vLLM)"),
    ("model_loader", "model weights (vLLM)"),
    ("cuda/graphs.py", "CUDA graphs"),
    ("cudagraph", "CUDA graphs"),
    ("mempool", "torch.cuda.MemPool"),
];

/// The owner the stacks of a private pool's blocks and segments name: the first rule of
/// `OWNERS` that some frame of the pool's largest stacks matches.
pub fn owner_of(members: &[&Segment], stacks: &StackTable) -> Option<String> {
    // The stacks holding the most bytes speak first.
    let mut weighted: Vec<(u64, StackId)> = Vec::new();
    for s in members {
        weighted.extend(s.stack.map(|st| (s.total_size, st)));
        for b in &s.blocks {
            weighted.extend(b.stack.map(|st| (b.size, st)));
        }
    }
    weighted.sort_unstable_by_key(|w| std::cmp::Reverse(w.0));
    weighted.dedup_by_key(|w| w.1);
    for (needle, owner) in OWNERS {
        let found = weighted.iter().take(64).any(|&(_, st)| {
            stacks.frames(st).any(|f| {
                f.filename.to_ascii_lowercase().contains(needle)
                    || f.name.to_ascii_lowercase().contains(needle)
            })
        });
        if found {
            return Some(owner.to_string());
        }
    }
    None
}
