//! The one place that applies CUDA driver records (`memprof-wire`) to a state: what a process
//! holds on each device after each record, and its counts. The recording reader's fold, the live
//! tally, `memprof run`'s summary and the ledger all walk records through it; what each keeps
//! beyond the state (every trace entry, a few running figures, an owner per allocation) is a
//! [`Keeper`] it calls at every change, as `model::state::Replay` does for snapshot entries.
//!
//! The rule every reader follows:
//!
//! - **Device memory held** on a device is its live allocations (`cuMemAlloc`, `cuMemAllocPitch`,
//!   `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, until `cuMemFree`/`cuMemFreeAsync`) plus its
//!   live physical memory handles (`cuMemCreate`, until `cuMemRelease`), each at its size. The
//!   driver makes physical memory at `cuMemCreate`, mapped or not, so a handle holds it from
//!   creation to release; a handle mapped twice holds it once.
//! - A **mapping** (`cuMemMap`) holds no memory of its own: it makes (part of) a handle
//!   addressable at a virtual range, on the handle's device. `cuMemUnmap` ends every mapping that
//!   starts inside its range. Mappings are the address view: the segments of the model a
//!   recording is read into (as PyTorch's expandable segments show them) and the addresses the
//!   ledger matches with PyTorch's segments (a handle mapped into one is PyTorch's). The driver
//!   keeps a released handle's memory until its last mapping goes; memprof takes it as gone at
//!   the release (PyTorch and NCCL unmap first), and the mapping stays in the address view.
//! - **Managed memory** (`cuMemAllocManaged`, freed by `cuMemFree`) is not device memory: it
//!   migrates and may exceed the device. It is its own figure per device, in no peak.
//! - **Pinned host memory** (`cuMemHostAlloc`, `cuMemAllocHost`, `cuMemHostRegister`, until
//!   `cuMemFreeHost`/`cuMemHostUnregister`) is its own figure, per device of the calling context.
//! - An allocating call that failed with out-of-memory is an OOM; any other failed call changes
//!   nothing. A free, release, unmap or host free of something no record made is unknown and
//!   changes nothing; memory made at an address (or handle) still held replaces it: the old one's
//!   free was not recorded.
//! - A record's device is the one the shim saw; a call that names none (or an impossible one) is
//!   put on device 0 and counted.

mod by_device;

pub use by_device::ByDevice;

use super::recording::MAX_DEVICES;
use memprof_wire::{Kind, Mapping, Record, CUDA_SUCCESS};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::fmt::Debug;

/// What some memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// A device allocation, by address.
    Device,
    /// Physical memory of a `cuMemCreate` handle, by handle.
    Handle,
    /// A `cuMemMap` mapping, by virtual address (no memory of its own).
    Mapping,
    /// `cuMemAllocManaged` memory, by address.
    Managed,
    /// Pinned host memory, by address.
    Host,
}

impl Memory {
    /// Whether it counts in a device's held memory.
    pub fn is_device(self) -> bool {
        matches!(self, Memory::Device | Memory::Handle)
    }

    /// Whether making it is an allocation in the counts (and giving it back a free).
    fn is_counted(self) -> bool {
        matches!(self, Memory::Device | Memory::Handle | Memory::Managed)
    }
}

/// Something alive: its device, size, kind, and what the keeper attached to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held<T> {
    pub device: u32,
    pub size: u64,
    pub memory: Memory,
    pub tag: T,
}

/// Why something held ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Freed, released or unmapped by the record.
    Freed,
    /// The record made new memory at its address or handle: its free was not recorded.
    Replaced,
}

/// A mapping and the handle it maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapped<T> {
    held: Held<T>,
    handle: u64,
}

/// One device's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceHeld {
    /// Device memory held now: allocations and handles.
    pub held: u64,
    /// The most `held` has been.
    pub peak: u64,
    pub managed: u64,
    pub host: u64,
    /// (free, total) of its last `cuMemGetInfo`.
    pub info: Option<(u64, u64)>,
}

