//! memprof recordings (the shim's driver calls, `memprof-wire`) into the model.
//!
//! A recording sees the CUDA driver, not PyTorch's caching allocator, so it is mapped at that
//! level (docs/recordings.md), following the one rule of what the driver
//! holds (`source::driver_state`, which every reader of driver records walks them through):
//!
//! - a successful device allocation (`cuMemAlloc`, `cuMemAllocPitch`, `cuMemAllocAsync`,
//!   `cuMemAllocFromPoolAsync`) is a `segment_alloc` followed by an `alloc` of the same address
//!   and size; its free (`cuMemFree`, `cuMemFreeAsync`) is a `free_completed` followed by a
//!   `segment_free`;
//! - a `cuMemMap` is a `segment_map` followed by an `alloc` of the mapped range; a `cuMemUnmap`
//!   ends every mapping inside its range (`free_completed`, then `segment_unmap`): the model is
//!   the address view, as PyTorch's expandable segments are. `cuMemCreate` and `cuMemRelease`
//!   (the physical memory behind mappings), address reservations, managed memory
//!   (`cuMemAllocManaged`, not device memory), pinned host memory (`cuMemHostAlloc` and the
//!   like) and the NVML samples `memprof run` adds make no entry; the ledger
//!   (`analysis::ledger`) shows them;
//! - an allocation that failed with `CUDA_ERROR_OUT_OF_MEMORY` is an `oom` entry of the request,
//!   with the free memory of the device's last `cuMemGetInfo` before it, when there was one.
//!
//! So reserved, allocated, active and requested figures are all driver memory, fragmentation
//! inside the allocator is not visible (it is reported as zero only because every segment is one
//! whole block), and there are no allocator settings. Native call stacks (version 3, unless the
//! program ran with `MEMPROF_STACKS=0`) are symbolized here (`symbols.rs`) and carried by the
//! entries and blocks of each allocation; its free carries the same stack. The segments at the end are the
//! allocations and mappings still alive, one block each. Entry times are Unix times when the
//! recording has the wall clock of its start (version 2), else absent. A record's device
//! is the one the shim saw (`cuMemCreate`'s property, else the calling thread's current context);
//! a map takes its handle's. Calls whose device the shim did not know are put on device 0; when
//! some call names another device, a warning says how many were put there.
//!
//! [`read_with`] feeds another keeper (the ledger) from the same pass over the file.

mod debug_info;
mod fold;
mod symbols;

pub use fold::DriverFold;
use symbols::Symbolizer;

use crate::model::{FormatKeys, StackId, StackTable};
use crate::source::driver_state::Keeper;
use crate::source::torch_snapshot::Parsed;
use memprof_wire::{
    DecodeError, Ending, Item, Mapping, ProcessInfo, Recording, RecordingReader, StreamError,
};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::io::Read;

/// Device ordinals from 0 up to this one (excluded) are read; a record naming a higher one is
/// damaged (CUDA machines have a few dozen devices at most).
pub const MAX_DEVICES: i32 = 1024;

/// Why a recording could not be read (a damaged record names its index and byte offset).
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error(
        "at byte {offset}: record {index} names device {device}, not a device ordinal (0 to {})",
        MAX_DEVICES - 1
    )]
    Device {
        index: usize,
        offset: usize,
        device: i32,
    },
}

impl From<StreamError> for RecordingError {
    fn from(e: StreamError) -> RecordingError {
        match e {
            StreamError::Decode(e) => RecordingError::Decode(e),
            StreamError::Io(e) => RecordingError::Io(e),
        }
    }
}

/// What a recording says beyond the model: the recorded process and the driver's view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordingInfo {
    /// Process id of the recorded process.
    pub pid: u32,
    /// Host name, command line and wall-clock start; `None` in a version-1 recording.
    pub process: Option<ProcessInfo>,
    /// The device total the last `cuMemGetInfo` of each device reported.
    pub device_total: BTreeMap<u32, u64>,
    /// Events the shim dropped; `None` when the recording has no trailer (cut short).
    pub dropped: Option<u64>,
}

/// A recording read into the model, with what the model has no place for.
#[derive(Debug)]
pub struct ReadRecording {
    pub parsed: Parsed,
    pub info: RecordingInfo,
}

