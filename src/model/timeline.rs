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

/// Entries a block of `Timeline::extra_blocks` covers.
const EXTRA_BLOCK: u32 = 1024;

/// All trace entries of all devices. Entries of one device are contiguous and chronological.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// The entries, in one list (a snapshot's, `new`) or one per device (a recording's,
    /// `of_devices`, so that its devices' entries are never copied into one).
    lists: Vec<Vec<TraceEntry>>,
    /// Each device's list and range in it.
    devices: Vec<(usize, Range<usize>)>,
    streams: Vec<u64>,
    extras: Vec<EntryExtra>,
    /// The metadata of each entry that has some (`TraceEntry::has_extra`): its index in
    /// the one list of entries and its id in `extras`, in index order.
    extra_at: Vec<(u32, ExtraId)>,
    /// Where in `extra_at` the entries of each block of `EXTRA_BLOCK` entries start, so that a
    /// lookup searches one block's part (a trace may have metadata on every entry).
    extra_blocks: Vec<usize>,
    /// `pool_id` of each `PoolIndex`.
    pools: Vec<(i64, i64)>,
    /// The time of the first timed entry of any device, found once (`time_origin_us`).
    origin: OnceLock<Option<i64>>,
    /// Whether the traces start with nothing alive (see `starts_empty`).
    starts_empty: bool,
}

impl Timeline {
    /// Builds a timeline from entries and each device's range in them (index = device).
    pub fn new(entries: Vec<TraceEntry>, devices: Vec<Range<usize>>) -> Timeline {
        debug_assert!(devices.iter().all(|r| r.end <= entries.len()));
        let devices = devices.into_iter().map(|r| (0, r)).collect();
        Timeline::of_lists(vec![entries], devices)
    }

    /// Builds a timeline from each device's entries (index = device), without metadata.
    pub fn of_devices(lists: Vec<Vec<TraceEntry>>) -> Timeline {
        debug_assert!(lists.iter().flatten().all(|e| !e.has_extra()));
        let devices = (lists.iter().enumerate())
            .map(|(i, l)| (i, 0..l.len()))
            .collect();
        Timeline::of_lists(lists, devices)
    }

    fn of_lists(mut lists: Vec<Vec<TraceEntry>>, devices: Vec<(usize, Range<usize>)>) -> Timeline {
        // The room past the last entry that the reader grew (and mapped ahead, up to 2 MiB)
        // goes back: the allocator shrinks it in place, without a copy.
        for list in &mut lists {
            list.shrink_to_fit();
        }
        Timeline {
            lists,
            devices,
            streams: vec![0],
            extras: Vec::new(),
            extra_at: Vec::new(),
            extra_blocks: Vec::new(),
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
        debug_assert!(self.lists.len() == 1);
        debug_assert!(devices.iter().all(|r| r.end <= self.lists[0].len()));
        Timeline {
            devices: devices.into_iter().map(|r| (0, r)).collect(),
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
            .map_or(&[], |(list, r)| &self.lists[*list][r.clone()])
    }

    /// The stream handle of an index.
    pub fn stream(&self, index: StreamIndex) -> u64 {
        self.streams[index.0 as usize]
    }

    /// The stream handle of every index, in index order.
    pub fn streams(&self) -> &[u64] {
        &self.streams
    }

    /// Whether any entry's metadata holds a `user_metadata` text.
    pub fn has_user_metadata(&self) -> bool {
        self.extras.iter().any(|x| x.user_metadata.is_some())
    }

    /// The metadata of entry `index` of `device`'s trace, if it has some (a search only for
    /// an entry that says it has some).
    pub fn extra_at(&self, device: usize, index: usize) -> Option<&EntryExtra> {
        if !self.device(device).get(index)?.has_extra() {
            return None;
        }
        // Only a timeline of one list has metadata (`set_extras`).
        let at = self.devices.get(device)?.1.start + index;
        let at = u32::try_from(at).ok()?;
        let block = (at / EXTRA_BLOCK) as usize;
        let from = *self.extra_blocks.get(block)?;
        let to = self
            .extra_blocks
            .get(block + 1)
            .map_or(self.extra_at.len(), |&to| to);
        let pairs = &self.extra_at[from..to];
        let i = pairs.binary_search_by_key(&at, |&(i, _)| i).ok()?;
        self.extras.get(pairs[i].1 .0.get() as usize - 1)
    }

    /// The metadata ids of `device`'s entries that have some, with each entry's index in the
    /// device's trace, in order.
    pub fn device_extras(&self, device: usize) -> impl Iterator<Item = (usize, ExtraId)> + '_ {
        let range = (self.devices.get(device)).map_or(0..0, |(_, r)| r.clone());
        let from = self
            .extra_at
            .partition_point(|&(i, _)| (i as usize) < range.start);
        self.extra_at[from..]
            .iter()
            .take_while(move |&&(i, _)| (i as usize) < range.end)
            .map(move |&(i, id)| (i as usize - range.start, id))
    }

    /// The `pool_id` of each `PoolIndex` entries hold (empty when no entry records one).
    pub fn pools(&self) -> &[(i64, i64)] {
        &self.pools
    }

    /// Replaces the `pool_id` table.
    pub fn set_pools(&mut self, pools: Vec<(i64, i64)>) {
        self.pools = pools;
    }

    /// Replaces the stream table (when entries were built elsewhere).
    pub fn set_streams(&mut self, streams: Vec<u64>) {
        self.streams = streams;
    }

    /// Replaces the metadata table and which entries it belongs to, in a timeline of one list
    /// (`new`): `at` holds each entry's index in that list and its id in `extras`, in index
    /// order. Each of those entries says it has metadata, and no other does.
    pub fn set_extras(&mut self, extras: Vec<EntryExtra>, at: Vec<(u32, ExtraId)>) {
        debug_assert!(self.lists.len() == 1 || at.is_empty());
        debug_assert!(at.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(at
            .iter()
            .all(|&(i, id)| self.lists[0][i as usize].has_extra()
                && id.0.get() as usize <= extras.len()));
        debug_assert_eq!(
            at.len(),
            self.lists
                .iter()
                .flatten()
                .filter(|e| e.has_extra())
                .count()
        );
        let blocks = at.last().map_or(0, |&(i, _)| i / EXTRA_BLOCK + 1);
        self.extra_blocks = (0..blocks)
            .map(|b| at.partition_point(|&(i, _)| i / EXTRA_BLOCK < b))
            .collect();
        self.extras = extras;
        self.extra_at = at;
    }
}
