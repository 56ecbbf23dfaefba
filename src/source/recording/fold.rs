//! Folding driver-call records into trace entries and the segments left alive, one record at a
//! time, as a keeper of the one walk over driver records (`source::driver_state`; the mapping
//! is documented in `recording/mod.rs`). `from_recording` folds a whole file;
//! a live client can fold as records arrive, ask what is held now, and take a model any time.
//! Entries and held allocations carry the record's own stack id while folding (the stacks are
//! symbolized once the whole recording is read); `into_snapshot` maps them into the table.

use crate::model::{
    Action, Block, BlockState, PoolKind, Segment, Snapshot, SnapshotFormat, StackId, StackTable,
    StreamIndex, Timeline, TraceEntry,
};
use crate::source::driver_state::{DriverState, End, Held, Keeper, Memory};
use crate::source::prefault::Prefaulter;
use memprof_wire::{Kind, Record};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::num::NonZeroU32;

/// What the fold attaches to each allocation and mapping: the recorded stack id and the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Origin {
    stack: Option<StackId>,
    stream: StreamIndex,
}

/// The fold's keeper: every trace entry so far and the streams they name.
#[derive(Clone, Debug, Default)]
struct Entries {
    /// (monotonic, wall clock) ns at the start, to give entries Unix times.
    clock: Option<(u64, u64)>,
    /// Time of the record being applied, µs since the Unix epoch.
    time_us: Option<i64>,
    /// By device (below `recording::MAX_DEVICES`).
    entries: Vec<Vec<TraceEntry>>,
    /// Map the room ahead of each device's entries, by device.
    prefaulters: Vec<Prefaulter>,
    streams: Vec<u64>,
    stream_index: FxHashMap<u64, StreamIndex>,
    /// The highest recorded stack id an entry holds.
    max_stack: u32,
}

impl Keeper for Entries {
    type Tag = Origin;

    fn record(&mut self, r: &Record) {
        self.time_us = self.clock.and_then(|(mono, wall)| {
            let ns = wall.checked_add(r.ts_ns.checked_sub(mono)?)?;
            i64::try_from(ns / 1000).ok()
        });
    }

    fn tag(&mut self, r: &Record, memory: Memory, _device: u32) -> Origin {
        Origin {
            // The recorded id, until `into_snapshot` maps it into the stack table.
            stack: NonZeroU32::new(r.stack).map(StackId),
            stream: match memory {
                Memory::Device => self.stream(r),
                _ => StreamIndex(0),
            },
        }
    }

    /// An allocation is a `segment_alloc` and an `alloc`, a mapping a `segment_map` and an
    /// `alloc`.
    fn hold(&mut self, _r: &Record, key: u64, held: &Held<Origin>) {
        let segment = match held.memory {
            Memory::Device => Action::SegmentAlloc,
            Memory::Mapping => Action::SegmentMap,
            _ => return,
        };
        for action in [segment, Action::Alloc] {
            self.push_held(action, key, held);
        }
    }

    fn release(&mut self, _r: &Record, key: u64, held: &Held<Origin>, _end: End) {
        let segment = match held.memory {
            Memory::Device => Action::SegmentFree,
            Memory::Mapping => Action::SegmentUnmap,
            _ => return,
        };
        // A free carries the stack of the allocation it ends, as PyTorch's trace entries do.
        for action in [Action::FreeCompleted, segment] {
            self.push_held(action, key, held);
        }
    }

    fn oom(&mut self, r: &Record, device: u32, free: Option<u64>) {
        let stream = self.stream(r);
        let mut entry = TraceEntry::oom(r.size, free, stream);
        entry.stack = NonZeroU32::new(r.stack).map(StackId);
        self.push(device, entry);
    }
}

impl Entries {
    fn push_held(&mut self, action: Action, addr: u64, held: &Held<Origin>) {
        let mut entry = TraceEntry::new(action, Some(addr), held.size, held.tag.stream);
        entry.stack = held.tag.stack;
        self.push(held.device, entry);
    }

    fn stream(&mut self, r: &Record) -> StreamIndex {
        let handle = match r.kind {
            Kind::AllocAsync | Kind::FreeAsync | Kind::AllocFromPoolAsync => r.stream,
            _ => 0,
        };
        if self.streams.is_empty() {
            self.streams.push(0);
            self.stream_index.insert(0, StreamIndex(0));
        }
        if let Some(&i) = self.stream_index.get(&handle) {
            return i;
        }
        match u16::try_from(self.streams.len()) {
            Ok(n) => {
                self.streams.push(handle);
                self.stream_index.insert(handle, StreamIndex(n));
                StreamIndex(n)
            }
            // More distinct streams than the model indexes: the rest share the default one.
            Err(_) => StreamIndex(0),
        }
    }

