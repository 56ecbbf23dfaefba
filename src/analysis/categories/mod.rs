//! What the live memory is: every allocation alive at the peak, the OOM and the dump sorted into
//! parameter, gradient, optimizer state, activation, autograd, workspace or other, from its
//! call stack (`context`) and its lifetime in the trace (`lifetimes`), under the user's own
//! rules and PyTorch's `user_metadata`; and the named ranges of the trace (`phases`). The trace
//! gives requested sizes; where the allocator replay knows the blocks, the peak and the OOM are
//! also counted in block bytes (`allocated`).

mod allocated;
mod context;
mod lifetimes;
mod phases;
mod rules;
mod temporaries;
mod wrappers;

use allocated::Kept;
pub use allocated::{Classified, Figure};
pub use phases::Phase;
pub use rules::{CategoryRule, CategoryRules};

use crate::analysis::{Grouping, StackBy};
use crate::model::{BlockState, Live, Snapshot, StackId, StackTable};
use context::Context;
pub use lifetimes::Lifetimes;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use temporaries::unrecorded;
pub use wrappers::{CallerBytes, Wrapper};

/// The built-in categories, in the order a breakdown lists equal amounts. A private pool's
/// allocations come after them, one category per pool owner (`pool_category`).
pub const BUILTIN: [&str; 8] = [
    "parameter",
    "gradient",
    "optimizer_state",
    "optimizer_temporary",
    "activation",
    "autograd",
    "workspace",
    "other",
];

const PARAMETER: usize = 0;
const GRADIENT: usize = 1;
const OPTIMIZER_STATE: usize = 2;
const OPTIMIZER_TEMPORARY: usize = 3;
const ACTIVATION: usize = 4;
const AUTOGRAD: usize = 5;
const WORKSPACE: usize = 6;
const OTHER: usize = 7;

/// The category of a private pool's allocations: `private_pool`, with the owner its blocks'
/// frames name (`private_pool:CUDA graphs`).
pub fn pool_category(owner: Option<&str>) -> String {
    match owner {
        Some(o) => format!("private_pool:{o}"),
        None => "private_pool".to_string(),
    }
}

/// Bytes and allocations of one category at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CategoryBytes {
    pub category: String,
    /// Sum of the allocations' sizes: requested sizes, or block sizes in a list of allocated
    /// bytes (the list says which).
    pub bytes: u64,
    pub count: usize,
}

/// The categories of the live memory at the moments that matter; each list sums to the live
/// total at its moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Categories {
    /// At the peak of active memory, in requested bytes (`trace.peak_active_bytes`).
    pub at_peak: Vec<CategoryBytes>,
    /// The same in block bytes of the allocations not freed by then: they sum to the
    /// account's `allocated_bytes` at the peak; `None` where it does not know them.
    pub at_peak_allocated: Option<Vec<CategoryBytes>>,
    /// At the last `oom` entry, replayed, in requested bytes; `None` without one.
    pub at_oom: Option<Vec<CategoryBytes>>,
    /// The same in block bytes (as `at_peak_allocated`).
    pub at_oom_allocated: Option<Vec<CategoryBytes>>,
    /// The allocated blocks of the dump, by block size (`allocated_bytes`).
    pub at_dump: Vec<CategoryBytes>,
    /// The optimizer step's own temporaries at their most; `None` when no step made any.
    pub optimizer_temporaries: Option<StepTemporaries>,
    /// Allocations without a call stack, alive at the peak (at the dump without a trace).
    pub unrecorded: Unrecorded,
    /// User frames alive at the peak as the innermost for several callers (wrappers that pass
    /// an allocation on), most bytes first.
    pub wrappers: Vec<Wrapper>,
    /// The classified allocations of the peak and the OOM until `add_allocated`.
    #[serde(skip)]
    kept: Option<Box<Kept>>,
}

