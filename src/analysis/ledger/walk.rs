//! The ledger's keeper of the one walk over driver records (`source::driver_state`, whose rule
//! says what is held): who holds each live allocation, handle and pinned host range, each
//! device's tallies at its peak, and the NVML samples with the driver's total at their moment.

use super::history::TotalHistory;
use super::library::Libraries;
use super::{
    DeviceLedger, HostBytes, LedgerView, LibraryBytes, PoolBytes, TorchHostShare, TorchSegment,
    TorchShare,
};
use crate::source::driver_state::{ByDevice, DriverState, End, Held, Keeper, Memory};
use memprof_wire::{Item, Kind, Mapping, Record, RecordingReader, StreamError};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::io::Read;

/// Why a ledger could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("{0}")]
    Read(#[from] StreamError),
    /// The snapshot names segments (device or host), none of which the recording's driver
    /// calls made.
    #[error(
        "none of the snapshot's {segments} segments is an allocation or mapping of the recorded \
         process: they are not of the same process"
    )]
    NotJoined { segments: usize },
}

/// Who holds some memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Owner {
    /// PyTorch, in the pool of this index.
    Torch(usize),
    /// The library of this index, or none.
    Library(Option<usize>),
}

/// The pinned host "library" of the ranges that hold a host segment of the snapshot: PyTorch's
/// host allocator, listed apart from the libraries.
const TORCH_HOST: usize = usize::MAX;

/// Bytes and count of one owner, and its most bytes so far (read from the device's tallies
/// now: a copy taken at the peak keeps the most bytes until then).
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    bytes: u64,
    count: u64,
    most_bytes: u64,
}

/// One device's figures at one moment.
#[derive(Clone, Debug, Default)]
struct Tallies {
    total: u64,
    owners: BTreeMap<Owner, Tally>,
    host: BTreeMap<Option<usize>, u64>,
    managed: u64,
}

#[derive(Debug, Default)]
struct Device {
    now: Tallies,
    /// The figures while the total was at its peak (the last of them, so pinned host and
    /// managed memory that changed meanwhile are as they were when it ended).
    peak: Option<Tallies>,
    /// When the total reached its peak, and when it first changed after that.
    peak_start_ns: u64,
    peak_end_ns: Option<u64>,
    /// Each host library's most bytes (each owner's are in its tally).
    host_peak: BTreeMap<Option<usize>, u64>,
    /// The time and the total after every change of the total, for the NVML samples.
    history: TotalHistory,
    /// NVML samples: (time, bytes).
    samples: Vec<(u64, u64)>,
}

/// The ledger being made, fed by a walk over a recording's records.
pub struct LedgerWalk {
    /// The snapshot's segments by (device, address).
    torch: Vec<TorchSegment>,
    pools: Vec<(i64, i64)>,
    /// The addresses of the snapshot's host segments, sorted.
    torch_host: Vec<u64>,
    libraries: Libraries,
    names: Vec<String>,
    name_index: FxHashMap<String, usize>,
    /// Frames of each stack id, until the first allocation using it resolves its library.
    frames: FxHashMap<u32, Vec<u64>>,
    library_of: FxHashMap<u32, Option<usize>>,
    devices: ByDevice<Device>,
    /// Whether an allocation or mapping fell in a snapshot segment.
    joined: bool,
}

/// The record's device; one the shim did not know is taken as device 0, as the model does.
fn device_of(r: &Record) -> u32 {
    u32::try_from(r.device)
        .ok()
        .filter(|&d| d < crate::source::recording::MAX_DEVICES as u32)
        .unwrap_or(0)
}

impl Keeper for LedgerWalk {
    type Tag = Owner;

    fn record(&mut self, r: &Record) {
        if r.kind == Kind::NvmlSample {
            self.devices
                .named(device_of(r))
                .samples
                .push((r.ts_ns, r.size));
        }
    }

