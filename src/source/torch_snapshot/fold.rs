//! Turns trace-entry dicts into compact `TraceEntry` rows while the pickle is decoded, and
//! interns the stacks, streams and metadata they point to.

use crate::model::{
    Action, EntryExtra, ExtraId, Frame, StackId, StackTable, StreamIndex, TraceEntry,
};
use crate::source::pickle::{Document, Fold, Node, NodeId, StrId, Value};
use rustc_hash::FxHashMap;
use std::num::NonZeroU32;

/// A contiguous run of entries folded out of one list.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub list: NodeId,
    pub start: usize,
    pub end: usize,
}

/// Handle returned for dicts that were taken but produced no row (unknown action, bad field).
const SKIPPED: u32 = u32::MAX;

/// Which trace-entry field a key string names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Unseen,
    Action,
    Addr,
    Size,
    Stream,
    Time,
    Frames,
    DeviceFree,
    CompileContext,
    UserMetadata,
    ForwardFrames,
    Other,
}

fn field_of(key: &str) -> Field {
    match key {
        "action" => Field::Action,
        "addr" => Field::Addr,
        "size" => Field::Size,
        "stream" => Field::Stream,
        "time_us" => Field::Time,
        "frames" => Field::Frames,
        "device_free" => Field::DeviceFree,
        "compile_context" => Field::CompileContext,
        "user_metadata" => Field::UserMetadata,
        "forward_frames" => Field::ForwardFrames,
        _ => Field::Other,
    }
}

/// Interning tables shared by trace entries, blocks and segments.
#[derive(Default)]
pub struct Interner {
    pub stacks: StackTable,
    /// Stack of each frames-list node, by node id: 0 unknown, 1 empty, else id + 1.
    stack_ids: Vec<u32>,
    frame_ids: FxHashMap<NodeId, u32>,
    pub streams: Vec<u64>,
    last_stream: Option<(u64, StreamIndex)>,
    stream_ids: FxHashMap<u64, StreamIndex>,
    pub extras: Vec<EntryExtra>,
    extra_ids: FxHashMap<EntryExtra, ExtraId>,
}

impl Interner {
    pub fn new() -> Interner {
        let mut interner = Interner::default();
        interner.stream(0);
        interner
    }

    /// The interned stream index of a `cudaStream_t` value.
    pub fn stream(&mut self, stream: u64) -> StreamIndex {
        if let Some((last, index)) = self.last_stream {
            if last == stream {
                return index;
            }
        }
        let next = StreamIndex(self.streams.len() as u16);
        let index = *self.stream_ids.entry(stream).or_insert(next);
        if index == next {
            self.streams.push(stream);
        }
        self.last_stream = Some((stream, index));
        index
    }

    /// The stack of a `frames` value (a list of frame dicts, innermost first).
    pub fn stack(&mut self, doc: &Document, frames: Value) -> Result<Option<StackId>, String> {
        let Value::Node(list) = frames else {
            return match frames {
                Value::None => Ok(None),
                _ => Err("'frames' is not a list".into()),
            };
        };
        match self.stack_ids.get(list as usize) {
            Some(0) | None => {}
            Some(1) => return Ok(None),
            Some(&id) => return Ok(NonZeroU32::new(id - 1).map(StackId)),
        }
        let items = doc.as_seq(frames).ok_or("'frames' is not a list")?;
        let mut ids = Vec::with_capacity(items.len());
        for &item in items {
            ids.push(self.frame(doc, item)?);
        }
        let id = self.stacks.add_stack(ids.into_boxed_slice());
        if self.stack_ids.len() <= list as usize {
            self.stack_ids.resize(list as usize + 1, 0);
        }
        self.stack_ids[list as usize] = id.map_or(1, |s| s.0.get() + 1);
        Ok(id)
    }

