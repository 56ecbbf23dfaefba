//! Which library holds the memory of one process's live shim stream: device memory held through
//! the driver (per device) and pinned host memory, each split by the shared library that asked
//! for it, named by the ledger's rule (`analysis::ledger::library`: the first frame of the native
//! stack outside the shim and the CUDA runtime and driver), with each library's peak since the
//! client connected. The live tally (`live_tally.rs`) tags everything the one walk over driver
//! records holds with its library number (`tag`) and calls `hold` and `release` as it changes;
//! the stack and mapping definitions of the stream name the libraries. A `cuMemCreate` handle's
//! memory is its first mapping's library (the create call carries no stack), counted from then.
//!
//! Bounded memory, whatever the process does: stacks are kept as a library number (two bytes
//! per stack id, ids up to `MAX_STACK_ID`; never their frames), mappings up to `MAX_MAPPINGS`
//! (the process's executable files; more are ignored, their stacks unattributed); what is alive
//! is the walk's, with a two-byte tag each.

use super::driver_state::{Held, Memory};
use crate::analysis::ledger::library::Libraries;
use crate::model::Bytes;
use memprof_wire::{Mapping, Record};
use std::collections::BTreeMap;

/// Stack ids beyond this are not remembered (their memory is unattributed). The shim numbers
/// stacks from 1 up, one per distinct stack: 4 Mi of them is 8 MiB here.
const MAX_STACK_ID: usize = 1 << 22;
/// Executable mappings remembered (a process maps a few hundred files).
const MAX_MAPPINGS: usize = 1 << 14;
/// A stack (or allocation) whose library is not known.
const NONE: u16 = u16::MAX;
/// The tag of a `cuMemCreate` handle not mapped yet: not in the split until its first mapping.
const UNMAPPED: u16 = u16::MAX - 1;

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

/// The split by library of one live stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveLibraries {
    mappings: Libraries,
    mapping_count: usize,
    /// Library names, numbered in order of first sight.
    names: Vec<String>,
    /// The library number of each stack id (`NONE` when none or not defined).
    stacks: Vec<u16>,
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

    /// The tag of what record `r` makes: the library number of its stack.
    pub fn tag(&self, r: &Record, memory: Memory) -> u16 {
        match memory {
            Memory::Handle => UNMAPPED,
            _ => self.library_of(r.stack),
        }
    }

    /// `held` (tagged by `tag`) is now held.
    pub fn hold(&mut self, held: &Held<u16>) {
        if let Some(f) = self.figures_of(held) {
            f.add(held.size);
        }
    }

    /// `held` was given back.
    pub fn release(&mut self, held: &Held<u16>) {
        if let Some(f) = self.figures_of(held) {
            f.sub(held.size);
        }
    }

    /// `handle` was mapped by `r`: its first mapping names its library.
    pub fn mapped(&mut self, r: &Record, handle: &mut Held<u16>) {
        if handle.tag == UNMAPPED {
            handle.tag = self.library_of(r.stack);
            self.hold(handle);
        }
    }

    /// The figures `held` counts in, if any.
    fn figures_of(&mut self, held: &Held<u16>) -> Option<&mut Figures> {
        match held.memory {
            Memory::Device | Memory::Handle if held.tag != UNMAPPED => {
                Some(self.on_device.entry((held.device, held.tag)).or_default())
            }
            Memory::Host => Some(self.pinned.entry(held.tag).or_default()),
            _ => None,
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
    use crate::source::live::LiveEvent;
    use crate::source::live_tally::LiveTally;
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

    fn record(kind: Kind, ptr: u64, size: u64, aux: u64, device: i32, stack: u32) -> LiveEvent {
        LiveEvent::Record(Record {
            ptr,
            size,
            aux,
            device,
            stack,
            ..Record::new(kind)
        })
    }

    /// Through the live tally, as the stream feeds it.
    #[test]
    fn memory_is_split_by_the_library_of_its_stack_per_device_and_pinned() {
        let mut t = LiveTally::default();
        for (start, path) in [
            (0x1000, "/usr/lib/libcuda.so.1"),
            (0x5000, "/opt/nccl/lib/libnccl.so.2"),
            (0x8000, "/usr/bin/python3.12"),
        ] {
            t.apply(&LiveEvent::Mapping(mapping(start, path)));
        }
        for (id, frames) in [
            (1, vec![0x1010, 0x5010, 0x8010]),
            (2, vec![0x1010, 0x8020]),
            (3, vec![0x1010]),
        ] {
            t.apply(&LiveEvent::Stack { id, frames });
        }
        t.apply(&record(Kind::Alloc, 0xa000, 100, 0, 0, 1));
        t.apply(&record(Kind::Alloc, 0xb000, 50, 0, 0, 1));
        t.apply(&record(Kind::Alloc, 0xc000, 70, 0, 0, 2));
        t.apply(&record(Kind::Alloc, 0xd000, 10, 0, 1, 3));
        t.apply(&record(Kind::Alloc, 0xe000, 5, 0, 1, 99));
        t.apply(&record(Kind::Free, 0xb000, 0, 0, 0, 0));
        t.apply(&record(Kind::Free, 0xf000, 0, 0, 0, 0));
        // Managed memory is not device memory: in no split.
        t.apply(&record(Kind::AllocManaged, 0x10_0000, 1000, 0, 0, 1));
        let libs = &t.libraries;
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
        t.apply(&record(Kind::Alloc, 0xa000, 20, 0, 0, 2));
        assert_eq!(
            t.libraries.on_device(0),
            [
                figures(Some("python3.12"), 90, 90),
                figures(Some("libnccl.so.2"), 0, 150),
            ]
        );
        // A handle is its first mapping's library, counted once however often it is mapped.
        t.apply(&record(Kind::VmmCreate, 0, 4096, 7, 1, 0));
        assert_eq!(t.libraries.on_device(1), [figures(None, 15, 15)]);
        t.apply(&record(Kind::VmmMap, 0x9000_0000, 4096, 7, -1, 1));
        t.apply(&record(Kind::VmmMap, 0x9100_0000, 4096, 7, -1, 2));
        assert_eq!(
            t.libraries.on_device(1),
            [
                figures(Some("libnccl.so.2"), 4096, 4096),
                figures(None, 15, 15),
            ]
        );
        t.apply(&record(Kind::VmmUnmap, 0x9000_0000, 4096, 0, 1, 0));
        t.apply(&record(Kind::VmmRelease, 0, 0, 7, 1, 0));
        assert_eq!(
            t.libraries.on_device(1)[1],
            figures(Some("libnccl.so.2"), 0, 4096)
        );
        t.apply(&record(Kind::HostAlloc, 0x70, 3 << 20, 0, 0, 1));
        t.apply(&record(Kind::HostRegister, 0x80, 1 << 20, 0, 0, 2));
        t.apply(&record(Kind::HostUnregister, 0x80, 0, 0, 0, 0));
        t.apply(&record(Kind::HostFree, 0x90, 0, 0, 0, 0));
        assert_eq!(
            t.libraries.pinned(),
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
        let mut t = LiveTally::default();
        t.apply(&LiveEvent::Mapping(mapping(0x5000, "/lib/libx.so")));
        t.apply(&LiveEvent::Stack {
            id: u32::MAX,
            frames: vec![0x5010],
        });
        t.apply(&record(Kind::Alloc, 0xa000, 8, 0, 0, u32::MAX));
        assert_eq!(t.libraries.on_device(0), [figures(None, 8, 8)]);
        assert!(t.libraries.stacks.is_empty());
    }
}
