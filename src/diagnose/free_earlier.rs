//! The remedy "free the named tensors earlier", replayed through the simulator.
//!
//! A trace records when a tensor was freed, never when it was last used, so the rule needs
//! evidence that a tensor was not needed any more. The evidence taken is the loop: a tensor
//! alive at the OOM, made by one of the diagnosis' sites during an earlier iteration (after
//! the first boundary, so not setup), that outlived the iteration that made it, from a site
//! that holds such tensors from at least two different earlier iterations. That is the shape
//! of a list that accumulates tensors (or of a leak): one more each iteration, none released.
//! State made once (weights, optimizer state, a cache filled in the first step) is never
//! chosen, and neither is what the current iteration holds. Each chosen tensor is freed at
//! the end of the iteration that made it; the rest of the trace replays as recorded, under
//! the same settings and capacity. Without iterations (markers or a repeating pattern) the
//! remedy is not offered.

use crate::analysis::iterations::{find_iterations, Iterations};
use crate::analysis::oom::{OomSite, Remedy, RemedyKind};
use crate::analysis::site_label_of;
use crate::model::{replay_device, Action, Bytes, Snapshot};
use crate::sim::replay::{self, Prepared};
use crate::sim::{AllocatorConfig, EarlyFree};
use rustc_hash::{FxHashMap, FxHashSet};

/// Tensors of one site kept across iterations.
#[derive(Default)]
struct Kept {
    /// The library function the site called (as `Site::via`).
    via: Option<String>,
    frees: Vec<EarlyFree>,
    bytes: u64,
    iterations: FxHashSet<usize>,
}

/// The remedy for the OOM at `oom_index`, freeing what the sites in `named` keep across
/// iterations; `None` when none of them does (or the trace shows no iterations).
/// Replayed when the recorded replay reproduces the OOM under a known capacity.
pub fn free_earlier(
    snapshot: &Snapshot,
    prepared: &Prepared,
    recorded: &AllocatorConfig,
    oom_index: usize,
    named: &[&str],
) -> Option<Remedy> {
    let device = prepared.device;
    let it = find_iterations(snapshot, device, oom_index)?;
    let kept = kept_across_iterations(snapshot, device, oom_index, &it, named);
    if kept.is_empty() {
        return None;
    }
    let mut freed: Vec<OomSite> = kept
        .iter()
        .map(|(frame, k)| OomSite {
            frame: frame.clone(),
            via: k.via.clone(),
            bytes: k.bytes,
        })
        .collect();
    freed.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.frame.cmp(&b.frame)));
    let frees: Vec<EarlyFree> = kept.into_values().flat_map(|k| k.frees).collect();
    let total: u64 = freed.iter().map(|s| s.bytes).sum();
    let sites: Vec<&str> = freed.iter().map(|s| s.frame.as_str()).collect();
    let action = format!(
        "free the {} tensors ({}) that {} keep across iterations, each at the end of the \
         iteration that made it",
        frees.len(),
        Bytes(total),
        sites.join(", ")
    );
    let replayable = prepared
        .capacity
        .filter(|_| prepared.recorded_run.oom.is_some());
    let mut remedy = Remedy::unverified(RemedyKind::FreeEarlier, action);
    remedy.sites = freed;
    if let Some(capacity) = replayable {
        let run = replay::run_freeing_early(prepared, recorded, Some(capacity), &frees);
        super::remedies::set_replayed(&mut remedy, &run);
    }
    Some(remedy)
}

/// By site: the tensors alive at `oom_index` (not already being freed) that a named site made
/// in an earlier iteration, for the sites that hold them from two or more iterations.
fn kept_across_iterations(
    snapshot: &Snapshot,
    device: u32,
    oom_index: usize,
    it: &Iterations,
    named: &[&str],
) -> FxHashMap<String, Kept> {
    let entries = snapshot.timeline.device(device as usize);
    let mut state = replay_device(snapshot, device);
    state.run_through(oom_index);
    let mut being_freed: FxHashSet<u64> = FxHashSet::default();
    for e in &entries[..oom_index.min(entries.len())] {
        let Some(addr) = e.addr() else { continue };
        match e.action() {
            Action::FreeRequested => {
                being_freed.insert(addr);
            }
            Action::Alloc | Action::FreeCompleted => {
                being_freed.remove(&addr);
            }
            _ => {}
        }
    }
    let named: FxHashSet<&str> = named.iter().copied().collect();
    let mut by_site: FxHashMap<String, Kept> = FxHashMap::default();
    for (addr, live) in state.live().iter() {
        let Some(born) = live.born() else { continue };
        if being_freed.contains(&addr) {
            continue;
        }
        // Iteration k lies between boundaries k-1 and k; 0 is before the first.
        let k = it.boundaries.partition_point(|&b| b < born);
        let Some(&end) = it
            .boundaries
            .get(k)
            .filter(|&&end| k > 0 && end < oom_index)
        else {
            continue;
        };
        let site = site_label_of(&snapshot.stacks, live.stack);
        if !named.contains(site.frame.as_str()) {
            continue;
        }
        let kept = by_site.entry(site.frame).or_insert_with(|| Kept {
            via: site.via,
            ..Kept::default()
        });
        kept.frees.push(EarlyFree { after: end, addr });
        kept.bytes = kept.bytes.saturating_add(live.size);
        kept.iterations.insert(k);
    }
    by_site.retain(|_, k| k.iterations.len() >= 2);
    by_site
}