    /// A device allocation in a snapshot segment is PyTorch's; the rest (and handles, and
    /// pinned host memory) belong to the library that asked.
    fn tag(&mut self, r: &Record, memory: Memory, device: u32) -> Owner {
        match memory {
            Memory::Device => match self.torch_pool(device, r.ptr) {
                Some(pool) => Owner::Torch(pool),
                None => Owner::Library(self.library(r.stack)),
            },
            Memory::Host if self.holds_torch_host(r.ptr, r.size) => {
                Owner::Library(Some(TORCH_HOST))
            }
            Memory::Handle | Memory::Host => Owner::Library(self.library(r.stack)),
            Memory::Managed | Memory::Mapping => Owner::Library(None),
        }
    }

    fn hold(&mut self, r: &Record, _key: u64, held: &Held<Owner>) {
        self.change(r.ts_ns, held, true);
    }

    fn release(&mut self, r: &Record, _key: u64, held: &Held<Owner>, _end: End) {
        self.change(r.ts_ns, held, false);
    }

    /// A handle mapped into one of PyTorch's segments is PyTorch's.
    fn mapped(&mut self, r: &Record, handle: &mut Held<Owner>) {
        if let Some(pool) = self.torch_pool(handle.device, r.ptr) {
            let owner = Owner::Torch(pool);
            if owner != handle.tag {
                self.count(r.ts_ns, handle.device, handle.size, handle.tag, false);
                self.count(r.ts_ns, handle.device, handle.size, owner, true);
                handle.tag = owner;
            }
        }
    }

    fn stack(&mut self, id: u32, frames: &[u64]) {
        self.frames.insert(id, frames.to_vec());
    }

    fn mapping(&mut self, m: &Mapping) {
        self.libraries.add(m);
    }
}

impl LedgerWalk {
    /// A ledger joined with the snapshot's `torch` segments and the addresses of its
    /// `torch_host` segments (both empty: no snapshot).
    pub fn new(torch: &[TorchSegment], torch_host: &[u64]) -> LedgerWalk {
        let mut host_segments = torch_host.to_vec();
        host_segments.sort_unstable();
        host_segments.dedup();
        let mut pools: Vec<(i64, i64)> = torch.iter().map(|s| s.pool_id).collect();
        pools.sort();
        pools.dedup();
        let mut sorted = torch.to_vec();
        sorted.sort_by_key(|s| (s.device, std::cmp::Reverse(s.size), s.address));
        sorted.sort_by_key(|s| (s.device, s.address));
        // A segment inside another (a mapping the trace saw within a segment) is left out, so
        // that the last segment starting at or below an address is the only one to look at.
        let mut torch: Vec<TorchSegment> = Vec::with_capacity(sorted.len());
        for s in sorted {
            let inside = torch.last().is_some_and(|o| {
                o.device == s.device && s.address.saturating_sub(o.address) < o.size
            });
            if !inside {
                torch.push(s);
            }
        }
        LedgerWalk {
            torch,
            pools,
            torch_host: host_segments,
            libraries: Libraries::new(),
            names: Vec::new(),
            name_index: FxHashMap::default(),
            frames: FxHashMap::default(),
            library_of: FxHashMap::default(),
            devices: ByDevice::default(),
            joined: false,
        }
    }

    /// The library of stack `id`, resolved once.
    fn library(&mut self, id: u32) -> Option<usize> {
        if let Some(&known) = self.library_of.get(&id) {
            return known;
        }
        let frames = self.frames.remove(&id).unwrap_or_default();
        let found = self.libraries.of_stack(&frames).map(|name| {
            let next = self.names.len();
            let index = *self.name_index.entry(name.clone()).or_insert(next);
            if index == next {
                self.names.push(name);
            }
            index
        });
        self.library_of.insert(id, found);
        found
    }

