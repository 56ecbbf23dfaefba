//! Running figures of one process's live shim stream: driver memory held per device and its
//! peak, allocation/free/OOM counts, records lost or dropped, and the allocations alive now.
//! Bounded memory (no history is kept), so a dashboard or the agent can follow a process for
//! days. Records are applied by the one walk over driver records (`source::driver_state`, whose
//! rule says what is held); the figures change at its hold and release points (`Figures`). The
//! split of held memory (and pinned host memory) by library is `live_libraries.rs`'s, kept as
//! the tag of each thing held.

use super::driver_state::{DriverState, End, Held, Keeper, Memory};
use super::live::LiveEvent;
use super::live_libraries::LiveLibraries;
use crate::model::Bytes;
use memprof_wire::{Record, FLAG_SNAPSHOT};
use std::collections::BTreeMap;

/// One allocation or mapping alive now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveAlloc {
    pub address: u64,
    pub device: u32,
    pub size: Bytes,
    /// A `cuMemMap` mapping rather than an allocation.
    pub mapped: bool,
}

/// Figures of one device, as the driver sees them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceFigures {
    /// Device memory held through the driver now (allocations and `cuMemCreate` physical
    /// memory alive).
    pub held: Bytes,
    /// The most `held` has been since the client connected.
    pub peak: Bytes,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Successful allocations (device, managed and `cuMemCreate` handles), and their frees and
    /// releases, after connecting.
    pub allocations: u64,
    pub frees: u64,
    /// Total and free memory of the device at its last `cuMemGetInfo` (the whole device, every
    /// process); `None` until the process asked.
    pub total: Option<Bytes>,
    pub free: Option<Bytes>,
}

/// The figures of one live stream so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveTally {
    /// What is held, each with its library number.
    state: DriverState<u16>,
    pub devices: BTreeMap<u32, DeviceFigures>,
    /// Successful allocations and handles made after connecting (the snapshot of what was
    /// alive at connection is not counted).
    pub allocations: u64,
    /// Frees and releases seen after connecting.
    pub frees: u64,
    /// Allocations that failed with out-of-memory, all devices.
    pub ooms: u64,
    /// Calls that failed with another error.
    pub failed: u64,
    /// Records received (snapshot included).
    pub records: u64,
    /// Records the shim did not send because this client read too slowly (they are in the file).
    pub lost: u64,
    /// Events the shim dropped from the recording itself; `None` until the stream's end says.
    pub dropped: Option<u64>,
    /// The stream ended with the process.
    pub ended: bool,
    /// Device and pinned host memory by library.
    pub libraries: LiveLibraries,
}

impl LiveTally {
    /// Applies one event of the stream.
    pub fn apply(&mut self, event: &LiveEvent) {
        match *event {
            LiveEvent::Record(ref r) => self.record(r),
            LiveEvent::Stack { id, ref frames } => self.libraries.stack(id, frames),
            LiveEvent::Mapping(ref m) => self.libraries.mapping(m),
            LiveEvent::Lost(n) => self.lost = self.lost.saturating_add(n),
            LiveEvent::CaughtUp => {}
            LiveEvent::End { dropped } => {
                self.dropped = Some(dropped);
                self.ended = true;
            }
        }
    }

    /// The `n` largest allocations and mappings alive, largest first (ties: lower address
    /// first).
    pub fn largest(&self, n: usize) -> Vec<LiveAlloc> {
        let order =
            |a: &LiveAlloc, b: &LiveAlloc| b.size.cmp(&a.size).then(a.address.cmp(&b.address));
        let alive = |(address, h): (u64, &Held<u16>)| LiveAlloc {
            address,
            device: h.device,
            size: Bytes(h.size),
            mapped: h.memory == Memory::Mapping,
        };
        let mut all: Vec<LiveAlloc> = (self.state.allocations())
            .chain(self.state.mappings())
            .map(alive)
            .collect();
        // Only the first `n` need sorting: a process may hold a million allocations.
        if n == 0 {
            return Vec::new();
        }
        if all.len() > n {
            all.select_nth_unstable_by(n - 1, order);
            all.truncate(n);
        }
        all.sort_by(order);
        all
    }

    /// How many allocations and mappings are alive.
    pub fn alive(&self) -> usize {
        self.state.addressed()
    }

    fn record(&mut self, r: &Record) {
        self.records += 1;
        let mut figures = Figures {
            devices: &mut self.devices,
            allocations: &mut self.allocations,
            frees: &mut self.frees,
            ooms: &mut self.ooms,
            libraries: &mut self.libraries,
        };
        self.state.apply(r, &mut figures);
        self.failed = self.state.counts().failed;
    }
}

/// The tally's keeper: its figures, changed where the driver state holds or releases memory.
struct Figures<'a> {
    devices: &'a mut BTreeMap<u32, DeviceFigures>,
    allocations: &'a mut u64,
    frees: &'a mut u64,
    ooms: &'a mut u64,
    libraries: &'a mut LiveLibraries,
}

