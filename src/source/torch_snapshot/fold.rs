//! Turns trace-entry dicts into compact `TraceEntry` rows while the pickle is decoded, and
//! interns the stacks, streams and metadata they point to.

use super::budget::{Budget, ITEM};
use super::intern::Interner;
use super::marks::{row_mark, HandleMarks, AWAITING, BAD, NOT_AGAIN, ORPHAN, UNKNOWN};
use crate::model::{Action, EntryExtra, StreamIndex, TraceEntry};
use crate::source::pickle::{Document, FlatDict, Fold, Node, NodeId, StrId, Value, RENDER_MAX};
use crate::source::prefault::Prefaulter;

/// A contiguous run of entries folded out of one list.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub list: NodeId,
    pub start: usize,
    pub end: usize,
}

/// The rare metadata of an entry, with PyTorch's placeholders ("N/A", "") read as absent.
/// The text it copies is charged to `budget` first.
fn entry_extra(
    doc: &Document,
    budget: &mut Budget,
    compile_context: Option<Value>,
    user_metadata: Option<Value>,
    forward_frames: Option<Value>,
) -> Result<EntryExtra, String> {
    let forward_items = forward_frames.and_then(|value| doc.as_seq(value));
    let mut bytes = [compile_context, user_metadata, forward_frames]
        .iter()
        .flatten()
        .filter(|v| forward_items.is_none() || Some(**v) != forward_frames)
        .map(|&v| text_len(doc, v))
        .sum::<u64>();
    for &item in forward_items.unwrap_or(&[]) {
        bytes = bytes.saturating_add(text_len(doc, item) + ITEM);
    }
    budget.charge(doc, bytes, "an entry's metadata")?;
    let present = |value: Option<Value>, placeholder: &str| {
        value
            .map(|v| text_of(doc, v))
            .filter(|text| !text.is_empty() && text != placeholder)
    };
    Ok(EntryExtra {
        compile_context: present(compile_context, "N/A"),
        user_metadata: present(user_metadata, ""),
        forward_frames: forward_frames.map_or_else(Vec::new, |value| match forward_items {
            Some(items) => items.iter().map(|&v| text_of(doc, v)).collect(),
            None => vec![doc.render(value)],
        }),
    })
}

/// The length `text_of` gives a value, at most: a string's own, or the rendering limit.
fn text_len(doc: &Document, value: Value) -> u64 {
    doc.as_str(value)
        .map_or(RENDER_MAX as u64, |s| s.len() as u64)
}

/// A string value as it is, anything else rendered.
fn text_of(doc: &Document, value: Value) -> String {
    doc.as_str(value)
        .map_or_else(|| doc.render(value), str::to_string)
}

/// A non-negative integer field (`what` names it in the error), read inline when it is a
/// plain int.
#[inline(always)]
fn uint(doc: &Document, value: Option<Value>, what: &str) -> Result<Option<u64>, EntryError> {
    match value {
        None => Ok(None),
        Some(Value::Int(i)) if i >= 0 => Ok(Some(i as u64)),
        Some(v) => uint_other(doc, v, what).map(Some),
    }
}

/// `uint` of anything but a non-negative int: a big int that fits, or an error.
#[cold]
#[inline(never)]
fn uint_other(doc: &Document, value: Value, what: &str) -> Result<u64, EntryError> {
    doc.as_u64(value).ok_or_else(|| {
        EntryError::Bad(format!(
            "'{what}' is not a valid integer: {}",
            doc.render(value)
        ))
    })
}

/// A trace entry's `pool_id`: a pair of integers, as `segment_pool_id` is.
fn pool_id(doc: &Document, value: Value) -> Result<(i64, i64), EntryError> {
    if let Some(&[a, b]) = doc.as_seq(value) {
        if let (Some(a), Some(b)) = (doc.as_i64(a), doc.as_i64(b)) {
            return Ok((a, b));
        }
    }
    Err(EntryError::Bad(format!(
        "'pool_id' is not a pair of integers: {}",
        doc.render(value)
    )))
}