    /// The pool of the snapshot segment holding `addr` on `device`.
    fn torch_pool(&mut self, device: u32, addr: u64) -> Option<usize> {
        let at = self
            .torch
            .partition_point(|s| (s.device, s.address) <= (device, addr));
        let segment = self.torch[..at]
            .last()
            .filter(|s| s.device == device && addr - s.address < s.size)?;
        self.joined = true;
        self.pools.binary_search(&segment.pool_id).ok()
    }

    /// Whether the pinned range `[ptr, ptr + size)` holds a host segment of the snapshot.
    fn holds_torch_host(&mut self, ptr: u64, size: u64) -> bool {
        let at = self.torch_host.partition_point(|&a| a < ptr);
        let held = (self.torch_host.get(at)).is_some_and(|&a| a - ptr < size.max(1));
        self.joined |= held;
        held
    }

    /// Adds (or with `add` false, takes away) what the driver state held or released.
    fn change(&mut self, ts_ns: u64, held: &Held<Owner>, add: bool) {
        match held.memory {
            Memory::Device | Memory::Handle => {
                self.count(ts_ns, held.device, held.size, held.tag, add);
            }
            Memory::Managed => {
                let d = self.devices.named(held.device);
                d.now.managed = if add {
                    d.now.managed.saturating_add(held.size)
                } else {
                    d.now.managed.saturating_sub(held.size)
                };
                self.follow_peak(held.device);
            }
            Memory::Host => {
                let Owner::Library(library) = held.tag else {
                    return;
                };
                self.count_host(held.device, library, held.size, add);
            }
            Memory::Mapping => {}
        }
    }

    /// Adds (or with `add` false, takes away) `size` bytes of `owner` to `device`'s tallies.
    fn count(&mut self, ts_ns: u64, device: u32, size: u64, owner: Owner, add: bool) {
        let d = self.devices.named(device);
        let tally = d.now.owners.entry(owner).or_default();
        if add {
            tally.bytes = tally.bytes.saturating_add(size);
            tally.count += 1;
            d.now.total = d.now.total.saturating_add(size);
        } else {
            tally.bytes = tally.bytes.saturating_sub(size);
            tally.count = tally.count.saturating_sub(1);
            d.now.total = d.now.total.saturating_sub(size);
        }
        tally.most_bytes = tally.most_bytes.max(tally.bytes);
        d.history.push(ts_ns, d.now.total);
        let peak = d.peak.as_ref().map_or(0, |p| p.total);
        if d.peak.is_none() || d.now.total > peak {
            d.peak = Some(d.now.clone());
            d.peak_start_ns = ts_ns;
            d.peak_end_ns = None;
        } else if d.peak_end_ns.is_none() {
            if d.now.total == peak {
                d.peak = Some(d.now.clone());
            } else {
                d.peak_end_ns = Some(ts_ns);
            }
        }
    }

    /// After a change of pinned host or managed memory: the peak's figures follow while it holds.
    fn follow_peak(&mut self, device: u32) {
        let d = self.devices.named(device);
        if d.peak.is_some() && d.peak_end_ns.is_none() {
            d.peak = Some(d.now.clone());
        }
    }

    fn count_host(&mut self, device: u32, library: Option<usize>, size: u64, add: bool) {
        let d = self.devices.named(device);
        let bytes = d.now.host.entry(library).or_default();
        *bytes = if add {
            bytes.saturating_add(size)
        } else {
            bytes.saturating_sub(size)
        };
        let now = *bytes;
        let peak = d.host_peak.entry(library).or_default();
        *peak = (*peak).max(now);
        self.follow_peak(device);
    }

    /// Why the ledger cannot be joined with the snapshot: it had segments and none of them is
    /// one of the recording's allocations or mappings.
    pub fn refused(&self) -> Option<LedgerError> {
        let named = !self.torch.is_empty() || !self.torch_host.is_empty();
        (named && !self.joined).then_some(LedgerError::NotJoined {
            segments: self.torch.len() + self.torch_host.len(),
        })
    }