/// Counts of the records applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records applied.
    pub records: u64,
    /// Device allocations, handles and managed allocations made.
    pub allocations: u64,
    /// Of those, freed or released (not replaced).
    pub frees: u64,
    pub ooms: u64,
    /// Calls that failed with another error.
    pub failed: u64,
    /// Frees, releases and unmaps of something no record made, and the index of the first.
    pub unknown_frees: u64,
    pub first_unknown: Option<u64>,
    /// Memory made where some was still held.
    pub reused: u64,
    /// Calls put on device 0 because they named no device.
    pub guessed_device: u64,
    /// Whether a call named a device other than 0.
    pub other_device: bool,
}

/// What a reader keeps beyond the state: told of every change, in record order.
pub trait Keeper {
    /// Attached to everything held (a stack, an owner); `()` for nothing.
    type Tag: Copy + Debug + Eq;

    /// Every record, before it is applied.
    fn record(&mut self, _r: &Record) {}
    /// The tag of `memory` that record `r` makes on `device`.
    fn tag(&mut self, r: &Record, memory: Memory, device: u32) -> Self::Tag;
    /// `r` made `held` at `key` (an address, or a handle).
    fn hold(&mut self, _r: &Record, _key: u64, _held: &Held<Self::Tag>) {}
    /// What was held at `key` ended, by `r`.
    fn release(&mut self, _r: &Record, _key: u64, _held: &Held<Self::Tag>, _end: End) {}
    /// `r` mapped `handle` (known) at `r.ptr`; the keeper may change its tag.
    fn mapped(&mut self, _r: &Record, _handle: &mut Held<Self::Tag>) {}
    /// `r` failed with out-of-memory on `device`, which had `free` bytes free at its last
    /// `cuMemGetInfo`.
    fn oom(&mut self, _r: &Record, _device: u32, _free: Option<u64>) {}
    /// A `cuMemGetInfo` of `device`.
    fn info(&mut self, _device: u32, _free: u64, _total: u64) {}
    /// A recording's stack definition.
    fn stack(&mut self, _id: u32, _frames: &[u64]) {}
    /// A recording's executable mapping.
    fn mapping(&mut self, _m: &Mapping) {}
}

/// Keeps nothing.
impl Keeper for () {
    type Tag = ();
    fn tag(&mut self, _r: &Record, _memory: Memory, _device: u32) {}
}

/// Two keepers fed by one walk.
impl<A: Keeper, B: Keeper> Keeper for (A, B) {
    type Tag = (A::Tag, B::Tag);

    fn record(&mut self, r: &Record) {
        self.0.record(r);
        self.1.record(r);
    }
    fn tag(&mut self, r: &Record, memory: Memory, device: u32) -> Self::Tag {
        (self.0.tag(r, memory, device), self.1.tag(r, memory, device))
    }
    fn hold(&mut self, r: &Record, key: u64, held: &Held<Self::Tag>) {
        self.0.hold(r, key, &with_tag(held, held.tag.0));
        self.1.hold(r, key, &with_tag(held, held.tag.1));
    }
    fn release(&mut self, r: &Record, key: u64, held: &Held<Self::Tag>, end: End) {
        self.0.release(r, key, &with_tag(held, held.tag.0), end);
        self.1.release(r, key, &with_tag(held, held.tag.1), end);
    }
    fn mapped(&mut self, r: &Record, handle: &mut Held<Self::Tag>) {
        let mut a = with_tag(handle, handle.tag.0);
        self.0.mapped(r, &mut a);
        let mut b = with_tag(handle, handle.tag.1);
        self.1.mapped(r, &mut b);
        handle.tag = (a.tag, b.tag);
    }
    fn oom(&mut self, r: &Record, device: u32, free: Option<u64>) {
        self.0.oom(r, device, free);
        self.1.oom(r, device, free);
    }
    fn info(&mut self, device: u32, free: u64, total: u64) {
        self.0.info(device, free, total);
        self.1.info(device, free, total);
    }
    fn stack(&mut self, id: u32, frames: &[u64]) {
        self.0.stack(id, frames);
        self.1.stack(id, frames);
    }
    fn mapping(&mut self, m: &Mapping) {
        self.0.mapping(m);
        self.1.mapping(m);
    }
}

