//! Iteration boundaries of a training loop before a trace entry: the markers the trace records
//! (`snapshot` entries, the most frequent `record_function` annotation) or, without them, the
//! trace's own repeating allocation pattern.
//!
//! The pattern rule: each `alloc` gets a key, its site (or, without a stack, its size, so
//! that stack-less traces still tell allocations apart). The iteration is the smallest period
//! P such that
//! - the keys of the allocations before the entry repeat with period P over at least
//!   `MIN_ITERATIONS` periods, counted back from the entry;
//! - one period holds at least half of the distinct sites of all allocations before the entry
//!   (a training step runs the whole program; an inner loop, such as an optimizer's loop over
//!   parameters or model construction layer by layer, runs a small part of it);
//! - each iteration frees within itself at least what it keeps: its swing above the level it
//!   started at is at least twice its rise (a forward pass, layer by layer, keeps most of what
//!   it allocates as activations for the backward pass).
//!
//! Within the period, the boundary is the position where live memory is lowest summed over
//! the periods: the point each iteration returns to. The search has a work budget and finds
//! nothing past it. Iterations whose sites vary (data-dependent control flow), or stack-less
//! traces whose sizes vary, are not recognised.

use super::sites::site_of;
use crate::model::{replay_device, Action, Snapshot, StackId, TraceEntry};
use rustc_hash::{FxHashMap, FxHashSet};

/// Fewest iteration boundaries that count as a loop.
pub const MIN_ITERATIONS: usize = 3;
/// Comparisons the pattern search may make (a fixed part plus a part per allocation) before
/// it gives up: a trace that repeats one allocation a million times would otherwise cost
/// time quadratic in its length.
const SEARCH_BUDGET: usize = 1 << 22;
const SEARCH_PER_ALLOC: usize = 64;

/// Iteration boundaries found before some entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iterations {
    /// What marks them, for evidence.
    pub marker: String,
    /// Ascending entry indices; each boundary lies just after its entry.
    pub boundaries: Vec<usize>,
}

/// The iterations of `device`'s trace before entry `until`: recorded markers first, else the
/// repeating allocation pattern. `None` when neither shows at least `MIN_ITERATIONS`.
pub fn find_iterations(snapshot: &Snapshot, device: u32, until: usize) -> Option<Iterations> {
    let enough = |it: &Iterations| it.boundaries.len() >= MIN_ITERATIONS;
    marked(snapshot, device, until)
        .filter(enough)
        .or_else(|| repeating(snapshot, device, until).filter(enough))
}

/// Entry indices before `until` that mark the same point of each iteration.
fn marked(snapshot: &Snapshot, device: u32, until: usize) -> Option<Iterations> {
    let all = snapshot.timeline.device(device as usize);
    let entries = &all[..until.min(all.len())];
    let snaps: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].action() == Action::Snapshot)
        .collect();
    if snaps.len() >= MIN_ITERATIONS {
        return Some(Iterations {
            marker: "`snapshot` trace entries".to_string(),
            boundaries: snaps,
        });
    }
    let mut groups: FxHashMap<(String, String), Vec<i64>> = FxHashMap::default();
    for a in &snapshot.annotations {
        if a.device.is_some_and(|d| d != device) {
            continue;
        }
        if let (Some(t), Some(name)) = (a.time_us, &a.name) {
            let key = (a.stage.clone().unwrap_or_default(), name.clone());
            groups.entry(key).or_default().push(t);
        }
    }
    let ((stage, name), mut times) = groups
        .into_iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(&a.0)))?;
    times.sort_unstable();
    let mut boundaries: Vec<usize> = times
        .iter()
        .filter_map(|&t| {
            entries
                .iter()
                .position(|e| e.time_us().is_some_and(|u| u >= t))
        })
        .collect();
    boundaries.dedup();
    Some(Iterations {
        marker: format!("the {stage} of `{name}` annotations"),
        boundaries,
    })
}

/// What identifies an allocation in the pattern: its site (interned), or its size when it has
/// no stack. Sites, not stacks: real files repeat a stack's frames under a new stack object
/// each iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Site(usize),
    Size(u64),
}

