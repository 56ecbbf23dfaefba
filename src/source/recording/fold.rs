//! Folding driver-call records into trace entries and the segments left alive, one record at a
//! time (the mapping is documented in `recording/mod.rs`). `from_recording` folds a whole file;
//! a live client can fold as records arrive, ask what is held now, and take a model any time.
//! Entries and held allocations carry the record's own stack id while folding (the stacks are
//! symbolized once the whole recording is read); `into_snapshot` maps them into the table.

use crate::model::{
    Action, Block, BlockState, PoolKind, Segment, Snapshot, SnapshotFormat, StackId, StackTable,
    StreamIndex, Timeline, TraceEntry,
};
use memprof_wire::{Kind, Record, CUDA_SUCCESS};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::num::NonZeroU32;

/// A driver allocation or mapping alive at some point of the recording.
#[derive(Clone, Copy, Debug)]
struct Held {
    device: u32,
    size: u64,
    stream: StreamIndex,
    mapped: bool,
    stack: Option<StackId>,
}

/// The fold's state: entries so far and what is held.
#[derive(Clone, Debug, Default)]
pub struct DriverFold {
    /// (monotonic, wall clock) ns at the start, to give entries Unix times.
    clock: Option<(u64, u64)>,
    /// Time of the record being applied, µs since the Unix epoch.
    time_us: Option<i64>,
    entries: BTreeMap<u32, Vec<TraceEntry>>,
    held: BTreeMap<u64, Held>,
    /// Device of each `cuMemCreate` handle.
    handles: FxHashMap<u64, u32>,
    /// (free, total) of each device's last `cuMemGetInfo`.
    info: FxHashMap<u32, (u64, u64)>,
    streams: Vec<u64>,
    stream_index: FxHashMap<u64, StreamIndex>,
    /// Frees and unmaps of addresses no recorded call allocated.
    unknown_frees: usize,
    first_unknown: Option<usize>,
    /// Calls that failed with another error than out-of-memory (they change nothing).
    failed: usize,
    /// Allocations at an address still held (its free was not recorded).
    reused: usize,
    /// Calls put on device 0 because they do not name a device.
    guessed_device: usize,
    /// Whether a call named a device other than 0 (then the guess may be wrong).
    other_device: bool,
    /// Index of the record being applied.
    index: usize,
}

impl DriverFold {
    /// A fold of a recording whose header has monotonic start `start_ns`; `wall_start_ns` (the
    /// process block's wall clock) gives entries Unix times.
    pub fn new(start_ns: u64, wall_start_ns: Option<u64>) -> DriverFold {
        DriverFold {
            clock: wall_start_ns.map(|wall| (start_ns, wall)),
            ..DriverFold::default()
        }
    }

    /// Bytes held through the driver now (allocations and mappings), by device.
    pub fn held_bytes(&self) -> BTreeMap<u32, u64> {
        let mut out = BTreeMap::new();
        for h in self.held.values() {
            let total: &mut u64 = out.entry(h.device).or_default();
            *total = total.saturating_add(h.size);
        }
        out
    }

    /// The total memory the last `cuMemGetInfo` of each device reported.
    pub fn device_totals(&self) -> BTreeMap<u32, u64> {
        self.info
            .iter()
            .map(|(&d, &(_, total))| (d, total))
            .collect()
    }

