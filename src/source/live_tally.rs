//! Running figures of one process's live shim stream: driver memory held per device and its
//! peak, allocation/free/OOM counts, records lost or dropped, and the allocations alive now.
//! Bounded memory (no history is kept), so a dashboard or the agent can follow a process for
//! days. The mapping of calls to held memory is the recording reader's (`recording/mod.rs`).
//! The split of held memory (and pinned host memory) by library is `live_libraries.rs`'s.

use super::live::LiveEvent;
use super::live_libraries::LiveLibraries;
use crate::model::Bytes;
use memprof_wire::{Kind, Record, CUDA_SUCCESS, FLAG_SNAPSHOT};
use rustc_hash::FxHashMap;
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
    /// Bytes held through the driver now (allocations and mappings alive).
    pub held: Bytes,
    /// The most `held` has been since the client connected.
    pub peak: Bytes,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
    /// Successful allocations and mappings, and frees and unmaps, after connecting.
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
    held: BTreeMap<u64, LiveAlloc>,
    handles: FxHashMap<u64, u32>,
    pub devices: BTreeMap<u32, DeviceFigures>,
    /// Successful allocations and mappings seen after connecting (the snapshot of what was
    /// alive at connection is not counted).
    pub allocations: u64,
    /// Frees and unmaps seen after connecting.
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

    /// The `n` largest allocations alive, largest first (ties: lower address first).
    pub fn largest(&self, n: usize) -> Vec<LiveAlloc> {
        let order =
            |a: &LiveAlloc, b: &LiveAlloc| b.size.cmp(&a.size).then(a.address.cmp(&b.address));
        let mut all: Vec<LiveAlloc> = self.held.values().copied().collect();
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
        self.held.len()
    }

    fn record(&mut self, r: &Record) {
        self.records += 1;
        let counted = r.flags & FLAG_SNAPSHOT == 0;
        let device = u32::try_from(r.device).unwrap_or(0);
        if r.is_oom() {
            self.ooms += 1;
            self.devices.entry(device).or_default().ooms += 1;
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
            | Kind::AllocFromPoolAsync => self.hold(r, device, false, counted),
            Kind::Free | Kind::FreeAsync if self.held.get(&r.ptr).is_some_and(|a| !a.mapped) => {
                self.release(r.ptr, counted);
            }
            Kind::VmmCreate => {
                self.handles.insert(r.aux, device);
            }
            Kind::VmmMap => {
                let device = self.handles.get(&r.aux).copied().unwrap_or(device);
                self.hold(r, device, true, counted);
            }
            Kind::VmmUnmap => {
                let end = r.ptr.saturating_add(r.size);
                let inside: Vec<u64> = self
                    .held
                    .range(r.ptr..end)
                    .filter(|(_, a)| a.mapped)
                    .map(|(&at, _)| at)
                    .collect();
                for at in inside {
                    self.release(at, counted);
                }
            }
            Kind::HostAlloc | Kind::HostRegister | Kind::HostFree | Kind::HostUnregister => {
                self.libraries.host(r);
            }
            Kind::MemGetInfo => {
                let d = self.devices.entry(device).or_default();
                d.free = Some(Bytes(r.aux));
                d.total = Some(Bytes(r.size));
            }
            _ => {}
        }
    }

    /// Holds the memory `r` made addressable at its pointer (`r.size` bytes).
    fn hold(&mut self, r: &Record, device: u32, mapped: bool, counted: bool) {
        let (address, size) = (r.ptr, r.size);
        // An address still held was freed unrecorded: its old entry goes.
        if self.held.contains_key(&address) {
            self.release(address, false);
        }
        self.libraries.hold(address, device, size, r.stack);
        self.held.insert(
            address,
            LiveAlloc {
                address,
                device,
                size: Bytes(size),
                mapped,
            },
        );
        let d = self.devices.entry(device).or_default();
        d.held = Bytes(d.held.0.saturating_add(size));
        d.peak = d.peak.max(d.held);
        if counted {
            d.allocations += 1;
            self.allocations += 1;
        }
    }

    fn release(&mut self, address: u64, counted: bool) {
        if let Some(a) = self.held.remove(&address) {
            self.libraries.release(address);
            let d = self.devices.entry(a.device).or_default();
            d.held = Bytes(d.held.0.saturating_sub(a.size.0));
            if counted {
                d.frees += 1;
                self.frees += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::CUDA_ERROR_OUT_OF_MEMORY;

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
        assert_eq!(t.records, 9);
    }
}