    fn push(&mut self, device: u32, entry: TraceEntry) {
        let entry = entry.with_time(self.time_us);
        self.max_stack = self.max_stack.max(entry.stack.map_or(0, |s| s.0.get()));
        // Devices are below `recording::MAX_DEVICES`.
        let device = device as usize;
        if device >= self.entries.len() {
            self.entries.resize_with(device + 1, Vec::new);
            self.prefaulters
                .resize_with(device + 1, Prefaulter::default);
        }
        let list = &mut self.entries[device];
        list.push(entry);
        self.prefaulters[device].follow(list);
    }
}

/// The fold's state: what is held (`driver_state`), the entries so far, and `X`, another
/// keeper fed by the same walk (the ledger, when `analyze` reads a recording).
#[derive(Clone, Debug)]
pub struct DriverFold<X: Keeper = ()> {
    state: DriverState<(Origin, X::Tag)>,
    keepers: (Entries, X),
}

impl DriverFold {
    /// A fold of a recording whose header has monotonic start `start_ns`; `wall_start_ns` (the
    /// process block's wall clock) gives entries Unix times.
    pub fn new(start_ns: u64, wall_start_ns: Option<u64>) -> DriverFold {
        DriverFold::with(start_ns, wall_start_ns, ())
    }
}

impl<X: Keeper> DriverFold<X> {
    /// A fold that also feeds `extra` every change (see [`DriverFold::new`]).
    pub fn with(start_ns: u64, wall_start_ns: Option<u64>, extra: X) -> DriverFold<X> {
        let entries = Entries {
            clock: wall_start_ns.map(|wall| (start_ns, wall)),
            ..Entries::default()
        };
        DriverFold {
            state: DriverState::default(),
            keepers: (entries, extra),
        }
    }

    /// Device memory held now (allocations and physical memory handles), by device.
    pub fn held_bytes(&self) -> BTreeMap<u32, u64> {
        (self.state.devices())
            .filter(|(_, d)| d.held > 0)
            .map(|(device, d)| (device, d.held))
            .collect()
    }

    /// The total memory the last `cuMemGetInfo` of each device reported.
    pub fn device_totals(&self) -> BTreeMap<u32, u64> {
        (self.state.devices())
            .filter_map(|(device, d)| d.info.map(|(_, total)| (device, total)))
            .collect()
    }

    /// Applies the next record.
    pub fn apply(&mut self, r: &Record) {
        self.state.apply(r, &mut self.keepers);
    }

    /// The other keeper, to feed it what is not a record (stack and mapping definitions).
    pub fn extra(&mut self) -> &mut X {
        &mut self.keepers.1
    }

    /// What was odd so far, one line each.
    pub fn warnings(&self) -> Vec<String> {
        let c = self.state.counts();
        let mut out = Vec::new();
        if let Some(first) = c.first_unknown {
            out.push(format!(
                "{} frees or unmaps of addresses no recorded call allocated were skipped (first: \
                 record {first})",
                c.unknown_frees
            ));
        }
        if c.reused > 0 {
            out.push(format!(
                "{} allocations reused an address still held, whose free was not recorded; it \
                 is taken as freed there",
                c.reused
            ));
        }
        if c.failed > 0 {
            out.push(format!(
                "{} calls failed with an error other than out-of-memory and change nothing",
                c.failed
            ));
        }
        if c.guessed_device > 0 && c.other_device {
            out.push(format!(
                "{} driver calls do not name their device; they are reported under device 0",
                c.guessed_device
            ));
        }
        out
    }

    /// The model (see [`DriverFold::into_parts`]).
    pub fn into_snapshot(self, stacks: StackTable, ids: &FxHashMap<u32, StackId>) -> Snapshot {
        self.into_parts(stacks, ids).0
    }

