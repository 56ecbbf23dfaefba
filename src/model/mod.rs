//! The vocabulary every part of memprof shares: sizes, trace actions and entries, stacks,
//! segment layouts, the timeline, and the one place that replays entries into a memory state.
//! No I/O; depends on serde at most.

mod event;
mod frames;
mod host;
mod layout;
mod ranges;
mod snapshot;
mod stack;
mod starts;
mod state;
mod timeline;
mod units;

pub use event::{Action, ExtraId, PoolIndex, StackId, StreamIndex, TraceEntry};
pub use frames::FrameKind;
pub use host::{HostAllocator, HostSegment};
pub use layout::{Block, BlockState, PoolKind, Segment};
pub use ranges::{fits_address_space, ranges_before, RangeRules, SegmentRange};
pub use snapshot::{
    AllocatorSettings, Annotation, FormatKeys, SettingValue, Snapshot, SnapshotFormat,
};
pub use stack::{Frame, StackTable};
pub use starts::{replay_device, ReplayStarts};
pub use state::{Live, LiveSet, Replay, ReplayIssue, ReplayStart};
pub use timeline::{EntryExtra, Timeline};
pub use units::{count, Bytes, ParseBytesError};
