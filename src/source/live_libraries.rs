//! Which library holds the memory of one process's live shim stream: device memory held through
//! the driver (per device) and pinned host memory, each split by the shared library that asked
//! for it, named by the ledger's rule (`analysis::ledger::library`: the first frame of the native
//! stack outside the shim and the CUDA runtime and driver), with each library's peak since the
//! client connected. The live tally (`live_tally.rs`) calls it where it holds and releases an
//! allocation; the stack and mapping definitions of the stream name the libraries.
//!
//! Bounded memory, whatever the process does: stacks are kept as a library number (two bytes
//! per stack id, ids up to `MAX_STACK_ID`; never their frames), mappings up to `MAX_MAPPINGS`
//! (the process's executable files; more are ignored, their stacks unattributed), and one entry
//! per allocation alive, as the tally keeps.

use crate::analysis::ledger::library::Libraries;
use crate::model::Bytes;
use memprof_wire::{Mapping, Record};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Stack ids beyond this are not remembered (their memory is unattributed). The shim numbers
/// stacks from 1 up, one per distinct stack: 4 Mi of them is 8 MiB here.
const MAX_STACK_ID: usize = 1 << 22;
/// Executable mappings remembered (a process maps a few hundred files).
const MAX_MAPPINGS: usize = 1 << 14;
/// A stack (or allocation) whose library is not known.
const NONE: u16 = u16::MAX;

/// What one library holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryFigures {
    /// The file name (`libnccl.so.2`); `None` when no frame outside the CUDA runtime and
    /// driver names one (no stack recorded, or code in no file).
    pub library: Option<String>,
    /// Bytes it holds now.
    pub held: Bytes,
    /// The most it held at once since the client connected (the snapshot of what was alive
    /// then included).
    pub peak: Bytes,
}

/// Held and peak bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Figures {
    held: u64,
    peak: u64,
}

impl Figures {
    fn add(&mut self, size: u64) {
        self.held = self.held.saturating_add(size);
        self.peak = self.peak.max(self.held);
    }

    fn sub(&mut self, size: u64) {
        self.held = self.held.saturating_sub(size);
    }
}

/// One allocation alive: its library, device (`u32::MAX` for pinned host memory) and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    library: u16,
    device: u32,
    size: u64,
}

/// The split by library of one live stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveLibraries {
    mappings: Libraries,
    mapping_count: usize,
    /// Library names, numbered in order of first sight.
    names: Vec<String>,
    /// The library number of each stack id (`NONE` when none or not defined).
    stacks: Vec<u16>,
    /// Device memory alive by address, and pinned host memory by address.
    device: FxHashMap<u64, Held>,
    host: FxHashMap<u64, Held>,
    /// Figures by (device, library number), and by library number for pinned host memory.
    on_device: BTreeMap<(u32, u16), Figures>,
    pinned: BTreeMap<u16, Figures>,
}

impl LiveLibraries {
    /// Learns an executable mapping of the process (it comes before the stacks it covers).
    pub fn mapping(&mut self, m: &Mapping) {
        if self.mapping_count < MAX_MAPPINGS {
            self.mapping_count += 1;
            self.mappings.add(m);
        }
    }

    /// Learns stack `id` as its library.
    pub fn stack(&mut self, id: u32, frames: &[u64]) {
        let at = id as usize;
        if at >= MAX_STACK_ID {
            return;
        }
        let number = match self.mappings.of_stack(frames) {
            Some(name) => match self.names.iter().position(|n| *n == name) {
                Some(i) => i as u16,
                // Names are files of the mappings kept: fewer than NONE.
                None => {
                    self.names.push(name);
                    (self.names.len() - 1) as u16
                }
            },
            None => NONE,
        };
        if self.stacks.len() <= at {
            self.stacks.resize(at + 1, NONE);
        }
        self.stacks[at] = number;
    }

    fn library_of(&self, stack: u32) -> u16 {
        self.stacks.get(stack as usize).copied().unwrap_or(NONE)
    }

