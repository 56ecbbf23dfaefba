//! The moments an account speaks of (the peaks, each OOM and OOM retry, each `empty_cache()`
//! burst, the dump), each with its trace entry and one time on the input's one axis: seconds
//! from the first trace entry of any device, the axis the plots use.

use super::figures::Figures;
use crate::model::{Snapshot, TraceEntry};
use serde::{Deserialize, Serialize};

/// What happened at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MomentKind {
    /// The highest total of live requested bytes (`max_memory_allocated()` less rounding).
    PeakRequested,
    /// The highest total of allocated block bytes (`max_memory_allocated()`).
    PeakAllocated,
    /// The highest reserved total (`max_memory_reserved()`).
    PeakReserved,
    /// A request the allocator could not serve (an `oom` trace entry).
    Oom,
    /// A request served only after the allocator freed its cache (an OOM retry).
    OomRetry,
    /// The first release of a `torch.cuda.empty_cache()` call.
    EmptyCache,
    /// The state the file holds (when the snapshot was taken).
    Dump,
}

/// One moment of one device, with the figures then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moment {
    pub kind: MomentKind,
    /// The trace entry (of the device's trace) just after which the moment is; `None` for the
    /// dump, and for a peak that is the state before the first entry.
    pub entry: Option<usize>,
    /// Microseconds on the input's axis (`TimeAxis`); `None` when the trace has no times.
    /// Serialized as `seconds`.
    #[serde(rename = "seconds", with = "seconds")]
    pub offset_us: Option<i64>,
    pub figures: Figures,
}

impl Moment {
    /// Seconds on the input's axis, when known.
    pub fn seconds(&self) -> Option<f64> {
        self.offset_us.map(|us| us as f64 / 1e6)
    }
}

/// The one time axis of an input: microseconds since the first trace entry of any device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeAxis {
    /// The time of the first trace entry of any device (µs since the Unix epoch, as PyTorch
    /// records it); `None` when no entry has a time.
    pub origin_us: Option<i64>,
}

impl TimeAxis {
    pub fn of(snapshot: &Snapshot) -> TimeAxis {
        TimeAxis {
            origin_us: snapshot.timeline.time_origin_us(),
        }
    }

    /// Where `entry` of `entries` lies on the axis.
    pub fn offset_of(&self, entries: &[TraceEntry], entry: usize) -> Option<i64> {
        Some(entries.get(entry)?.time_us()? - self.origin_us?)
    }
}

/// `Option<i64>` microseconds written and read as `Option<f64>` seconds.
pub(crate) mod seconds {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(us: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match us {
            Some(us) => s.serialize_f64(*us as f64 / 1e6),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.map(|s| (s * 1e6).round() as i64))
    }
}