    /// The ledger; without the snapshot's share when it did not join (nothing was attributed
    /// to PyTorch then, so it is the ledger of a walk without the snapshot).
    pub fn finish(mut self) -> Vec<DeviceLedger> {
        if !self.joined {
            self.torch.clear();
            self.torch_host.clear();
        }
        self.tallies()
    }

    fn tallies(self) -> Vec<DeviceLedger> {
        let with_torch = !self.torch.is_empty();
        let with_torch_host = !self.torch_host.is_empty();
        let mut out = Vec::new();
        for (device, d) in self.devices.iter() {
            let end = &d.now;
            let peak = d.peak.as_ref().unwrap_or(end);
            let context = |sample: Option<&(u64, u64)>| {
                sample.map(|&(ts, used)| (used, used.saturating_sub(d.history.total_at(ts))))
            };
            // At the peak: the last sample taken while the peak held (NVML lags the driver, so
            // the last one is the one that has caught up), else the one nearest to it.
            let end_of_peak = d.peak_end_ns.unwrap_or(u64::MAX);
            let during =
                (d.samples.iter()).rfind(|&&(t, _)| t >= d.peak_start_ns && t < end_of_peak);
            let nearest = d
                .samples
                .iter()
                .min_by_key(|&&(t, _)| t.abs_diff(d.peak_start_ns));
            let at_peak = context(during.or(nearest));
            let at_end = context(d.samples.last());
            let view = |t: &Tallies, nvml: Option<(u64, u64)>| LedgerView {
                device_bytes: t.total,
                nvml_bytes: nvml.map(|n| n.0),
                context_bytes: nvml.map(|n| n.1),
                torch: with_torch.then(|| self.torch_share(t)),
                outside_torch: self.outside(t, d),
                pinned_host: self.pinned(t, d),
                torch_pinned_host: with_torch_host.then(|| TorchHostShare {
                    bytes: t.host.get(&Some(TORCH_HOST)).copied().unwrap_or(0),
                    peak_bytes: d.host_peak.get(&Some(TORCH_HOST)).copied().unwrap_or(0),
                }),
                managed_bytes: t.managed,
                unattributed_bytes: t.owners.get(&Owner::Library(None)).map_or(0, |t| t.bytes),
            };
            out.push(DeviceLedger {
                device,
                at_peak: view(peak, at_peak),
                at_end: view(end, at_end),
            });
        }
        out
    }

    fn torch_share(&self, t: &Tallies) -> TorchShare {
        let mut share = TorchShare::default();
        for (i, &id) in self.pools.iter().enumerate() {
            let bytes = t.owners.get(&Owner::Torch(i)).map_or(0, |t| t.bytes);
            share.reserved_bytes += bytes;
            share.pools.push(PoolBytes {
                pool: if id == (0, 0) { "default" } else { "private" },
                pool_id: [id.0, id.1],
                bytes,
            });
        }
        share
    }

    fn outside(&self, t: &Tallies, d: &Device) -> Vec<LibraryBytes> {
        let mut out: Vec<LibraryBytes> = (t.owners.iter())
            .filter_map(|(&owner, tally)| {
                let Owner::Library(Some(i)) = owner else {
                    return None;
                };
                let peak = d.now.owners.get(&owner).map_or(0, |t| t.most_bytes);
                (peak > 0).then(|| LibraryBytes {
                    library: self.names[i].clone(),
                    bytes: tally.bytes,
                    peak_bytes: peak,
                    count: tally.count,
                })
            })
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse((e.bytes, e.peak_bytes)));
        out
    }

    fn pinned(&self, t: &Tallies, d: &Device) -> Vec<HostBytes> {
        let mut out: Vec<HostBytes> = (d.host_peak.iter())
            .filter(|&(&library, &peak)| peak > 0 && library != Some(TORCH_HOST))
            .map(|(&library, &peak)| HostBytes {
                library: library.map(|i| self.names[i].clone()),
                bytes: t.host.get(&library).copied().unwrap_or(0),
                peak_bytes: peak,
            })
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse((e.bytes, e.peak_bytes)));
        out
    }
}