/// The recording's stacks, symbolized into a stack table, and the table's id of each recorded
/// stack id. Each address is symbolized once.
fn stack_table(
    stacks: &BTreeMap<u32, Vec<u64>>,
    mappings: &[Mapping],
) -> (StackTable, FxHashMap<u32, StackId>) {
    let mut symbols = Symbolizer::new(mappings);
    let mut table = StackTable::default();
    let mut frames_of: FxHashMap<u64, Vec<u32>> = FxHashMap::default();
    let mut ids = FxHashMap::default();
    for (&id, addrs) in stacks {
        let mut frames = Vec::new();
        for &addr in addrs {
            let indices = frames_of.entry(addr).or_insert_with(|| {
                (symbols.frames(addr).into_iter())
                    .map(|f| table.add_frame(f))
                    .collect()
            });
            frames.extend_from_slice(indices);
        }
        if let Some(stack) = table.add_stack(frames.into()) {
            ids.insert(id, stack);
        }
    }
    (table, ids)
}

/// What a recording holds besides its events, gathered while they are folded.
struct Rest {
    pid: u32,
    process: Option<ProcessInfo>,
    stacks: BTreeMap<u32, Vec<u64>>,
    mappings: Vec<Mapping>,
    ending: Ending,
    /// Events read.
    events: usize,
}

/// Reads a whole recording in memory (see [`read_from`]).
pub fn read(bytes: &[u8]) -> Result<ReadRecording, RecordingError> {
    read_from(bytes)
}

/// Reads a recording from `input`, streaming: each record is folded as it is read, so memory
/// holds the model, never the file or its records. A recording cut short (no trailer, a partial
/// last record) is read as far as it goes, with a warning.
pub fn read_from(input: impl Read) -> Result<ReadRecording, RecordingError> {
    read_with(input, ()).map(|(read, ())| read)
}

/// Reads a recording from `input` as [`read_from`] does, feeding `extra` every change of the
/// driver state and the recording's stack and mapping definitions in the same pass.
pub fn read_with<X: Keeper>(
    input: impl Read,
    extra: X,
) -> Result<(ReadRecording, X), RecordingError> {
    let mut reader = RecordingReader::new(input)?;
    let wall = reader.process.as_ref().and_then(|p| p.wall_start_ns);
    let mut fold = DriverFold::with(reader.header.start_ns, wall, extra);
    let mut stacks = BTreeMap::new();
    let mut mappings = Vec::new();
    // The first record naming an impossible device; the rest is still decoded, so that damage
    // further on is reported as it is for a recording read whole.
    let mut bad_device = None;
    while let Some(item) = reader.next_item()? {
        match item {
            Item::Event {
                index,
                offset,
                record,
            } => {
                if bad_device.is_some() {
                    continue;
                }
                if record.device >= MAX_DEVICES {
                    bad_device = Some(RecordingError::Device {
                        index,
                        offset,
                        device: record.device,
                    });
                    continue;
                }
                fold.apply(&record);
            }
            Item::Stack { id, frames } => {
                fold.extra().stack(id, &frames);
                stacks.insert(id, frames);
            }
            Item::Mapping(m) => {
                fold.extra().mapping(&m);
                mappings.push(m);
            }
        }
    }
    if let Some(bad) = bad_device {
        return Err(bad);
    }
    let rest = Rest {
        pid: reader.header.pid,
        process: reader.process.take(),
        stacks,
        mappings,
        ending: reader.ending().unwrap_or_default(),
        events: reader.events(),
    };
    Ok(finish(fold, rest))
}

/// Maps decoded records into the model (see the module documentation). Fails on a record
/// naming an impossible device.
pub fn from_recording(recording: &Recording) -> Result<ReadRecording, RecordingError> {
    if let Some((index, r)) =
        (recording.records.iter().enumerate()).find(|(_, r)| r.device >= MAX_DEVICES)
    {
        return Err(RecordingError::Device {
            index,
            offset: (recording.offsets.get(index).copied())
                .unwrap_or(recording.records_at + index * memprof_wire::RECORD_LEN),
            device: r.device,
        });
    }
    let wall = recording.process.as_ref().and_then(|p| p.wall_start_ns);
    let mut fold = DriverFold::new(recording.header.start_ns, wall);
    for record in &recording.records {
        fold.apply(record);
    }
    let rest = Rest {
        pid: recording.header.pid,
        process: recording.process.clone(),
        stacks: recording.stacks.clone(),
        mappings: recording.mappings.clone(),
        ending: Ending {
            dropped: recording.dropped,
            delayed: recording.delayed,
            trailing_bytes: recording.trailing_bytes,
        },
        events: recording.records.len(),
    };
    Ok(finish(fold, rest).0)
}

