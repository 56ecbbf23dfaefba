//! One account of each input: the moments it speaks of on one time axis, the figures at each
//! moment (one definition per word, `figures.rs`), both peaks, the pools and the findings with
//! their evidence. It is computed once, below every renderer: `analyze`, `diagnose`, the HTML
//! report, `view`, the plots, the comparison table and the MCP tools print what it holds and
//! never derive a figure or a verdict of their own (docs/json/account.md says what each word
//! means).

pub mod anomalies;
pub mod at;
mod build;
pub mod figures;
mod findings;
pub mod moments;
pub mod pools;
mod ranks;

pub use crate::analysis::categories::Figure;
pub use anomalies::Anomalies;
pub use at::{MomentQuery, Resolved};
pub use build::{build, build_keeping_classifiers, DeviceReport, InputAccount, Options};
pub use figures::Figures;
pub use findings::{Finding, FindingKind};
pub use moments::{Moment, MomentKind, TimeAxis};
pub use pools::Pool;

use crate::analysis::trace_states::TraceState;
use crate::analysis::DeviceAnalysis;
use crate::model::{Action, Segment, Snapshot, TraceEntry};
use crate::sim::replay::{Replayed, StateAt};
use serde::{Deserialize, Serialize};

/// At most this many moments of one kind (OOM retries, `empty_cache()` calls) are listed.
pub const MOMENTS_OF_A_KIND: usize = 64;

/// A peak: its bytes and its moment. `bytes` is `None` when the input cannot tell it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeakOf {
    pub bytes: Option<u64>,
    /// The trace entry that first reached it; `None` when it is the state before the trace
    /// (or not known).
    pub entry: Option<usize>,
    #[serde(rename = "seconds", with = "moments::seconds")]
    pub offset_us: Option<i64>,
}

/// The three peaks over the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peaks {
    /// Block bytes (`torch.cuda.max_memory_allocated()`), from the allocator replay.
    pub allocated: PeakOf,
    /// Requested bytes, allocated and pending free (`requested_bytes.peak` of
    /// `memory_stats()`), from the trace.
    pub requested: PeakOf,
    /// Reserved bytes (`torch.cuda.max_memory_reserved()`), from the trace.
    pub reserved: PeakOf,
}

/// The account of one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceAccount {
    /// Every moment, in trace order, the dump last.
    pub moments: Vec<Moment>,
    pub peaks: Peaks,
    /// The pools at the dump, the default pool first.
    pub pools: Vec<Pool>,
    pub findings: Vec<Finding>,
    /// Pending-free stalls, leak suspects and the lifetimes of freed blocks over the trace.
    pub anomalies: Anomalies,
}

impl DeviceAccount {
    /// The first moment of `kind`.
    pub fn moment(&self, kind: MomentKind) -> Option<&Moment> {
        self.moments.iter().find(|m| m.kind == kind)
    }

    /// The moment of `kind` at `entry`.
    pub fn moment_at(&self, kind: MomentKind, entry: usize) -> Option<&Moment> {
        self.moments
            .iter()
            .find(|m| m.kind == kind && m.entry == Some(entry))
    }

    /// The figures the account knows just after `entry` (`None`: the dump): those of every
    /// moment there, merged (they describe one instant, so they agree). `None` when no moment
    /// is there.
    pub fn figures_at(&self, entry: Option<usize>) -> Option<Figures> {
        let mut at = self.moments.iter().filter(|m| match entry {
            None => m.kind == MomentKind::Dump,
            Some(_) => m.entry == entry && m.kind != MomentKind::Dump,
        });
        let first = at.next()?.figures;
        Some(at.fold(first, |a, m| a.or(&m.figures)))
    }

    /// The figures the account holds for moment `m`: those of every moment at its entry,
    /// merged; its own for a moment without an entry (the dump, a peak before the trace).
    pub fn figures_of(&self, m: &Moment) -> Figures {
        match m.entry {
            Some(_) if m.kind != MomentKind::Dump => self.figures_at(m.entry).unwrap_or(m.figures),
            _ => m.figures,
        }
    }

