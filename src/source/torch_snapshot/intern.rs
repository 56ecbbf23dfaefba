//! Interning tables shared by trace entries, blocks and segments: stacks (by the pickle node
//! that holds them, so shared frame lists are converted once), streams, pool ids and rare
//! metadata.

use super::budget::{Budget, ITEM};
use super::parked::ParkedExtras;
use crate::model::{EntryExtra, ExtraId, Frame, PoolIndex, StackId, StackTable, StreamIndex};
use crate::source::pickle::{Document, NodeId, Value};
use rustc_hash::FxHashMap;
use std::num::NonZeroU32;

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
    /// The metadata made from each triple of pickle values (compile context, user metadata,
    /// forward frames), so that values shared by many entries are converted once.
    extra_by_values: FxHashMap<[(u8, u64); 3], Option<ExtraId>>,
    /// `pool_id` pairs of trace entries, by `PoolIndex`.
    pub pools: Vec<(i64, i64)>,
    pool_ids: FxHashMap<(i64, i64), PoolIndex>,
    /// The metadata ids that entries carry while the trace is folded.
    pub parked: ParkedExtras,
    /// What the conversions out of the pickle have cost so far.
    pub budget: Budget,
}

impl Interner {
    pub fn new() -> Interner {
        let mut interner = Interner::default();
        interner.streams.push(0);
        interner.stream_ids.insert(0, StreamIndex(0));
        interner
    }

    /// The interned stream index of a `cudaStream_t` value.
    #[inline]
    pub fn stream(&mut self, stream: u64) -> Result<StreamIndex, String> {
        match self.last_stream {
            Some((last, index)) if last == stream => Ok(index),
            _ => self.new_stream(stream),
        }
    }

    /// `stream` for a value other than the last one looked up.
    fn new_stream(&mut self, stream: u64) -> Result<StreamIndex, String> {
        let index = match self.stream_ids.get(&stream) {
            Some(&index) => index,
            None => {
                let next = u16::try_from(self.streams.len())
                    .map_err(|_| "more than 65536 distinct streams in one trace".to_string())?;
                self.streams.push(stream);
                self.stream_ids.insert(stream, StreamIndex(next));
                StreamIndex(next)
            }
        };
        self.last_stream = Some((stream, index));
        Ok(index)
    }

    /// The interned index of a trace entry's `pool_id`.
    pub fn pool(&mut self, pool: (i64, i64)) -> Result<PoolIndex, String> {
        if let Some(&index) = self.pool_ids.get(&pool) {
            return Ok(index);
        }
        let next = u16::try_from(self.pools.len())
            .ok()
            .filter(|&n| n <= PoolIndex::MAX.0)
            .ok_or("more than 65535 distinct pool ids in one trace")?;
        self.pools.push(pool);
        self.pool_ids.insert(pool, PoolIndex(next));
        Ok(PoolIndex(next))
    }

    /// The stack of a `frames` value (a list of frame dicts, innermost first).
    #[inline]
    pub fn stack(&mut self, doc: &Document, frames: Value) -> Result<Option<StackId>, String> {
        if let Value::Node(list) = frames {
            match self.stack_ids.get(list as usize) {
                Some(0) | None => {}
                Some(1) => return Ok(None),
                Some(&id) => return Ok(NonZeroU32::new(id - 1).map(StackId)),
            }
        }
        self.new_stack(doc, frames)
    }

    /// `stack` for a frames list not seen before.
    fn new_stack(&mut self, doc: &Document, frames: Value) -> Result<Option<StackId>, String> {
        let Value::Node(list) = frames else {
            return match frames {
                Value::None => Ok(None),
                _ => Err("'frames' is not a list".into()),
            };
        };
        let items = doc.as_seq(frames).ok_or("'frames' is not a list")?;
        self.budget
            .charge_items(doc, items.len(), ITEM as usize, "a frames list")?;
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
        let copied = text("filename").len() + text("name").len() + std::mem::size_of::<Frame>();
        let looked = pairs.len() as u64 * ITEM;
        self.budget.charge(doc, copied as u64 + looked, "a frame")?;
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

    /// The interned metadata of an entry whose metadata fields hold `values`, made by `make`
    /// the first time these values are seen; `None` when it is all absent.
    pub fn extra_of(
        &mut self,
        doc: &Document,
        values: [Option<Value>; 3],
        make: impl FnOnce(&Document, &mut Budget) -> Result<EntryExtra, String>,
    ) -> Result<Option<ExtraId>, String> {
        // A dict's node may be reused for another dict later in the file; lists and strings
        // are never reused, so only they (and scalars) make a key.
        let key = match values.iter().flatten().any(|&v| doc.as_dict(v).is_some()) {
            true => None,
            false => Some(values.map(|v| v.map_or((u8::MAX, 0), value_key))),
        };
        if let Some(id) = key.and_then(|key| self.extra_by_values.get(&key)) {
            return Ok(*id);
        }
        let extra = make(doc, &mut self.budget)?;
        let id = (extra != EntryExtra::default()).then(|| self.extra(extra));
        if let Some(key) = key {
            self.extra_by_values.insert(key, id);
        }
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

/// A value as a hashable key: its kind and payload.
fn value_key(value: Value) -> (u8, u64) {
    match value {
        Value::None => (0, 0),
        Value::Bool(b) => (1, b.into()),
        Value::Int(i) => (2, i as u64),
        Value::BigInt(i) => (3, i.into()),
        Value::Float(f) => (4, f.to_bits()),
        Value::Str(id) => (5, id.into()),
        Value::Bytes(i) => (6, i.into()),
        Value::Folded(h) => (7, h.into()),
        Value::Node(id) => (8, id.into()),
    }
}
