//! The state each device's replays start from, worked out once per input and shared by every
//! replay of that device's trace, on whichever thread asks first.

use super::snapshot::Snapshot;
use super::state::{Replay, ReplayStart};
use std::sync::OnceLock;

/// The start of each device's replays of one snapshot, each worked out when first needed.
/// Holding the snapshot borrowed keeps it from changing under what was worked out.
pub struct ReplayStarts<'s> {
    snapshot: &'s Snapshot,
    starts: Vec<OnceLock<ReplayStart>>,
}

impl<'s> ReplayStarts<'s> {
    /// Nothing worked out yet.
    pub fn new(snapshot: &'s Snapshot) -> ReplayStarts<'s> {
        ReplayStarts {
            snapshot,
            starts: (0..snapshot.timeline.device_count())
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// The snapshot.
    pub fn snapshot(&self) -> &'s Snapshot {
        self.snapshot
    }

    /// A replay of `device`'s trace from the state before its first entry (as `Replay::new`
    /// makes it). Another thread asking for the same device meanwhile waits for the one
    /// working it out.
    pub fn replay(&self, device: u32) -> Replay<'s> {
        let entries = self.snapshot.timeline.device(device as usize);
        let start = || start_of(self.snapshot, device);
        match self.starts.get(device as usize) {
            Some(cell) => Replay::from_start(entries, cell.get_or_init(start)),
            // A device with segments but no trace.
            None => Replay::from_start(entries, &start()),
        }
    }
}

/// A replay of `device`'s trace from the state before its first entry, worked out for this
/// replay alone (`ReplayStarts` shares it between replays of one input).
pub fn replay_device(snapshot: &Snapshot, device: u32) -> Replay<'_> {
    let entries = snapshot.timeline.device(device as usize);
    Replay::from_start(entries, &start_of(snapshot, device))
}

/// The state before the first entry of `device`'s trace, without looking for allocations made
/// before the trace where the timeline says there were none.
fn start_of(snapshot: &Snapshot, device: u32) -> ReplayStart {
    let entries = snapshot.timeline.device(device as usize);
    let segments = snapshot.device_segments(device);
    if snapshot.timeline.starts_empty() {
        ReplayStart::of_empty(entries, segments)
    } else {
        ReplayStart::of(entries, segments)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, SnapshotFormat, StackTable, StreamIndex, Timeline, TraceEntry};

    #[test]
    fn a_shared_start_replays_as_a_fresh_replay_does() {
        let e = |action, addr, size| TraceEntry::new(action, Some(addr), size, StreamIndex(0));
        // The free of 0x10 ends an allocation made before the trace.
        let entries = vec![
            e(Action::Alloc, 0x20, 8),
            e(Action::FreeCompleted, 0x10, 4),
            e(Action::FreeCompleted, 0x20, 8),
        ];
        let snapshot = Snapshot {
            format: SnapshotFormat::History,
            segments: Vec::new(),
            timeline: Timeline::new(entries, vec![0..0, 0..3]),
            stacks: StackTable::default(),
            settings: None,
            annotations: Vec::new(),
        };
        let starts = ReplayStarts::new(&snapshot);
        for _ in 0..2 {
            let mut shared = starts.replay(1);
            let mut fresh = Replay::new(snapshot.timeline.device(1), []);
            assert_eq!(shared.live().total(), 4);
            while let Some(i) = fresh.step() {
                assert_eq!(shared.step(), Some(i));
                assert_eq!(shared.live().total(), fresh.live().total());
                assert_eq!(shared.ended(), fresh.ended());
            }
            assert_eq!(shared.step(), None);
        }
        assert_eq!(starts.replay(5).live().total(), 0, "a device with no trace");
    }
}
