//! A whole memory snapshot in model terms: the final layout, the timeline and settings.

use super::layout::Segment;
use super::stack::StackTable;
use super::timeline::Timeline;

/// Which snapshot layout the file used (see the reference's version table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotFormat {
    /// PyTorch 2.0: blocks carry `history`, no `address`.
    History,
    /// PyTorch 2.1 and later.
    Modern,
    /// A bare segment list, as `torch.cuda.memory_snapshot()` returns; no trace.
    SegmentsOnly,
    /// A memprof recording of driver calls (`source::recording`): segments only, no stacks.
    Recording,
}

/// `allocator_settings` (PyTorch 2.3+): what the allocator ran with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocatorSettings {
    /// The raw `PYTORCH_CUDA_ALLOC_CONF` string (empty when unset).
    pub alloc_conf: Option<String>,
    pub expandable_segments: Option<bool>,
    /// `None` when unlimited (PyTorch writes -1).
    pub max_split_size: Option<u64>,
    pub garbage_collection_threshold: Option<f64>,
    /// (interval start in MiB, divisions), for intervals with divisions set.
    pub roundup_power2_divisions: Vec<(u64, u64)>,
}

/// Which optional keys a snapshot file held: each arrived with a PyTorch release, so together
/// they bound the version that wrote the file (`analysis::version`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormatKeys {
    /// Top-level `allocator_settings` (2.3+).
    pub allocator_settings: bool,
    /// Top-level `external_annotations` (2.5+).
    pub external_annotations: bool,
    /// `allocator_settings.graph_capture_record_stream_reuse` (2.9+).
    pub settings_stream_reuse: bool,
    /// Trace entries carry `time_us` (2.2+).
    pub entry_time_us: bool,
    /// Trace entries carry `compile_context` (2.8+).
    pub entry_compile_context: bool,
    /// Trace entries carry `user_metadata` (2.10+).
    pub entry_user_metadata: bool,
}

/// One `record_function` annotation (PyTorch 2.5+ `external_annotations`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Annotation {
    pub device: Option<u32>,
    pub time_us: Option<i64>,
    pub stage: Option<String>,
    pub name: Option<String>,
}

/// Everything read from one snapshot file.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub format: SnapshotFormat,
    /// Segments of every device at the moment of the dump, each device's in address order.
    pub segments: Vec<Segment>,
    pub timeline: Timeline,
    pub stacks: StackTable,
    pub settings: Option<AllocatorSettings>,
    pub annotations: Vec<Annotation>,
}

impl Snapshot {
    /// Devices that have a segment or a non-empty trace, in order.
    pub fn devices(&self) -> Vec<u32> {
        let mut devices: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        devices.extend(
            (0..self.timeline.device_count())
                .filter(|&d| !self.timeline.device(d).is_empty())
                .map(|d| d as u32),
        );
        devices.sort_unstable();
        devices.dedup();
        devices
    }

    /// The segments of one device.
    pub fn device_segments(&self, device: u32) -> impl Iterator<Item = &Segment> + '_ {
        self.segments.iter().filter(move |s| s.device == device)
    }
}
