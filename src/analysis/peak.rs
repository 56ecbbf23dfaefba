//! The peak of active memory over a trace and what was alive at it.

use crate::model::{LiveSet, Replay, ReplayIssue, Segment, TraceEntry};

/// The highest total of live requested bytes over a device's trace, and of reserved bytes.
#[derive(Clone, Debug)]
pub struct Peak {
    pub bytes: u64,
    /// Entry at which the peak is first reached; `None` when no entry rises above the level
    /// alive before the trace.
    pub entry_index: Option<usize>,
    /// The allocations alive at the peak.
    pub live: LiveSet,
    /// Live requested bytes before the first entry.
    pub before_trace_bytes: u64,
    /// The highest reserved total (segment bytes) over the trace, the state before it included.
    pub reserved_bytes: u64,
    /// The first contradiction in the trace and the number of them.
    pub first_issue: Option<ReplayIssue>,
    pub issue_count: usize,
}

/// Replays the trace twice: once to find the peak, once more to stop there.
pub fn find_peak(entries: &[TraceEntry], segments: &[&Segment]) -> Peak {
    let start = Replay::new(entries, segments.iter().copied());
    let mut replay = start.clone();
    let before_trace_bytes = replay.live().total();
    let mut best = before_trace_bytes;
    let mut best_index = None;
    let mut most_reserved = replay.reserved();
    while let Some(i) = replay.step() {
        most_reserved = most_reserved.max(replay.reserved());
        let total = replay.live().total();
        if total > best {
            best = total;
            best_index = Some(i);
        }
    }
    let (first_issue, issue_count) = {
        let (first, count) = replay.issues();
        (first.cloned(), count)
    };
    let mut again = start;
    if let Some(i) = best_index {
        again.run_through(i);
    }
    let live = again.live().clone();
    Peak {
        bytes: best,
        entry_index: best_index,
        live,
        before_trace_bytes,
        reserved_bytes: most_reserved,
        first_issue,
        issue_count,
    }
}