/// The temporaries an optimizer step makes and frees within itself (`_multi_tensor_adam`'s
/// intermediates, a hand-written step's `exp_avg / denom`), at the moment most of them are
/// alive at once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepTemporaries {
    pub peak_bytes: u64,
    /// The entry after which that many are alive.
    pub peak_entry_index: usize,
    /// How many allocations those are.
    pub count: usize,
    /// The foreach or fused implementation whose frames made most of them
    /// (`_multi_tensor_adam`), when the stacks name one.
    pub implementation: Option<String>,
    /// The site that made most of them.
    pub site: String,
}

/// Live allocations whose stack PyTorch did not record, split by when they were made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Unrecorded {
    /// Alive before the first trace entry (made before recording began).
    pub before_trace_bytes: u64,
    pub before_trace_count: usize,
    /// Made during the trace with no frame recorded.
    pub in_trace_bytes: u64,
    pub in_trace_count: usize,
}

/// Sorts allocations of one device into categories.
pub struct Classifier<'a> {
    stacks: &'a StackTable,
    snapshot: &'a Snapshot,
    /// The device whose trace `lifetimes` follows.
    device: u32,
    /// Whether some entry of the input has a `user_metadata` text (few inputs do).
    user_metadata: bool,
    rules: CategoryRules,
    /// Category names: the built-in ones, then the user's that are new.
    names: Vec<String>,
    /// For each user rule, its index in `names`.
    rule_index: Vec<usize>,
    lifetimes: Lifetimes<'a>,
    /// Sizes that a gradient and an optimizer state of the trace both have: a stackless
    /// allocation of such a size alive across an optimizer step is a parameter.
    parameter_sizes: FxHashSet<u64>,
    by_rule: FxHashMap<StackId, Option<usize>>,
    /// The dump's segments of private pools, by address: start, end, category index.
    pools: Vec<(u64, u64, usize)>,
}

impl<'a> Classifier<'a> {
    pub fn new(snapshot: &'a Snapshot, device: u32, rules: &CategoryRules) -> Classifier<'a> {
        let segments: Vec<_> = snapshot.device_segments(device).collect();
        let entries = snapshot.timeline.device(device as usize);
        let lifetimes = Lifetimes::new(entries, &segments, &snapshot.stacks);
        Classifier::with_lifetimes(snapshot, device, lifetimes, rules)
    }

    /// A classifier over lifetimes already gathered (from a shared replay).
    pub fn with_lifetimes(
        snapshot: &'a Snapshot,
        device: u32,
        lifetimes: Lifetimes<'a>,
        rules: &CategoryRules,
    ) -> Classifier<'a> {
        let mut names: Vec<String> = BUILTIN.iter().map(|s| s.to_string()).collect();
        let rule_index = rules
            .rules()
            .iter()
            .map(|r| match names.iter().position(|n| *n == r.name) {
                Some(i) => i,
                None => {
                    names.push(r.name.clone());
                    names.len() - 1
                }
            })
            .collect();
        let pools = pool_ranges(snapshot, device, &mut names);
        let mut c = Classifier {
            stacks: &snapshot.stacks,
            snapshot,
            device,
            user_metadata: snapshot.timeline.has_user_metadata(),
            rules: rules.clone(),
            names,
            rule_index,
            lifetimes,
            parameter_sizes: FxHashSet::default(),
            by_rule: FxHashMap::default(),
            pools,
        };
        c.parameter_sizes = c.sizes_of_parameters();
        c
    }

    /// Sizes made in the trace both as a gradient and as an optimizer state (none without an
    /// optimizer step).
    fn sizes_of_parameters(&mut self) -> FxHashSet<u64> {
        let mut gradients = FxHashSet::default();
        let mut states = FxHashSet::default();
        if self.lifetimes.steps_before(usize::MAX) == 0 {
            return FxHashSet::default();
        }
        let entries = self.lifetimes.entries;
        let mut next = self.lifetimes.next_alloc(0);
        while let Some(i) = next {
            next = self.lifetimes.next_alloc(i + 1);
            let e = &entries[i];
            let Some(addr) = e.addr() else { continue };
            // Sizes repeat every iteration: a size already found is not looked at again.
            let known = match self.lifetimes.context(self.stacks, e.stack) {
                Context::AccumulateGrad | Context::Backward => gradients.contains(&e.size),
                Context::Optimizer => states.contains(&e.size),
                _ => true,
            };
            if known {
                continue;
            }
            match self.builtin(addr, &Live::from_alloc(e, i)) {
                GRADIENT => gradients.insert(e.size),
                OPTIMIZER_STATE => states.insert(e.size),
                _ => false,
            };
        }
        gradients.intersection(&states).copied().collect()
    }