    /// Applies the next record.
    pub fn apply(&mut self, r: &Record) {
        let index = self.index;
        self.index += 1;
        self.time_us = self.clock.and_then(|(mono, wall)| {
            let ns = wall.checked_add(r.ts_ns.checked_sub(mono)?)?;
            i64::try_from(ns / 1000).ok()
        });
        // The recorded id, until `into_snapshot` maps it into the stack table.
        let stack = NonZeroU32::new(r.stack).map(StackId);
        if r.is_oom() {
            let device = self.device_of(r);
            let free = self.info.get(&device).map(|&(free, _)| free);
            let stream = self.stream(r);
            let mut entry = TraceEntry::oom(r.size, free, stream);
            entry.stack = stack;
            self.push(device, entry);
            return;
        }
        if r.result != CUDA_SUCCESS {
            self.failed += 1;
            return;
        }
        match r.kind {
            Kind::Alloc
            | Kind::AllocPitch
            | Kind::AllocManaged
            | Kind::AllocAsync
            | Kind::AllocFromPoolAsync => {
                let device = self.device_of(r);
                let stream = self.stream(r);
                self.hold(r.ptr, device, r.size, stream, false, stack);
            }
            Kind::Free | Kind::FreeAsync => match self.held.get(&r.ptr).copied() {
                Some(h) if !h.mapped => self.release(r.ptr, h),
                _ => self.unknown(index),
            },
            Kind::VmmCreate => {
                let device = self.device_of(r);
                self.handles.insert(r.aux, device);
            }
            Kind::VmmMap => {
                let device = match self.handles.get(&r.aux) {
                    Some(&d) => d,
                    None => self.device_of(r),
                };
                self.hold(r.ptr, device, r.size, StreamIndex(0), true, stack);
            }
            Kind::VmmUnmap => {
                let end = r.ptr.saturating_add(r.size);
                let inside: Vec<(u64, Held)> = self
                    .held
                    .range(r.ptr..end)
                    .filter(|(_, h)| h.mapped)
                    .map(|(&a, &h)| (a, h))
                    .collect();
                if inside.is_empty() {
                    self.unknown(index);
                }
                for (addr, h) in inside {
                    self.release(addr, h);
                }
            }
            Kind::MemGetInfo => {
                let device = self.device_of(r);
                self.info.insert(device, (r.aux, r.size));
            }
            Kind::VmmRelease
            | Kind::AddressReserve
            | Kind::AddressFree
            | Kind::Trailer
            | Kind::LiveDropped
            | Kind::Stack
            | Kind::Mapping
            | Kind::HostAlloc
            | Kind::HostFree
            | Kind::HostRegister
            | Kind::HostUnregister
            | Kind::NvmlSample => {}
        }
    }

    fn hold(
        &mut self,
        addr: u64,
        device: u32,
        size: u64,
        stream: StreamIndex,
        mapped: bool,
        stack: Option<StackId>,
    ) {
        if let Some(old) = self.held.get(&addr).copied() {
            // The driver handed out an address the recording still holds, so its free was not
            // recorded (dropped): end the old one first so the totals stay right.
            self.release(addr, old);
            self.reused += 1;
        }
        let segment = if mapped {
            Action::SegmentMap
        } else {
            Action::SegmentAlloc
        };
        let mut segment = TraceEntry::new(segment, Some(addr), size, stream);
        segment.stack = stack;
        self.push(device, segment);
        let mut alloc = TraceEntry::new(Action::Alloc, Some(addr), size, stream);
        alloc.stack = stack;
        self.push(device, alloc);
        let held = Held {
            device,
            size,
            stream,
            mapped,
            stack,
        };
        self.held.insert(addr, held);
    }

    fn release(&mut self, addr: u64, h: Held) {
        self.held.remove(&addr);
        let segment = if h.mapped {
            Action::SegmentUnmap
        } else {
            Action::SegmentFree
        };
        // A free carries the stack of the allocation it ends, as PyTorch's trace entries do.
        let mut free = TraceEntry::new(Action::FreeCompleted, Some(addr), h.size, h.stream);
        free.stack = h.stack;
        self.push(h.device, free);
        let mut segment = TraceEntry::new(segment, Some(addr), h.size, h.stream);
        segment.stack = h.stack;
        self.push(h.device, segment);
    }

    fn unknown(&mut self, index: usize) {
        self.unknown_frees += 1;
        self.first_unknown.get_or_insert(index);
    }

    /// The record's device; an unknown one (no current context, or a number no machine has,
    /// which only a damaged record carries) is counted and taken as device 0, so the fold never
    /// builds per-device tables for billions of devices whoever feeds it.
    fn device_of(&mut self, r: &Record) -> u32 {
        match u32::try_from(r.device) {
            Ok(d) if r.device < super::MAX_DEVICES => {
                self.other_device |= d != 0;
                d
            }
            _ => {
                self.guessed_device += 1;
                0
            }
        }
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
        self.entries.entry(device).or_default().push(entry);
    }

