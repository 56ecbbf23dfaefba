//! Allocator pressure on one device: OOM retries, `empty_cache()` calls, the capacity they
//! bracket and the headroom at the peak (computed by `diagnose::pressure`, which replays the
//! trace to tell retries from `empty_cache()` calls).

use crate::sim::replay::UpperBound;
use serde::Serialize;

/// One OOM retry: the allocator ran out of device memory, released its cache and retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Retry {
    /// Index of the request that was retried (the `alloc` after the releases).
    pub entry_index: usize,
    /// Microseconds from the first entry, when the trace has times.
    pub offset_us: Option<i64>,
    pub request_bytes: u64,
    /// Cached memory released to make room.
    pub released_bytes: u64,
    /// Segments released.
    pub segments_released: usize,
    /// Site of the retried request.
    pub site: String,
}

/// `empty_cache()` calls made from one place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EmptyCacheSite {
    pub site: String,
    pub bursts: usize,
    pub released_bytes: u64,
}

/// One device's allocator pressure (names fixed by the JSON reference).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pressure {
    /// OOM retries that succeeded (the failed one, if any, is the `oom` entry itself).
    pub oom_retries: usize,
    pub empty_cache_bursts: usize,
    /// The device memory the allocator could use lies in [min, max]: min is the highest
    /// reserved total the trace reached, max the least that the retries, the `oom` entries
    /// (reserved plus the segment they could not get, and reserved plus the device's free
    /// memory then) and a device total given allow. Both equal a capacity given to the
    /// replay; null when nothing bounds it.
    pub capacity_bytes_min: Option<u64>,
    pub capacity_bytes_max: Option<u64>,
    /// What gave `capacity_bytes_max` when the trace bracketed it.
    pub capacity_max_from: Option<UpperBound>,
    /// Where the capacity came from: `given`, `inferred` (bracketed by the trace) or
    /// `unknown`.
    pub capacity_source: &'static str,
    /// At most this much device memory was left at the peak of reserved memory
    /// (capacity_bytes_max - peak reserved); null when the capacity is not known.
    pub headroom_at_peak_bytes: Option<u64>,
    pub peak_reserved_bytes: u64,
    /// The request of the last retry when the `oom` entry followed it with no request
    /// served in between: that retry postponed the OOM, it did not recover from it.
    pub retry_before_oom: Option<usize>,
    /// The `oom` entry, when the trace ends in one.
    pub oom_entry_index: Option<usize>,
    /// The first retries, in trace order.
    pub retries: Vec<Retry>,
    /// Where the `empty_cache()` calls came from, most bursts first.
    pub empty_cache_sites: Vec<EmptyCacheSite>,
}