    fn frame(&mut self, doc: &Document, value: Value) -> Result<u32, String> {
        let Value::Node(node) = value else {
            return Err("a frame is not a dict".into());
        };
        if let Some(&id) = self.frame_ids.get(&node) {
            return Ok(id);
        }
        let pairs = doc.as_dict(value).ok_or("a frame is not a dict")?;
        let text = |key| {
            doc.get(pairs, key)
                .and_then(|v| doc.as_str(v))
                .unwrap_or("??")
        };
        let frame = Frame {
            filename: text("filename").to_string(),
            line: doc
                .get(pairs, "line")
                .and_then(|v| doc.as_i64(v))
                .unwrap_or(0),
            name: text("name").to_string(),
        };
        let id = self.stacks.add_frame(frame);
        self.frame_ids.insert(node, id);
        Ok(id)
    }

    fn extra(&mut self, extra: EntryExtra) -> ExtraId {
        if let Some(&id) = self.extra_ids.get(&extra) {
            return id;
        }
        self.extras.push(extra.clone());
        let id = ExtraId(NonZeroU32::new(self.extras.len() as u32).unwrap_or(NonZeroU32::MIN));
        self.extra_ids.insert(extra, id);
        id
    }
}

/// Why a dict did not become a row.
enum EntryError {
    /// It has no `action`: not a trace entry at all.
    NotAnEntry,
    /// A trace entry with a field that cannot be read.
    Bad(String),
}

impl From<String> for EntryError {
    fn from(message: String) -> Self {
        EntryError::Bad(message)
    }
}

impl From<&str> for EntryError {
    fn from(message: &str) -> Self {
        EntryError::Bad(message.to_string())
    }
}

/// Why one trace entry was not turned into a row.
#[derive(Clone, Debug)]
pub struct EntryProblem {
    pub list: NodeId,
    pub position: usize,
    pub message: String,
}

/// The `Fold` that takes every dict with an `action` key.
#[derive(Default)]
pub struct TraceFolder {
    pub interner: Interner,
    pub entries: Vec<TraceEntry>,
    pub runs: Vec<Run>,
    /// The list dicts were last offered from, and how many it was offered, for positions in
    /// messages (trace lists are filled one after the other).
    offered: (NodeId, usize),
    fields: Vec<Field>,
    /// Entries with an action this version does not know, skipped: (action, count).
    pub unknown_actions: Vec<(String, usize)>,
    /// The first entry that could not be read.
    pub first_problem: Option<EntryProblem>,
    pub problems: usize,
}

impl TraceFolder {
    pub fn new() -> TraceFolder {
        TraceFolder {
            interner: Interner::new(),
            ..TraceFolder::default()
        }
    }

    #[inline]
    fn field(&mut self, doc: &Document, key: StrId) -> Field {
        let i = key as usize;
        if i >= self.fields.len() {
            self.fields.resize(i + 1, Field::Unseen);
        }
        if self.fields[i] == Field::Unseen {
            self.fields[i] = field_of(doc.str(key));
        }
        self.fields[i]
    }