/// A row about to be overwritten.
fn blank_row() -> TraceEntry {
    TraceEntry::new(Action::Alloc, None, 0, StreamIndex(0))
}

/// `TraceFolder::actions` marks: not looked at yet, and not an action name.
const ACTION_UNSEEN: u8 = u8::MAX;
const ACTION_UNKNOWN: u8 = u8::MAX - 1;

/// The action an interned string names, cached per string in `actions` (see `ACTION_UNSEEN`;
/// `None`: not an action name).
#[inline(always)]
fn action_of(actions: &mut Vec<u8>, doc: &Document, name: StrId) -> Option<Action> {
    let i = name as usize;
    if i >= actions.len() {
        actions.resize(i + 1, ACTION_UNSEEN);
    }
    if actions[i] == ACTION_UNSEEN {
        actions[i] = Action::from_torch_name(doc.str(name))
            .and_then(|a| Action::ALL.iter().position(|&b| b == a))
            .map_or(ACTION_UNKNOWN, |p| p as u8);
    }
    Action::ALL.get(actions[i] as usize).copied()
}

/// The handle a dict gets when there is no room for one more (4 billion dicts): it names
/// nothing, so a reference to it is not adopted.
const NO_HANDLE: u32 = u32::MAX;

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
    PoolId,
    Other,
}

/// Number of `Field` values.
const FIELD_COUNT: usize = Field::Other as usize + 1;

/// For each field, the index of its pair in a dict, when present.
#[derive(Clone, Copy, Default)]
struct Shape([Option<u8>; FIELD_COUNT]);

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
        "pool_id" => Field::PoolId,
        _ => Field::Other,
    }
}

/// Keys found in trace entries that tell PyTorch versions apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EntryKeys {
    pub time_us: bool,
    pub compile_context: bool,
    pub user_metadata: bool,
}

/// Why a dict did not become a row.
enum EntryError {
    /// It has no `action`: not a trace entry at all.
    NotAnEntry,
    /// An action this version does not know (a newer PyTorch): skipped with a warning.
    UnknownAction(StrId),
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
    /// Where the fields are in flat dicts of the decoder's shape number `flat_shape.0`.
    flat_shape: (u64, Shape),
    /// The keys of the last other dict read, and where its fields were.
    node_keys: Vec<Value>,
    node_shape: Shape,
    /// The values of the last other dict read.
    node_values: Vec<Value>,
    /// Index in `Action::ALL` of each interned string, see `ACTION_UNSEEN`.
    actions: Vec<u8>,
    /// Entries with an action this version does not know, skipped: (action, count).
    pub unknown_actions: Vec<(String, usize)>,
    /// The first entry that could not be read.
    pub first_problem: Option<EntryProblem>,
    pub problems: usize,
    /// Entries taken by `fold_flat` and not yet appended to their list, with their handles.
    staged: Vec<TraceEntry>,
    staged_handles: Vec<u32>,
    /// The next staged entry to adopt.
    staged_next: usize,
    /// Bit `Field as u32` is set when some dict with an `action` key had that field: which
    /// keys the PyTorch that wrote the file puts in trace entries.
    entry_fields_seen: u32,
    /// What became of each dict taken, by handle (handles are its indices): the index of its
    /// row in `entries`, or a mark (`marks::AWAITING` and those after it). A dict the pickle names
    /// again (a memo reference, or one stack value appended twice) is read from here: one row
    /// per reference, copied, as Python reads the file, without reading the dict again.
    taken: HandleMarks,
    /// The action of each dict marked `UNKNOWN`, by handle (in handle order).
    unknown_of: Vec<(u32, StrId)>,
    /// The row of each dict marked `ORPHAN`, by handle (in handle order).
    orphans: Vec<(u32, TraceEntry)>,
    /// Maps `entries`' room ahead on the second core.
    prefaulter: Prefaulter,
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

