//! What is alive, as the writer thread has drained it: device allocations, physical handles,
//! mappings and address reservations, and each device's last `cuMemGetInfo`. A live client that
//! connects late gets these records first (flagged `FLAG_SNAPSHOT`), so it starts from the
//! process's current state. Only the writer thread touches it, never a hook.

use memprof_wire::{Kind, Record, CUDA_SUCCESS, FLAG_SNAPSHOT, RECORD_LEN};
use std::collections::{BTreeMap, HashMap};

#[derive(Default)]
pub struct Table {
    /// Device allocations by pointer.
    allocations: BTreeMap<u64, Record>,
    /// `cuMemCreate` handles not yet released.
    handles: BTreeMap<u64, Record>,
    /// Mappings by virtual address.
    mappings: BTreeMap<u64, Record>,
    /// Address reservations by address.
    reservations: BTreeMap<u64, Record>,
    /// The last `cuMemGetInfo` of each device.
    info: HashMap<i32, Record>,
}

impl Table {
    /// Applies a drained record.
    pub fn apply(&mut self, r: &Record) {
        if r.result != CUDA_SUCCESS {
            return;
        }
        match r.kind {
            Kind::Alloc
            | Kind::AllocPitch
            | Kind::AllocManaged
            | Kind::AllocAsync
            | Kind::AllocFromPoolAsync => {
                self.allocations.insert(r.ptr, *r);
            }
            Kind::Free | Kind::FreeAsync => {
                self.allocations.remove(&r.ptr);
            }
            Kind::VmmCreate => {
                self.handles.insert(r.aux, *r);
            }
            Kind::VmmRelease => {
                self.handles.remove(&r.aux);
            }
            Kind::VmmMap => {
                self.mappings.insert(r.ptr, *r);
            }
            Kind::VmmUnmap => {
                let end = r.ptr.saturating_add(r.size);
                let inside: Vec<u64> = self.mappings.range(r.ptr..end).map(|(&a, _)| a).collect();
                for addr in inside {
                    self.mappings.remove(&addr);
                }
            }
            Kind::AddressReserve => {
                self.reservations.insert(r.ptr, *r);
            }
            Kind::AddressFree => {
                self.reservations.remove(&r.ptr);
            }
            Kind::MemGetInfo => {
                self.info.insert(r.device, *r);
            }
            Kind::Trailer | Kind::LiveDropped | Kind::Stack | Kind::Mapping => {}
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

    /// The records that rebuild the current state, in the order they must be applied
    /// (reservations, handles, mappings, allocations, free memory), each flagged
    /// `FLAG_SNAPSHOT`.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut info: Vec<&Record> = self.info.values().collect();
        info.sort_by_key(|r| r.device);
        let records = self
            .reservations
            .values()
            .chain(self.handles.values())
            .chain(self.mappings.values())
            .chain(self.allocations.values())
            .chain(info);
        let mut out = Vec::new();
        for r in records {
            let mut flagged = *r;
            flagged.flags |= FLAG_SNAPSHOT;
            out.extend_from_slice(&flagged.encode());
        }
        out
    }
}

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
            decoded(&t.snapshot()),
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