    /// The state at the dump (every account has one).
    pub fn dump(&self) -> Figures {
        self.moment(MomentKind::Dump)
            .map(|m| m.figures)
            .unwrap_or_default()
    }

    /// Whether the device held any memory at any moment.
    pub fn holds_memory(&self) -> bool {
        self.moments
            .iter()
            .any(|m| m.figures.reserved_bytes.unwrap_or(0) > 0)
            || self.peaks.requested.bytes.unwrap_or(0) > 0
    }
}

/// What the account of a device is built from: its analysis (one replay of its trace, with
/// the allocator replay where one was made) and its part of the snapshot.
pub struct DeviceInput<'a> {
    pub analysis: &'a DeviceAnalysis,
    pub segments: &'a [&'a Segment],
    pub entries: &'a [TraceEntry],
    pub snapshot: &'a Snapshot,
    pub axis: TimeAxis,
}

/// Builds the account of one device, from its input and the walk of its trace for anomalies.
pub fn account_of(input: &DeviceInput<'_>, walked: anomalies::TracePass) -> DeviceAccount {
    let d = input.analysis;
    let states = &d.trace_states;
    let replayed = d.replayed.as_ref();
    let at = |entry: usize| input.axis.offset_of(input.entries, entry);
    let trace_known = peak_is_known(input.entries.len(), d.trace.peak_entry_index);
    let mut moments = Vec::new();

    // The peak of requested bytes, with the allocator's figures where the replay agrees.
    let requested_peak = trace_known.then(|| {
        let state = states.peak_requested.unwrap_or(TraceState {
            entry_index: usize::MAX,
            requested_bytes: d.trace.peak_active_bytes,
            reserved_bytes: d.trace.peak_reserved_bytes,
        });
        let entry = d.trace.peak_entry_index;
        let sim = replayed
            .map(|r| r.at_peak_requested)
            .filter(|s| agrees(s, entry, &state, replayed));
        Moment {
            kind: MomentKind::PeakRequested,
            entry,
            offset_us: entry.and_then(at),
            figures: Figures {
                requested_bytes: Some(d.trace.peak_active_bytes),
                reserved_bytes: entry.map(|_| state.reserved_bytes),
                ..sim.map(from_model).unwrap_or_default()
            },
        }
    });
    moments.extend(requested_peak);
    // The peak of allocated bytes: the allocator replay alone knows block sizes.
    // It is trusted where the replay reproduced the record up to it and found the trace's own
    // peak of requested bytes.
    let allocated_peak = replayed
        .filter(|_| trace_known)
        .filter(|r| r.trusted_at(r.at_peak_allocated.entry_index))
        .filter(|r| r.at_peak_requested.requested_bytes == d.trace.peak_active_bytes)
        .map(|r| {
            let s = r.at_peak_allocated;
            Moment {
                kind: MomentKind::PeakAllocated,
                entry: s.entry_index,
                offset_us: s.entry_index.and_then(at),
                figures: from_model(s),
            }
        });
    moments.extend(allocated_peak);
    let reserved_peak = trace_known.then(|| {
        let entry = states.peak_reserved.map(|s| s.entry_index);
        Moment {
            kind: MomentKind::PeakReserved,
            entry,
            offset_us: entry.and_then(at),
            figures: Figures {
                reserved_bytes: Some(d.trace.peak_reserved_bytes),
                requested_bytes: states.peak_reserved.map(|s| s.requested_bytes),
                ..Figures::default()
            },
        }
    });
    moments.extend(reserved_peak);
    // Each `oom` entry, with the allocator's figures at the one the replay reproduced.
    for state in states.at_ooms(input.entries) {
        let i = state.entry_index;
        let sim = replayed.and_then(|r| {
            r.oom
                .filter(|s| s.entry_index == Some(i) && r.trusted_at(Some(i)))
        });
        let mut figures = sim.map(from_model).unwrap_or_default();
        figures.requested_bytes = Some(state.requested_bytes);
        figures.reserved_bytes = Some(state.reserved_bytes);
        moments.push(Moment {
            kind: MomentKind::Oom,
            entry: Some(i),
            offset_us: at(i),
            figures,
        });
    }
    let retries = d.pressure.iter().flat_map(|p| &p.retries);
    for r in retries.take(MOMENTS_OF_A_KIND) {
        moments.push(trace_moment(
            MomentKind::OomRetry,
            r.entry_index,
            states,
            &at,
        ));
    }
    let empties = replayed.iter().flat_map(|r| &r.empty_cache_entries);
    for &i in empties.take(MOMENTS_OF_A_KIND) {
        moments.push(trace_moment(MomentKind::EmptyCache, i, states, &at));
    }
    moments.sort_by_key(|m| (m.entry.map_or(0, |e| e + 1), m.kind));
    let dump = Moment {
        kind: MomentKind::Dump,
        entry: None,
        offset_us: dump_time(input.entries).and_then(|t| Some(t - input.axis.origin_us?)),
        figures: Figures::of_layout(input.segments.iter().copied()),
    };
    moments.push(dump);
    let peak_of = |m: Option<&Moment>, bytes: fn(&Figures) -> Option<u64>| {
        m.map(|m| PeakOf {
            bytes: bytes(&m.figures),
            entry: m.entry,
            offset_us: m.offset_us,
        })
        .unwrap_or_default()
    };
    let find = |kind| moments.iter().find(|m: &&Moment| m.kind == kind);
    let peaks = Peaks {
        allocated: peak_of(find(MomentKind::PeakAllocated), |f| f.allocated_bytes),
        requested: peak_of(find(MomentKind::PeakRequested), |f| f.requested_bytes),
        reserved: peak_of(find(MomentKind::PeakReserved), |f| f.reserved_bytes),
    };
    let pools = pools::pools_of(input.segments, &input.snapshot.stacks);
    let mut account = DeviceAccount {
        moments,
        peaks,
        pools,
        findings: Vec::new(),
        anomalies: anomalies::anomalies(
            walked,
            input.entries,
            &input.snapshot.stacks,
            d.phases.as_deref().unwrap_or_default(),
        ),
    };
    account.findings = findings::findings(d, &account, input.entries.len());
    account
}