fn with_tag<T, U>(held: &Held<T>, tag: U) -> Held<U> {
    Held {
        device: held.device,
        size: held.size,
        memory: held.memory,
        tag,
    }
}

/// What is held after the records applied so far (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverState<T> {
    allocations: FxHashMap<u64, Held<T>>,
    handles: FxHashMap<u64, Held<T>>,
    mappings: BTreeMap<u64, Mapped<T>>,
    managed: FxHashMap<u64, Held<T>>,
    host: FxHashMap<u64, Held<T>>,
    devices: ByDevice<DeviceHeld>,
    /// Device memory held on all devices, and its most.
    total: u64,
    peak: u64,
    counts: Counts,
}

impl<T> Default for DriverState<T> {
    fn default() -> Self {
        DriverState {
            allocations: FxHashMap::default(),
            handles: FxHashMap::default(),
            mappings: BTreeMap::new(),
            managed: FxHashMap::default(),
            host: FxHashMap::default(),
            devices: ByDevice::default(),
            total: 0,
            peak: 0,
            counts: Counts::default(),
        }
    }
}

impl<T: Copy + Debug + Eq> DriverState<T> {
    /// Applies the next record, telling `keeper` of each change.
    pub fn apply<K: Keeper<Tag = T>>(&mut self, r: &Record, keeper: &mut K) {
        let index = self.counts.records;
        self.counts.records += 1;
        keeper.record(r);
        if r.is_oom() {
            let device = self.device_of(r);
            self.counts.ooms += 1;
            let free = (self.devices.get(device))
                .and_then(|d| d.info)
                .map(|(free, _)| free);
            keeper.oom(r, device, free);
            return;
        }
        if r.result != CUDA_SUCCESS {
            self.counts.failed += 1;
            return;
        }
        match r.kind {
            Kind::Alloc | Kind::AllocPitch | Kind::AllocAsync | Kind::AllocFromPoolAsync => {
                self.make(r, Memory::Device, r.ptr, keeper);
            }
            Kind::AllocManaged => self.make(r, Memory::Managed, r.ptr, keeper),
            Kind::HostAlloc | Kind::HostRegister => self.make(r, Memory::Host, r.ptr, keeper),
            Kind::VmmCreate => self.make(r, Memory::Handle, r.aux, keeper),
            Kind::Free | Kind::FreeAsync => {
                let gone =
                    (self.allocations.remove(&r.ptr)).or_else(|| self.managed.remove(&r.ptr));
                self.end(r, r.ptr, gone, index, keeper);
            }
            Kind::HostFree | Kind::HostUnregister => {
                let gone = self.host.remove(&r.ptr);
                self.end(r, r.ptr, gone, index, keeper);
            }
            Kind::VmmRelease => {
                let gone = self.handles.remove(&r.aux);
                self.end(r, r.aux, gone, index, keeper);
            }
            Kind::VmmMap => self.map(r, keeper),
            Kind::VmmUnmap => {
                let end = r.ptr.saturating_add(r.size);
                let inside: Vec<u64> = self.mappings.range(r.ptr..end).map(|(&a, _)| a).collect();
                if inside.is_empty() {
                    self.unknown(index);
                }
                for at in inside {
                    if let Some(m) = self.mappings.remove(&at) {
                        keeper.release(r, at, &m.held, End::Freed);
                    }
                }
            }
            Kind::MemGetInfo => {
                let device = self.device_of(r);
                self.devices.named(device).info = Some((r.aux, r.size));
                keeper.info(device, r.aux, r.size);
            }
            Kind::AddressReserve
            | Kind::AddressFree
            | Kind::Trailer
            | Kind::LiveDropped
            | Kind::Stack
            | Kind::Mapping
            | Kind::NvmlSample => {}
        }
    }

