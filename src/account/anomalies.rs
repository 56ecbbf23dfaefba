//! What a trace shows that nobody asked about: frees that waited on other streams longer than
//! a millisecond (pending-free stalls), allocations made in the trace and still alive at its end
//! grouped by site, with the iterations they came from (leak suspects), and how long the blocks
//! the program freed lived (a histogram).

use crate::analysis::categories::Phase;
use crate::model::{Action, StackTable, Timeline, TraceEntry};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// A free that took longer than this from `free_requested` to `free_completed` is a stall.
pub const STALL_US: i64 = 1000;
/// Stalls and leak suspects listed (the counts and sums cover them all).
pub const LISTED: usize = 8;
/// Upper bounds of the lifetime histogram's buckets, in microseconds; a last bucket holds the
/// rest.
pub const LIFETIME_BOUNDS_US: [i64; 7] = [10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];

/// The anomalies of one device's trace (all empty without a timed trace).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Anomalies {
    pub stalls: Stalls,
    pub leak_suspects: LeakSuspects,
    /// Freed blocks by how long they lived, from `alloc` to `free_requested`, shortest first.
    pub lifetimes: Vec<LifetimeBucket>,
}

/// Frees that waited on other streams: `free_requested` to `free_completed` over `STALL_US`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stalls {
    pub count: usize,
    pub bytes: u64,
    /// The longest, longest first (at most `LISTED`).
    pub longest: Vec<Stall>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stall {
    /// The `free_requested` entry.
    pub entry: usize,
    pub wait_us: i64,
    pub bytes: u64,
    /// The stream the block was allocated on (`cudaStream_t`).
    pub stream: u64,
    /// The site that allocated the block (that freed it, where the trace did not see it made).
    pub site: String,
}

