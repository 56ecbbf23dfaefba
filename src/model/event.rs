//! The event vocabulary: one `Action` per PyTorch trace action, and the compact `TraceEntry`.
//!
//! Every source (snapshot trace, shim recording, simulator) speaks this vocabulary, so every
//! analysis and sink works on all of them. No I/O here.

use serde::Serialize;
use std::fmt;
use std::num::NonZeroU32;

/// What happened, named after the `action` strings of PyTorch's allocator trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Action {
    /// A block was handed out (`alloc_found_block`); size is the requested size.
    Alloc,
    /// The program freed a block (`free`); it stays active until `FreeCompleted`.
    FreeRequested,
    /// The block went back to the cache (`free_block`), after any cross-stream events.
    FreeCompleted,
    /// A new segment came from the driver (`cudaMalloc`); size is the segment size.
    SegmentAlloc,
    /// A segment went back to the driver (`cudaFree`).
    SegmentFree,
    /// Pages were mapped into an expandable segment (`cuMemMap`).
    SegmentMap,
    /// Pages were unmapped from an expandable segment (`cuMemUnmap`).
    SegmentUnmap,
    /// An earlier `torch.cuda.memory._snapshot()` call; size is the active total then.
    Snapshot,
    /// The allocator ran out of memory; size is the rounded request, and the entry carries
    /// `device_free` (what `cudaMemGetInfo` reported) instead of an address.
    Oom,
}

impl Action {
    /// Every action, in declaration order.
    pub const ALL: [Action; 9] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
    ];

    /// The action string PyTorch writes in a trace entry.
    pub fn torch_name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
        }
    }

    /// Reads PyTorch's action string.
    pub fn from_torch_name(name: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.torch_name() == name)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.torch_name())
    }
}

/// Index of an interned call stack in a `StackTable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub NonZeroU32);

/// Index of an interned stream in a `Timeline` (streams are `cudaStream_t` values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StreamIndex(pub u16);

/// Index of an interned private-pool id in a `Timeline` (the `pool_id` pair newer PyTorch
/// writes on trace entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolIndex(pub u16);

impl PoolIndex {
    /// The largest index an entry can hold: a trace names at most 65,535 pools.
    pub const MAX: PoolIndex = PoolIndex(u16::MAX - 1);
}

/// Index of rare per-entry metadata (compile context, user metadata, forward frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExtraId(pub NonZeroU32);

/// One allocator trace entry, kept compact (32 bytes) because real traces hold millions: the
/// time, flags and action share one word, and the rare metadata lives beside the entries
/// (`Timeline::extra_at`), the entry saying only whether it has some.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceEntry {
    /// The block or segment address; for `Oom` the `device_free` value.
    addr_or_free: u64,
    /// Requested size for alloc / free entries, segment or mapped size for segment entries,
    /// rounded request for `Oom`, active total for `Snapshot`.
    pub size: u64,
    /// The time in microseconds (bits 8 to 63, signed), the flags (bits 4 to 7) and the action
    /// (bits 0 to 3).
    word: u64,
    pub stack: Option<StackId>,
    pub stream: StreamIndex,
    /// The entry's `pool_id` index plus one, 0 when the trace records none (PyTorch after 2.11).
    pool: u16,
}

const HAS_TIME: u64 = 1 << 4;
const HAS_ADDR: u64 = 1 << 5;
/// The source entry had no `frames` key (PyTorch leaves it out where it kept no context).
const NO_FRAMES_KEY: u64 = 1 << 6;
/// The entry has metadata in its timeline's table (`Timeline::extra_at`).
const HAS_EXTRA: u64 = 1 << 7;
const ACTION_BITS: u64 = 0xf;
const TIME_SHIFT: u32 = 8;

impl TraceEntry {
    /// The earliest and latest times an entry can hold (56 bits, more than a million years
    /// each side of 1970).
    pub const TIME_RANGE: std::ops::RangeInclusive<i64> =
        (i64::MIN >> TIME_SHIFT)..=(i64::MAX >> TIME_SHIFT);

    /// An entry with an address (every action but `Oom`).
    pub fn new(action: Action, addr: Option<u64>, size: u64, stream: StreamIndex) -> TraceEntry {
        TraceEntry {
            addr_or_free: addr.unwrap_or(0),
            size,
            word: action as u64 | if addr.is_some() { HAS_ADDR } else { 0 },
            stack: None,
            stream,
            pool: 0,
        }
    }

    /// An `Oom` entry: `device_free` is what the driver reported free, when recorded.
    pub fn oom(size: u64, device_free: Option<u64>, stream: StreamIndex) -> TraceEntry {
        TraceEntry::new(Action::Oom, device_free, size, stream)
    }

    /// What happened.
    #[inline(always)]
    pub fn action(&self) -> Action {
        match self.word & ACTION_BITS {
            0 => Action::Alloc,
            1 => Action::FreeRequested,
            2 => Action::FreeCompleted,
            3 => Action::SegmentAlloc,
            4 => Action::SegmentFree,
            5 => Action::SegmentMap,
            6 => Action::SegmentUnmap,
            7 => Action::Snapshot,
            _ => Action::Oom,
        }
    }

    /// Sets the entry's time in microseconds since the Unix epoch. A time outside
    /// `TIME_RANGE` is held at its nearest end (readers refuse such times first).
    pub fn with_time(mut self, time_us: Option<i64>) -> TraceEntry {
        self.word &= (1 << TIME_SHIFT) - 1;
        if let Some(t) = time_us {
            debug_assert!(TraceEntry::TIME_RANGE.contains(&t));
            let t = t.clamp(
                *TraceEntry::TIME_RANGE.start(),
                *TraceEntry::TIME_RANGE.end(),
            );
            self.word |= HAS_TIME | (t as u64) << TIME_SHIFT;
        } else {
            self.word &= !HAS_TIME;
        }
        self
    }

