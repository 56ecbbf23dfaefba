//! memprof's own JSON event stream (`kind: memprof_events`, `schema_version` 1): every trace
//! entry of every device, the final segments and blocks, settings and annotations, for
//! people's own scripts. Stacks are lists of indices into one top-level `frames` table (frames
//! inline would make the file some 30 times the size of the pickle). Entries are streamed.
//!
//! ```text
//! {"schema_version": 1, "kind": "memprof_events", "format": "modern|history|segments_only|recording",
//!  "frames": [{"filename", "line", "name"}],
//!  "devices": [{"device", "entries": [{"index", "action", "addr"|null, "size", "stream",
//!               "time_us"|null, "device_free"|null, "frames": [frame index, innermost first],
//!               "compile_context"|null, "user_metadata"|null, "forward_frames": [text]}]}],
//!  "segments": [{"device", "address", "total_size", "stream", "pool": "small|large",
//!                "pool_id": [a, b], "is_expandable", "frames",
//!                "blocks": [{"address", "size", "requested_size", "state", "frames"}]}],
//!  "allocator_settings": null | {"alloc_conf", "expandable_segments", "max_split_size",
//!                                "garbage_collection_threshold", "roundup_power2_divisions"},
//!  "annotations": [{"device", "time_us", "stage", "name"}]}
//! ```

use crate::model::{
    AllocatorSettings, Annotation, Block, BlockState, Frame, PoolKind, Segment, Snapshot,
    SnapshotFormat, StackId, Timeline, TraceEntry,
};
use rustc_hash::FxHashMap;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use std::io::{self, Write};

/// Bumped on any change that could break a reader of the previous version.
pub const SCHEMA_VERSION: u32 = 1;
/// The `kind` field that tells this document from memprof's other JSON documents.
pub const KIND: &str = "memprof_events";

/// Writes the event stream of `snapshot` as one JSON document.
pub fn write<W: Write>(snapshot: &Snapshot, out: W) -> io::Result<()> {
    let doc = Document {
        snapshot,
        frames: FrameTable::new(snapshot),
    };
    serde_json::to_writer(out, &doc).map_err(io::Error::from)
}

struct Document<'a> {
    snapshot: &'a Snapshot,
    frames: FrameTable<'a>,
}

/// Every distinct frame used by an entry, block or segment, and each stack as indices into it.
struct FrameTable<'a> {
    frames: Vec<&'a Frame>,
    stacks: FxHashMap<StackId, Vec<u32>>,
}

impl<'a> FrameTable<'a> {
    fn new(s: &'a Snapshot) -> FrameTable<'a> {
        let mut table = FrameTable {
            frames: Vec::new(),
            stacks: FxHashMap::default(),
        };
        let mut index: FxHashMap<&'a Frame, u32> = FxHashMap::default();
        let used = s
            .devices()
            .into_iter()
            .flat_map(|d| s.timeline.device(d as usize))
            .filter_map(|e| e.stack)
            .chain(s.segments.iter().filter_map(|seg| seg.stack))
            .chain(
                s.segments
                    .iter()
                    .flat_map(|seg| &seg.blocks)
                    .filter_map(|b| b.stack),
            );
        for id in used {
            if table.stacks.contains_key(&id) {
                continue;
            }
            let indices = s
                .stacks
                .frames(id)
                .map(|frame| {
                    *index.entry(frame).or_insert_with(|| {
                        table.frames.push(frame);
                        table.frames.len() as u32 - 1
                    })
                })
                .collect();
            table.stacks.insert(id, indices);
        }
        table
    }

    /// The frame indices of a stack, innermost first; empty when not recorded.
    fn stack(&self, id: Option<StackId>) -> &[u32] {
        id.and_then(|id| self.stacks.get(&id))
            .map_or(&[], Vec::as_slice)
    }
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let s = self.snapshot;
        let mut map = serializer.serialize_map(Some(8))?;
        map.serialize_entry("schema_version", &SCHEMA_VERSION)?;
        map.serialize_entry("kind", KIND)?;
        map.serialize_entry(
            "format",
            match s.format {
                SnapshotFormat::History => "history",
                SnapshotFormat::Modern => "modern",
                SnapshotFormat::SegmentsOnly => "segments_only",
                SnapshotFormat::Recording => "recording",
            },
        )?;
        let frames: Vec<FrameOut> = self.frames.frames.iter().map(|f| FrameOut(f)).collect();
        map.serialize_entry("frames", &frames)?;
        let devices: Vec<DeviceOut> = s
            .devices()
            .into_iter()
            .map(|device| DeviceOut {
                device,
                entries: EntriesOut {
                    timeline: &s.timeline,
                    device: device as usize,
                    frames: &self.frames,
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
                frames: &self.frames,
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
    device: usize,
    frames: &'a FrameTable<'a>,
    entries: &'a [TraceEntry],
}

impl Serialize for EntriesOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.entries.iter().enumerate().map(|(index, e)| {
            let extra = self.timeline.extra_at(self.device, index);
            EntryOut {
                index,
                action: e.action().torch_name(),
                addr: e.addr(),
                size: e.size,
                stream: self.timeline.stream(e.stream),
                time_us: e.time_us(),
                device_free: e.device_free(),
                frames: self.frames.stack(e.stack),
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
    frames: &'a [u32],
    compile_context: Option<&'a str>,
    user_metadata: Option<&'a str>,
    forward_frames: &'a [String],
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
    frames: &'a FrameTable<'a>,
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
        map.serialize_entry("frames", self.frames.stack(s.stack))?;
        let blocks: Vec<BlockOut> = s
            .blocks
            .iter()
            .map(|block| BlockOut {
                block,
                frames: self.frames,
            })
            .collect();
        map.serialize_entry("blocks", &blocks)?;
        map.end()
    }
}

struct BlockOut<'a> {
    block: &'a Block,
    frames: &'a FrameTable<'a>,
}

impl Serialize for BlockOut<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let b = self.block;
        let mut map = serializer.serialize_map(Some(5))?;
        map.serialize_entry("address", &b.address)?;
        map.serialize_entry("size", &b.size)?;
        map.serialize_entry("requested_size", &b.requested_size)?;
        map.serialize_entry::<_, BlockState>("state", &b.state)?;
        map.serialize_entry("frames", self.frames.stack(b.stack))?;
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
