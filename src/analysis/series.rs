//! Memory over time: active bytes (split into groups: allocation sites or categories) and
//! reserved bytes after each trace entry, observed on the one `model::Replay`, downsampled for
//! plotting. Memory changes in steps, so a series is a step function: each point's values hold
//! until the next point.

use super::sites::site_of;
use crate::model::{Action, Live, Replay, Snapshot, StackId};
use rustc_hash::FxHashMap;

/// What active memory is split by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackBy {
    /// The top allocation sites, then "other sites".
    Site,
    /// The categories of `analysis::categories`.
    Category,
}

/// The group of a live allocation at an address: an index in `Grouping::labels`.
pub type GroupOf<'g> = Box<dyn FnMut(u64, &Live) -> usize + 'g>;

/// How active memory is split: the groups' labels (stacked bottom first) and the group of each
/// live allocation.
pub struct Grouping<'g> {
    pub stack_by: StackBy,
    pub labels: Vec<String>,
    pub group_of: GroupOf<'g>,
}

/// The last group of a split by site: every site not named.
pub const OTHER_SITES: &str = "other sites";

/// A split by `sites`, then `OTHER_SITES`.
pub fn by_site<'s>(snapshot: &'s Snapshot, sites: &[String]) -> Grouping<'s> {
    let named = sites.to_vec();
    let mut known: FxHashMap<Option<StackId>, usize> = FxHashMap::default();
    let group_of = move |_: u64, live: &Live| {
        *known.entry(live.stack).or_insert_with(|| {
            let label = site_of(&snapshot.stacks, live.stack);
            named
                .iter()
                .position(|s| *s == label)
                .unwrap_or(named.len())
        })
    };
    let mut labels = sites.to_vec();
    labels.push(OTHER_SITES.to_string());
    Grouping {
        stack_by: StackBy::Site,
        labels,
        group_of: Box::new(group_of),
    }
}

/// What the x values of a series count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    /// Seconds from the earliest trace entry of any device in the file (every entry of this
    /// device has a time): one origin for all devices.
    Seconds,
    /// Entries replayed: the state after entry `i` is at `i + 1`, the state before the first
    /// entry at 0 (the trace has no times).
    EntriesReplayed,
}

/// The state after one trace entry (the first point: before the first entry), held until the
/// next point.
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesPoint {
    pub x: f64,
    /// Live requested bytes.
    pub active: u64,
    /// Reserved (segment) bytes; at a downsampled bucket's highest point, the bucket's highest.
    pub reserved: u64,
    /// `active` split into the groups of `MemorySeries::groups`, in their order.
    pub by_group: Vec<u64>,
}

/// A marked entry: where it is on the x axis and the bytes it is about.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mark {
    pub entry_index: usize,
    pub x: f64,
    pub bytes: u64,
}

/// One device's memory over its trace.
#[derive(Clone, Debug)]
pub struct MemorySeries {
    pub x_axis: XAxis,
    pub stack_by: StackBy,
    /// The labels of the groups active memory is split into, stacked bottom first.
    pub groups: Vec<String>,
    pub points: Vec<SeriesPoint>,
    /// Where active memory first reaches its highest value (none when no entry rises above
    /// the level alive before the trace).
    pub peak: Option<Mark>,
    /// The last `oom` entry; `bytes` is the request that failed.
    pub oom: Option<Mark>,
    /// Entries in the trace (points may be fewer).
    pub entries: usize,
}

/// Replays a device's trace and records the memory before the first entry and after each
/// entry, split by `grouping` (each allocation's group is asked once), keeping at most `max_points` points: the trace is cut into runs of entries and each
/// run keeps its entry of highest active memory (with the run's highest reserved) and its last
/// entry, so peaks survive and the value held after the run is the true one.
pub fn memory_series(
    snapshot: &Snapshot,
    device: u32,
    grouping: Grouping,
    max_points: usize,
) -> MemorySeries {
    let Grouping {
        stack_by,
        labels,
        mut group_of,
    } = grouping;
    let entries = snapshot.timeline.device(device as usize);
    let timed = !entries.is_empty() && entries.iter().all(|e| e.time_us().is_some());
    let x_axis = if timed {
        XAxis::Seconds
    } else {
        XAxis::EntriesReplayed
    };
    let origin = time_origin(snapshot);
    let x_of = |i: usize| match (x_axis, origin, entries[i].time_us()) {
        (XAxis::Seconds, Some(t0), Some(t)) => (t - t0) as f64 / 1e6,
        _ => (i + 1) as f64,
    };
    // The group of each live allocation, by address.
    let mut group: FxHashMap<u64, usize> = FxHashMap::default();
    let mut replay = Replay::new(entries, snapshot.device_segments(device));
    let mut by_group = vec![0u64; labels.len()];
    for (addr, live) in replay.live().iter() {
        let g = group_of(addr, live);
        group.insert(addr, g);
        by_group[g] = by_group[g].wrapping_add(live.size);
    }
    let mut best = replay.live().total();
    let mut peak = None;
    let runs = (max_points / 2).max(1);
    let run = entries.len().div_ceil(runs).max(1);
    let mut points: Vec<SeriesPoint> = Vec::with_capacity(entries.len().min(max_points) + 1);
    // Without a trace there is nothing over time, not even the state before it.
    if !entries.is_empty() {
        // Before the first entry: at its time, or at 0 entries replayed.
        let x = match x_axis {
            XAxis::Seconds => x_of(0),
            XAxis::EntriesReplayed => 0.0,
        };
        points.push(SeriesPoint {
            x,
            active: best,
            reserved: replay.reserved(),
            by_group: by_group.clone(),
        });
    }
    // The current run's highest point (by active) and its last point, with their indices.
    let mut high: Option<(usize, SeriesPoint)> = None;
    let mut last: Option<(usize, SeriesPoint)> = None;
    let mut run_reserved = 0u64;
    loop {
        let index = replay.position();
        let Some(entry) = entries.get(index) else {
            break;
        };
        if index.is_multiple_of(run) {
            end_run(&mut points, high.take(), last.take());
            run_reserved = 0;
        }
        let addr = entry.addr().unwrap_or(0);
        let touches_live = matches!(entry.action, Action::Alloc | Action::FreeCompleted);
        if let Some(old) = touches_live
            .then(|| replay.live().get(addr).copied())
            .flatten()
        {
            let g = group.remove(&addr).unwrap_or(0);
            by_group[g] = by_group[g].wrapping_sub(old.size);
        }
        replay.step();
        if let Some(new) = touches_live
            .then(|| replay.live().get(addr).copied())
            .flatten()
        {
            let g = group_of(addr, &new);
            group.insert(addr, g);
            by_group[g] = by_group[g].wrapping_add(new.size);
        }
        let active = replay.live().total();
        if active > best {
            best = active;
            peak = Some(Mark {
                entry_index: index,
                x: x_of(index),
                bytes: active,
            });
        }
        run_reserved = run_reserved.max(replay.reserved());
        let point = SeriesPoint {
            x: x_of(index),
            active,
            reserved: replay.reserved(),
            by_group: by_group.clone(),
        };
        if high.as_ref().is_none_or(|(_, h)| active > h.active) {
            high = Some((index, point.clone()));
        }
        if let Some((_, h)) = high.as_mut() {
            h.reserved = run_reserved;
        }
        last = Some((index, point));
    }
    end_run(&mut points, high, last);
    let oom = entries
        .iter()
        .rposition(|e| e.action == Action::Oom)
        .map(|i| Mark {
            entry_index: i,
            x: x_of(i),
            bytes: entries[i].size,
        });
    MemorySeries {
        x_axis,
        stack_by,
        groups: labels,
        points,
        peak,
        oom,
        entries: entries.len(),
    }
}