    /// The address, for every action but `Oom`.
    pub fn addr(&self) -> Option<u64> {
        (self.action() != Action::Oom && self.word & HAS_ADDR != 0).then_some(self.addr_or_free)
    }

    /// Free device memory reported at an `Oom` entry.
    pub fn device_free(&self) -> Option<u64> {
        (self.action() == Action::Oom && self.word & HAS_ADDR != 0).then_some(self.addr_or_free)
    }

    /// Marks an entry whose source had no `frames` key, so an export leaves it out too.
    pub fn without_frames_key(mut self) -> TraceEntry {
        self.word |= NO_FRAMES_KEY;
        self
    }

    /// Whether the source entry had a `frames` key (every entry not read from a file has).
    pub fn has_frames_key(&self) -> bool {
        self.word & NO_FRAMES_KEY == 0
    }

    /// Microseconds since the Unix epoch (PyTorch 2.2+ traces).
    pub fn time_us(&self) -> Option<i64> {
        (self.word & HAS_TIME != 0).then_some(self.word as i64 >> TIME_SHIFT)
    }

    /// The entry's private-pool index, when the trace records one.
    pub fn pool(&self) -> Option<PoolIndex> {
        self.pool.checked_sub(1).map(PoolIndex)
    }

    /// Sets the entry's pool index (`None` where the trace records none). Indices stop at
    /// `PoolIndex::MAX`: the readers refuse a trace with more pools.
    pub fn with_pool(mut self, pool: Option<PoolIndex>) -> TraceEntry {
        debug_assert!(pool.is_none_or(|p| p.0 <= PoolIndex::MAX.0));
        self.pool = pool.map_or(0, |p| p.0.saturating_add(1));
        self
    }

    /// Says whether the entry has metadata in its timeline's table (`Timeline::extra_at`).
    pub fn with_extra(mut self, has: bool) -> TraceEntry {
        self.word = self.word & !HAS_EXTRA | if has { HAS_EXTRA } else { 0 };
        self
    }

    /// Whether the entry has metadata in its timeline's table.
    pub fn has_extra(&self) -> bool {
        self.word & HAS_EXTRA != 0
    }

    /// The stream and pool fields as one number, for a reader that parks other figures in
    /// them for a while (see `with_lane`).
    pub fn lane(&self) -> u32 {
        u32::from(self.stream.0) | u32::from(self.pool) << 16
    }

    /// Sets the stream and pool fields from one number (`lane`'s inverse). The snapshot
    /// reader parks an index of its own there while it folds, so that the entry carries it
    /// through every copy, and restores the fields before the entry leaves the reader.
    pub fn with_lane(mut self, lane: u32) -> TraceEntry {
        self.stream = StreamIndex(lane as u16);
        self.pool = (lane >> 16) as u16;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_stays_compact() {
        assert_eq!(std::mem::size_of::<TraceEntry>(), 32);
    }

    #[test]
    fn packed_fields_read_back() {
        for action in Action::ALL {
            let e = TraceEntry::new(action, Some(9), 1, StreamIndex(3));
            assert_eq!(e.action(), action);
        }
        let ends = [
            *TraceEntry::TIME_RANGE.start(),
            -1,
            0,
            1,
            *TraceEntry::TIME_RANGE.end(),
        ];
        for t in ends {
            let e = TraceEntry::new(
                Action::SegmentUnmap,
                Some(u64::MAX),
                u64::MAX,
                StreamIndex(7),
            )
            .with_time(Some(t))
            .without_frames_key()
            .with_pool(Some(PoolIndex::MAX))
            .with_extra(true);
            assert_eq!(e.action(), Action::SegmentUnmap);
            assert_eq!(e.time_us(), Some(t));
            assert_eq!((e.addr(), e.size), (Some(u64::MAX), u64::MAX));
            assert_eq!((e.stream, e.pool()), (StreamIndex(7), Some(PoolIndex::MAX)));
            assert!(!e.has_frames_key() && e.has_extra());
            assert_eq!(e.with_time(None).time_us(), None);
            assert_eq!(e.with_pool(None).pool(), None);
            assert!(!e.with_extra(false).has_extra());
            assert_eq!(e.with_pool(Some(PoolIndex(0))).pool(), Some(PoolIndex(0)));
            assert_eq!(e.with_lane(e.lane()), e);
        }
        let plain = TraceEntry::new(Action::Alloc, None, 0, StreamIndex(0));
        assert_eq!(
            (plain.time_us(), plain.pool(), plain.has_extra()),
            (None, None, false)
        );
        assert!(plain.has_frames_key());
    }

    #[test]
    fn action_names_round_trip() {
        for action in Action::ALL {
            assert_eq!(Action::from_torch_name(action.torch_name()), Some(action));
        }
        assert_eq!(Action::from_torch_name("free"), None);
    }

    #[test]
    fn oom_carries_device_free_not_addr() {
        let e = TraceEntry::oom(4096, Some(123), StreamIndex(0));
        assert_eq!(e.addr(), None);
        assert_eq!(e.device_free(), Some(123));
        let a = TraceEntry::new(Action::Alloc, Some(77), 10, StreamIndex(0)).with_time(Some(5));
        assert_eq!(
            (a.addr(), a.device_free(), a.time_us()),
            (Some(77), None, Some(5))
        );
        assert_eq!(TraceEntry::oom(1, None, StreamIndex(0)).device_free(), None);
    }
}