    /// The category of a live allocation (an index in `names`).
    pub fn category(&mut self, addr: u64, live: &Live) -> usize {
        if let Some(i) = self.by_metadata(live) {
            return i;
        }
        if let Some(i) = self.by_rules(live.stack) {
            return i;
        }
        if let Some(i) = self.by_pool(addr) {
            return i;
        }
        self.builtin(addr, live)
    }

    /// PyTorch's `user_metadata` on the `alloc` entry: a rule's pattern that matches it, else
    /// the text itself when it names a category.
    fn by_metadata(&self, live: &Live) -> Option<usize> {
        let born = live.born()?;
        if !self.user_metadata {
            return None;
        }
        let text = self
            .snapshot
            .timeline
            .extra_at(self.device as usize, born)?
            .user_metadata
            .as_deref()?;
        if let Some(r) = self.rules.matching([text]) {
            return Some(self.rule_index[r]);
        }
        self.names.iter().position(|n| n == text)
    }

    /// The private pool whose segment (at the dump) holds `addr`.
    fn by_pool(&self, addr: u64) -> Option<usize> {
        let i = self.pools.partition_point(|p| p.0 <= addr).checked_sub(1)?;
        let (_, end, category) = self.pools[i];
        (addr < end).then_some(category)
    }

    /// The first `--category` rule that a frame of the filtered stack matches (cached per stack).
    fn by_rules(&mut self, stack: Option<StackId>) -> Option<usize> {
        if self.rules.is_empty() {
            return None;
        }
        let id = stack?;
        if let Some(&found) = self.by_rule.get(&id) {
            return found;
        }
        let frames = crate::analysis::shown_stack(self.stacks, id, false).frames;
        let found = self
            .rules
            .matching(frames.iter().map(String::as_str))
            .map(|r| self.rule_index[r]);
        self.by_rule.insert(id, found);
        found
    }

    /// The built-in rules: the stack's context, settled by the lifetime where it is ambiguous.
    fn builtin(&mut self, addr: u64, live: &Live) -> usize {
        let context = self.lifetimes.context(self.stacks, live.stack);
        let end = self.lifetimes.end_of(addr, live);
        let l = &self.lifetimes;
        let Some(born) = live.born() else {
            // Alive before the trace: it outlived whatever made it.
            return match context {
                Context::Workspace => WORKSPACE,
                Context::AccumulateGrad | Context::Backward => GRADIENT,
                Context::Optimizer => OPTIMIZER_STATE,
                Context::Parameter => PARAMETER,
                Context::Forward if l.steps_before(end) == 0 => ACTIVATION,
                Context::Unknown if l.phase_at(end) == Context::Backward => ACTIVATION,
                Context::Unknown
                    if l.steps_before(end) > 0 && self.parameter_sizes.contains(&live.size) =>
                {
                    PARAMETER
                }
                _ => OTHER,
            };
        };
        match context {
            Context::Workspace => WORKSPACE,
            Context::AccumulateGrad => GRADIENT,
            Context::Parameter => PARAMETER,
            // A step that replaces a tensor (`p.data = ...`) rather than updating it in place:
            // the new one is what the old one was.
            Context::Optimizer if l.outlived_run(born, end) => match l.replaced_by(born) {
                Some((older_addr, older)) => self.builtin(older_addr, &older),
                None => OPTIMIZER_STATE,
            },
            // Made in the step and freed there: the step's own intermediates.
            Context::Optimizer => OPTIMIZER_TEMPORARY,
            Context::Backward if l.outlived_run(born, end) => GRADIENT,
            Context::Backward => AUTOGRAD,
            // Made in forward and kept across an optimizer step: a cache, not an activation.
            Context::Forward if l.steps_before(end) > l.steps_before(born) => OTHER,
            Context::Forward => ACTIVATION,
            // Made outside any step phase, kept across an optimizer step, of a size that the
            // trace's gradients and optimizer states have.
            Context::Unknown
                if l.steps_before(end) > l.steps_before(born)
                    && self.parameter_sizes.contains(&live.size) =>
            {
                PARAMETER
            }
            // Made outside any module but kept for backward and freed there.
            Context::Unknown
                if l.phase_at(born) != Context::Backward
                    && end < l.entries.len()
                    && l.phase_at(end) == Context::Backward =>
            {
                ACTIVATION
            }
            _ => OTHER,
        }
    }

