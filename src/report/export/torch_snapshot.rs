//! A model `Snapshot` written back as a PyTorch memory snapshot pickle (the 2.5-style layout
//! `torch.cuda.memory._dump_snapshot()` writes), for pytorch.org/memory_viz and
//! `_memory_viz.py`. Frame dicts and frame lists are shared objects, as PyTorch's are. Every
//! key a modern input had comes back (the `FormatKeys` say which optional ones it held); a
//! segments-only input comes out as the dict layout with empty traces, which every reader
//! takes; a `free_completed` without its `free_requested` (a recording's) gets the pair.

use super::pickle::PickleWriter;
use crate::model::{
    Action, AllocatorSettings, Annotation, Block, BlockState, EntryExtra, FormatKeys, Frame,
    PoolKind, Segment, SettingValue, Snapshot, SnapshotFormat, StackId, TraceEntry,
};
use rustc_hash::{FxHashMap, FxHashSet};
use std::io::{self, Write};

/// Writes `snapshot` as a protocol-4 pickle; `keys` are the optional keys the input held
/// (`FormatKeys::default()` for a snapshot that was never a file).
pub fn write<W: Write>(snapshot: &Snapshot, keys: &FormatKeys, out: W) -> io::Result<()> {
    let mut w = Writer {
        snapshot,
        keys: *keys,
        pickle: PickleWriter::new(out)?,
        frames: FxHashMap::default(),
        stacks: FxHashMap::default(),
    };
    w.top()?;
    w.pickle.finish()?;
    Ok(())
}

struct Writer<'a, W: Write> {
    snapshot: &'a Snapshot,
    keys: FormatKeys,
    pickle: PickleWriter<W>,
    /// Memo index of each frame dict already written.
    frames: FxHashMap<&'a Frame, u32>,
    /// Memo index of each frame list already written.
    stacks: FxHashMap<StackId, u32>,
}

impl<'a, W: Write> Writer<'a, W> {
    fn top(&mut self) -> io::Result<()> {
        let s = self.snapshot;
        let annotations = self.keys.external_annotations || !s.annotations.is_empty();
        let len = 2 + usize::from(s.settings.is_some()) + usize::from(annotations);
        self.pickle.begin_dict(len)?;
        self.pickle.key("segments")?;
        self.segments()?;
        self.pickle.key("device_traces")?;
        self.traces()?;
        if let Some(settings) = &s.settings {
            self.pickle.key("allocator_settings")?;
            self.settings(settings)?;
        }
        if annotations {
            self.pickle.key("external_annotations")?;
            self.pickle.begin_list(s.annotations.len())?;
            for a in &s.annotations {
                self.pickle.item()?;
                self.annotation(a)?;
            }
            self.pickle.end()?;
        }
        self.pickle.end()
    }

    fn segments(&mut self) -> io::Result<()> {
        let segments = &self.snapshot.segments;
        self.pickle.begin_list(segments.len())?;
        for segment in segments {
            self.pickle.item()?;
            self.segment(segment)?;
        }
        self.pickle.end()
    }

    fn segment(&mut self, s: &'a Segment) -> io::Result<()> {
        let sum = |keep: fn(&Block) -> bool, size: fn(&Block) -> u64| -> u64 {
            s.blocks.iter().filter(|b| keep(b)).map(size).sum()
        };
        let allocated = sum(|b| b.state == BlockState::ActiveAllocated, |b| b.size);
        let active = sum(|b| b.state.is_active(), |b| b.size);
        let requested = sum(|b| b.state.is_active(), |b| b.requested_size);
        let p = &mut self.pickle;
        p.begin_dict(12)?;
        p.key("device")?;
        p.int(s.device.into())?;
        p.key("address")?;
        p.int(s.address.into())?;
        p.key("total_size")?;
        p.int(s.total_size.into())?;
        p.key("allocated_size")?;
        p.int(allocated.into())?;
        p.key("active_size")?;
        p.int(active.into())?;
        p.key("requested_size")?;
        p.int(requested.into())?;
        p.key("stream")?;
        p.int(stream_value(s.stream))?;
        p.key("segment_type")?;
        p.str(match s.pool {
            PoolKind::Small => "small",
            PoolKind::Large => "large",
        })?;
        p.key("segment_pool_id")?;
        p.int_pair(s.pool_id.0.into(), s.pool_id.1.into())?;
        p.key("is_expandable")?;
        p.bool(s.is_expandable)?;
        p.key("blocks")?;
        p.begin_list(s.blocks.len())?;
        for block in &s.blocks {
            self.pickle.item()?;
            self.block(block)?;
        }
        self.pickle.end()?;
        self.pickle.key("frames")?;
        self.frames(s.stack)?;
        self.pickle.end()
    }