/// The model and the recording's information from a fold of all its events, and the fold's
/// other keeper.
fn finish<X: Keeper>(fold: DriverFold<X>, rest: Rest) -> (ReadRecording, X) {
    let mut warnings = fold.warnings();
    match rest.ending.dropped {
        Some(0) => {}
        Some(n) => warnings.push(format!(
            "the shim dropped {n} events (its buffer was full); figures may miss them"
        )),
        None => warnings.push(format!(
            "the recording has no trailer (the program was killed or is still running); read \
             its first {} records",
            rest.events
        )),
    }
    if rest.ending.trailing_bytes > 0 {
        warnings.push(format!(
            "ignored {} bytes at the end that do not make a whole record",
            rest.ending.trailing_bytes
        ));
    }
    let info = RecordingInfo {
        pid: rest.pid,
        process: rest.process,
        device_total: fold.device_totals(),
        dropped: rest.ending.dropped,
    };
    let (stacks, ids) = stack_table(&rest.stacks, &rest.mappings);
    let (snapshot, extra) = fold.into_parts(stacks, &ids);
    let read = ReadRecording {
        parsed: Parsed {
            snapshot,
            warnings,
            keys: FormatKeys::default(),
            host: None,
        },
        info,
    };
    (read, extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Action, Snapshot};
    use memprof_wire::{FileHeader, Kind, Record, CUDA_ERROR_OUT_OF_MEMORY};

    fn rec(kind: Kind, ptr: u64, size: u64, aux: u64) -> Record {
        Record {
            ptr,
            size,
            aux,
            ..Record::new(kind)
        }
    }

    fn recording(records: Vec<Record>, dropped: Option<u64>) -> Recording {
        Recording {
            header: FileHeader {
                pid: 7,
                start_ns: 0,
            },
            version: memprof_wire::VERSION,
            process: None,
            records_at: 0,
            offsets: (0..records.len())
                .map(|i| i * memprof_wire::RECORD_LEN)
                .collect(),
            records,
            stacks: BTreeMap::new(),
            mappings: Vec::new(),
            dropped,
            delayed: 0,
            trailing_bytes: 0,
        }
    }

    fn actions(s: &Snapshot, device: usize) -> Vec<(Action, Option<u64>, u64)> {
        s.timeline
            .device(device)
            .iter()
            .map(|e| (e.action(), e.addr(), e.size))
            .collect()
    }

    #[test]
    fn driver_calls_become_segments_and_allocations() {
        let mut oom = rec(Kind::Alloc, 0, 900, 0);
        oom.result = CUDA_ERROR_OUT_OF_MEMORY;
        let mut create = rec(Kind::VmmCreate, 0, 64, 11);
        create.device = 2;
        let mut async_alloc = rec(Kind::AllocAsync, 0x500, 30, 0);
        async_alloc.stream = 0x99;
        let mut failed_free = rec(Kind::Free, 0x100, 0, 0);
        failed_free.result = 1;
        let read = from_recording(&recording(
            vec![
                rec(Kind::Alloc, 0x100, 10, 0),
                rec(Kind::MemGetInfo, 0, 1000, 400),
                oom,
                failed_free,
                rec(Kind::Free, 0x100, 0, 0),
                rec(Kind::Free, 0x999, 0, 0),
                create,
                rec(Kind::VmmMap, 0x7000, 32, 11),
                rec(Kind::VmmMap, 0x7020, 32, 11),
                rec(Kind::VmmUnmap, 0x7000, 64, 0),
                rec(Kind::VmmMap, 0x8000, 16, 11),
                async_alloc,
                rec(Kind::AddressReserve, 0x9000, 1 << 30, 0),
            ],
            Some(0),
        ))
        .expect("readable");
        let s = &read.parsed.snapshot;
        use Action::*;
        assert_eq!(
            actions(s, 0),
            [
                (SegmentAlloc, Some(0x100), 10),
                (Alloc, Some(0x100), 10),
                (Oom, None, 900),
                (FreeCompleted, Some(0x100), 10),
                (SegmentFree, Some(0x100), 10),
                (SegmentAlloc, Some(0x500), 30),
                (Alloc, Some(0x500), 30),
            ]
        );
        assert_eq!(s.timeline.device(0)[2].device_free(), Some(400));
        assert_eq!(s.timeline.stream(s.timeline.device(0)[6].stream), 0x99);
        assert!(s.timeline.device(1).is_empty());
        assert_eq!(
            actions(s, 2),
            [
                (SegmentMap, Some(0x7000), 32),
                (Alloc, Some(0x7000), 32),
                (SegmentMap, Some(0x7020), 32),
                (Alloc, Some(0x7020), 32),
                (FreeCompleted, Some(0x7000), 32),
                (SegmentUnmap, Some(0x7000), 32),
                (FreeCompleted, Some(0x7020), 32),
                (SegmentUnmap, Some(0x7020), 32),
                (SegmentMap, Some(0x8000), 16),
                (Alloc, Some(0x8000), 16),
            ]
        );
        let left: Vec<(u32, u64, u64, bool)> = s
            .segments
            .iter()
            .map(|g| (g.device, g.address, g.total_size, g.is_expandable))
            .collect();
        assert_eq!(left, [(0, 0x500, 30, false), (2, 0x8000, 16, true)]);
        assert_eq!(read.info.device_total.get(&0), Some(&1000));
        assert_eq!(read.info.pid, 7);
        let w = &read.parsed.warnings;
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].starts_with("1 frees or unmaps") && w[0].contains("record 5"));
        assert!(w[1].starts_with("1 calls failed"));
        assert!(w[2].starts_with("4 driver calls do not name their device"));
    }

    #[test]
    fn an_address_handed_out_again_ends_the_old_allocation() {
        let read = from_recording(&recording(
            vec![
                rec(Kind::Alloc, 0x100, 10, 0),
                rec(Kind::Alloc, 0x100, 20, 0),
            ],
            Some(1),
        ))
        .expect("readable");
        let s = &read.parsed.snapshot;
        let mut replay = crate::model::Replay::new(s.timeline.device(0), &s.segments);
        while replay.step().is_some() {}
        assert_eq!((replay.live().total(), replay.reserved()), (20, 20));
        assert_eq!(replay.issues().1, 0);
        assert!(read.parsed.warnings.iter().any(|w| w.contains("dropped 1")));
        assert!(read.parsed.warnings.iter().any(|w| w.contains("reused")));
    }

    #[test]
    fn entries_get_unix_times_from_the_clocks_of_the_start() {
        let mut alloc = rec(Kind::Alloc, 0x100, 10, 0);
        alloc.ts_ns = 5_000_000;
        let mut r = recording(vec![alloc], Some(0));
        r.header.start_ns = 1_000_000;
        let time = |r: &Recording| {
            let read = from_recording(r).expect("readable");
            read.parsed.snapshot.timeline.device(0)[0].time_us()
        };
        assert_eq!(time(&r), None, "no wall clock, no time");
        r.process = Some(ProcessInfo {
            wall_start_ns: Some(1_700_000_000_000_000_000),
            ..ProcessInfo::default()
        });
        assert_eq!(time(&r), Some(1_700_000_000_000_000 + 4_000));
    }

    fn file(records: &[Record]) -> Vec<u8> {
        let mut out = FileHeader {
            pid: 1,
            start_ns: 0,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(&ProcessInfo::default().encode());
        for r in records {
            out.extend_from_slice(&r.encode());
        }
        out
    }

    #[test]
    fn a_bad_record_is_named_by_index_and_byte_offset() {
        let mut bytes = file(&[rec(Kind::Alloc, 1, 2, 0), rec(Kind::Free, 1, 0, 0)]);
        // 32 header bytes, 4 of an empty process block, then one record.
        bytes[100] = 99;
        let err = read(&bytes).map(|_| ()).expect_err("unknown kind");
        assert_eq!(err.to_string(), "at byte 100: record 1 has unknown kind 99");
        let err = read(&bytes[..20]).map(|_| ()).expect_err("short header");
        assert_eq!(err.to_string(), "recording header cut short");
    }

    #[test]
    fn an_impossible_device_is_named_by_record_and_offset() {
        let mut odd = rec(Kind::Alloc, 1, 2, 0);
        odd.device = i32::MAX;
        let bytes = file(&[rec(Kind::Free, 1, 0, 0), odd]);
        let err = read(&bytes).map(|_| ()).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "at byte 100: record 1 names device 2147483647, not a device ordinal (0 to 1023)"
        );
    }

    /// Found by the `recording` fuzz target: a mapping whose file offset is near 2^64 made
    /// the symbolizer's file offset of an address overflow (a panic in a debug build).
    #[test]
    fn a_mapping_offset_past_any_file_gives_an_unknown_frame() {
        let mut bytes = file(&[]);
        bytes.extend_from_slice(&memprof_wire::encode_mapping(&Mapping {
            start: 0x1000,
            len: 0x1000,
            file_offset: u64::MAX - 8,
            path: b"/nonexistent/lib.so".to_vec(),
        }));
        bytes.extend_from_slice(&memprof_wire::encode_stack(1, &[0x1800]));
        let mut alloc = rec(Kind::Alloc, 0x100, 10, 0);
        alloc.stack = 1;
        bytes.extend_from_slice(&alloc.encode());
        let read = read(&bytes).expect("readable");
        let s = &read.parsed.snapshot;
        let stack = s.timeline.device(0)[0].stack.expect("a stack");
        let names: Vec<&str> = s.stacks.frames(stack).map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["0x1800"]);
    }

    #[test]
    fn damage_further_on_is_reported_before_an_impossible_device() {
        let mut odd = rec(Kind::Alloc, 1, 2, 0);
        odd.device = i32::MAX;
        let mut bytes = file(&[odd, rec(Kind::Free, 1, 0, 0)]);
        bytes[100] = 99;
        let err = read(&bytes).map(|_| ()).expect_err("refused");
        assert_eq!(err.to_string(), "at byte 100: record 1 has unknown kind 99");
    }

    #[test]
    fn a_cut_recording_is_read_as_far_as_it_goes() {
        let bytes = file(&[rec(Kind::Alloc, 1, 2, 0), rec(Kind::Free, 1, 0, 0)]);
        let read = read(&bytes[..bytes.len() - 10]).expect("readable");
        assert_eq!(read.parsed.snapshot.timeline.device(0).len(), 2);
        assert_eq!(read.info.dropped, None);
        let w = read.parsed.warnings.join("\n");
        assert!(
            w.contains("no trailer") && w.contains("first 1 records"),
            "{w}"
        );
        assert!(w.contains("ignored 54 bytes"), "{w}");
    }
}

