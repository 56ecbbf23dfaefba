//! memprof's own JSON event stream (`kind: memprof_events`, `schema_version` 1): every trace
//! entry of every device with its stack, and the final segments, for people's own scripts.
//! Entries are streamed, never collected.

use crate::model::{
    AllocatorSettings, Annotation, Block, BlockState, Frame, PoolKind, Segment, Snapshot,
    SnapshotFormat, StackId, StackTable, Timeline, TraceEntry,
};
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::io::{self, Write};

/// Bumped on any change that could break a reader of the previous version.
pub const SCHEMA_VERSION: u32 = 1;
/// The `kind` field that tells this document from memprof's other JSON documents.
pub const KIND: &str = "memprof_events";

/// Writes the event stream of `snapshot` as one JSON document.
pub fn write<W: Write>(snapshot: &Snapshot, out: W) -> io::Result<()> {
    let doc = Document { snapshot };
    serde_json::to_writer(out, &doc).map_err(io::Error::from)
}

struct Document<'a> {
    snapshot: &'a Snapshot,
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = self.snapshot;
        let mut map = serializer.serialize_map(Some(7))?;
        map.serialize_entry("schema_version", &SCHEMA_VERSION)?;
        map.serialize_entry("kind", KIND)?;
        map.serialize_entry(
            "format",
            match s.format {
                SnapshotFormat::History => "history",
                SnapshotFormat::Modern => "modern",
                SnapshotFormat::SegmentsOnly => "segments_only",
            },
        )?;
        let devices: Vec<DeviceOut> = s
            .devices()
            .into_iter()
            .map(|device| DeviceOut {
                device,
                entries: EntriesOut {
                    timeline: &s.timeline,
                    stacks: &s.stacks,
                    entries: s.timeline.device(device as usize),
                },
            })
            .collect();
        map.serialize_entry("devices", &devices)?;
        let segments: Vec<SegmentOut> = s
            .segments
            .iter()
            .map(|segment| SegmentOut {
                segment,
                stacks: &s.stacks,
            })
            .collect();
        map.serialize_entry("segments", &segments)?;
        map.serialize_entry("allocator_settings", &s.settings.as_ref().map(SettingsOut))?;
        let annotations: Vec<AnnotationOut> = s.annotations.iter().map(AnnotationOut).collect();
        map.serialize_entry("annotations", &annotations)?;
        map.end()
    }
}

#[derive(Serialize)]
struct DeviceOut<'a> {
    device: u32,
    entries: EntriesOut<'a>,
}

struct EntriesOut<'a> {
    timeline: &'a Timeline,
    stacks: &'a StackTable,
    entries: &'a [TraceEntry],
}

impl Serialize for EntriesOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.entries.iter().enumerate().map(|(index, e)| {
            let extra = e.extra.map(|id| self.timeline.extra(id));
            EntryOut {
                index,
                action: e.action.torch_name(),
                addr: e.addr(),
                size: e.size,
                stream: self.timeline.stream(e.stream),
                time_us: e.time_us(),
                device_free: e.device_free(),
                frames: FramesOut(self.stacks, e.stack),
                compile_context: extra.and_then(|x| x.compile_context.as_deref()),
                user_metadata: extra.and_then(|x| x.user_metadata.as_deref()),
                forward_frames: extra.map_or(&[][..], |x| &x.forward_frames[..]),
            }
        }))
    }
}

#[derive(Serialize)]
struct EntryOut<'a> {
    index: usize,
    action: &'static str,
    addr: Option<u64>,
    size: u64,
    stream: u64,
    time_us: Option<i64>,
    device_free: Option<u64>,
    frames: FramesOut<'a>,
    compile_context: Option<&'a str>,
    user_metadata: Option<&'a str>,
    forward_frames: &'a [String],
}

/// A stack as a list of `{filename, line, name}`, innermost first; `[]` when not recorded.
struct FramesOut<'a>(&'a StackTable, Option<StackId>);

impl Serialize for FramesOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.1 {
            Some(id) => serializer.collect_seq(self.0.frames(id).map(FrameOut)),
            None => serializer.collect_seq(std::iter::empty::<FrameOut>()),
        }
    }
}

struct FrameOut<'a>(&'a Frame);

impl Serialize for FrameOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("filename", &self.0.filename)?;
        map.serialize_entry("line", &self.0.line)?;
        map.serialize_entry("name", &self.0.name)?;
        map.end()
    }
}

struct SegmentOut<'a> {
    segment: &'a Segment,
    stacks: &'a StackTable,
}

impl Serialize for SegmentOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = self.segment;
        let mut map = serializer.serialize_map(Some(9))?;
        map.serialize_entry("device", &s.device)?;
        map.serialize_entry("address", &s.address)?;
        map.serialize_entry("total_size", &s.total_size)?;
        map.serialize_entry("stream", &s.stream)?;
        map.serialize_entry::<_, PoolKind>("pool", &s.pool)?;
        map.serialize_entry("pool_id", &[s.pool_id.0, s.pool_id.1])?;
        map.serialize_entry("is_expandable", &s.is_expandable)?;
        map.serialize_entry("frames", &FramesOut(self.stacks, s.stack))?;
        let blocks: Vec<BlockOut> = s
            .blocks
            .iter()
            .map(|block| BlockOut {
                block,
                stacks: self.stacks,
            })
            .collect();
        map.serialize_entry("blocks", &blocks)?;
        map.end()
    }
}

struct BlockOut<'a> {
    block: &'a Block,
    stacks: &'a StackTable,
}

impl Serialize for BlockOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let b = self.block;
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("address", &b.address)?;
        map.serialize_entry("size", &b.size)?;
        map.serialize_entry("requested_size", &b.requested_size)?;
        map.serialize_entry::<_, BlockState>("state", &b.state)?;
        map.serialize_entry("frames", &FramesOut(self.stacks, b.stack))?;
        map.end()
    }
}

struct SettingsOut<'a>(&'a AllocatorSettings);

impl Serialize for SettingsOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = self.0;
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("alloc_conf", &s.alloc_conf)?;
        map.serialize_entry("expandable_segments", &s.expandable_segments)?;
        map.serialize_entry("max_split_size", &s.max_split_size)?;
        map.serialize_entry(
            "garbage_collection_threshold",
            &s.garbage_collection_threshold,
        )?;
        map.serialize_entry("roundup_power2_divisions", &s.roundup_power2_divisions)?;
        map.end()
    }
}

struct AnnotationOut<'a>(&'a Annotation);

impl Serialize for AnnotationOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let a = self.0;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("device", &a.device)?;
        map.serialize_entry("time_us", &a.time_us)?;
        map.serialize_entry("stage", &a.stage)?;
        map.serialize_entry("name", &a.name)?;
        map.end()
    }
}