    /// Reads one trace-entry dict. `Ok(None)` for an action this version does not know.
    fn entry(
        &mut self,
        doc: &Document,
        pairs: &[(Value, Value)],
    ) -> Result<Option<TraceEntry>, EntryError> {
        let mut action = None;
        let (mut addr, mut size, mut stream, mut time, mut frames, mut device_free) =
            (None, None, None, None, None, None);
        let mut extra = EntryExtra::default();
        // A field error only matters once the dict is known to be a trace entry.
        let mut bad: Option<String> = None;
        for &(key, value) in pairs {
            let Value::Str(key) = key else { continue };
            let mut want_u64 = |what: &str| {
                let v = doc.as_u64(value);
                if v.is_none() && bad.is_none() {
                    bad = Some(format!(
                        "'{what}' is not a non-negative integer: {}",
                        doc.render(value)
                    ));
                }
                v
            };
            match self.field(doc, key) {
                Field::Action => {
                    let Some(name) = doc.as_str(value) else {
                        return Err(EntryError::Bad("'action' is not a string".into()));
                    };
                    match Action::from_torch_name(name) {
                        Some(a) => action = Some(a),
                        None => {
                            match self.unknown_actions.iter_mut().find(|(n, _)| n == name) {
                                Some((_, count)) => *count += 1,
                                None => self.unknown_actions.push((name.to_string(), 1)),
                            }
                            return Ok(None);
                        }
                    }
                }
                Field::Addr => addr = want_u64("addr"),
                Field::Size => size = want_u64("size"),
                Field::DeviceFree => device_free = want_u64("device_free"),
                Field::Stream => {
                    stream = doc
                        .as_i64(value)
                        .map(|s| s as u64)
                        .or_else(|| doc.as_u64(value));
                    if stream.is_none() {
                        bad.get_or_insert_with(|| "'stream' is not an integer".into());
                    }
                }
                Field::Time => {
                    time = doc.as_i64(value);
                    if time.is_none() {
                        bad.get_or_insert_with(|| "'time_us' is not an integer".into());
                    }
                }
                Field::Frames => frames = Some(value),
                Field::CompileContext => {
                    let text = doc
                        .as_str(value)
                        .map_or_else(|| doc.render(value), str::to_string);
                    if text != "N/A" && !text.is_empty() {
                        extra.compile_context = Some(text);
                    }
                }
                Field::UserMetadata => {
                    let text = doc
                        .as_str(value)
                        .map_or_else(|| doc.render(value), str::to_string);
                    if !text.is_empty() {
                        extra.user_metadata = Some(text);
                    }
                }
                Field::ForwardFrames => {
                    extra.forward_frames = match doc.as_seq(value) {
                        Some(items) => items
                            .iter()
                            .map(|&v| doc.as_str(v).map_or_else(|| doc.render(v), str::to_string))
                            .collect(),
                        None => vec![doc.render(value)],
                    };
                }
                Field::Other | Field::Unseen => {}
            }
        }
        let Some(action) = action else {
            return Err(EntryError::NotAnEntry);
        };
        if let Some(message) = bad {
            return Err(EntryError::Bad(message));
        }
        let size = size.ok_or_else(|| format!("'{action}' entry has no 'size'"))?;
        let stream = self.interner.stream(stream.unwrap_or(0));
        let mut entry = if action == Action::Oom {
            TraceEntry::oom(size, device_free, stream)
        } else {
            let addr = addr.ok_or_else(|| format!("'{action}' entry has no 'addr'"))?;
            TraceEntry::new(action, Some(addr), size, stream)
        };
        entry = entry.with_time(time);
        if let Some(frames) = frames {
            entry.stack = self.interner.stack(doc, frames)?;
        }
        if extra != EntryExtra::default() {
            entry.extra = Some(self.interner.extra(extra));
        }
        Ok(Some(entry))
    }

    fn push(&mut self, list: NodeId, entry: TraceEntry) -> u32 {
        let index = self.entries.len();
        self.entries.push(entry);
        match self.runs.last_mut() {
            Some(run) if run.list == list && run.end == index => run.end += 1,
            _ => self.runs.push(Run {
                list,
                start: index,
                end: index + 1,
            }),
        }
        index as u32
    }
}

impl Fold for TraceFolder {
    #[inline]
    fn fold(&mut self, doc: &Document, list: NodeId, dict: NodeId) -> Option<u32> {
        let Node::Dict(pairs) = doc.node(dict) else {
            return None;
        };
        if self.offered.0 != list {
            self.offered = (list, 0);
        }
        let position = self.offered.1;
        match self.entry(doc, pairs) {
            Ok(Some(entry)) => {
                self.offered.1 += 1;
                Some(self.push(list, entry))
            }
            Ok(None) => {
                self.offered.1 += 1;
                Some(SKIPPED)
            }
            Err(EntryError::NotAnEntry) => None,
            Err(EntryError::Bad(message)) => {
                self.offered.1 += 1;
                self.problems += 1;
                self.first_problem.get_or_insert(EntryProblem {
                    list,
                    position,
                    message,
                });
                Some(SKIPPED)
            }
        }
    }
}
