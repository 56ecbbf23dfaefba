//! The timeline: every device's trace entries in order, with the tables they point into.

use super::event::{ExtraId, StreamIndex, TraceEntry};
use std::ops::Range;
use std::sync::OnceLock;

/// Rare per-entry metadata of newer PyTorch versions; absent on almost every entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EntryExtra {
    /// `compile_context` (2.8+), when it is not PyTorch's "N/A" placeholder.
    pub compile_context: Option<String>,
    /// `user_metadata` (2.10+), when not empty.
    pub user_metadata: Option<String>,
    /// `forward_frames` (2.11): where the tensor was created in the forward pass.
    pub forward_frames: Vec<String>,
}

/// All trace entries of all devices. Entries of one device are contiguous and chronological.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    entries: Vec<TraceEntry>,
    devices: Vec<Range<usize>>,
    streams: Vec<u64>,
    extras: Vec<EntryExtra>,
    /// `pool_id` of each `PoolIndex`.
    pools: Vec<(i64, i64)>,
    /// The time of the first timed entry of any device, found once (`time_origin_us`).
    origin: OnceLock<Option<i64>>,
    /// Whether the traces start with nothing alive (see `starts_empty`).
    starts_empty: bool,
}

impl Timeline {
    /// Builds a timeline from entries and each device's range in them (index = device).
    pub fn new(mut entries: Vec<TraceEntry>, devices: Vec<Range<usize>>) -> Timeline {
        debug_assert!(devices.iter().all(|r| r.end <= entries.len()));
        // The room past the last entry that the reader grew (and mapped ahead, up to 2 MiB)
        // goes back: the allocator shrinks it in place, without a copy.
        entries.shrink_to_fit();
        Timeline {
            entries,
            devices,
            streams: vec![0],
            extras: Vec::new(),
            pools: Vec::new(),
            origin: OnceLock::new(),
            starts_empty: false,
        }
    }

    /// Says that nothing was alive before any device's trace: every free in a trace follows
    /// the allocation of its address there, and every block that the segments hold at the end
    /// was allocated in its device's trace. A recording's fold makes its traces so (it skips a
    /// free of memory it did not see allocated), and replays then need not look for
    /// allocations made before the trace.
    pub fn set_starts_empty(&mut self) {
        self.starts_empty = true;
    }

    /// Whether nothing was alive before any device's trace (`set_starts_empty`).
    pub fn starts_empty(&self) -> bool {
        self.starts_empty
    }

    /// The time of the first trace entry of any device that has a time (µs, as PyTorch
    /// records it): the origin of the input's one time axis. Found once, however many devices.
    pub fn time_origin_us(&self) -> Option<i64> {
        *self.origin.get_or_init(|| {
            (0..self.device_count())
                .filter_map(|d| self.device(d).iter().find_map(|e| e.time_us()))
                .min()
        })
    }

    /// The same entries and tables with other device ranges (ranges may share entries).
    #[cfg(test)]
    pub(crate) fn with_devices(self, devices: Vec<Range<usize>>) -> Timeline {
        debug_assert!(devices.iter().all(|r| r.end <= self.entries.len()));
        Timeline {
            devices,
            origin: OnceLock::new(),
            ..self
        }
    }

    /// The number of devices with a trace list (possibly empty).
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// One device's entries, oldest first; empty for a device without a trace.
    pub fn device(&self, device: usize) -> &[TraceEntry] {
        self.devices
            .get(device)
            .map_or(&[], |r| &self.entries[r.clone()])
    }

    /// The stream handle of an index.
    pub fn stream(&self, index: StreamIndex) -> u64 {
        self.streams[index.0 as usize]
    }

    /// The stream handle of every index, in index order.
    pub fn streams(&self) -> &[u64] {
        &self.streams
    }

    /// The metadata of an entry that has some.
    pub fn extra(&self, id: ExtraId) -> &EntryExtra {
        &self.extras[id.0.get() as usize - 1]
    }

    /// The `pool_id` of each `PoolIndex` entries hold (empty when no entry records one).
    pub fn pools(&self) -> &[(i64, i64)] {
        &self.pools
    }

    /// Replaces the `pool_id` table.
    pub fn set_pools(&mut self, pools: Vec<(i64, i64)>) {
        self.pools = pools;
    }

    /// Replaces the stream and extra tables (when entries were built elsewhere).
    pub fn set_tables(&mut self, streams: Vec<u64>, extras: Vec<EntryExtra>) {
        self.streams = streams;
        self.extras = extras;
    }
}
