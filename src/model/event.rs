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

/// Index of rare per-entry metadata (compile context, user metadata, forward frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExtraId(pub NonZeroU32);

/// One allocator trace entry, kept compact (40 bytes) because real traces hold millions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceEntry {
    /// The block or segment address; for `Oom` the `device_free` value.
    addr_or_free: u64,
    /// Requested size for alloc / free entries, segment or mapped size for segment entries,
    /// rounded request for `Oom`, active total for `Snapshot`.
    pub size: u64,
    time_us: i64,
    pub stack: Option<StackId>,
    pub extra: Option<ExtraId>,
    pub stream: StreamIndex,
    /// The entry's `pool_id`, when the trace records one (PyTorch after 2.11).
    pub pool: Option<PoolIndex>,
    pub action: Action,
    flags: u8,
}

const HAS_TIME: u8 = 1;
const HAS_ADDR: u8 = 2;
/// The source entry had no `frames` key (PyTorch leaves it out where it kept no context).
const NO_FRAMES_KEY: u8 = 4;

impl TraceEntry {
    /// An entry with an address (every action but `Oom`).
    pub fn new(action: Action, addr: Option<u64>, size: u64, stream: StreamIndex) -> TraceEntry {
        TraceEntry {
            addr_or_free: addr.unwrap_or(0),
            size,
            time_us: 0,
            stack: None,
            extra: None,
            stream,
            pool: None,
            action,
            flags: if addr.is_some() { HAS_ADDR } else { 0 },
        }
    }

    /// An `Oom` entry: `device_free` is what the driver reported free, when recorded.
    pub fn oom(size: u64, device_free: Option<u64>, stream: StreamIndex) -> TraceEntry {
        let mut entry = TraceEntry::new(Action::Oom, device_free, size, stream);
        entry.flags &= !HAS_ADDR;
        entry.flags |= if device_free.is_some() { HAS_ADDR } else { 0 };
        entry
    }

    /// Sets the entry's time in microseconds since the Unix epoch.
    pub fn with_time(mut self, time_us: Option<i64>) -> TraceEntry {
        match time_us {
            Some(t) => {
                self.time_us = t;
                self.flags |= HAS_TIME;
            }
            None => self.flags &= !HAS_TIME,
        }
        self
    }

    /// The address, for every action but `Oom`.
    pub fn addr(&self) -> Option<u64> {
        (self.action != Action::Oom && self.flags & HAS_ADDR != 0).then_some(self.addr_or_free)
    }

    /// Free device memory reported at an `Oom` entry.
    pub fn device_free(&self) -> Option<u64> {
        (self.action == Action::Oom && self.flags & HAS_ADDR != 0).then_some(self.addr_or_free)
    }

    /// Marks an entry whose source had no `frames` key, so an export leaves it out too.
    pub fn without_frames_key(mut self) -> TraceEntry {
        self.flags |= NO_FRAMES_KEY;
        self
    }

    /// Whether the source entry had a `frames` key (every entry not read from a file has).
    pub fn has_frames_key(&self) -> bool {
        self.flags & NO_FRAMES_KEY == 0
    }

    /// Microseconds since the Unix epoch (PyTorch 2.2+ traces).
    pub fn time_us(&self) -> Option<i64> {
        (self.flags & HAS_TIME != 0).then_some(self.time_us)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_stays_compact() {
        assert_eq!(std::mem::size_of::<TraceEntry>(), 40);
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
