//! A moment a user names (`analyze --at`, `tree --at`): a trace entry, a time on the input's
//! axis or one of the account's moments, resolved on one device's account; and the state
//! there (the account's figures, the categories and the sites alive), computed below every
//! renderer.

use super::{DeviceAccount, Figures, MomentKind, TimeAxis};
use crate::analysis::categories::{CategoryBytes, Classifier};
use crate::analysis::{top_sites, Site};
use crate::model::{replay_device, Snapshot, TraceEntry};
use crate::sim::block_sizes::BlockSizes;
use serde::Serialize;

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MomentQuery {
    /// One of the account's moments: a peak, the (last) OOM, the dump.
    Named(MomentKind),
    /// Just after this trace entry.
    Entry(usize),
    /// Just after the last trace entry at or before this many seconds on the input's axis.
    Seconds(f64),
}

/// What the grammar accepts, for error lines.
pub const MOMENT_FORMS: &str =
    "peak, peak-allocated, peak-reserved, oom, dump, an entry (120) or a time in seconds (2.5s)";

impl MomentQuery {
    /// Reads `peak` (the peak of requested bytes), `peak-requested`, `peak-allocated`,
    /// `peak-reserved`, `oom`, `dump`, an entry (`120`, `entry 120`) or a time (`2.5s`,
    /// `time 2.5`).
    pub fn parse(text: &str) -> Result<MomentQuery, String> {
        let t = text.trim().to_ascii_lowercase().replace('_', "-");
        let named = match t.as_str() {
            "peak" | "peak-requested" => Some(MomentKind::PeakRequested),
            "peak-allocated" => Some(MomentKind::PeakAllocated),
            "peak-reserved" => Some(MomentKind::PeakReserved),
            "oom" => Some(MomentKind::Oom),
            "dump" => Some(MomentKind::Dump),
            _ => None,
        };
        if let Some(kind) = named {
            return Ok(MomentQuery::Named(kind));
        }
        let (word, rest) = t
            .split_once([' ', ':', '='])
            .map_or(("", t.as_str()), |(w, r)| (w, r.trim()));
        let entry = rest.parse::<usize>().ok();
        let seconds = rest
            .strip_suffix('s')
            .unwrap_or(rest)
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0);
        match (word, entry, seconds) {
            ("" | "entry", Some(n), _) => Ok(MomentQuery::Entry(n)),
            ("", _, Some(s)) if rest.ends_with('s') => Ok(MomentQuery::Seconds(s)),
            ("time", _, Some(s)) => Ok(MomentQuery::Seconds(s)),
            _ => Err(format!("{text:?}: expected {MOMENT_FORMS}")),
        }
    }
}

/// A moment found on one device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    /// The account's moment there; `None` for an entry or a time the account has no name for.
    pub kind: Option<MomentKind>,
    /// The trace entry just after which it is; `None` for the dump and for a peak that is the
    /// state before the first entry.
    pub entry: Option<usize>,
    /// Microseconds on the input's axis, when the trace has times.
    pub offset_us: Option<i64>,
    /// The figures the account holds for that moment; `None` at an entry where it has none.
    pub figures: Option<Figures>,
}

impl Resolved {
    pub fn is_dump(&self) -> bool {
        self.kind == Some(MomentKind::Dump)
    }
}

impl DeviceAccount {
    /// Finds `query` on this device, whose trace is `entries`; an error line says why a moment
    /// is not there.
    pub fn resolve(
        &self,
        query: MomentQuery,
        entries: &[TraceEntry],
        axis: TimeAxis,
    ) -> Result<Resolved, String> {
        let at_entry = |i: usize| Resolved {
            kind: None,
            entry: Some(i),
            offset_us: axis.offset_of(entries, i),
            figures: self.figures_at(Some(i)),
        };
        match query {
            MomentQuery::Named(kind) => {
                // The last OOM, as `analyze`'s `oom` names it; the first of any other kind.
                let found = if kind == MomentKind::Oom {
                    self.moments.iter().rev().find(|m| m.kind == kind)
                } else {
                    self.moment(kind)
                };
                let Some(m) = found else {
                    return Err(match kind {
                        MomentKind::Oom => "the trace has no out-of-memory error".to_string(),
                        MomentKind::PeakAllocated if !entries.is_empty() => {
                            "the peak of allocated bytes is not known (the allocator replay \
                             did not reproduce the trace up to it); try peak"
                                .to_string()
                        }
                        _ => "the input has no trace, so no peak; try dump".to_string(),
                    });
                };
                Ok(Resolved {
                    kind: Some(kind),
                    entry: m.entry,
                    offset_us: m.offset_us,
                    figures: Some(self.figures_of(m)),
                })
            }
            _ if entries.is_empty() => Err("the input has no trace; try dump".to_string()),
            MomentQuery::Entry(n) if n < entries.len() => Ok(at_entry(n)),
            MomentQuery::Entry(n) => Err(format!(
                "entry {n} is past the end of the trace ({} entries)",
                entries.len()
            )),
            MomentQuery::Seconds(_) if axis.origin_us.is_none() => {
                Err("the trace has no times; give an entry".to_string())
            }
            MomentQuery::Seconds(s) => {
                let us = (s * 1e6).round() as i64;
                // Entries without a time belong with the one before them.
                let found = (0..entries.len())
                    .take_while(|&i| axis.offset_of(entries, i).is_none_or(|o| o <= us))
                    .last();
                found
                    .map(at_entry)
                    .ok_or_else(|| format!("no trace entry at or before {s} s"))
            }
        }
    }