    /// Where each field sits in dicts with these keys.
    fn shape_of(&mut self, doc: &Document, keys: &[Value]) -> Shape {
        let mut shape = Shape::default();
        for (i, &key) in keys.iter().enumerate() {
            if let Value::Str(key) = key {
                let field = self.field(doc, key);
                shape.0[field as usize] = Some(i as u8);
            }
        }
        if shape.0[Field::Action as usize].is_some() {
            for (bit, at) in shape.0.iter().enumerate() {
                if at.is_some() {
                    self.entry_fields_seen |= 1 << bit;
                }
            }
        }
        shape
    }

    /// Which version-telling keys some trace entry had.
    pub fn entry_keys(&self) -> EntryKeys {
        let seen = |f: Field| self.entry_fields_seen & (1 << f as u32) != 0;
        EntryKeys {
            time_us: seen(Field::Time),
            compile_context: seen(Field::CompileContext),
            user_metadata: seen(Field::UserMetadata),
        }
    }

    /// Splits a dict node's pairs into `node_keys` and `node_values` and returns its shape,
    /// worked out again only when the keys differ from the previous dict node's.
    fn node_shape(&mut self, doc: &Document, pairs: &[(Value, Value)]) -> Shape {
        let same = self.node_keys.len() == pairs.len()
            && self
                .node_keys
                .iter()
                .zip(pairs)
                .all(|(k, (key, _))| k == key);
        if !same {
            let mut keys = std::mem::take(&mut self.node_keys);
            keys.clear();
            keys.extend(pairs.iter().map(|&(key, _)| key));
            self.node_shape = self.shape_of(doc, &keys);
            self.node_keys = keys;
        }
        self.node_values.clear();
        self.node_values
            .extend(pairs.iter().map(|&(_, value)| value));
        self.node_shape
    }

    /// Reads one trace-entry dict. Its stream, stack and metadata are interned only once its
    /// action, sizes, address, time and stream value have been read (an unreadable frames list
    /// is reported after its stream was interned).
    /// `values` are the dict's values, in the order of the keys `shape` was made from.
    /// The row is written into `row` (left as it was on an error), and the function always
    /// inlined: a row returned by value is stored in pieces into a temporary and then read
    /// back whole, and the CPU stalls on that (store forwarding fails), for a good part of
    /// the decoding time.
    /// It takes the folder's tables one by one, so that `row` may be borrowed from it too.
    #[inline(always)]
    fn entry(
        interner: &mut Interner,
        actions: &mut Vec<u8>,
        doc: &Document,
        shape: Shape,
        values: &[Value],
        row: &mut TraceEntry,
    ) -> Result<(), EntryError> {
        if values.len() > u8::MAX as usize {
            return Err(EntryError::NotAnEntry);
        }
        let get = |field: Field| shape.0[field as usize].map(|i| values[i as usize]);
        let Some(action_value) = get(Field::Action) else {
            return Err(EntryError::NotAnEntry);
        };
        let Value::Str(name) = action_value else {
            return Err(EntryError::Bad("'action' is not a string".into()));
        };
        let Some(action) = action_of(actions, doc, name) else {
            return Err(EntryError::UnknownAction(name));
        };
        let size = uint(doc, get(Field::Size), "size")?
            .ok_or_else(|| format!("'{action}' entry has no 'size'"))?;
        let stream = match get(Field::Stream) {
            None => 0,
            Some(Value::Int(i)) => i as u64,
            Some(v) => doc.as_u64(v).ok_or("'stream' is not an integer")?,
        };
        let time = match get(Field::Time) {
            None => None,
            Some(Value::Int(t)) => Some(t),
            Some(v) => Some(doc.as_i64(v).ok_or("'time_us' is not an integer")?),
        };
        if time.is_some_and(|t| !TraceEntry::TIME_RANGE.contains(&t)) {
            return Err("'time_us' is more than a million years from 1970".into());
        }
        // Read what can still fail first; intern only for a good entry.
        let (addr, device_free) = if action == Action::Oom {
            (None, uint(doc, get(Field::DeviceFree), "device_free")?)
        } else {
            let addr = uint(doc, get(Field::Addr), "addr")?
                .ok_or_else(|| format!("'{action}' entry has no 'addr'"))?;
            (Some(addr), None)
        };
        let pool = match get(Field::PoolId) {
            None | Some(Value::None) => None,
            Some(v) => Some(pool_id(doc, v)?),
        };
        let stream = interner.stream(stream)?;
        let pool = match pool {
            Some(id) => Some(interner.pool(id)?),
            None => None,
        };
        let frames = get(Field::Frames);
        let stack = match frames {
            Some(frames) => interner.stack(doc, frames)?,
            None => None,
        };
        let (context, metadata, forward) = (
            get(Field::CompileContext),
            get(Field::UserMetadata),
            get(Field::ForwardFrames),
        );
        let mut extra = None;
        if context.is_some() || metadata.is_some() || forward.is_some() {
            extra = interner.extra_of(doc, [context, metadata, forward], |doc, budget| {
                entry_extra(doc, budget, context, metadata, forward)
            })?;
        }
        *row = match addr {
            Some(addr) => TraceEntry::new(action, Some(addr), size, stream),
            None => TraceEntry::oom(size, device_free, stream),
        }
        .with_time(time);
        if frames.is_none() {
            *row = row.without_frames_key();
        }
        row.stack = stack;
        *row = row.with_pool(pool);
        if let Some(extra) = extra {
            *row = interner.parked.park(*row, extra)?;
        }
        Ok(())
    }