/// The time all devices' series count from: the earliest `time_us` of any trace entry.
pub fn time_origin(snapshot: &Snapshot) -> Option<i64> {
    (0..snapshot.timeline.device_count())
        .flat_map(|d| snapshot.timeline.device(d))
        .filter_map(|e| e.time_us())
        .min()
}

/// Adds a finished run's points: its highest, then its last when that is another entry.
fn end_run(
    points: &mut Vec<SeriesPoint>,
    high: Option<(usize, SeriesPoint)>,
    last: Option<(usize, SeriesPoint)>,
) {
    let high_index = high.as_ref().map(|(i, _)| *i);
    points.extend(high.map(|(_, p)| p));
    points.extend(last.filter(|(i, _)| Some(*i) != high_index).map(|(_, p)| p));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        AllocatorSettings, Frame, Segment, SnapshotFormat, StackTable, StreamIndex, Timeline,
        TraceEntry,
    };

    fn snapshot(entries: Vec<TraceEntry>, stacks: StackTable) -> Snapshot {
        let n = entries.len();
        Snapshot {
            format: SnapshotFormat::Modern,
            segments: Vec::<Segment>::new(),
            timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
            stacks,
            settings: Some(AllocatorSettings::default()),
            annotations: Vec::new(),
        }
    }

    fn entry(action: Action, addr: u64, size: u64, stack: Option<StackId>) -> TraceEntry {
        let mut e = TraceEntry::new(action, Some(addr), size, StreamIndex(0));
        e.stack = stack;
        e
    }

    #[test]
    fn splits_active_by_site_and_marks_peak_and_oom() {
        let mut stacks = StackTable::default();
        let f = stacks.add_frame(Frame {
            filename: "/home/me/a.py".into(),
            line: 1,
            name: "f".into(),
        });
        let a = stacks.add_stack([f].into());
        let entries = vec![
            entry(Action::SegmentAlloc, 0x1000, 1000, None),
            entry(Action::Alloc, 0x1000, 300, a),
            entry(Action::Alloc, 0x2000, 200, None),
            entry(Action::FreeCompleted, 0x1000, 300, a),
            TraceEntry::oom(4096, None, StreamIndex(0)),
        ];
        let snap = snapshot(entries, stacks);
        let s = memory_series(&snap, 0, by_site(&snap, &["/home/me/a.py:1:f".into()]), 100);
        assert_eq!(s.x_axis, XAxis::EntriesReplayed);
        let active: Vec<u64> = s.points.iter().map(|p| p.active).collect();
        assert_eq!(
            active,
            [0, 0, 300, 500, 200, 200],
            "before the trace, then each entry"
        );
        let xs: Vec<f64> = s.points.iter().map(|p| p.x).collect();
        assert_eq!(xs, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(s.points[3].by_group, [300, 200]);
        assert_eq!(s.points[4].by_group, [0, 200]);
        assert_eq!(s.points[2].reserved, 1000);
        assert_eq!(s.peak.map(|m| (m.entry_index, m.bytes)), Some((2, 500)));
        assert_eq!(s.oom.map(|m| (m.entry_index, m.bytes)), Some((4, 4096)));
        let small = memory_series(&snap, 0, by_site(&snap, &[]), 2);
        let kept: Vec<(f64, u64)> = small.points.iter().map(|p| (p.x, p.active)).collect();
        assert_eq!(
            kept,
            [(0.0, 0), (3.0, 500), (5.0, 200)],
            "one run: its highest point and its last"
        );
        assert_eq!(small.points[1].by_group, [500]);
        assert_eq!(small.points[1].reserved, 1000);
    }
}