/// The ledger of the recording read from `input` alone (no model), joined with the snapshot's
/// `torch` segments and the addresses of its `torch_host` segments (both empty: no snapshot).
/// A snapshot none of whose segments the recording made is refused.
pub fn ledger_of(
    input: impl Read,
    torch: &[TorchSegment],
    torch_host: &[u64],
) -> Result<Vec<DeviceLedger>, LedgerError> {
    let mut reader = RecordingReader::new(input)?;
    let mut walk = LedgerWalk::new(torch, torch_host);
    let mut state = DriverState::default();
    while let Some(item) = reader.next_item()? {
        match item {
            Item::Event { record, .. } => state.apply(&record, &mut walk),
            Item::Stack { id, frames } => walk.stack(id, &frames),
            Item::Mapping(m) => walk.mapping(&m),
        }
    }
    match walk.refused() {
        Some(refused) => Err(refused),
        None => Ok(walk.finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::{encode_mapping, encode_stack, FileHeader, Mapping, ProcessInfo};

    fn rec(kind: Kind, ptr: u64, size: u64, ts_ns: u64, stack: u32) -> Record {
        Record {
            ptr,
            size,
            ts_ns,
            stack,
            device: 0,
            ..Record::new(kind)
        }
    }

    fn file(items: &[Vec<u8>]) -> Vec<u8> {
        let mut out = FileHeader {
            pid: 1,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&ProcessInfo::default().encode());
        for item in items {
            out.extend_from_slice(item);
        }
        out.extend_from_slice(&Record::new(Kind::Trailer).encode());
        out
    }

    fn mapping(start: u64, path: &str) -> Vec<u8> {
        encode_mapping(&Mapping {
            start,
            len: 0x1000,
            file_offset: 0,
            path: path.as_bytes().to_vec(),
        })
    }

    #[test]
    fn device_memory_splits_into_torch_libraries_and_the_context() {
        let bytes = file(&[
            mapping(0x1000, "/x/libcuda.so.1"),
            mapping(0x5000, "/x/libnccl.so.2"),
            encode_stack(1, &[0x1010, 0x5010]),
            encode_stack(2, &[0x1010]),
            rec(Kind::Alloc, 0x10_0000, 1000, 10, 0).encode().to_vec(),
            rec(Kind::Alloc, 0x20_0000, 300, 20, 1).encode().to_vec(),
            rec(Kind::HostAlloc, 0x9000, 64, 21, 1).encode().to_vec(),
            rec(Kind::Alloc, 0x30_0000, 7, 22, 2).encode().to_vec(),
            rec(Kind::AllocManaged, 0x40_0000, 5, 23, 0)
                .encode()
                .to_vec(),
            rec(Kind::NvmlSample, 0, 1307 + 500, 30, 0)
                .encode()
                .to_vec(),
            rec(Kind::Free, 0x20_0000, 0, 40, 0).encode().to_vec(),
            rec(Kind::NvmlSample, 0, 1007 + 500, 50, 0)
                .encode()
                .to_vec(),
        ]);
        let torch = [TorchSegment {
            device: 0,
            address: 0x10_0000,
            size: 1000,
            pool_id: (0, 0),
        }];
        let ledger = ledger_of(&bytes[..], &torch, &[]).expect("joined");
        assert_eq!(ledger.len(), 1);
        let peak = &ledger[0].at_peak;
        assert_eq!(peak.device_bytes, 1307);
        assert_eq!(
            (peak.nvml_bytes, peak.context_bytes),
            (Some(1807), Some(500))
        );
        assert_eq!(peak.torch.as_ref().map(|t| t.reserved_bytes), Some(1000));
        assert_eq!(
            peak.outside_torch,
            [LibraryBytes {
                library: "libnccl.so.2".into(),
                bytes: 300,
                peak_bytes: 300,
                count: 1
            }]
        );
        assert_eq!(peak.unattributed_bytes, 7);
        assert_eq!(peak.managed_bytes, 5);
        assert_eq!(peak.pinned_host[0].bytes, 64);
        let end = &ledger[0].at_end;
        assert_eq!((end.device_bytes, end.context_bytes), (1007, Some(500)));
        assert_eq!(end.outside_torch[0].bytes, 0);
        assert_eq!(end.outside_torch[0].peak_bytes, 300);

        let elsewhere = [TorchSegment {
            address: 0x77_0000,
            ..torch[0]
        }];
        let refused = ledger_of(&bytes[..], &elsewhere, &[]).expect_err("refused");
        assert!(refused.to_string().contains("not of the same process"));
        let alone = ledger_of(&bytes[..], &[], &[]).expect("no snapshot");
        assert_eq!(alone[0].at_peak.torch, None);
        assert_eq!(alone[0].at_peak.unattributed_bytes, 1007);
    }

    /// PyTorch's expandable segments: physical memory made by `cuMemCreate` is PyTorch's once
    /// mapped into one of its segments, and held until it is released.
    #[test]
    fn a_handle_mapped_into_a_torch_segment_is_torchs_until_released() {
        let vmm = |kind, ptr, size, aux, ts_ns| {
            Record {
                aux,
                ..rec(kind, ptr, size, ts_ns, 0)
            }
            .encode()
            .to_vec()
        };
        let bytes = file(&[
            vmm(Kind::VmmCreate, 0, 2048, 1, 10),
            vmm(Kind::VmmCreate, 0, 512, 2, 11),
            vmm(Kind::VmmMap, 0x7000, 2048, 1, 12),
            vmm(Kind::VmmMap, 0x9000, 512, 2, 13),
            vmm(Kind::VmmUnmap, 0x7000, 2048, 0, 20),
        ]);
        let torch = [TorchSegment {
            device: 0,
            address: 0x7000,
            size: 4096,
            pool_id: (0, 0),
        }];
        let ledger = ledger_of(&bytes[..], &torch, &[]).expect("joined");
        let end = &ledger[0].at_end;
        assert_eq!(end.device_bytes, 2560, "unmapped, not released: still held");
        assert_eq!(end.torch.as_ref().map(|t| t.reserved_bytes), Some(2048));
        assert_eq!(end.unattributed_bytes, 512);
        let mut released = bytes.clone();
        released.truncate(released.len() - memprof_wire::RECORD_LEN);
        released.extend_from_slice(&vmm(Kind::VmmRelease, 0, 0, 1, 30));
        released.extend_from_slice(&Record::new(Kind::Trailer).encode());
        let ledger = ledger_of(&released[..], &torch, &[]).expect("joined");
        assert_eq!(ledger[0].at_end.device_bytes, 512);
        assert_eq!(ledger[0].at_peak.device_bytes, 2560);
    }

    #[test]
    fn a_segment_nested_in_another_does_not_hide_it() {
        let bytes = file(&[
            rec(Kind::Alloc, 0x10_0000, 1000, 10, 0).encode().to_vec(),
            rec(Kind::Alloc, 0x10_0300, 50, 20, 0).encode().to_vec(),
        ]);
        let segment = |address, size, pool_id| TorchSegment {
            device: 0,
            address,
            size,
            pool_id,
        };
        let torch = [
            segment(0x10_0100, 16, (0, 0)),
            segment(0x10_0000, 0x1000, (1, 0)),
        ];
        let ledger = ledger_of(&bytes[..], &torch, &[]).expect("joined");
        let share = ledger[0].at_end.torch.as_ref().expect("a share");
        assert_eq!(share.reserved_bytes, 1050);
        assert_eq!(share.pools[1].bytes, 1050);
    }
}