/// Whether a trace of `entries` entries tells the peak: it needs a trace, and a trace of one
/// entry that rose above nothing tells nothing.
pub(crate) fn peak_is_known(entries: usize, peak_entry: Option<usize>) -> bool {
    entries > 1 || (entries == 1 && peak_entry.is_some())
}

/// The model's figures as the account's.
fn from_model(s: StateAt) -> Figures {
    Figures {
        allocated_bytes: Some(s.allocated_bytes),
        requested_bytes: Some(s.requested_bytes),
        active_bytes: Some(s.active_bytes),
        reserved_bytes: Some(s.reserved_bytes),
        cached_free_bytes: Some(s.reserved_bytes.saturating_sub(s.active_bytes)),
        largest_free_block_bytes: Some(s.largest_free_block_bytes),
    }
}

/// Whether the model's state `s` is the allocator's at the trace's moment `entry`: same entry,
/// the replay trusted there, and the same requested and reserved bytes as the trace.
fn agrees(s: &StateAt, entry: Option<usize>, trace: &TraceState, r: Option<&Replayed>) -> bool {
    s.entry_index == entry
        && r.is_some_and(|r| r.trusted_at(entry))
        && s.requested_bytes == trace.requested_bytes
        && (entry.is_none() || s.reserved_bytes == trace.reserved_bytes)
}

/// A moment whose figures the trace alone gives (requested and reserved bytes).
fn trace_moment(
    kind: MomentKind,
    entry: usize,
    states: &crate::analysis::trace_states::TraceStates,
    at: &dyn Fn(usize) -> Option<i64>,
) -> Moment {
    let state = states.at(entry);
    Moment {
        kind,
        entry: Some(entry),
        offset_us: at(entry),
        figures: Figures {
            requested_bytes: state.map(|s| s.requested_bytes),
            reserved_bytes: state.map(|s| s.reserved_bytes),
            ..Figures::default()
        },
    }
}

/// When the dump was taken, as far as the trace says: the time of its closing `snapshot`
/// entries, if the trace ends with one.
fn dump_time(entries: &[TraceEntry]) -> Option<i64> {
    let last = entries.last()?;
    (last.action() == Action::Snapshot).then(|| last.time_us())?
}
