//! What is alive, as the writer thread has drained it: device allocations and pinned host memory, physical handles,
//! mappings and address reservations, and each device's last `cuMemGetInfo`. A live client that
//! connects late gets these records first (flagged `FLAG_SNAPSHOT`), so it starts from the
//! process's current state. Only the writer thread touches it, never a hook.
//!
//! A client's snapshot is copied in bounded pieces (`fill`), each from where its `Cursor` stopped,
//! while the table keeps changing: the table is five sections in the order they must be applied
//! (reservations, handles, mappings, allocations, free memory), each ordered by its key. A record
//! drained meanwhile is sent to the client when it changes what the client already has
//! (`Cursor::has_sent`); one that changes what is still to come is not, as the snapshot will
//! show its effect. When the cursor reaches the end, the client holds the table as it is then.

use memprof_wire::{Kind, Record, CUDA_SUCCESS, FLAG_SNAPSHOT, RECORD_LEN};
use std::collections::BTreeMap;

/// The sections, in snapshot order.
const RESERVATIONS: usize = 0;
const HANDLES: usize = 1;
const MAPPINGS: usize = 2;
const ALLOCATIONS: usize = 3;
const INFO: usize = 4;
const SECTIONS: usize = 5;

#[derive(Default)]
pub struct Table {
    /// By section: address reservations by address, `cuMemCreate` handles not yet released by
    /// handle, mappings by virtual address, device allocations by pointer, and the last
    /// `cuMemGetInfo` of each device (by `device_key`).
    sections: [BTreeMap<u64, Record>; SECTIONS],
}

/// Where a client's snapshot stands: everything before `key` in `section` (and every earlier
/// section) has been copied to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    section: usize,
    key: u64,
}

impl Cursor {
    /// Whether the whole table has been copied.
    pub fn done(&self) -> bool {
        self.section >= SECTIONS
    }

    /// Whether a client at this cursor must be sent `r`: it changes what the client already
    /// has, or no state at all (a failed call). False when the snapshot still to come shows
    /// its effect.
    pub fn has_sent(&self, r: &Record) -> bool {
        match place(r) {
            // An unmap of a range reaches what was sent when the range starts there.
            Some((section, key)) => {
                section < self.section || (section == self.section && key < self.key)
            }
            None => true,
        }
    }

    fn next_section(&mut self) {
        self.section += 1;
        self.key = 0;
    }
}

/// The section and key of the state `r` changes; `None` when it changes none.
fn place(r: &Record) -> Option<(usize, u64)> {
    if r.result != CUDA_SUCCESS {
        return None;
    }
    match r.kind {
        Kind::Alloc
        | Kind::AllocPitch
        | Kind::AllocManaged
        | Kind::AllocAsync
        | Kind::AllocFromPoolAsync
        | Kind::Free
        | Kind::FreeAsync
        | Kind::HostAlloc
        | Kind::HostRegister
        | Kind::HostFree
        | Kind::HostUnregister => Some((ALLOCATIONS, r.ptr)),
        Kind::VmmCreate | Kind::VmmRelease => Some((HANDLES, r.aux)),
        Kind::VmmMap | Kind::VmmUnmap => Some((MAPPINGS, r.ptr)),
        Kind::AddressReserve | Kind::AddressFree => Some((RESERVATIONS, r.ptr)),
        Kind::MemGetInfo => Some((INFO, device_key(r.device))),
        Kind::Trailer | Kind::LiveDropped | Kind::Stack | Kind::Mapping | Kind::NvmlSample => None,
    }
}

/// A device number as a key that sorts as the number does.
fn device_key(device: i32) -> u64 {
    (i64::from(device) - i64::from(i32::MIN)) as u64
}

impl Table {
    /// Applies a drained record.
    pub fn apply(&mut self, r: &Record) {
        let Some((section, key)) = place(r) else {
            return;
        };
        let map = &mut self.sections[section];
        match r.kind {
            Kind::Free
            | Kind::FreeAsync
            | Kind::HostFree
            | Kind::HostUnregister
            | Kind::VmmRelease
            | Kind::AddressFree => {
                map.remove(&key);
            }
            Kind::VmmUnmap => {
                let end = r.ptr.saturating_add(r.size);
                let inside: Vec<u64> = map.range(r.ptr..end).map(|(&a, _)| a).collect();
                for addr in inside {
                    map.remove(&addr);
                }
            }
            _ => {
                map.insert(key, *r);
            }
        }
    }