/// The keys of the `alloc` entries of `entries`, with their indices.
fn keys(snapshot: &Snapshot, entries: &[TraceEntry]) -> Vec<(usize, Key)> {
    let mut by_stack: FxHashMap<StackId, usize> = FxHashMap::default();
    let mut by_site: FxHashMap<String, usize> = FxHashMap::default();
    let mut site = |stack: StackId| {
        let next = by_site.len();
        *by_stack.entry(stack).or_insert_with(|| {
            *by_site
                .entry(site_of(&snapshot.stacks, Some(stack)))
                .or_insert(next)
        })
    };
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action() == Action::Alloc)
        .map(|(i, e)| (i, e.stack.map_or(Key::Size(e.size), |s| Key::Site(site(s)))))
        .collect()
}

/// Boundaries from the repeating allocation pattern before `until` (rule in the module doc).
fn repeating(snapshot: &Snapshot, device: u32, until: usize) -> Option<Iterations> {
    let all = snapshot.timeline.device(device as usize);
    let entries = &all[..until.min(all.len())];
    let allocs = keys(snapshot, entries);
    let n = allocs.len();
    let site = |k: Key| match k {
        Key::Site(s) => Some(s),
        Key::Size(_) => None,
    };
    let everywhere = allocs
        .iter()
        .map(|&(_, k)| site(k))
        .collect::<FxHashSet<_>>()
        .len();
    let (before, after) = live_around_allocs(snapshot, device, &allocs);
    // Sites of the last p allocations, grown with p.
    let mut last_sites: FxHashSet<Option<usize>> = FxHashSet::default();
    let mut budget = SEARCH_BUDGET.saturating_add(n.saturating_mul(SEARCH_PER_ALLOC));
    let mut found = None;
    for p in 1..=n / MIN_ITERATIONS {
        last_sites.insert(site(allocs[n - p].1));
        if 2 * last_sites.len() < everywhere {
            continue;
        }
        let run = (p..n)
            .rev()
            .take_while(|&i| allocs[i].1 == allocs[i - p].1)
            .count();
        budget = budget.checked_sub(run + 1)?;
        if run < (MIN_ITERATIONS - 1) * p {
            continue;
        }
        let start = n - run - p;
        let full = (n - start) / p;
        budget = budget.checked_sub(2 * (n - start))?;
        let phase = (0..p)
            .min_by_key(|&r| {
                (0..full)
                    .map(|k| u128::from(before[start + r + k * p]))
                    .sum::<u128>()
            })
            .unwrap_or(0);
        let positions: Vec<usize> = (start + phase..n).step_by(p).collect();
        // Each iteration frees within itself at least what it keeps (module doc).
        let returns = positions.windows(2).all(|w| {
            let (base, next) = (before[w[0]], before[w[1]]);
            let peak = after[w[0]..w[1]].iter().copied().max().unwrap_or(base);
            peak.saturating_sub(base) >= next.saturating_sub(base).saturating_mul(2)
        });
        if returns {
            found = Some((p, positions));
            break;
        }
    }
    let (period, positions) = found?;
    let boundaries = positions
        .into_iter()
        .filter_map(|k| allocs[k].0.checked_sub(1))
        .collect();
    Some(Iterations {
        marker: format!(
            "the start of each repetition of the trace's allocation pattern (every {period} \
             allocations; the trace has no iteration markers)"
        ),
        boundaries,
    })
}