    /// Device memory held at `address` (an allocation or a mapping), asked for by `stack`.
    pub fn hold(&mut self, address: u64, device: u32, size: u64, stack: u32) {
        self.release(address);
        let library = self.library_of(stack);
        self.device.insert(
            address,
            Held {
                library,
                device,
                size,
            },
        );
        self.on_device
            .entry((device, library))
            .or_default()
            .add(size);
    }

    /// Device memory at `address` given back.
    pub fn release(&mut self, address: u64) {
        if let Some(h) = self.device.remove(&address) {
            if let Some(f) = self.on_device.get_mut(&(h.device, h.library)) {
                f.sub(h.size);
            }
        }
    }

    /// A pinned host memory record: `cuMemHostAlloc` / `cuMemAllocHost` / `cuMemHostRegister`
    /// pin `size` bytes at `ptr`, `cuMemFreeHost` / `cuMemHostUnregister` give them back.
    pub fn host(&mut self, r: &Record) {
        if let Some(h) = self.host.remove(&r.ptr) {
            if let Some(f) = self.pinned.get_mut(&h.library) {
                f.sub(h.size);
            }
        }
        if r.kind.pins_host() {
            let library = self.library_of(r.stack);
            self.host.insert(
                r.ptr,
                Held {
                    library,
                    device: u32::MAX,
                    size: r.size,
                },
            );
            self.pinned.entry(library).or_default().add(r.size);
        }
    }

    fn figures(&self, library: u16, f: &Figures) -> LibraryFigures {
        LibraryFigures {
            library: self.names.get(usize::from(library)).cloned(),
            held: Bytes(f.held),
            peak: Bytes(f.peak),
        }
    }

    /// Device memory on `device` by library, most held first (then highest peak, then name).
    pub fn on_device(&self, device: u32) -> Vec<LibraryFigures> {
        let list = self
            .on_device
            .range((device, 0)..=(device, NONE))
            .map(|(&(_, library), f)| self.figures(library, f))
            .collect();
        most_first(list)
    }

    /// The devices with device memory seen, in order.
    pub fn devices(&self) -> Vec<u32> {
        let mut devices: Vec<u32> = self.on_device.keys().map(|&(d, _)| d).collect();
        devices.dedup();
        devices
    }

    /// Pinned host memory by library, most held first (then highest peak, then name).
    pub fn pinned(&self) -> Vec<LibraryFigures> {
        let list = (self.pinned.iter())
            .map(|(&library, f)| self.figures(library, f))
            .collect();
        most_first(list)
    }
}

fn most_first(mut list: Vec<LibraryFigures>) -> Vec<LibraryFigures> {
    list.sort_by(|a, b| {
        (b.held, b.peak)
            .cmp(&(a.held, a.peak))
            .then_with(|| a.library.cmp(&b.library))
    });
    list
}

/// The first `n` of `list` (most first), and what the rest hold together as one more entry
/// named `other` (held: their sum; peak: the sum of their peaks, a bound), when there is a rest:
/// a bounded number of series or rows whatever the process loads.
pub fn top_and_other(mut list: Vec<LibraryFigures>, n: usize) -> Vec<(String, LibraryFigures)> {
    let rest = list.split_off(n.min(list.len()));
    let mut out: Vec<(String, LibraryFigures)> = list
        .into_iter()
        .map(|f| (label(f.library.as_deref()), f))
        .collect();
    if !rest.is_empty() {
        let sum = |get: fn(&LibraryFigures) -> Bytes| {
            Bytes(rest.iter().map(|f| get(f).0).fold(0, u64::saturating_add))
        };
        let other = LibraryFigures {
            library: None,
            held: sum(|f| f.held),
            peak: sum(|f| f.peak),
        };
        out.push(("other".to_owned(), other));
    }
    out
}