    /// `r` makes `memory` at `key`.
    fn make<K: Keeper<Tag = T>>(&mut self, r: &Record, memory: Memory, key: u64, keeper: &mut K) {
        let device = self.device_of(r);
        let held = Held {
            device,
            size: r.size,
            memory,
            tag: keeper.tag(r, memory, device),
        };
        // (Mappings are made by `map`, never here.)
        let map = match memory {
            Memory::Device => &mut self.allocations,
            Memory::Handle => &mut self.handles,
            Memory::Managed => &mut self.managed,
            Memory::Host | Memory::Mapping => &mut self.host,
        };
        if let Some(old) = map.insert(key, held) {
            self.counts.reused += 1;
            self.count(&old, false);
            keeper.release(r, key, &old, End::Replaced);
        }
        if memory.is_counted() {
            self.counts.allocations += 1;
        }
        self.count(&held, true);
        keeper.hold(r, key, &held);
    }

    /// `r` frees what was held at `key` (`None`: nothing was).
    fn end<K: Keeper<Tag = T>>(
        &mut self,
        r: &Record,
        key: u64,
        gone: Option<Held<T>>,
        index: u64,
        keeper: &mut K,
    ) {
        let Some(held) = gone else {
            self.unknown(index);
            return;
        };
        if held.memory.is_counted() {
            self.counts.frees += 1;
        }
        self.count(&held, false);
        keeper.release(r, key, &held, End::Freed);
    }

    fn map<K: Keeper<Tag = T>>(&mut self, r: &Record, keeper: &mut K) {
        let device = match self.handles.get(&r.aux) {
            Some(h) => h.device,
            None => self.device_of(r),
        };
        let held = Held {
            device,
            size: r.size,
            memory: Memory::Mapping,
            tag: keeper.tag(r, Memory::Mapping, device),
        };
        let mapped = Mapped {
            held,
            handle: r.aux,
        };
        if let Some(old) = self.mappings.insert(r.ptr, mapped) {
            self.counts.reused += 1;
            keeper.release(r, r.ptr, &old.held, End::Replaced);
        }
        keeper.hold(r, r.ptr, &held);
        if let Some(handle) = self.handles.get_mut(&r.aux) {
            keeper.mapped(r, handle);
        }
    }

    /// Adds (or takes away) `held` to its device's figures.
    fn count(&mut self, held: &Held<T>, add: bool) {
        if held.memory == Memory::Mapping {
            return;
        }
        let d = self.devices.named(held.device);
        let figure = match held.memory {
            Memory::Device | Memory::Handle => &mut d.held,
            Memory::Managed => &mut d.managed,
            Memory::Host | Memory::Mapping => &mut d.host,
        };
        *figure = if add {
            figure.saturating_add(held.size)
        } else {
            figure.saturating_sub(held.size)
        };
        if held.memory.is_device() {
            d.peak = d.peak.max(d.held);
            self.total = if add {
                self.total.saturating_add(held.size)
            } else {
                self.total.saturating_sub(held.size)
            };
            self.peak = self.peak.max(self.total);
        }
    }

    fn unknown(&mut self, index: u64) {
        self.counts.unknown_frees += 1;
        self.counts.first_unknown.get_or_insert(index);
    }

    /// The record's device; an unknown one (no current context, or a number no machine has,
    /// which only a damaged record carries) is counted and taken as device 0.
    fn device_of(&mut self, r: &Record) -> u32 {
        match u32::try_from(r.device) {
            Ok(d) if r.device < MAX_DEVICES => {
                self.counts.other_device |= d != 0;
                d
            }
            _ => {
                self.counts.guessed_device += 1;
                0
            }
        }
    }

    /// Each device's figures, by device (a device appears once a record named it).
    pub fn devices(&self) -> impl Iterator<Item = (u32, &DeviceHeld)> {
        self.devices.iter()
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Device memory held now on all devices together, and its most so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Device allocations alive, by address (in no order).
    pub fn allocations(&self) -> impl Iterator<Item = (u64, &Held<T>)> {
        self.allocations.iter().map(|(&a, h)| (a, h))
    }

    /// Mappings alive, by address.
    pub fn mappings(&self) -> impl Iterator<Item = (u64, &Held<T>)> {
        self.mappings.iter().map(|(&a, m)| (a, &m.held))
    }

    /// Physical memory handles alive.
    pub fn handles(&self) -> usize {
        self.handles.len()
    }

    /// Device allocations and mappings alive (the address view).
    pub fn addressed(&self) -> usize {
        self.allocations.len() + self.mappings.len()
    }
}

#[cfg(test)]
mod tests;