    /// Applies every whole record of `batch`.
    pub fn apply_all(&mut self, batch: &[u8]) {
        for chunk in batch.chunks_exact(RECORD_LEN) {
            let mut raw = [0u8; RECORD_LEN];
            raw.copy_from_slice(chunk);
            if let Ok(record) = Record::decode(&raw) {
                self.apply(&record);
            }
        }
    }

    /// Copies the next records of the snapshot at `cursor` (at most `max`), each flagged
    /// `FLAG_SNAPSHOT`, to `out`, and moves the cursor past them; returns how many.
    pub fn fill(&self, cursor: &mut Cursor, max: usize, out: &mut Vec<u8>) -> usize {
        let mut copied = 0;
        while copied < max && !cursor.done() {
            let mut last = None;
            let mut taken = 0;
            for (&key, r) in self.sections[cursor.section]
                .range(cursor.key..)
                .take(max - copied)
            {
                let mut flagged = *r;
                flagged.flags |= FLAG_SNAPSHOT;
                out.extend_from_slice(&flagged.encode());
                last = Some(key);
                taken += 1;
            }
            copied += taken;
            match last.and_then(|key| key.checked_add(1)) {
                // The section may hold more: the next piece starts after the last key.
                Some(next) if copied == max => cursor.key = next,
                _ => cursor.next_section(),
            }
        }
        copied
    }
}

