//! Memory over time: active bytes (split into groups: allocation sites or categories) and
//! reserved bytes after each trace entry, observed on the one `model::Replay`, downsampled for
//! plotting. Memory changes in steps, so a series is a step function: each point's values hold
//! until the next point.

use super::sites::site_of;
use crate::model::{replay_device, Action, Live, Snapshot, StackId};
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

/// One device's memory over its trace.
#[derive(Clone, Debug)]
pub struct MemorySeries {
    pub x_axis: XAxis,
    pub stack_by: StackBy,
    /// The labels of the groups active memory is split into, stacked bottom first.
    pub groups: Vec<String>,
    pub points: Vec<SeriesPoint>,
    /// Entries in the trace (points may be fewer).
    pub entries: usize,
}

/// Where on a series' x axis the state just after `entry` of the device's trace lies, given
/// its offset on the input's time axis (`offset_us`, microseconds from `origin`).
pub fn x_of_entry(x_axis: XAxis, entry: usize, offset_us: Option<i64>) -> Option<f64> {
    match x_axis {
        XAxis::Seconds => offset_us.map(|us| us as f64 / 1e6),
        XAxis::EntriesReplayed => Some((entry + 1) as f64),
    }
}

/// Replays a device's trace and records the memory before the first entry and after each
/// entry, split by `grouping` (each allocation's group is asked once). The x span is cut into
/// `columns` equal columns (a plot's pixel columns) and each column keeps, of every quantity a
/// plot draws (active, reserved, and reserved less active), the entries of its lowest and its
/// highest value, and its last entry: every extreme survives, and the value held after each
/// column is the true one. Times count from `origin_us`, the input's one time origin (the
/// first trace entry of any device).
pub fn memory_series(
    snapshot: &Snapshot,
    device: u32,
    grouping: Grouping,
    columns: usize,
    origin_us: Option<i64>,
) -> MemorySeries {
    let Grouping {
        stack_by,
        labels,
        mut group_of,
    } = grouping;
    let entries = snapshot.timeline.device(device as usize);
    let timed = !entries.is_empty() && entries.iter().all(|e| e.time_us().is_some());
    let x_axis = if timed && origin_us.is_some() {
        XAxis::Seconds
    } else {
        XAxis::EntriesReplayed
    };
    let x_of = |i: usize| {
        let offset = entries[i].time_us().zip(origin_us).map(|(t, t0)| t - t0);
        x_of_entry(x_axis, i, offset).unwrap_or((i + 1) as f64)
    };
    let span = x_span(entries.len(), x_axis, &x_of);
    let columns = columns.max(1);
    let column_of = |x: f64| {
        let (lo, hi) = span;
        let at = if hi > lo { (x - lo) / (hi - lo) } else { 0.0 };
        ((at * columns as f64).floor().max(0.0) as usize).min(columns - 1)
    };
    // The group of each live allocation, by address.
    let mut group: FxHashMap<u64, usize> = FxHashMap::default();
    let mut replay = replay_device(snapshot, device);
    let mut by_group = vec![0u64; labels.len()];
    for (addr, live) in replay.live().iter() {
        let g = group_of(addr, live);
        group.insert(addr, g);
        by_group[g] = by_group[g].wrapping_add(live.size);
    }
    let mut points: Vec<SeriesPoint> = Vec::with_capacity(entries.len().min(columns * 3) + 1);
    // Without a trace there is nothing over time, not even the state before it.
    if !entries.is_empty() {
        // Before the first entry: at its time, or at 0 entries replayed.
        let x = match x_axis {
            XAxis::Seconds => x_of(0),
            XAxis::EntriesReplayed => 0.0,
        };
        points.push(SeriesPoint {
            x,
            active: replay.live().total(),
            reserved: replay.reserved(),
            by_group: by_group.clone(),
        });
    }
    let mut column: Option<Column> = None;
    loop {
        let index = replay.position();
        let Some(entry) = entries.get(index) else {
            break;
        };
        let addr = entry.addr().unwrap_or(0);
        let touches_live = matches!(entry.action(), Action::Alloc | Action::FreeCompleted);
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
        let x = x_of(index);
        let at = column_of(x);
        if let Some(done) = column.take_if(|c| c.index != at) {
            done.flush(&mut points);
        }
        let now = Column::quantities(replay.live().total(), replay.reserved());
        column
            .get_or_insert_with(|| Column::new(at))
            .add(index, x, now, &by_group);
    }
    if let Some(c) = column {
        c.flush(&mut points);
    }
    MemorySeries {
        x_axis,
        stack_by,
        groups: labels,
        points,
        entries: entries.len(),
    }
}