    /// Bytes and counts by category index, as a list most bytes first.
    fn listed(&self, sums: &[(u64, usize)]) -> Vec<CategoryBytes> {
        listed(&self.names, sums)
    }

    /// The allocations alive right after entry `at` (before the first entry for `None`), each
    /// with its category.
    pub fn classify(&mut self, at: Option<usize>) -> Classified {
        let live = self.lifetimes.live_at(at);
        self.classified(at, live)
    }

    /// `live`, the allocations alive just after `at`, each with its category.
    fn classified(&mut self, at: Option<usize>, live: Vec<(u64, Live)>) -> Classified {
        let members = live
            .into_iter()
            .map(|(addr, l)| (addr, l, self.category(addr, &l)))
            .collect();
        Classified { at, members }
    }

    /// The category names, indexed as `Classified` indexes them.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The categories alive right after each of `indices` (before the first entry for `None`),
    /// classifying each allocation once however many of the moments it is alive at.
    pub fn at_entries(&mut self, indices: &[Option<usize>]) -> Vec<Vec<CategoryBytes>> {
        let after_of = |i: Option<usize>| i.map_or(0, |i| i + 1);
        let mut order: Vec<usize> = (0..indices.len()).collect();
        order.sort_by_key(|&k| after_of(indices[k]));
        let after: Vec<usize> = order.iter().map(|&k| after_of(indices[k])).collect();
        // Per moment (in `after`'s order) and category: what starts being alive there, less
        // what stops; sums wrap, as `breakdown`'s do, and come out the same.
        let width = self.names.len();
        let mut changes = vec![(0u64, 0usize); (after.len() + 1) * width];
        for (addr, live, slots) in self.lifetimes.alive_at_any(&after) {
            let c = self.category(addr, &live);
            let (on, off) = (slots.start * width + c, slots.end * width + c);
            changes[on].0 = changes[on].0.wrapping_add(live.size);
            changes[on].1 = changes[on].1.wrapping_add(1);
            changes[off].0 = changes[off].0.wrapping_sub(live.size);
            changes[off].1 = changes[off].1.wrapping_sub(1);
        }
        let mut out = vec![Vec::new(); indices.len()];
        let mut sums = vec![(0u64, 0usize); width];
        for (slot, &k) in order.iter().enumerate() {
            for (sum, change) in sums.iter_mut().zip(&changes[slot * width..]) {
                sum.0 = sum.0.wrapping_add(change.0);
                sum.1 = sum.1.wrapping_add(change.1);
            }
            out[k] = self.listed(&sums);
        }
        out
    }

    /// The categories of the dump's allocated blocks, by block size: they sum to the dump's
    /// allocated bytes. Each is classified by its requested size, as the trace knows it.
    pub fn at_dump(&mut self, device: u32) -> Vec<CategoryBytes> {
        let mut sums = vec![(0u64, 0usize); self.names.len()];
        for (addr, live, size) in self.dump_live(device) {
            let c = self.category(addr, &live);
            sums[c].0 = sums[c].0.wrapping_add(size);
            sums[c].1 += 1;
        }
        self.listed(&sums)
    }