    fn block(&mut self, b: &Block) -> io::Result<()> {
        let p = &mut self.pickle;
        p.begin_dict(5)?;
        p.key("address")?;
        p.int(b.address.into())?;
        p.key("size")?;
        p.int(b.size.into())?;
        p.key("requested_size")?;
        p.int(b.requested_size.into())?;
        p.key("state")?;
        p.str(match b.state {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        })?;
        p.key("frames")?;
        self.frames(b.stack)?;
        self.pickle.end()
    }

    /// One list per device ordinal, up to the highest device with a trace or a segment.
    fn traces(&mut self) -> io::Result<()> {
        let s = self.snapshot;
        let count = s
            .segments
            .iter()
            .map(|seg| seg.device as usize + 1)
            .chain([s.timeline.device_count()])
            .max()
            .unwrap_or(0);
        self.pickle.begin_list(count)?;
        for device in 0..count {
            self.pickle.item()?;
            let entries = s.timeline.device(device);
            // A PyTorch trace is kept as it was (its ring buffer may have lost a request).
            let unrequested = if s.format == SnapshotFormat::Recording {
                unrequested_frees(entries)
            } else {
                FxHashSet::default()
            };
            self.pickle.begin_list(entries.len() + unrequested.len())?;
            for (index, entry) in entries.iter().enumerate() {
                let context = |e: io::Error| {
                    io::Error::new(e.kind(), format!("device {device} entry {index}: {e}"))
                };
                let extra = s.timeline.extra_at(device, index);
                if unrequested.contains(&index) {
                    self.pickle.item()?;
                    self.entry(entry, Action::FreeRequested, extra)
                        .map_err(context)?;
                }
                self.pickle.item()?;
                self.entry(entry, entry.action(), extra).map_err(context)?;
            }
            self.pickle.end()?;
        }
        self.pickle.end()
    }