/// The shared table of driver record sequences (its tests check this table against it).
#[cfg(test)]
#[path = "../../memprof-wire/tests/data/driver_sequences.rs"]
mod sequences;

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(kind: Kind, ptr: u64, size: u64, aux: u64) -> Record {
        Record {
            ptr,
            size,
            aux,
            ..Record::new(kind)
        }
    }

    fn decoded(bytes: &[u8]) -> Vec<(Kind, u64, u64)> {
        bytes
            .chunks_exact(RECORD_LEN)
            .map(|c| {
                let mut raw = [0u8; RECORD_LEN];
                raw.copy_from_slice(c);
                let r = Record::decode(&raw).expect("a record");
                assert_eq!(r.flags & FLAG_SNAPSHOT, FLAG_SNAPSHOT);
                (r.kind, r.ptr, r.aux)
            })
            .collect()
    }

    /// The whole snapshot, copied in pieces of 2.
    fn whole(t: &Table) -> Vec<u8> {
        let mut cursor = Cursor::default();
        let mut out = Vec::new();
        while !cursor.done() {
            assert!(t.fill(&mut cursor, 2, &mut out) <= 2);
        }
        out
    }

    fn records(bytes: &[u8]) -> Vec<Record> {
        bytes
            .chunks_exact(RECORD_LEN)
            .map(|c| {
                let mut raw = [0u8; RECORD_LEN];
                raw.copy_from_slice(c);
                Record::decode(&raw).expect("a record")
            })
            .collect()
    }

    /// The root crate's rule (`source::driver_state`), from what the table keeps: device memory
    /// is allocations and handles, by the device the record names (none: device 0).
    fn bytes(t: &Table, section: usize, kinds: &[Kind], device: u32) -> u64 {
        t.sections[section]
            .values()
            .filter(|r| kinds.contains(&r.kind) && u32::try_from(r.device).unwrap_or(0) == device)
            .map(|r| r.size)
            .sum()
    }

    #[test]
    fn every_sequence_of_the_shared_table_ends_in_its_expected_state() {
        use super::sequences::{self, Expect, Step};
        let allocations = [
            Kind::Alloc,
            Kind::AllocPitch,
            Kind::AllocAsync,
            Kind::AllocFromPoolAsync,
        ];
        for sequence in sequences::sequences() {
            let mut t = Table::default();
            for step in &sequence.steps {
                let e = match *step {
                    Step::Apply(r) => {
                        t.apply(&r);
                        continue;
                    }
                    Step::Expect(e) => e,
                };
                let got = match e {
                    Expect::Held { device, .. } => Expect::Held {
                        device,
                        bytes: bytes(&t, ALLOCATIONS, &allocations, device)
                            + bytes(&t, HANDLES, &[Kind::VmmCreate], device),
                    },
                    Expect::Managed { device, .. } => Expect::Managed {
                        device,
                        bytes: bytes(&t, ALLOCATIONS, &[Kind::AllocManaged], device),
                    },
                    Expect::Host { device, .. } => Expect::Host {
                        device,
                        bytes: bytes(
                            &t,
                            ALLOCATIONS,
                            &[Kind::HostAlloc, Kind::HostRegister],
                            device,
                        ),
                    },
                    Expect::Handles(_) => Expect::Handles(t.sections[HANDLES].len()),
                    Expect::Mappings(_) => Expect::Mappings(t.sections[MAPPINGS].len()),
                };
                assert_eq!(got, e, "{}", sequence.name);
            }
        }
    }

    #[test]
    fn a_snapshot_copied_in_pieces_while_the_table_changes_ends_as_the_table() {
        // A table of 300 entries in every section, changed between every piece of 7 records:
        // frees and new entries before and after the cursor, unmaps across it, new free memory.
        let mut t = Table::default();
        let mut step = 0u64;
        let mut change = |t: &mut Table, client: &mut Table, cursor: &Cursor| {
            step += 1;
            let k = (step * 7919) % 600;
            let changes = [
                rec(Kind::Alloc, 0x1000 + k, k, 0),
                rec(Kind::Free, 0x1000 + (k * 13) % 600, 0, 0),
                rec(Kind::VmmCreate, 0, 64, k),
                rec(Kind::VmmRelease, 0, 0, (k * 17) % 600),
                rec(Kind::VmmMap, 0x9000 + k, 1, k),
                rec(Kind::VmmUnmap, 0x9000 + k / 2, 40, 0),
                rec(Kind::AddressReserve, 0x5000 + k, 4096, 0),
                rec(Kind::AddressFree, 0x5000 + (k * 3) % 600, 0, 0),
                Record {
                    device: (k % 3) as i32 - 1,
                    ..rec(Kind::MemGetInfo, 0, 1000, k)
                },
            ];
            for r in changes {
                t.apply(&r);
                if cursor.has_sent(&r) {
                    client.apply(&r);
                }
            }
        };
        let mut ignored = Table::default();
        for _ in 0..300 {
            change(&mut t, &mut ignored, &Cursor::default());
        }
        let mut client = Table::default();
        let mut cursor = Cursor::default();
        let mut pieces = 0;
        while !cursor.done() {
            let mut piece = Vec::new();
            t.fill(&mut cursor, 7, &mut piece);
            for r in records(&piece) {
                assert_eq!(r.flags & FLAG_SNAPSHOT, FLAG_SNAPSHOT);
                client.apply(&r);
            }
            change(&mut t, &mut client, &cursor);
            pieces += 1;
        }
        assert!(pieces > 100, "{pieces} pieces");
        assert_eq!(records(&whole(&client)), records(&whole(&t)));
    }

    #[test]
    fn the_snapshot_holds_what_is_still_alive() {
        let mut failed = rec(Kind::Alloc, 0, 99, 0);
        failed.result = 2;
        let mut t = Table::default();
        for r in [
            rec(Kind::Alloc, 0x100, 10, 0),
            rec(Kind::Alloc, 0x200, 20, 0),
            failed,
            rec(Kind::Free, 0x100, 0, 0),
            rec(Kind::AddressReserve, 0x9000, 1 << 20, 0),
            rec(Kind::VmmCreate, 0, 64, 7),
            rec(Kind::VmmCreate, 0, 64, 8),
            rec(Kind::VmmMap, 0x9000, 64, 7),
            rec(Kind::VmmMap, 0x9040, 64, 8),
            rec(Kind::VmmUnmap, 0x9000, 128, 0),
            rec(Kind::VmmRelease, 0, 0, 7),
            rec(Kind::VmmMap, 0x9100, 64, 8),
            rec(Kind::MemGetInfo, 0, 1000, 500),
            rec(Kind::MemGetInfo, 0, 1000, 400),
        ] {
            t.apply(&r);
        }
        assert_eq!(
            decoded(&whole(&t)),
            [
                (Kind::AddressReserve, 0x9000, 0),
                (Kind::VmmCreate, 0, 8),
                (Kind::VmmMap, 0x9100, 8),
                (Kind::Alloc, 0x200, 0),
                (Kind::MemGetInfo, 0, 400),
            ]
        );
    }
}