/// Whether `r` came after connecting (not in the snapshot of what was alive then).
fn counted(r: &Record) -> bool {
    r.flags & FLAG_SNAPSHOT == 0
}

impl Keeper for Figures<'_> {
    type Tag = u16;

    fn tag(&mut self, r: &Record, memory: Memory, _device: u32) -> u16 {
        self.libraries.tag(r, memory)
    }

    fn hold(&mut self, r: &Record, _key: u64, held: &Held<u16>) {
        self.libraries.hold(held);
        if held.memory == Memory::Mapping || held.memory == Memory::Host {
            return;
        }
        let d = self.devices.entry(held.device).or_default();
        if held.memory.is_device() {
            d.held = Bytes(d.held.0.saturating_add(held.size));
            d.peak = d.peak.max(d.held);
        }
        if counted(r) {
            d.allocations += 1;
            *self.allocations += 1;
        }
    }

    fn release(&mut self, r: &Record, _key: u64, held: &Held<u16>, end: End) {
        self.libraries.release(held);
        if held.memory == Memory::Mapping || held.memory == Memory::Host {
            return;
        }
        let d = self.devices.entry(held.device).or_default();
        if held.memory.is_device() {
            d.held = Bytes(d.held.0.saturating_sub(held.size));
        }
        if end == End::Freed && counted(r) {
            d.frees += 1;
            *self.frees += 1;
        }
    }

    fn mapped(&mut self, r: &Record, handle: &mut Held<u16>) {
        self.libraries.mapped(r, handle);
    }

    fn oom(&mut self, _r: &Record, device: u32, _free: Option<u64>) {
        *self.ooms += 1;
        self.devices.entry(device).or_default().ooms += 1;
    }

    fn info(&mut self, device: u32, free: u64, total: u64) {
        let d = self.devices.entry(device).or_default();
        d.free = Some(Bytes(free));
        d.total = Some(Bytes(total));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::{Kind, CUDA_ERROR_OUT_OF_MEMORY};

    fn rec(kind: Kind, ptr: u64, size: u64, aux: u64, device: i32) -> LiveEvent {
        LiveEvent::Record(Record {
            ptr,
            size,
            aux,
            device,
            ..Record::new(kind)
        })
    }

    #[test]
    fn holds_allocations_and_mappings_per_device_and_counts_what_came_after_connecting() {
        let mut t = LiveTally::default();
        let mut alive = Record {
            ptr: 0x100,
            size: 1000,
            device: 1,
            ..Record::new(Kind::Alloc)
        };
        alive.flags = FLAG_SNAPSHOT;
        t.apply(&LiveEvent::Record(alive));
        t.apply(&rec(Kind::VmmCreate, 0, 4096, 7, 1));
        // The mapping's device is its handle's, not the calling thread's.
        t.apply(&rec(Kind::VmmMap, 0x9000, 4096, 7, -1));
        t.apply(&rec(Kind::Alloc, 0x200, 500, 0, 0));
        t.apply(&rec(Kind::Free, 0x9000, 0, 0, 0));
        assert_eq!(t.frees, 0, "a free of a mapping frees nothing");
        let mut oom = Record {
            size: 1 << 40,
            device: 1,
            ..Record::new(Kind::Alloc)
        };
        oom.result = CUDA_ERROR_OUT_OF_MEMORY;
        t.apply(&LiveEvent::Record(oom));
        t.apply(&rec(Kind::MemGetInfo, 0, 80, 30, 1));
        let d1 = t.devices.get(&1).copied().unwrap_or_default();
        assert_eq!((d1.held, d1.peak, d1.ooms), (Bytes(5096), Bytes(5096), 1));
        assert_eq!((d1.total, d1.free), (Some(Bytes(80)), Some(Bytes(30))));
        assert_eq!(
            t.largest(2).iter().map(|a| a.address).collect::<Vec<_>>(),
            [0x9000, 0x100]
        );
        t.apply(&rec(Kind::VmmUnmap, 0x8000, 0x2000, 0, 1));
        assert_eq!(
            t.devices.get(&1).map(|d| d.held),
            Some(Bytes(5096)),
            "the handle holds its memory until it is released"
        );
        t.apply(&rec(Kind::VmmRelease, 0, 0, 7, 1));
        t.apply(&rec(Kind::Free, 0x200, 0, 0, 0));
        assert_eq!(
            (t.allocations, t.frees, t.ooms),
            (2, 2, 1),
            "the snapshot is not counted"
        );
        assert_eq!(t.alive(), 1);
        assert_eq!(
            t.devices.get(&1).map(|d| (d.held, d.peak)),
            Some((Bytes(1000), Bytes(5096)))
        );
        assert_eq!(t.devices.get(&0).map(|d| d.held), Some(Bytes(0)));
        t.apply(&LiveEvent::Lost(5));
        t.apply(&LiveEvent::End { dropped: 2 });
        assert_eq!((t.lost, t.dropped, t.ended), (5, Some(2), true));
        assert_eq!(t.records, 10);
    }
}
