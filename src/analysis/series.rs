//! Memory over time: active bytes (split by allocation site) and reserved bytes after each
//! trace entry, observed on the one `model::Replay`, downsampled for plotting.

use super::sites::site_of;
use crate::model::{Action, Replay, Snapshot, StackId};
use rustc_hash::FxHashMap;

/// What the x values of a series count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XAxis {
    /// Seconds from the first trace entry (every entry has a time).
    Seconds,
    /// Index of the entry in the device trace.
    EntryIndex,
}

/// The state after one trace entry (or the heaviest entry of a downsampled bucket).
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesPoint {
    pub x: f64,
    /// Live requested bytes.
    pub active: u64,
    /// Reserved (segment) bytes; in a downsampled bucket, the bucket's highest.
    pub reserved: u64,
    /// `active` split by site, in the order of `MemorySeries::sites`, then "other".
    pub by_site: Vec<u64>,
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
    /// The sites active memory is split by; points carry one more value, "other".
    pub sites: Vec<String>,
    pub points: Vec<SeriesPoint>,
    /// Where active memory first reaches its highest value (none when no entry rises above
    /// the level alive before the trace).
    pub peak: Option<Mark>,
    /// The last `oom` entry; `bytes` is the request that failed.
    pub oom: Option<Mark>,
    /// Entries in the trace (points may be fewer).
    pub entries: usize,
}

/// Replays a device's trace and records the memory after each entry, keeping at most
/// `max_points` points (each the entry of highest active memory in its run of entries).
pub fn memory_series(
    snapshot: &Snapshot,
    device: u32,
    sites: &[String],
    max_points: usize,
) -> MemorySeries {
    let entries = snapshot.timeline.device(device as usize);
    let first_time = entries.first().and_then(|e| e.time_us());
    let x_axis = match first_time {
        Some(_) if entries.iter().all(|e| e.time_us().is_some()) => XAxis::Seconds,
        _ => XAxis::EntryIndex,
    };
    let x_of = |i: usize| match (x_axis, first_time, entries[i].time_us()) {
        (XAxis::Seconds, Some(t0), Some(t)) => (t - t0) as f64 / 1e6,
        _ => i as f64,
    };
    let mut categories: FxHashMap<Option<StackId>, usize> = FxHashMap::default();
    let mut category = |stack: Option<StackId>| {
        *categories.entry(stack).or_insert_with(|| {
            let label = site_of(&snapshot.stacks, stack);
            sites
                .iter()
                .position(|s| *s == label)
                .unwrap_or(sites.len())
        })
    };
    let mut replay = Replay::new(entries, snapshot.device_segments(device));
    let mut by_site = vec![0u64; sites.len() + 1];
    for (_, live) in replay.live().iter() {
        let c = category(live.stack);
        by_site[c] = by_site[c].wrapping_add(live.size);
    }
    let mut best = replay.live().total();
    let mut peak = None;
    let bucket = entries.len().div_ceil(max_points.max(1)).max(1);
    let mut points: Vec<SeriesPoint> = Vec::with_capacity(entries.len().min(max_points));
    let mut bucket_reserved = 0u64;
    loop {
        let index = replay.position();
        let Some(entry) = entries.get(index) else {
            break;
        };
        let addr = entry.addr().unwrap_or(0);
        let touches_live = matches!(entry.action, Action::Alloc | Action::FreeCompleted);
        if let Some(old) = touches_live
            .then(|| replay.live().get(addr).copied())
            .flatten()
        {
            let c = category(old.stack);
            by_site[c] = by_site[c].wrapping_sub(old.size);
        }
        replay.step();
        if let Some(new) = touches_live
            .then(|| replay.live().get(addr).copied())
            .flatten()
        {
            let c = category(new.stack);
            by_site[c] = by_site[c].wrapping_add(new.size);
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
        if index.is_multiple_of(bucket) {
            bucket_reserved = 0;
        }
        bucket_reserved = bucket_reserved.max(replay.reserved());
        let point = SeriesPoint {
            x: x_of(index),
            active,
            reserved: bucket_reserved,
            by_site: by_site.clone(),
        };
        match points.last_mut() {
            Some(last) if !index.is_multiple_of(bucket) => {
                if active > last.active {
                    *last = point;
                } else {
                    last.reserved = bucket_reserved;
                }
            }
            _ => points.push(point),
        }
    }
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
        sites: sites.to_vec(),
        points,
        peak,
        oom,
        entries: entries.len(),
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
        let s = memory_series(&snap, 0, &["/home/me/a.py:1:f".into()], 100);
        assert_eq!(s.x_axis, XAxis::EntryIndex);
        let active: Vec<u64> = s.points.iter().map(|p| p.active).collect();
        assert_eq!(active, [0, 300, 500, 200, 200]);
        assert_eq!(s.points[2].by_site, [300, 200]);
        assert_eq!(s.points[3].by_site, [0, 200]);
        assert_eq!(s.points[1].reserved, 1000);
        assert_eq!(s.peak.map(|m| (m.entry_index, m.bytes)), Some((2, 500)));
        assert_eq!(s.oom.map(|m| (m.entry_index, m.bytes)), Some((4, 4096)));
        let small = memory_series(&snap, 0, &[], 2);
        assert_eq!(small.points.len(), 2);
        assert_eq!(
            small.points[0].active, 500,
            "each bucket keeps its highest point"
        );
        assert_eq!(small.points[0].by_site, [500]);
    }
}
