//! Named ranges of a trace and what peaked in each: the `record_function` ranges PyTorch
//! records as `external_annotations` (START/END pairs, 2.5+), else the forward, backward and
//! optimizer runs the stacks show, numbered by iteration (each optimizer step ends one).

use super::context::Context;
use super::{CategoryBytes, Classifier};
use crate::model::Snapshot;
use serde::Serialize;

/// Phases kept per device.
const MOST: usize = 256;
/// Categories listed per phase.
const TOP_CATEGORIES: usize = 3;

/// One named range of the trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Phase {
    pub name: String,
    /// `annotation` (a `record_function` range) or `stacks` (a run of forward, backward or
    /// optimizer allocations).
    pub source: &'static str,
    /// First entry of the range and the entry after its last.
    pub start_entry: usize,
    pub end_entry: usize,
    /// Live bytes when the range began.
    pub at_entry_bytes: u64,
    /// The most live bytes inside the range (`at_entry_bytes` for a range without entries).
    pub peak_bytes: u64,
    pub peak_entry_index: Option<usize>,
    /// The largest categories alive at the range's peak.
    pub top_categories: Vec<CategoryBytes>,
}

/// The phases of one device's trace (none without a trace).
pub(super) fn phases(c: &mut Classifier<'_>, snapshot: &Snapshot, device: u32) -> Vec<Phase> {
    if c.lifetimes.entries.is_empty() {
        return Vec::new();
    }
    let mut ranges = annotated(c, snapshot, device);
    let source = if ranges.is_empty() {
        ranges = from_stacks(c);
        "stacks"
    } else {
        "annotation"
    };
    ranges.truncate(MOST);
    let mut phases: Vec<Phase> = ranges
        .into_iter()
        .map(|(name, start, end)| measure(c, name, source, start, end))
        .collect();
    // What was alive at each phase's peak (before it, for a phase without entries).
    let at: Vec<Option<usize>> = phases
        .iter()
        .map(|p| p.peak_entry_index.or(p.start_entry.checked_sub(1)))
        .collect();
    for (phase, mut top) in phases.iter_mut().zip(c.at_entries(&at)) {
        top.truncate(TOP_CATEGORIES);
        phase.top_categories = top;
    }
    phases
}

/// `record_function` START/END pairs of this device, as entry ranges found by time.
fn annotated(c: &Classifier<'_>, snapshot: &Snapshot, device: u32) -> Vec<(String, usize, usize)> {
    let entries = c.lifetimes.entries;
    let first_at = |t: i64, inclusive: bool| {
        entries.partition_point(|e| {
            e.time_us()
                .is_some_and(|et| if inclusive { et < t } else { et <= t })
        })
    };
    let mut open: Vec<(&str, i64)> = Vec::new();
    let mut ranges = Vec::new();
    for a in &snapshot.annotations {
        if a.device.is_some_and(|d| d != device) {
            continue;
        }
        let (Some(stage), Some(name), Some(t)) = (a.stage.as_deref(), a.name.as_deref(), a.time_us)
        else {
            continue;
        };
        match stage {
            "START" => open.push((name, t)),
            "END" => {
                if let Some(i) = open.iter().rposition(|(n, _)| *n == name) {
                    let (_, start) = open.remove(i);
                    let (s, e) = (first_at(start, true), first_at(t, false));
                    ranges.push((name.to_string(), s, e.max(s)));
                }
            }
            _ => {}
        }
    }
    ranges.sort_by_key(|r| r.1);
    ranges
}

/// Runs of one phase (forward, backward, optimizer step, parameter set-up) in the trace.
fn from_stacks(c: &Classifier<'_>) -> Vec<(String, usize, usize)> {
    let l = &c.lifetimes;
    l.runs()
        .filter(|&(start, end, _)| end > start)
        .filter_map(|(start, end, phase)| {
            let what = match phase {
                Context::Forward => "forward",
                Context::Backward => "backward",
                Context::Optimizer => "optimizer step",
                Context::Parameter => "parameter set-up",
                _ => return None,
            };
            let iteration = l.steps_before(start) + 1;
            Some((format!("{what} (iteration {iteration})"), start, end))
        })
        // Only the first are kept: the rest are not named.
        .take(MOST)
        .collect()
}

/// A range's figures; its `top_categories` are filled by the caller.
fn measure(
    c: &Classifier<'_>,
    name: String,
    source: &'static str,
    start: usize,
    end: usize,
) -> Phase {
    let l = &c.lifetimes;
    let at_entry_bytes = match start.checked_sub(1) {
        Some(i) => l.total_after(i),
        None => l.before_total,
    };
    // The first entry with the most bytes.
    let peak = (start..end)
        .zip(l.totals_from(start))
        .max_by_key(|&(i, total)| (total, std::cmp::Reverse(i)));
    let peak_bytes = peak.map_or(at_entry_bytes, |(_, total)| total);
    let peak = peak.map(|(i, _)| i);
    Phase {
        name,
        source,
        start_entry: start,
        end_entry: end,
        at_entry_bytes,
        peak_bytes,
        peak_entry_index: peak,
        top_categories: Vec::new(),
    }
}