    /// What was odd so far, one line each.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(first) = self.first_unknown {
            out.push(format!(
                "{} frees or unmaps of addresses no recorded call allocated were skipped (first: \
                 record {first})",
                self.unknown_frees
            ));
        }
        if self.reused > 0 {
            out.push(format!(
                "{} allocations reused an address still held, whose free was not recorded; it \
                 is taken as freed there",
                self.reused
            ));
        }
        if self.failed > 0 {
            out.push(format!(
                "{} calls failed with an error other than out-of-memory and change nothing",
                self.failed
            ));
        }
        if self.guessed_device > 0 && self.other_device {
            out.push(format!(
                "{} driver calls do not name their device; they are reported under device 0",
                self.guessed_device
            ));
        }
        out
    }

    /// The model: every entry so far and the segments held now, with the recording's call
    /// stacks: `ids` maps a record's stack id into `stacks` (an id it does not map is no
    /// stack). The entries are moved, not copied, where they can be (one device's are).
    pub fn into_snapshot(self, stacks: StackTable, ids: &FxHashMap<u32, StackId>) -> Snapshot {
        let mapped = |s: Option<StackId>| s.and_then(|s| ids.get(&s.0.get()).copied());
        let devices = self
            .entries
            .keys()
            .next_back()
            .map_or(0, |&d| d as usize + 1);
        let mut lists = self.entries;
        let mut entries: Vec<TraceEntry> = Vec::new();
        let mut ranges = Vec::with_capacity(devices);
        for device in 0..devices {
            let start = entries.len();
            if let Some(mut list) = lists.remove(&(device as u32)) {
                for e in &mut list {
                    e.stack = mapped(e.stack);
                }
                if entries.is_empty() {
                    entries = list;
                } else {
                    append_freeing(&mut entries, list);
                }
            }
            ranges.push(start..entries.len());
        }
        let mut timeline = Timeline::new(entries, ranges);
        let streams = if self.streams.is_empty() {
            vec![0]
        } else {
            self.streams
        };
        let mut segments: Vec<Segment> = self
            .held
            .iter()
            .map(|(&address, h)| Segment {
                device: h.device,
                address,
                total_size: h.size,
                stream: streams[h.stream.0 as usize],
                pool: PoolKind::Large,
                pool_id: (0, 0),
                is_expandable: h.mapped,
                stack: mapped(h.stack),
                blocks: vec![Block {
                    address,
                    size: h.size,
                    requested_size: h.size,
                    state: BlockState::ActiveAllocated,
                    stack: mapped(h.stack),
                }],
            })
            .collect();
        segments.sort_by_key(|s| (s.device, s.address));
        timeline.set_tables(streams, Vec::new());
        Snapshot {
            format: SnapshotFormat::Recording,
            segments,
            timeline,
            stacks,
            settings: None,
            annotations: Vec::new(),
        }
    }
}

/// Entries moved at a time by [`append_freeing`].
const APPEND_CHUNK: usize = 1 << 16;

/// Appends `list` to `base`, giving `list`'s memory back as its entries move, so that a
/// device's entries are not held twice (a recording's entries are most of what reading it
/// holds). The tail is cut off chunk by chunk (each cut shrinks `list`), then the chunks are
/// appended in order.
fn append_freeing(base: &mut Vec<TraceEntry>, mut list: Vec<TraceEntry>) {
    let mut tail = Vec::new();
    while list.len() > APPEND_CHUNK {
        tail.push(list.split_off(list.len() - APPEND_CHUNK));
        list.shrink_to_fit();
    }
    base.extend_from_slice(&list);
    drop(list);
    for chunk in tail.into_iter().rev() {
        base.extend_from_slice(&chunk);
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
        assert_eq!(fold.held_bytes(), BTreeMap::new());
        let end = fold.into_snapshot(StackTable::default(), &FxHashMap::default());
        assert!(end.segments.is_empty());
        assert_eq!(end.timeline.device(0).len(), 4);
    }

    #[test]
    fn appending_in_chunks_keeps_the_order() {
        let entry = |i: usize| TraceEntry::new(Action::Alloc, Some(i as u64), 1, StreamIndex(0));
        let n = 2 * APPEND_CHUNK + 5;
        let mut base: Vec<TraceEntry> = (0..3).map(entry).collect();
        append_freeing(&mut base, (3..n).map(entry).collect());
        let addrs: Vec<u64> = base.iter().filter_map(|e| e.addr()).collect();
        assert_eq!(addrs, (0..n as u64).collect::<Vec<_>>());
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