/// Allocations made in the trace and alive at its end.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakSuspects {
    pub count: usize,
    pub bytes: u64,
    /// Optimizer steps the trace shows (iteration `n` is what ran after `n - 1` of them).
    pub steps: u32,
    /// By site: those made in more than one iteration first, then most bytes first (at most
    /// `LISTED`).
    pub sites: Vec<LeakSite>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeakSite {
    pub site: String,
    pub bytes: u64,
    pub count: usize,
    /// The first and last iteration its live allocations were made in, and in how many.
    pub first_iteration: u32,
    pub last_iteration: u32,
    pub iterations: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifetimeBucket {
    /// Lived less than this many microseconds (and at least the previous bucket's bound);
    /// `None` for the last bucket.
    pub below_us: Option<i64>,
    pub count: usize,
    pub bytes: u64,
}

/// Whether a phase ends an iteration: an optimizer step, as the stacks or `record_function`
/// name it.
fn is_step(p: &Phase) -> bool {
    p.name.starts_with("optimizer step") || p.name.starts_with("Optimizer.step")
}

/// What one walk over a device's trace gathers for its anomalies: every stall, the lifetime
/// histogram's counts, and the `alloc` entries still alive at the end (in trace order). It
/// needs nothing but the trace, so `account::build` runs it beside the analysis.
#[derive(Debug, Default)]
pub struct TracePass {
    stalls: Vec<Stall>,
    buckets: Vec<(usize, u64)>,
    alive: Vec<usize>,
}

/// Walks `entries` (one device's trace) for its anomalies.
pub fn trace_pass(entries: &[TraceEntry], timeline: &Timeline, stacks: &StackTable) -> TracePass {
    let site = |i: usize| crate::analysis::site_of(stacks, entries[i].stack);
    // By address: the `alloc` entry alive there, and the `free_requested` one waiting with
    // the `alloc` it frees (where the trace saw it).
    let mut alive: FxHashMap<u64, usize> = FxHashMap::default();
    let mut pending: FxHashMap<u64, (usize, Option<usize>)> = FxHashMap::default();
    let mut stalls = Vec::new();
    let mut buckets = vec![(0usize, 0u64); LIFETIME_BOUNDS_US.len() + 1];
    for (i, e) in entries.iter().enumerate() {
        let Some(addr) = e.addr() else { continue };
        match e.action() {
            Action::Alloc => {
                alive.insert(addr, i);
            }
            Action::FreeRequested => {
                let made = alive.remove(&addr);
                if let Some(born) = made {
                    if let (Some(from), Some(to)) = (entries[born].time_us(), e.time_us()) {
                        let k = LIFETIME_BOUNDS_US.partition_point(|&b| b <= to - from);
                        buckets[k].0 += 1;
                        buckets[k].1 = buckets[k].1.saturating_add(e.size);
                    }
                }
                pending.insert(addr, (i, made));
            }
            Action::FreeCompleted => {
                let Some((asked, made)) = pending.remove(&addr) else {
                    alive.remove(&addr);
                    continue;
                };
                let wait = e.time_us().zip(entries[asked].time_us());
                if let Some(wait_us) = wait.map(|(to, from)| to - from).filter(|&w| w > STALL_US) {
                    stalls.push(Stall {
                        entry: asked,
                        wait_us,
                        bytes: e.size,
                        stream: timeline.stream(e.stream),
                        // Where the block was made, else where it was freed.
                        site: site(made.unwrap_or(asked)),
                    });
                }
            }
            _ => {}
        }
    }
    let mut alive: Vec<usize> = alive.into_values().collect();
    alive.sort_unstable();
    TracePass {
        stalls,
        buckets,
        alive,
    }
}

/// The anomalies of `entries` (one device's trace) from its walk, numbering iterations by the
/// optimizer steps among `phases`.
pub fn anomalies(
    pass: TracePass,
    entries: &[TraceEntry],
    stacks: &StackTable,
    phases: &[Phase],
) -> Anomalies {
    let mut step_ends: Vec<usize> = phases
        .iter()
        .filter(|p| is_step(p))
        .map(|p| p.end_entry)
        .collect();
    step_ends.sort_unstable();
    step_ends.dedup();
    let iteration = |i: usize| step_ends.partition_point(|&e| e <= i) as u32 + 1;
    let site = |i: usize| crate::analysis::site_of(stacks, entries[i].stack);
    let TracePass {
        mut stalls,
        buckets,
        alive: born,
    } = pass;
    let stall_bytes = stalls.iter().fold(0u64, |a, s| a.saturating_add(s.bytes));
    let stall_count = stalls.len();
    stalls.sort_by_key(|s| (std::cmp::Reverse(s.wait_us), s.entry));
    stalls.truncate(LISTED);
    // Leak suspects, by site.
    let mut by_site: FxHashMap<String, LeakSite> = FxHashMap::default();
    let mut seen_iterations: FxHashMap<String, Vec<u32>> = FxHashMap::default();
    let (mut count, mut bytes) = (0usize, 0u64);
    // Sites by stack: one label per distinct stack, however many allocations share it.
    let mut labels: FxHashMap<Option<crate::model::StackId>, String> = FxHashMap::default();
    for &b in &born {
        let label = labels
            .entry(entries[b].stack)
            .or_insert_with(|| site(b))
            .clone();
        let (it, size) = (iteration(b), entries[b].size);
        count += 1;
        bytes = bytes.saturating_add(size);
        let s = by_site.entry(label.clone()).or_insert(LeakSite {
            site: label.clone(),
            bytes: 0,
            count: 0,
            first_iteration: it,
            last_iteration: it,
            iterations: 0,
        });
        s.bytes = s.bytes.saturating_add(size);
        s.count += 1;
        s.last_iteration = it;
        let its = seen_iterations.entry(label).or_default();
        if its.last() != Some(&it) {
            its.push(it);
            s.iterations += 1;
        }
    }
    let mut sites: Vec<LeakSite> = by_site.into_values().collect();
    // Sites still making live allocations in several iterations first: what grows with the
    // run, not what a run keeps (weights, optimizer state).
    sites.sort_by(|a, b| {
        (b.iterations > 1)
            .cmp(&(a.iterations > 1))
            .then(b.bytes.cmp(&a.bytes))
            .then_with(|| a.site.cmp(&b.site))
    });
    sites.truncate(LISTED);
    let lifetimes = if buckets.iter().all(|b| b.0 == 0) {
        Vec::new()
    } else {
        buckets
            .into_iter()
            .enumerate()
            .map(|(k, (count, bytes))| LifetimeBucket {
                below_us: LIFETIME_BOUNDS_US.get(k).copied(),
                count,
                bytes,
            })
            .collect()
    };
    Anomalies {
        stalls: Stalls {
            count: stall_count,
            bytes: stall_bytes,
            longest: stalls,
        },
        leak_suspects: LeakSuspects {
            count,
            bytes,
            steps: step_ends.len() as u32,
            sites,
        },
        lifetimes,
    }
}