    fn count_unknown_action(&mut self, name: &str) {
        match self.unknown_actions.iter_mut().find(|(n, _)| n == name) {
            Some((_, count)) => *count += 1,
            None => self.unknown_actions.push((name.to_string(), 1)),
        }
    }

    /// Counts a dict offered from `list` and returns its position there.
    #[inline]
    fn offer(&mut self, list: NodeId) -> usize {
        if self.offered.0 != list {
            self.offered = (list, 0);
        }
        self.offered.1 += 1;
        self.offered.1 - 1
    }

    /// A new handle, marked `mark`; `None` once there is no room for one more.
    fn new_handle(&mut self, mark: u32) -> Option<u32> {
        let handle = u32::try_from(self.taken.len())
            .ok()
            .filter(|&h| h != NO_HANDLE)?;
        self.taken.push(mark);
        Some(handle)
    }

    /// Appends the row of a dict named again to `list`, when the bound allows one more row
    /// (rows are charged together at the end, see `schema::build`; this keeps their number
    /// within the bound while they are made).
    fn push_again(&mut self, doc: &Document, list: NodeId, entry: TraceEntry) {
        let position = self.offer(list);
        let rows = (self.entries.len() as u64 + 1) * std::mem::size_of::<TraceEntry>() as u64;
        match self.interner.budget.check(doc, rows, "the trace entries") {
            Ok(()) => self.push(list, entry),
            Err(message) => {
                self.problems += 1;
                self.first_problem.get_or_insert(EntryProblem {
                    list,
                    position,
                    message,
                });
            }
        }
    }

    fn push(&mut self, list: NodeId, entry: TraceEntry) {
        let index = self.entries.len();
        self.entries.push(entry);
        self.prefaulter.follow(&self.entries);
        match self.runs.last_mut() {
            Some(run) if run.list == list && run.end == index => run.end += 1,
            _ => self.runs.push(Run {
                list,
                start: index,
                end: index + 1,
            }),
        }
    }
}