#[cfg(test)]
mod damaged {
    //! Damaged recordings: random bytes written over a valid one are read or refused, and what
    //! is read goes through the analyses and the OOM diagnosis without a panic.
    use super::*;
    use crate::analysis::analyze_snapshot;
    use crate::diagnose::diagnose_recording_device;
    use memprof_wire::{FileHeader, Kind, Record, CUDA_ERROR_OUT_OF_MEMORY};

    fn valid() -> Vec<u8> {
        let mut out = FileHeader {
            pid: 3,
            start_ns: 100,
        }
        .encode()
        .to_vec();
        out.extend_from_slice(
            &ProcessInfo {
                wall_start_ns: Some(1_000_000_000),
                host: Some("h".into()),
                args: vec!["a".into()],
            }
            .encode(),
        );
        let kinds = [
            Kind::Alloc,
            Kind::MemGetInfo,
            Kind::Alloc,
            Kind::Free,
            Kind::VmmCreate,
            Kind::VmmMap,
            Kind::VmmUnmap,
            Kind::AllocAsync,
            Kind::FreeAsync,
        ];
        for (i, kind) in kinds.into_iter().cycle().take(60).enumerate() {
            let mut r = Record::new(kind);
            r.ptr = 0x1000 * (i as u64 % 7 + 1);
            r.size = 4096 * (i as u64 % 5 + 1);
            r.aux = i as u64 % 3;
            r.ts_ns = 100 + i as u64;
            r.device = i as i32 % 3 - 1;
            if i % 11 == 0 {
                r.result = CUDA_ERROR_OUT_OF_MEMORY;
            }
            out.extend_from_slice(&r.encode());
        }
        out
    }

    /// xorshift64*: a fixed sequence, so a failure repeats.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn random_damage_is_read_or_refused_never_a_panic() {
        let original = valid();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..3000 {
            let mut bytes = original.clone();
            for _ in 0..1 + next(&mut state) % 8 {
                let at = (next(&mut state) % bytes.len() as u64) as usize;
                // Often a whole field's worth of extreme values, else one random byte.
                if next(&mut state).is_multiple_of(2) && at + 8 <= bytes.len() {
                    let word =
                        [u64::MAX, 0, 1 << 63, next(&mut state)][next(&mut state) as usize % 4];
                    bytes[at..at + 8].copy_from_slice(&word.to_le_bytes());
                } else {
                    bytes[at] = next(&mut state) as u8;
                }
            }
            let cut = bytes.len() - (next(&mut state) % 100) as usize;
            let Ok(read) = read(&bytes[..cut]) else {
                continue;
            };
            let snapshot = &read.parsed.snapshot;
            let devices = analyze_snapshot(snapshot, 5, None);
            let starts = crate::model::ReplayStarts::new(snapshot);
            for d in devices {
                let total = read.info.device_total.get(&d.device).copied();
                let _ = diagnose_recording_device(&starts, d.device, total, true);
            }
        }
    }
}