    /// The allocated blocks of the dump, with the lifetimes the trace gives them, and their
    /// block sizes.
    fn dump_live(&self, device: u32) -> Vec<(u64, Live, u64)> {
        self.snapshot
            .device_segments(device)
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| {
                let live = match self.lifetimes.final_live.get(b.address) {
                    Some(l) => l.with_size(b.requested_size),
                    None => Live::before_trace(b.requested_size, b.stack),
                };
                (b.address, live, b.size)
            })
            .collect()
    }
}

/// Bytes and counts by index in `names`, as a list most bytes first (equal amounts in the
/// order of `names`).
fn listed(names: &[String], sums: &[(u64, usize)]) -> Vec<CategoryBytes> {
    let mut out: Vec<CategoryBytes> = sums
        .iter()
        .enumerate()
        .filter(|(_, (_, count))| *count > 0)
        .map(|(i, &(bytes, count))| CategoryBytes {
            category: names[i].clone(),
            bytes,
            count,
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    out
}

/// The dump's private-pool segments of `device` by address, each with the category of its
/// pool (added to `names` as needed).
fn pool_ranges(
    snapshot: &Snapshot,
    device: u32,
    names: &mut Vec<String>,
) -> Vec<(u64, u64, usize)> {
    let segments: Vec<&crate::model::Segment> = snapshot
        .device_segments(device)
        .filter(|s| s.pool_id != (0, 0))
        .collect();
    let mut ids: Vec<(i64, i64)> = segments.iter().map(|s| s.pool_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out = Vec::new();
    for id in ids {
        let members: Vec<&crate::model::Segment> = segments
            .iter()
            .copied()
            .filter(|s| s.pool_id == id)
            .collect();
        let owner = crate::analysis::pool_owner::owner_of(&members, &snapshot.stacks);
        let name = pool_category(owner.as_deref());
        let index = match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name);
                names.len() - 1
            }
        };
        out.extend(
            members
                .iter()
                .map(|s| (s.address, s.address.saturating_add(s.total_size), index)),
        );
    }
    out.sort_unstable();
    out
}

/// Active memory over the whole trace split by category: every allocation as `Classifier`
/// sorts it (the built-in categories, then the rules' new ones), for `analysis::memory_series`.
pub fn grouping<'a>(snapshot: &'a Snapshot, device: u32, rules: &CategoryRules) -> Grouping<'a> {
    let mut c = Classifier::new(snapshot, device, rules);
    Grouping {
        stack_by: StackBy::Category,
        labels: c.names.clone(),
        group_of: Box::new(move |addr, live| c.category(addr, live)),
    }
}

/// The categories at the peak (`peak_entry`, `None` for the state before the trace), at the
/// OOM entry (when there is one) and at the dump, and the phases of the trace, from the
/// device's lifetimes; with the classifier that found them, for a caller that classifies
/// more (`view` at its cursor). The peak and the OOM are in requested bytes until
/// `add_allocated`.
pub fn categorize<'a>(
    snapshot: &'a Snapshot,
    device: u32,
    lifetimes: Lifetimes<'a>,
    peak_entry: Option<usize>,
    oom_entry: Option<usize>,
    rules: &CategoryRules,
) -> (Categories, Vec<Phase>, Classifier<'a>) {
    let mut c = Classifier::with_lifetimes(snapshot, device, lifetimes, rules);
    let at_peak = c.lifetimes.live_at(peak_entry);
    let unrecorded = unrecorded(&at_peak);
    let wrappers = wrappers::wrappers(&snapshot.stacks, &at_peak);
    let peak = c.classified(peak_entry, at_peak);
    let optimizer_temporaries = c.step_temporaries();
    let oom = oom_entry.map(|i| c.classify(Some(i)));
    let at_dump = c.at_dump(device);
    let phases = phases::phases(&mut c, snapshot, device);
    (
        Categories {
            at_peak: peak.requested(&c.names),
            at_peak_allocated: None,
            at_oom: oom.as_ref().map(|o| o.requested(&c.names)),
            at_oom_allocated: None,
            at_dump,
            optimizer_temporaries,
            unrecorded,
            wrappers,
            kept: Some(Box::new(Kept {
                names: c.names.clone(),
                peak,
                oom,
            })),
        },
        phases,
        c,
    )
}