/// The lowest and highest x of a trace of `n` entries.
fn x_span(n: usize, x_axis: XAxis, x_of: &dyn Fn(usize) -> f64) -> (f64, f64) {
    match x_axis {
        XAxis::EntriesReplayed => (0.0, n as f64),
        XAxis::Seconds => (0..n)
            .map(x_of)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            }),
    }
}

/// The quantities a plot draws of a state: active, reserved, reserved less active.
const QUANTITIES: usize = 3;

/// The entries one column keeps: per quantity its lowest and its highest, and the last.
struct Column {
    index: usize,
    low: [Option<(usize, u64, SeriesPoint)>; QUANTITIES],
    high: [Option<(usize, u64, SeriesPoint)>; QUANTITIES],
    last: Option<(usize, SeriesPoint)>,
}

impl Column {
    fn new(index: usize) -> Column {
        Column {
            index,
            low: Default::default(),
            high: Default::default(),
            last: None,
        }
    }

    fn quantities(active: u64, reserved: u64) -> (u64, u64, [u64; QUANTITIES]) {
        (
            active,
            reserved,
            [active, reserved, reserved.saturating_sub(active)],
        )
    }

    /// Takes the state after entry `index` at `x` (a point is made only when kept).
    fn add(&mut self, index: usize, x: f64, now: (u64, u64, [u64; QUANTITIES]), by_group: &[u64]) {
        let (active, reserved, q) = now;
        let point = || SeriesPoint {
            x,
            active,
            reserved,
            by_group: by_group.to_vec(),
        };
        for ((value, low), high) in q.into_iter().zip(&mut self.low).zip(&mut self.high) {
            if low.as_ref().is_none_or(|(_, v, _)| value < *v) {
                *low = Some((index, value, point()));
            }
            if high.as_ref().is_none_or(|(_, v, _)| value > *v) {
                *high = Some((index, value, point()));
            }
        }
        self.last = Some((index, point()));
    }

    /// Adds the kept points, in trace order, each once.
    fn flush(self, points: &mut Vec<SeriesPoint>) {
        let mut kept: Vec<(usize, SeriesPoint)> = self
            .low
            .into_iter()
            .chain(self.high)
            .flatten()
            .map(|(i, _, p)| (i, p))
            .chain(self.last)
            .collect();
        kept.sort_by_key(|(i, _)| *i);
        kept.dedup_by_key(|(i, _)| *i);
        points.extend(kept.into_iter().map(|(_, p)| p));
    }
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
    fn splits_active_by_site_and_keeps_each_columns_extremes() {
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
        let s = memory_series(
            &snap,
            0,
            by_site(&snap, &["/home/me/a.py:1:f".into()]),
            100,
            None,
        );
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
        let small = memory_series(&snap, 0, by_site(&snap, &[]), 1, None);
        let kept: Vec<(f64, u64)> = small.points.iter().map(|p| (p.x, p.active)).collect();
        assert_eq!(
            kept,
            [(0.0, 0), (1.0, 0), (3.0, 500), (5.0, 200)],
            "one column: its lowest and highest of each quantity, and its last"
        );
        assert_eq!(small.points[2].by_group, [500]);
        assert_eq!(small.points[2].reserved, 1000);
    }
}