    /// The moment a tree of live memory shows by default: the last OOM, else the peak of
    /// requested bytes, else the dump.
    pub fn oom_else_peak(&self) -> MomentQuery {
        let kind = [MomentKind::Oom, MomentKind::PeakRequested]
            .into_iter()
            .find(|k| self.moment(*k).is_some())
            .unwrap_or(MomentKind::Dump);
        MomentQuery::Named(kind)
    }

    /// The figures just after `entry` (`None`: the dump) as far as the account and the trace
    /// tell them: the account's where it has a moment there, and else the trace's `requested`
    /// and `reserved` bytes, which a replay of the trace knows at any entry; the block figures
    /// stay `None` (not known) where the account has no moment.
    pub fn figures_with_trace(
        &self,
        entry: Option<usize>,
        requested: u64,
        reserved: u64,
    ) -> Figures {
        let known = self.figures_at(entry).unwrap_or_default();
        Figures {
            requested_bytes: Some(known.requested_bytes.unwrap_or(requested)),
            reserved_bytes: Some(known.reserved_bytes.unwrap_or(reserved)),
            ..known
        }
    }
}

/// The state of one device at a resolved moment.
#[derive(Clone, Debug, Serialize)]
pub struct StateAt {
    /// The account's figures there (see `DeviceAccount::figures_with_trace`).
    pub figures: Figures,
    pub live_allocations: usize,
    /// The categories alive there, most bytes first: requested bytes at an entry, block bytes
    /// at the dump (as the account's `categories` count them).
    pub categories: Vec<CategoryBytes>,
    /// The categories in block bytes of the allocations not freed by then: they add up to
    /// `figures.allocated_bytes`; `None` where that is not known.
    pub allocated_categories: Option<Vec<CategoryBytes>>,
    /// The sites holding the most live bytes there.
    pub top_sites: Vec<Site>,
}

/// The state of `device` (whose account is `account`, and the blocks of whose allocator replay
/// are `blocks`) at `at`, with `top` sites; `classifier` sorts the device's allocations into
/// categories (the account's, kept by `build_keeping_classifiers`, or a new one).
pub fn state_at(
    snapshot: &Snapshot,
    device: u32,
    account: &DeviceAccount,
    blocks: Option<&BlockSizes>,
    at: &Resolved,
    classifier: &mut Classifier<'_>,
    top: usize,
) -> StateAt {
    let entries = snapshot.timeline.device(device as usize);
    let mut replay = replay_device(snapshot, device);
    let through = if at.is_dump() {
        entries.len().checked_sub(1)
    } else {
        at.entry
    };
    if let Some(i) = through {
        replay.run_through(i);
    }
    let figures = match at.figures {
        // A peak before the trace or the dump: the moment's own figures.
        Some(f) if at.entry.is_none() => f,
        _ => account.figures_with_trace(at.entry, replay.live().total(), replay.reserved()),
    };
    let (categories, allocated_categories) = if at.is_dump() {
        let dump = classifier.at_dump(device);
        (dump.clone(), Some(dump))
    } else {
        let live = classifier.classify(at.entry);
        let names = classifier.names();
        let allocated =
            (figures.allocated_bytes.zip(blocks)).and_then(|(a, b)| live.allocated(names, b, a));
        (live.requested(names), allocated)
    };
    StateAt {
        figures,
        live_allocations: replay.live().len(),
        categories,
        allocated_categories,
        top_sites: top_sites(&snapshot.stacks, replay.live(), top),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grammar() {
        let ok = |t: &str| MomentQuery::parse(t).expect(t);
        assert_eq!(ok("peak"), MomentQuery::Named(MomentKind::PeakRequested));
        assert_eq!(
            ok("Peak-Allocated"),
            MomentQuery::Named(MomentKind::PeakAllocated)
        );
        assert_eq!(
            ok("peak_reserved"),
            MomentQuery::Named(MomentKind::PeakReserved)
        );
        assert_eq!(ok("oom"), MomentQuery::Named(MomentKind::Oom));
        assert_eq!(ok("dump"), MomentQuery::Named(MomentKind::Dump));
        assert_eq!(ok("120"), MomentQuery::Entry(120));
        assert_eq!(ok("entry 7"), MomentQuery::Entry(7));
        assert_eq!(ok("2.5s"), MomentQuery::Seconds(2.5));
        assert_eq!(ok("3s"), MomentQuery::Seconds(3.0));
        assert_eq!(ok("time 1.5"), MomentQuery::Seconds(1.5));
        for bad in [
            "noon",
            "",
            "-1",
            "2.5",
            "entry 2.5",
            "-3s",
            "peak 2",
            "nans",
        ] {
            assert!(MomentQuery::parse(bad).is_err(), "{bad:?} is refused");
        }
    }
}