    /// One trace entry, written as `action` (its own, or the `free_requested` it lacked).
    fn entry(
        &mut self,
        e: &TraceEntry,
        action: Action,
        extra: Option<&EntryExtra>,
    ) -> io::Result<()> {
        let s = self.snapshot;
        let (context, metadata, forward) = match extra {
            Some(x) => (
                x.compile_context.as_deref(),
                x.user_metadata.as_deref(),
                (!x.forward_frames.is_empty()).then_some(&x.forward_frames),
            ),
            None => (None, None, None),
        };
        // PyTorch writes these on every entry, with placeholders the model reads as absent.
        let context = context.or(self.keys.entry_compile_context.then_some("N/A"));
        let metadata = metadata.or(self.keys.entry_user_metadata.then_some(""));
        let pool = e
            .pool()
            .and_then(|p| s.timeline.pools().get(p.0 as usize).copied());
        let (place_key, place) = if e.action() == Action::Oom {
            ("device_free", e.device_free())
        } else {
            let addr = e.addr().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a '{}' entry without an address", e.action()),
                )
            })?;
            ("addr", Some(addr))
        };
        let len = 3
            + usize::from(e.has_frames_key())
            + usize::from(place.is_some())
            + usize::from(e.time_us().is_some())
            + usize::from(pool.is_some())
            + usize::from(context.is_some())
            + usize::from(metadata.is_some())
            + usize::from(forward.is_some());
        let p = &mut self.pickle;
        p.begin_dict(len)?;
        p.key("action")?;
        p.str(action.torch_name())?;
        if let Some(value) = place {
            p.key(place_key)?;
            p.int(value.into())?;
        }
        p.key("size")?;
        p.int(e.size.into())?;
        p.key("stream")?;
        p.int(stream_value(s.timeline.stream(e.stream)))?;
        if let Some(t) = e.time_us() {
            p.key("time_us")?;
            p.int(t.into())?;
        }
        if let Some((a, b)) = pool {
            p.key("pool_id")?;
            p.int_pair(a.into(), b.into())?;
        }
        if e.has_frames_key() {
            p.key("frames")?;
            self.frames(e.stack)?;
        }
        let p = &mut self.pickle;
        if let Some(text) = context {
            p.key("compile_context")?;
            p.str(text)?;
        }
        if let Some(text) = metadata {
            p.key("user_metadata")?;
            p.str(text)?;
        }
        if let Some(lines) = forward {
            p.key("forward_frames")?;
            p.begin_list(lines.len())?;
            for line in lines {
                p.item()?;
                p.str(line)?;
            }
            p.end()?;
        }
        p.end()
    }

    /// A frame list: written once per stack, referenced from the memo after that.
    fn frames(&mut self, stack: Option<StackId>) -> io::Result<()> {
        let Some(id) = stack else {
            self.pickle.begin_list(0)?;
            return self.pickle.end();
        };
        if let Some(&index) = self.stacks.get(&id) {
            return self.pickle.get(index);
        }
        let snapshot: &'a Snapshot = self.snapshot;
        let table = &snapshot.stacks;
        let index = self.pickle.begin_list(table.frames(id).len())?;
        for frame in table.frames(id) {
            self.pickle.item()?;
            match self.frames.get(frame) {
                Some(&memo) => self.pickle.get(memo)?,
                None => {
                    let memo = frame_dict(&mut self.pickle, frame)?;
                    self.frames.insert(frame, memo);
                }
            }
        }
        self.pickle.end()?;
        self.stacks.insert(id, index);
        Ok(())
    }

    fn settings(&mut self, s: &AllocatorSettings) -> io::Result<()> {
        let len = 2
            + s.other.len()
            + usize::from(s.alloc_conf.is_some())
            + usize::from(s.expandable_segments.is_some())
            + usize::from(s.garbage_collection_threshold.is_some());
        let p = &mut self.pickle;
        p.begin_dict(len)?;
        if let Some(conf) = &s.alloc_conf {
            p.key("PYTORCH_CUDA_ALLOC_CONF")?;
            p.str(conf)?;
        }
        p.key("max_split_size")?;
        p.int(s.max_split_size.map_or(-1, i128::from))?;
        if let Some(threshold) = s.garbage_collection_threshold {
            p.key("garbage_collection_threshold")?;
            p.float(threshold)?;
        }
        if let Some(expandable) = s.expandable_segments {
            p.key("expandable_segments")?;
            p.bool(expandable)?;
        }
        // PyTorch lists every power-of-two interval from 1 to 32768 MiB, 0 where unset.
        let mut intervals: Vec<(u64, u64)> = (0..16).map(|k| (1u64 << k, 0)).collect();
        for &(interval, divisions) in &s.roundup_power2_divisions {
            match intervals.iter_mut().find(|(i, _)| *i == interval) {
                Some(slot) => slot.1 = divisions,
                None => intervals.push((interval, divisions)),
            }
        }
        intervals.sort_unstable();
        p.key("roundup_power2_divisions")?;
        p.begin_dict(intervals.len())?;
        for (interval, divisions) in intervals {
            p.key(&interval.to_string())?;
            p.int(divisions.into())?;
        }
        p.end()?;
        for (key, value) in &s.other {
            p.key(key)?;
            match value {
                SettingValue::Bool(b) => p.bool(*b)?,
                SettingValue::Int(i) => p.int((*i).into())?,
                SettingValue::Float(f) => p.float(*f)?,
                SettingValue::Str(text) => p.str(text)?,
            }
        }
        p.end()
    }

    fn annotation(&mut self, a: &Annotation) -> io::Result<()> {
        let len = usize::from(a.stage.is_some())
            + usize::from(a.name.is_some())
            + usize::from(a.device.is_some())
            + usize::from(a.time_us.is_some());
        let p = &mut self.pickle;
        p.begin_dict(len)?;
        if let Some(stage) = &a.stage {
            p.key("stage")?;
            p.str(stage)?;
        }
        if let Some(name) = &a.name {
            p.key("name")?;
            p.str(name)?;
        }
        if let Some(device) = a.device {
            p.key("device")?;
            p.int(device.into())?;
        }
        if let Some(t) = a.time_us {
            p.key("time_us")?;
            p.int(t.into())?;
        }
        p.end()
    }
}

/// `{"name", "filename", "line"}` (PyTorch's key order); returns its memo index.
fn frame_dict<W: Write>(p: &mut PickleWriter<W>, frame: &Frame) -> io::Result<u32> {
    let index = p.begin_dict(3)?;
    p.key("name")?;
    p.str(&frame.name)?;
    p.key("filename")?;
    p.str(&frame.filename)?;
    p.key("line")?;
    p.int(frame.line.into())?;
    p.end()?;
    Ok(index)
}

/// Indices of the `free_completed` entries with no `free_requested` of their address before
/// them: a recording sees only the driver's side, and memory_viz reads a completion without
/// its request as a block waiting on another stream.
fn unrequested_frees(entries: &[TraceEntry]) -> FxHashSet<usize> {
    let mut requested: FxHashSet<u64> = FxHashSet::default();
    let mut lacking = FxHashSet::default();
    for (index, e) in entries.iter().enumerate() {
        match (e.action(), e.addr()) {
            (Action::FreeRequested, Some(addr)) => {
                requested.insert(addr);
            }
            (Action::FreeCompleted, Some(addr)) if !requested.remove(&addr) => {
                lacking.insert(index);
            }
            _ => {}
        }
    }
    lacking
}

/// PyTorch writes a `cudaStream_t` as a signed 64-bit integer; the model keeps its bits.
fn stream_value(stream: u64) -> i128 {
    i128::from(stream as i64)
}