impl Fold for TraceFolder {
    #[inline]
    fn fold(&mut self, doc: &Document, list: NodeId, dict: NodeId) -> Option<u32> {
        let Node::Dict(pairs) = doc.node(dict) else {
            return None;
        };
        let position = self.offer(list);
        let shape = self.node_shape(doc, pairs);
        let values = std::mem::take(&mut self.node_values);
        let mut entry = blank_row();
        let read = Self::entry(
            &mut self.interner,
            &mut self.actions,
            doc,
            shape,
            &values,
            &mut entry,
        );
        self.node_values = values;
        let mark = match read {
            Ok(()) => {
                self.push(list, entry);
                row_mark(self.entries.len() - 1)
            }
            Err(EntryError::NotAnEntry) => {
                self.offered.1 -= 1;
                return None;
            }
            Err(EntryError::UnknownAction(name)) => {
                self.count_unknown_action(doc.str(name));
                let handle = self.new_handle(UNKNOWN);
                if let Some(handle) = handle {
                    self.unknown_of.push((handle, name));
                }
                return Some(handle.unwrap_or(NO_HANDLE));
            }
            Err(EntryError::Bad(message)) => {
                self.problems += 1;
                self.first_problem.get_or_insert(EntryProblem {
                    list,
                    position,
                    message,
                });
                BAD
            }
        };
        Some(self.new_handle(mark).unwrap_or(NO_HANDLE))
    }

    fn wants_flat(&self) -> bool {
        true
    }

    /// Takes good entries only; anything odd is left for `fold`, which reports it in place.
    #[inline(always)]
    fn fold_flat(&mut self, doc: &Document, dict: FlatDict) -> Option<u32> {
        if dict.shape != self.flat_shape.0 {
            self.flat_shape = (dict.shape, self.shape_of(doc, dict.keys));
        }
        // The row is read in place, at the end of `staged`.
        let at = self.staged.len();
        self.staged.push(blank_row());
        let read = Self::entry(
            &mut self.interner,
            &mut self.actions,
            doc,
            self.flat_shape.1,
            dict.values,
            &mut self.staged[at],
        );
        let handle = match read {
            Ok(()) => self.new_handle(AWAITING),
            Err(_) => None,
        };
        let Some(handle) = handle else {
            self.staged.pop();
            return None;
        };
        self.staged_handles.push(handle);
        Some(handle)
    }

    #[inline(always)]
    fn adopt(&mut self, doc: &Document, list: NodeId, handle: u32) -> bool {
        let Some(mark) = self.taken.get(handle) else {
            return false;
        };
        match mark {
            AWAITING => self.adopt_staged(list, handle),
            NOT_AGAIN => false,
            BAD => {
                self.offer(list);
                self.problems += 1;
                true
            }
            UNKNOWN => {
                let Ok(i) = self.unknown_of.binary_search_by_key(&handle, |&(h, _)| h) else {
                    return false;
                };
                let name = self.unknown_of[i].1;
                self.offer(list);
                self.count_unknown_action(doc.str(name));
                true
            }
            ORPHAN => {
                let Ok(i) = self.orphans.binary_search_by_key(&handle, |&(h, _)| h) else {
                    return false;
                };
                let entry = self.orphans[i].1;
                self.push_again(doc, list, entry);
                true
            }
            index => {
                let entry = self.entries[index as usize];
                self.push_again(doc, list, entry);
                true
            }
        }
    }
}

impl TraceFolder {
    /// Appends the staged entry `handle` to `list`. Staged entries are appended in the order
    /// they were staged; those passed over (a dict used elsewhere first) are kept as orphans,
    /// in case a list names them later.
    #[inline]
    fn adopt_staged(&mut self, list: NodeId, handle: u32) -> bool {
        let Some(k) = self.staged_handles[self.staged_next..]
            .iter()
            .position(|&h| h == handle)
        else {
            return false;
        };
        for passed in self.staged_next..self.staged_next + k {
            let h = self.staged_handles[passed];
            self.taken.set(h, ORPHAN);
            self.orphans.push((h, self.staged[passed]));
        }
        let entry = self.staged[self.staged_next + k];
        self.staged_next += k + 1;
        if self.staged_next == self.staged.len() {
            self.staged.clear();
            self.staged_handles.clear();
            self.staged_next = 0;
        }
        self.offer(list);
        self.push(list, entry);
        self.taken.set(handle, row_mark(self.entries.len() - 1));
        true
    }
}