    /// The model: every entry so far and the allocations and mappings held now, with the
    /// recording's call stacks: `ids` maps a record's stack id into `stacks` (an id it does not
    /// map is no stack). Each device's entries are moved into the timeline, not copied. And the
    /// other keeper.
    pub fn into_parts(self, stacks: StackTable, ids: &FxHashMap<u32, StackId>) -> (Snapshot, X) {
        let mapped = |s: Option<StackId>| s.and_then(|s| ids.get(&s.0.get()).copied());
        let (log, extra) = self.keepers;
        let lists = log.entries;
        let devices = lists
            .iter()
            .rposition(|l| !l.is_empty())
            .map_or(0, |d| d + 1);
        // The shim numbers stacks 1, 2, ... and the table adds them in that order: unless an
        // id was never defined or a stack has no frames, every id the entries hold is the
        // table's already, and the entries are not walked to map them.
        let same_ids = (1..=log.max_stack).all(|id| ids.get(&id).map(|s| s.0.get()) == Some(id));
        let mut lists: Vec<Vec<TraceEntry>> = lists.into_iter().take(devices).collect();
        if !same_ids {
            for e in lists.iter_mut().flatten() {
                e.stack = mapped(e.stack);
            }
        }
        let mut timeline = Timeline::of_devices(lists);
        // The fold skips a free of memory it did not see allocated, and the segments below are
        // what it holds: nothing was alive before the trace.
        timeline.set_starts_empty();
        let streams = if log.streams.is_empty() {
            vec![0]
        } else {
            log.streams
        };
        let mut segments: Vec<Segment> = (self.state.allocations())
            .chain(self.state.mappings())
            .map(|(address, h)| {
                let stack = mapped(h.tag.0.stack);
                Segment {
                    device: h.device,
                    address,
                    total_size: h.size,
                    stream: streams[h.tag.0.stream.0 as usize],
                    pool: PoolKind::Large,
                    pool_id: (0, 0),
                    is_expandable: h.memory == Memory::Mapping,
                    stack,
                    blocks: vec![Block {
                        address,
                        size: h.size,
                        requested_size: h.size,
                        state: BlockState::ActiveAllocated,
                        stack,
                    }],
                }
            })
            .collect();
        segments.sort_by_key(|s| (s.device, s.address));
        timeline.set_streams(streams);
        let snapshot = Snapshot {
            format: SnapshotFormat::Recording,
            segments,
            timeline,
            stacks,
            settings: None,
            annotations: Vec::new(),
        };
        (snapshot, extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: Kind, ptr: u64, size: u64, aux: u64, device: i32) -> Record {
        Record {
            ptr,
            size,
            aux,
            device,
            ..Record::new(kind)
        }
    }

    #[test]
    fn what_is_held_follows_the_records_and_a_model_can_be_taken_any_time() {
        let mut fold = DriverFold::new(0, None);
        for r in [
            rec(Kind::Alloc, 0x100, 10, 0, -1),
            rec(Kind::VmmCreate, 0, 32, 5, 2),
            rec(Kind::VmmMap, 0x7000, 32, 5, -1),
            rec(Kind::MemGetInfo, 0, 4096, 100, 2),
        ] {
            fold.apply(&r);
        }
        assert_eq!(fold.held_bytes(), BTreeMap::from([(0, 10), (2, 32)]));
        assert_eq!(fold.device_totals(), BTreeMap::from([(2, 4096)]));
        let now = fold
            .clone()
            .into_snapshot(StackTable::default(), &FxHashMap::default());
        assert_eq!(now.segments.len(), 2);
        assert_eq!(now.timeline.device(2).len(), 2);

        fold.apply(&rec(Kind::Free, 0x100, 0, 0, -1));
        fold.apply(&rec(Kind::VmmUnmap, 0x7000, 32, 0, -1));
        assert_eq!(
            fold.held_bytes(),
            BTreeMap::from([(2, 32)]),
            "the handle holds it"
        );
        fold.apply(&rec(Kind::VmmRelease, 0, 0, 5, -1));
        assert_eq!(fold.held_bytes(), BTreeMap::new());
        let end = fold.into_snapshot(StackTable::default(), &FxHashMap::default());
        assert!(end.segments.is_empty());
        assert_eq!(end.timeline.device(0).len(), 4);
    }

    /// The fold's traces start with nothing alive (it skips a free of memory it never saw
    /// allocated), so a replay that does not look for older allocations replays as one that
    /// does.
    #[test]
    fn a_recordings_replays_start_with_nothing_alive() {
        let mut fold = DriverFold::new(0, None);
        for r in [
            rec(Kind::Alloc, 0x100, 10, 0, 0),
            rec(Kind::Free, 0x200, 0, 0, 0),
            rec(Kind::Alloc, 0x300, 5, 0, 0),
            rec(Kind::Free, 0x100, 0, 0, 0),
            rec(Kind::VmmCreate, 0, 32, 5, 0),
            rec(Kind::VmmMap, 0x7000, 32, 5, -1),
        ] {
            fold.apply(&r);
        }
        let s = fold.into_snapshot(StackTable::default(), &FxHashMap::default());
        assert!(s.timeline.starts_empty());
        let mut shared = crate::model::replay_device(&s, 0);
        let mut fresh = crate::model::Replay::new(s.timeline.device(0), s.device_segments(0));
        assert_eq!(shared.live().total(), 0);
        while let Some(i) = fresh.step() {
            assert_eq!(shared.step(), Some(i));
            assert_eq!(shared.live().total(), fresh.live().total(), "entry {i}");
            assert_eq!(shared.reserved(), fresh.reserved(), "entry {i}");
        }
        assert_eq!(shared.step(), None);
        assert_eq!(shared.live().total(), 37);
    }

    #[test]
    fn entries_take_the_tables_stack_ids() {
        let stack = |id: u32| NonZeroU32::new(id).map(StackId);
        let fold = {
            let mut fold = DriverFold::new(0, None);
            for (ptr, id) in [(0x100, 1), (0x200, 2), (0x300, 0)] {
                fold.apply(&Record {
                    stack: id,
                    ..rec(Kind::Alloc, ptr, 10, 0, 0)
                });
            }
            fold
        };
        let stacks_of = |ids: &[(u32, u32)]| {
            let ids = ids
                .iter()
                .filter_map(|&(from, to)| Some((from, stack(to)?)));
            let snapshot = (fold.clone()).into_snapshot(StackTable::default(), &ids.collect());
            let held: Vec<_> = snapshot
                .timeline
                .device(0)
                .iter()
                .map(|e| e.stack)
                .collect();
            held
        };
        // Each id as the table has it: kept without a walk.
        let kept = [stack(1), stack(1), stack(2), stack(2), None, None];
        assert_eq!(stacks_of(&[(1, 1), (2, 2)]), kept);
        // Stack 1 never defined, or 2 made the table's first: each entry is mapped.
        let mapped = [None, None, stack(1), stack(1), None, None];
        assert_eq!(stacks_of(&[(2, 1)]), mapped);
        let swapped = [stack(2), stack(2), stack(1), stack(1), None, None];
        assert_eq!(stacks_of(&[(1, 2), (2, 1)]), swapped);
    }

    /// Records of several devices, interleaved, give each device its own entries in record
    /// order, with the table's stack ids.
    #[test]
    fn each_device_keeps_its_entries_in_order_with_mapped_stacks() {
        let mut fold = DriverFold::new(0, None);
        for i in 0..6u64 {
            fold.apply(&Record {
                stack: (i % 2 + 1) as u32,
                ..rec(Kind::Alloc, 0x1000 * (i + 1), 10, 0, (i % 3) as i32)
            });
        }
        let stack = |id: u32| NonZeroU32::new(id).map(StackId);
        let ids: FxHashMap<u32, StackId> = [(1, 2), (2, 1)]
            .into_iter()
            .filter_map(|(from, to)| Some((from, stack(to)?)))
            .collect();
        let s = fold.into_snapshot(StackTable::default(), &ids);
        let seen = |device: usize| -> Vec<(Action, Option<u64>, Option<StackId>)> {
            (s.timeline.device(device).iter())
                .map(|e| (e.action(), e.addr(), e.stack))
                .collect()
        };
        let pair = |addr: u64, id: u32| {
            [
                (Action::SegmentAlloc, Some(addr), stack(id)),
                (Action::Alloc, Some(addr), stack(id)),
            ]
        };
        assert_eq!(seen(0), [pair(0x1000, 2), pair(0x4000, 1)].concat());
        assert_eq!(seen(1), [pair(0x2000, 1), pair(0x5000, 2)].concat());
        assert_eq!(seen(2), [pair(0x3000, 2), pair(0x6000, 1)].concat());
        assert!(seen(3).is_empty());
    }

    /// A damaged live record naming device 2^31 - 1 is an unknown device, not a reason to build
    /// tables for two billion devices.
    #[test]
    fn an_absurd_device_number_is_unknown() {
        let mut fold = DriverFold::new(0, None);
        fold.apply(&rec(Kind::Alloc, 0x100, 10, 0, i32::MAX));
        fold.apply(&rec(Kind::VmmCreate, 0, 32, 5, i32::MAX));
        fold.apply(&rec(Kind::VmmMap, 0x7000, 32, 5, -1));
        assert_eq!(fold.held_bytes(), BTreeMap::from([(0, 42)]));
        let snapshot = fold.into_snapshot(StackTable::default(), &FxHashMap::default());
        assert_eq!(snapshot.devices(), [0]);
    }
}
