//! The peak of active memory over a trace and what was alive at it.

use super::ended_at::{EndedAt, NEVER};
use crate::model::{Action, Live, LiveSet, Replay, ReplayIssue, Segment, TraceEntry};
use rustc_hash::FxHashMap;

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

/// Something that follows the replay `find_peak` makes, so that other analyses share it.
pub trait FollowReplay<'a> {
    /// After entry `i` has been applied.
    fn step(&mut self, i: usize, replay: &Replay<'a>);
    /// After the last entry.
    fn finish(&mut self, replay: &Replay<'a>);
}

impl<'a> FollowReplay<'a> for () {
    #[inline]
    fn step(&mut self, _: usize, _: &Replay<'a>) {}
    fn finish(&mut self, _: &Replay<'a>) {}
}

/// Two followers of one replay.
impl<'a, A: FollowReplay<'a>, B: FollowReplay<'a>> FollowReplay<'a> for (A, B) {
    #[inline]
    fn step(&mut self, i: usize, replay: &Replay<'a>) {
        self.0.step(i, replay);
        self.1.step(i, replay);
    }
    fn finish(&mut self, replay: &Replay<'a>) {
        self.0.finish(replay);
        self.1.finish(replay);
    }
}

/// When each allocation of a replayed trace ended, noted step by step.
pub struct Endings {
    /// For each `alloc` entry, the entry that ended it (`NEVER` while alive).
    pub ended_at: EndedAt,
    /// For each allocation alive before the trace that ended, the entry that first ended it.
    pub before_ended: FxHashMap<u64, u32>,
}

impl Endings {
    /// Room for `entries`, none of them noted yet.
    pub fn new(entries: &[TraceEntry]) -> Endings {
        Endings {
            ended_at: EndedAt::with_capacity(entries.len()),
            before_ended: FxHashMap::default(),
        }
    }

    /// Notes entry `i`, just applied by `replay` (every entry is noted, in order), and what
    /// it ended.
    #[inline(always)]
    pub fn note(&mut self, i: usize, replay: &Replay<'_>) {
        self.ended_at
            .push(replay.entries()[i].action() == Action::Alloc);
        if let Some((addr, ended)) = replay.ended() {
            let at = u32::try_from(i).unwrap_or(NEVER);
            match ended.born() {
                Some(born) => self.ended_at.set(born, at),
                None => {
                    self.before_ended.entry(addr).or_insert(at);
                }
            }
        }
    }
}

/// Replays the trace once, noting when each allocation ended, and rebuilds the live set at
/// the peak from those notes instead of replaying again.
pub fn find_peak(entries: &[TraceEntry], segments: &[&Segment]) -> Peak {
    find_peak_followed(Replay::new(entries, segments.iter().copied()), |_| ()).0
}

/// `find_peak` over `replay` (not yet stepped), with a follower (made by `follow` from the
/// state before the first entry) shown every step of the same replay; also returns when each
/// allocation ended.
pub fn find_peak_followed<'a, F: FollowReplay<'a>>(
    mut replay: Replay<'a>,
    follow: impl FnOnce(&Replay<'a>) -> F,
) -> (Peak, F, Endings) {
    let entries = replay.entries();
    let mut follower = follow(&replay);
    let before: Vec<(u64, Live)> = replay.live().iter().map(|(a, l)| (a, *l)).collect();
    let before_trace_bytes = replay.live().total();
    let mut endings = Endings::new(entries);
    let mut best = before_trace_bytes;
    let mut best_index = None;
    let mut most_reserved = replay.reserved();
    while let Some(i) = replay.step() {
        endings.note(i, &replay);
        most_reserved = most_reserved.max(replay.reserved());
        let total = replay.live().total();
        if total > best {
            best = total;
            best_index = Some(i);
        }
        follower.step(i, &replay);
    }
    follower.finish(&replay);
    let (first_issue, issue_count) = {
        let (first, count) = replay.issues();
        (first.cloned(), count)
    };
    let live = match best_index {
        None => before.into_iter().collect(),
        Some(peak) => {
            let older = before.into_iter().filter(|(addr, _)| {
                (endings.before_ended.get(addr)).is_none_or(|&end| end as usize > peak)
            });
            let made = endings.ended_at.alive_after_entry(entries, peak);
            older.chain(made).collect()
        }
    };
    let peak = Peak {
        bytes: best,
        entry_index: best_index,
        live,
        before_trace_bytes,
        reserved_bytes: most_reserved,
        first_issue,
        issue_count,
    };
    (peak, follower, endings)
}
