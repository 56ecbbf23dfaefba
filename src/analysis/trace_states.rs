//! The requested and reserved bytes just after the trace entries an account may speak of
//! (each `oom` entry, the first release of each burst of releases and the request after it
//! except in a recording, the first moment reserved memory peaked), taken from the one replay
//! the analysis makes.

use super::peak::FollowReplay;
use crate::model::{Action, Replay, TraceEntry};

/// Requested and reserved bytes just after one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceState {
    pub entry_index: usize,
    pub requested_bytes: u64,
    pub reserved_bytes: u64,
}

/// The states noted over one replay, in entry order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceStates {
    noted: Vec<TraceState>,
    /// The first entry at which reserved bytes reached their highest, with the state then;
    /// `None` when no entry rose above the state before the trace.
    pub peak_reserved: Option<TraceState>,
    /// Likewise for requested bytes (the peak `find_peak` finds).
    pub peak_requested: Option<TraceState>,
}

impl TraceStates {
    /// The state just after `entry_index`, if it was noted.
    pub fn at(&self, entry_index: usize) -> Option<TraceState> {
        let i = self
            .noted
            .binary_search_by_key(&entry_index, |s| s.entry_index)
            .ok()?;
        Some(self.noted[i])
    }

    /// The state just after each `oom` entry of `entries` (the trace these states were noted
    /// over, which notes every one), in order: found among the few noted, without a walk of
    /// the trace.
    pub fn at_ooms<'s>(
        &'s self,
        entries: &'s [TraceEntry],
    ) -> impl Iterator<Item = TraceState> + 's {
        (self.noted.iter().copied())
            .filter(|s| entries.get(s.entry_index).map(|e| e.action()) == Some(Action::Oom))
    }
}

/// Notes states while a replay runs (a `FollowReplay` of `find_peak`).
pub struct TraceStatesFollower<'a> {
    entries: &'a [TraceEntry],
    states: TraceStates,
    most_reserved: u64,
    most_requested: u64,
    /// Whether the previous entry was a release (a burst goes on).
    in_burst: bool,
    /// Whether the request after a burst is still to come.
    after_burst: bool,
    /// Whether bursts of releases are noted (see `new`).
    bursts: bool,
}

impl<'a> TraceStatesFollower<'a> {
    /// Notes the states of `oom` entries and the peaks, and those around each burst of
    /// releases with `bursts`: only an allocator replay names such a moment (an OOM retry, an
    /// `empty_cache()`), and a recording has none, while each of its `cudaFree` calls is a
    /// burst of its own.
    pub fn new(
        entries: &'a [TraceEntry],
        replay: &Replay<'a>,
        bursts: bool,
    ) -> TraceStatesFollower<'a> {
        TraceStatesFollower {
            entries,
            states: TraceStates::default(),
            most_reserved: replay.reserved(),
            most_requested: replay.live().total(),
            in_burst: false,
            after_burst: false,
            bursts,
        }
    }

    pub fn build(self) -> TraceStates {
        self.states
    }
}

impl<'a> FollowReplay<'a> for TraceStatesFollower<'a> {
    #[inline]
    fn step(&mut self, i: usize, replay: &Replay<'a>) {
        let action = self.entries[i].action();
        let release = matches!(action, Action::SegmentFree | Action::SegmentUnmap);
        let noted = match action {
            Action::Oom => true,
            _ if !self.bursts => false,
            _ if release => !self.in_burst,
            Action::Alloc => std::mem::take(&mut self.after_burst),
            _ => false,
        };
        if release {
            self.after_burst = true;
        }
        self.in_burst = release;
        let reserved = replay.reserved();
        let state = || TraceState {
            entry_index: i,
            requested_bytes: replay.live().total(),
            reserved_bytes: reserved,
        };
        if noted {
            self.states.noted.push(state());
        }
        if reserved > self.most_reserved {
            self.most_reserved = reserved;
            self.states.peak_reserved = Some(state());
        }
        let requested = replay.live().total();
        if requested > self.most_requested {
            self.most_requested = requested;
            self.states.peak_requested = Some(state());
        }
    }

    fn finish(&mut self, _: &Replay<'a>) {}
}