/// One device's trace split for `plan fit`: the live bytes after each entry, and of them
/// those in the categories that grow with the batch; the categories alive at the moment a
/// caller picks from those series; and the category of every `alloc` and `oom` entry, so a
/// replay can scale those of some categories.
pub struct TraceSplit {
    /// Category names (`BUILTIN`, then the rules' new ones).
    pub names: Vec<String>,
    /// The moment picked: after this entry.
    pub moment: Option<usize>,
    /// Bytes by category (index in `names`) alive at `moment` (plus the failed request at an
    /// `oom` entry).
    pub bytes: Vec<u64>,
    /// For each entry of the trace, the category of what it allocated (`None` for entries
    /// that allocate nothing).
    pub entry_category: Vec<Option<usize>>,
    /// The last `oom` entry.
    pub oom: Option<usize>,
    /// The most bytes outside the growing categories alive at once over the trace.
    pub fixed_peak: u64,
}

/// Splits `device`'s trace by category: `grows(names)` says which categories grow;
/// `pick(totals, growing)` picks the moment to break down from the live bytes after each entry
/// and the growing part of them (an `oom` entry counts its failed request in both).
pub fn split_trace(
    snapshot: &Snapshot,
    device: u32,
    rules: &CategoryRules,
    grows: impl Fn(&str) -> bool,
    pick: impl Fn(&[u64], &[u64]) -> Option<usize>,
) -> TraceSplit {
    use crate::model::Action;
    let mut c = Classifier::new(snapshot, device, rules);
    let entries = c.lifetimes.entries;
    let growing_category: Vec<bool> = c.names.iter().map(|n| grows(n)).collect();
    let entry_category: Vec<Option<usize>> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            matches!(e.action(), Action::Alloc | Action::Oom)
                .then(|| c.category(e.addr().unwrap_or(0), &Live::from_alloc(e, i)))
        })
        .collect();
    let grows_at = |i: usize| entry_category[i].is_some_and(|k| growing_category[k]);
    let mut totals: Vec<u64> = c.lifetimes.totals_from(0).collect();
    let mut growing = Vec::with_capacity(entries.len());
    let mut alive: FxHashMap<u64, u64> = FxHashMap::default();
    let mut sum = 0u64;
    for (i, e) in entries.iter().enumerate() {
        match (e.action(), e.addr()) {
            (Action::Alloc, Some(addr)) if grows_at(i) => {
                alive.insert(addr, e.size);
                sum = sum.saturating_add(e.size);
            }
            (Action::FreeCompleted, Some(addr)) => {
                if let Some(size) = alive.remove(&addr) {
                    sum = sum.saturating_sub(size);
                }
            }
            _ => {}
        }
        let failed = if e.action() == Action::Oom {
            if let Some(t) = totals.get_mut(i) {
                *t = t.saturating_add(e.size);
            }
            if grows_at(i) {
                e.size
            } else {
                0
            }
        } else {
            0
        };
        growing.push(sum.saturating_add(failed));
    }
    let oom = entries.iter().rposition(|e| e.action() == Action::Oom);
    let fixed_peak = totals
        .iter()
        .zip(&growing)
        .map(|(t, g)| t.saturating_sub(*g))
        .max()
        .unwrap_or(0);
    let moment = pick(&totals, &growing);
    let mut bytes = vec![0u64; c.names.len()];
    for (addr, live) in c.lifetimes.live_at(moment) {
        let k = c.category(addr, &live);
        bytes[k] = bytes[k].saturating_add(live.size);
    }
    if let Some(i) = moment.filter(|&i| entries.get(i).is_some_and(|e| e.action() == Action::Oom)) {
        if let (Some(Some(k)), Some(e)) = (entry_category.get(i), entries.get(i)) {
            bytes[*k] = bytes[*k].saturating_add(e.size);
        }
    }
    TraceSplit {
        names: c.names.clone(),
        moment,
        bytes,
        entry_category,
        oom,
        fixed_peak,
    }
}