/// Live bytes just before and just after each of `allocs` (ascending entry indices).
fn live_around_allocs(
    snapshot: &Snapshot,
    device: u32,
    allocs: &[(usize, Key)],
) -> (Vec<u64>, Vec<u64>) {
    let mut replay = replay_device(snapshot, device);
    allocs
        .iter()
        .map(|&(i, _)| {
            if let Some(previous) = i.checked_sub(1) {
                replay.run_through(previous);
            }
            let before = replay.live().total();
            replay.run_through(i);
            (before, replay.live().total())
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::growth::find_growth;
    use crate::source::torch_snapshot;
    use std::path::PathBuf;

    /// A real snapshot from `../shared/fixtures/real/` (never copied into the repo); `None`
    /// where this checkout does not have them, saying that the test is skipped in the form
    /// `.ci/run` collects (tests/util.rs `skip`).
    fn real(name: &str) -> Option<Snapshot> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/fixtures/real")
            .join(name);
        let Ok(file) = std::fs::File::open(path) else {
            let test = std::thread::current().name().unwrap_or("a test").to_owned();
            let line = format!(
                "SKIPPED: {test}: real snapshots from public runs: not in this repository, see \
                 fixtures/README.md\n"
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            return None;
        };
        Some(
            torch_snapshot::read(std::io::BufReader::new(file))
                .expect("a real snapshot parses")
                .snapshot,
        )
    }

    /// The snapshot with its `snapshot` trace entries (the markers) taken out.
    fn unmarked(s: &Snapshot) -> Snapshot {
        let entries: Vec<TraceEntry> = s
            .timeline
            .device(0)
            .iter()
            .filter(|e| e.action() != Action::Snapshot)
            .copied()
            .collect();
        let n = entries.len();
        Snapshot {
            timeline: crate::model::Timeline::new(entries, std::iter::once(0..n).collect()),
            annotations: Vec::new(),
            ..s.clone()
        }
    }

    #[test]
    fn the_pattern_finds_the_iterations_a_real_trace_marks() {
        // JasperSolt/EoR_NN: 9 `snapshot` entries, 193 allocations between each two, a loop
        // that does not grow. Cut inside the last iteration, the pattern alone must put the
        // boundaries where the markers are (just before the iteration's first allocation).
        let Some(s) = real("JasperSolt__EoR_NN__snapshot.pickle") else {
            return;
        };
        let entries = s.timeline.device(0);
        let until = entries.len() - 300;
        let marks: Vec<usize> = (0..until)
            .filter(|&i| entries[i].action() == Action::Snapshot)
            .collect();
        assert_eq!(marks.len(), 9);
        let found = repeating(&s, 0, until).expect("the loop is found");
        assert!(
            found.marker.contains("every 193 allocations"),
            "{}",
            found.marker
        );
        assert_eq!(found.boundaries, marks);
        assert!(find_growth(&s, 0, until).is_none());
        // Without its markers: the same boundaries (shifted by the removed entries), and
        // still no growth.
        let bare = unmarked(&s);
        let until = until - marks.len();
        let found = find_iterations(&bare, 0, until).expect("the loop is found");
        let shifted: Vec<usize> = marks.iter().enumerate().map(|(k, &m)| m - k - 1).collect();
        assert_eq!(found.boundaries, shifted);
        assert!(find_growth(&bare, 0, until).is_none());
    }

    #[test]
    fn layer_and_parameter_loops_are_not_iterations() {
        // kkaitlyn111/cs336-a2-systems: one training step (forward layer by layer, backward,
        // an optimizer creating its state parameter by parameter). Live memory climbs through
        // the forward pass and the optimizer's first step, by the same allocations over and
        // over, but neither loop is an iteration of the program. silmont2000: one forward and
        // backward.
        for name in [
            "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle",
            "silmont2000__assignment2-systems__mem_snapshot.pickle",
        ] {
            let Some(s) = real(name) else { continue };
            let n = s.timeline.device(0).len();
            for until in (n % 997..=n).step_by(997) {
                assert_eq!(find_iterations(&s, 0, until), None, "{name} @{until}");
            }
        }
    }

    #[test]
    fn a_long_run_of_one_allocation_ends_within_the_budget() {
        // 60000 allocations of one size, none freed: every period repeats, none returns to
        // a baseline. Without the budget the search would compare about 10^9 pairs.
        use crate::model::{SnapshotFormat, StackTable, StreamIndex, Timeline};
        let entries: Vec<TraceEntry> = (0..60_000u64)
            .map(|i| TraceEntry::new(Action::Alloc, Some(0x1000 + i * 512), 512, StreamIndex(0)))
            .collect();
        let n = entries.len();
        let s = Snapshot {
            format: SnapshotFormat::Modern,
            segments: Vec::new(),
            timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        };
        assert_eq!(find_iterations(&s, 0, n), None);
    }
}