/// How a library is named in series and tables: its file name, or `unattributed`.
pub fn label(library: Option<&str>) -> String {
    library.unwrap_or("unattributed").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use memprof_wire::Kind;

    fn mapping(start: u64, path: &str) -> Mapping {
        Mapping {
            start,
            len: 0x1000,
            file_offset: 0,
            path: path.as_bytes().to_vec(),
        }
    }

    fn figures(library: Option<&str>, held: u64, peak: u64) -> LibraryFigures {
        LibraryFigures {
            library: library.map(str::to_owned),
            held: Bytes(held),
            peak: Bytes(peak),
        }
    }

    fn host(kind: Kind, ptr: u64, size: u64, stack: u32) -> Record {
        Record {
            ptr,
            size,
            stack,
            ..Record::new(kind)
        }
    }

    #[test]
    fn memory_is_split_by_the_library_of_its_stack_per_device_and_pinned() {
        let mut libs = LiveLibraries::default();
        libs.mapping(&mapping(0x1000, "/usr/lib/libcuda.so.1"));
        libs.mapping(&mapping(0x5000, "/opt/nccl/lib/libnccl.so.2"));
        libs.mapping(&mapping(0x8000, "/usr/bin/python3.12"));
        libs.stack(1, &[0x1010, 0x5010, 0x8010]);
        libs.stack(2, &[0x1010, 0x8020]);
        libs.stack(3, &[0x1010]);
        libs.hold(0xa000, 0, 100, 1);
        libs.hold(0xb000, 0, 50, 1);
        libs.hold(0xc000, 0, 70, 2);
        libs.hold(0xd000, 1, 10, 3);
        libs.hold(0xe000, 1, 5, 99);
        libs.release(0xb000);
        libs.release(0xf000);
        assert_eq!(
            libs.on_device(0),
            [
                figures(Some("libnccl.so.2"), 100, 150),
                figures(Some("python3.12"), 70, 70),
            ]
        );
        assert_eq!(libs.on_device(1), [figures(None, 15, 15)]);
        assert_eq!(libs.devices(), [0, 1]);
        // An address held again was freed unrecorded: its old entry goes.
        libs.hold(0xa000, 0, 20, 2);
        assert_eq!(
            libs.on_device(0),
            [
                figures(Some("python3.12"), 90, 90),
                figures(Some("libnccl.so.2"), 0, 150),
            ]
        );
        libs.host(&host(Kind::HostAlloc, 0x70, 3 << 20, 1));
        libs.host(&host(Kind::HostRegister, 0x80, 1 << 20, 2));
        libs.host(&host(Kind::HostUnregister, 0x80, 0, 0));
        libs.host(&host(Kind::HostFree, 0x90, 0, 0));
        assert_eq!(
            libs.pinned(),
            [
                figures(Some("libnccl.so.2"), 3 << 20, 3 << 20),
                figures(Some("python3.12"), 0, 1 << 20),
            ]
        );
    }

    #[test]
    fn beyond_the_top_the_rest_is_one_entry_named_other() {
        let list = vec![
            figures(Some("a"), 30, 30),
            figures(None, 20, 25),
            figures(Some("c"), 10, 40),
            figures(Some("d"), 5, 5),
        ];
        let names = |top: &[(String, LibraryFigures)]| -> Vec<(String, u64, u64)> {
            top.iter()
                .map(|(n, f)| (n.clone(), f.held.0, f.peak.0))
                .collect()
        };
        assert_eq!(
            names(&top_and_other(list.clone(), 2)),
            [
                ("a".to_owned(), 30, 30),
                ("unattributed".to_owned(), 20, 25),
                ("other".to_owned(), 15, 45),
            ]
        );
        assert_eq!(top_and_other(list.clone(), 4).len(), 4);
        assert_eq!(top_and_other(list, 9).len(), 4);
    }

    #[test]
    fn stack_ids_beyond_the_bound_are_unattributed() {
        let mut libs = LiveLibraries::default();
        libs.mapping(&mapping(0x5000, "/lib/libx.so"));
        libs.stack(u32::MAX, &[0x5010]);
        libs.hold(0xa000, 0, 8, u32::MAX);
        assert_eq!(libs.on_device(0), [figures(None, 8, 8)]);
        assert!(libs.stacks.is_empty());
    }
}
