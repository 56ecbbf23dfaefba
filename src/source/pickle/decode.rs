//! The pickle virtual machine for data-only pickles (protocols 0 to 5).
//!
//! It honours the memo (a memoized object is stored once and shared), streams its input, and
//! refuses every opcode that would import or call Python code, so opening someone else's
//! snapshot can never run anything. The common opcodes run on the fast path of `fast.rs`;
//! this file has the general step for every opcode.

use super::error::{malformed, DecodeError, DecodeErrorKind, Step};
use super::fast::{KeyCode, FLAT_PAIRS};
use super::fold::Fold;
use super::input::{Input, Refill};
use super::memo::Memo;
use super::text::{parse_text_int, raw_unicode_escape};
use super::value::{Document, Node, NodeId, StrId, Value};
use rustc_hash::FxHashMap;

/// Decodes one pickle from `reader` (any `Read`, or a `Refill` source), offering dicts appended
/// to lists to `fold`.
pub fn decode<R: Refill, F: Fold>(
    reader: R,
    fold: &mut F,
) -> Result<(Document, Value), DecodeError> {
    let mut vm = Machine {
        input: Input::new(reader),
        doc: Document::default(),
        stack: Vec::with_capacity(1024),
        marks: Vec::new(),
        memo: Memo::default(),
        memo_count: 0,
        node_memo: Vec::new(),
        node_fold: Vec::new(),
        free_nodes: Vec::new(),
        string_ids: FxHashMap::default(),
        flat_keys: Vec::with_capacity(FLAT_PAIRS),
        flat_values: [Value::None; FLAT_PAIRS],
        flat_shape: 0,
        window_base: 0,
        flat_key_codes: [KeyCode::default(); FLAT_PAIRS],
        flat_stores: Vec::with_capacity(2 * FLAT_PAIRS + 1),
        fold,
    };
    match vm.input.at_end() {
        Ok(true) => {
            return Err(DecodeError {
                offset: 0,
                kind: DecodeErrorKind::Empty,
            })
        }
        Ok(false) => {}
        Err(e) => {
            return Err(DecodeError {
                offset: 0,
                kind: e.into(),
            })
        }
    }
    let root = vm.run()?;
    vm.doc.bytes_read = vm.input.offset();
    Ok((vm.doc, root))
}

pub(super) const NO_MEMO: u32 = u32::MAX;

pub(super) struct Machine<'f, R, F> {
    pub(super) input: Input<R>,
    pub(super) doc: Document,
    pub(super) stack: Vec<Value>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: Memo,
    pub(super) memo_count: usize,
    /// For each node, the memo slot that holds it (`NO_MEMO` if none), so a folded dict's slot
    /// can be updated.
    pub(super) node_memo: Vec<u32>,
    /// For each node, the fold's handle once the fold took it (it is then free for reuse): a
    /// reference to it still on the stack (a memo read or DUP before the APPENDS that took it)
    /// is that handle, never the node's next use, and the node is freed only once.
    pub(super) node_fold: Vec<Option<u32>>,
    pub(super) free_nodes: Vec<NodeId>,
    pub(super) string_ids: FxHashMap<Box<str>, StrId>,
    /// The keys of the last flat dict read (see `FlatDict`), and their shape number, which
    /// changes whenever they do.
    pub(super) flat_keys: Vec<Value>,
    pub(super) flat_shape: u64,
    /// The input offset of the fast path's buffer (`run_fast`).
    pub(super) window_base: u64,
    /// How each of `flat_keys` was read, to recognise it in the next flat dict.
    pub(super) flat_key_codes: [KeyCode; FLAT_PAIRS],
    /// Scratch space of `flat_dict`, kept to avoid allocating per dict.
    pub(super) flat_values: [Value; FLAT_PAIRS],
    pub(super) flat_stores: Vec<(usize, Value)>,
    pub(super) fold: &'f mut F,
}

impl<R: Refill, F: Fold> Machine<'_, R, F> {
    pub(super) fn run(&mut self) -> Result<Value, DecodeError> {
        loop {
            self.run_fast();
            let at = self.input.offset();
            let step = match self.input.byte() {
                Ok(op) => self.step(op, at),
                Err(e) => Err(e.into()),
            };
            match step {
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => {
                    return self.stack.pop().ok_or(DecodeError {
                        offset: at,
                        kind: malformed("STOP with an empty stack"),
                    });
                }
                Err(kind) => return Err(DecodeError { offset: at, kind }),
            }
        }
    }

    /// Executes one opcode.
    #[inline]
    fn step(&mut self, op: u8, at: u64) -> Result<Flow, DecodeErrorKind> {
        match op {
            // Structure.
            0x80 => {
                let proto = self.input.byte()?;
                if proto > 5 {
                    return Err(DecodeErrorKind::UnsupportedProtocol(proto));
                }
            }
            0x95 => {
                self.input.take(8)?;
            }
            b'.' => return Ok(Flow::Stop),
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                if self.stack.len() > self.marks.last().copied().unwrap_or(0) {
                    self.stack.pop();
                } else {
                    self.pop_mark()?;
                }
            }
            b'1' => {
                let mark = self.pop_mark()?;
                self.stack.truncate(mark);
            }
            b'2' => {
                let top = self.top()?;
                self.stack.push(top);
            }
            // Scalars.
            b'N' => self.stack.push(Value::None),
            0x88 => self.stack.push(Value::Bool(true)),
            0x89 => self.stack.push(Value::Bool(false)),
            b'J' => {
                let v = i32::from_le_bytes(self.input.array()?);
                self.stack.push(Value::Int(v as i64));
            }
            b'K' => {
                let v = self.input.byte()?;
                self.stack.push(Value::Int(v as i64));
            }
            b'M' => {
                let v = u16::from_le_bytes(self.input.array()?);
                self.stack.push(Value::Int(v as i64));
            }
            0x8a => {
                let n = self.input.byte()? as usize;
                self.long(n)?;
            }
            0x8b => {
                let n = i32::from_le_bytes(self.input.array()?);
                let n = usize::try_from(n).map_err(|_| malformed("negative LONG4 length"))?;
                self.long(n)?;
            }
            b'I' => {
                let line = self.input.line()?;
                let v = match line {
                    b"01" => Value::Bool(true),
                    b"00" => Value::Bool(false),
                    _ => Value::Int(parse_text_int(line)?),
                };
                self.stack.push(v);
            }
            b'L' => {
                let line = self.input.line()?;
                let digits = line.strip_suffix(b"L").unwrap_or(line);
                let v = parse_text_int(digits)?;
                self.stack.push(Value::Int(v));
            }
            b'F' => {
                let line = self.input.line()?;
                let v = std::str::from_utf8(line)
                    .ok()
                    .and_then(|s| s.trim().parse::<f64>().ok())
                    .ok_or_else(|| malformed("bad FLOAT text"))?;
                self.stack.push(Value::Float(v));
            }
            b'G' => {
                let v = f64::from_be_bytes(self.input.array()?);
                self.stack.push(Value::Float(v));
            }
            // Strings and bytes.
            0x8c => {
                let n = self.input.byte()? as usize;
                self.unicode(n)?;
            }
            b'X' => {
                let n = u32::from_le_bytes(self.input.array()?) as usize;
                self.unicode(n)?;
            }
            0x8d => {
                let n = self.len8()?;
                self.unicode(n)?;
            }
            b'V' => {
                let text = raw_unicode_escape(self.input.line()?)?;
                let id = self.intern(&text);
                self.stack.push(Value::Str(id));
            }
            b'U' => {
                let n = self.input.byte()? as usize;
                self.legacy_string(n)?;
            }
            b'T' => {
                let n = i32::from_le_bytes(self.input.array()?);
                let n = usize::try_from(n).map_err(|_| malformed("negative BINSTRING length"))?;
                self.legacy_string(n)?;
            }
            b'S' => {
                let line = self.input.line()?;
                let inner = line
                    .strip_prefix(b"'")
                    .and_then(|l| l.strip_suffix(b"'"))
                    .or_else(|| line.strip_prefix(b"\"").and_then(|l| l.strip_suffix(b"\"")))
                    .ok_or_else(|| malformed("STRING is not quoted"))?;
                let text = std::str::from_utf8(inner)
                    .map_err(|_| malformed("STRING is not UTF-8"))?
                    .to_string();
                let id = self.intern(&text);
                self.stack.push(Value::Str(id));
            }
            b'C' => {
                let n = self.input.byte()? as usize;
                self.bytes(n)?;
            }
            b'B' => {
                let n = u32::from_le_bytes(self.input.array()?) as usize;
                self.bytes(n)?;
            }
            0x8e | 0x96 => {
                let n = self.len8()?;
                self.bytes(n)?;
            }
            // Containers.
            b']' => {
                let id = self.new_node(Node::List(Vec::new()));
                self.stack.push(Value::Node(id));
            }
            b'}' => {
                let id = self.new_dict();
                self.stack.push(Value::Node(id));
            }
            b')' => {
                let id = self.new_node(Node::Tuple(Vec::new()));
                self.stack.push(Value::Node(id));
            }
            0x8f => {
                let id = self.new_node(Node::Set(Vec::new()));
                self.stack.push(Value::Node(id));
            }
            b'l' | b't' | 0x91 => {
                let mark = self.pop_mark()?;
                let items = self.stack.split_off(mark);
                let node = match op {
                    b'l' => Node::List(items),
                    b't' => Node::Tuple(items),
                    _ => Node::Set(items),
                };
                let id = self.new_node(node);
                self.stack.push(Value::Node(id));
            }
            b'd' => {
                let mark = self.pop_mark()?;
                let items = self.stack.split_off(mark);
                if !items.len().is_multiple_of(2) {
                    return Err(malformed("DICT with an odd number of items"));
                }
                let pairs = items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect();
                let id = self.new_node(Node::Dict(pairs));
                self.stack.push(Value::Node(id));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if self.stack.len() < self.marks.last().copied().unwrap_or(0) + n {
                    return Err(malformed("TUPLE with too few items on the stack"));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                let id = self.new_node(Node::Tuple(items));
                self.stack.push(Value::Node(id));
            }
            b'a' => {
                let value = self.pop()?;
                self.stack.push(value);
                let at_least = self.marks.last().copied().unwrap_or(0) + 2;
                if self.stack.len() < at_least {
                    return Err(malformed("APPEND without a list"));
                }
                self.append_from(self.stack.len() - 1)?;
            }
            b'e' => {
                let mark = self.pop_mark()?;
                self.append_from(mark)?;
            }
            b's' => {
                if self.stack.len() < self.marks.last().copied().unwrap_or(0) + 3 {
                    return Err(malformed("SETITEM without a dict, key and value"));
                }
                self.set_items_from(self.stack.len() - 2)?;
            }
            b'u' => {
                let mark = self.pop_mark()?;
                self.set_items_from(mark)?;
            }
            0x90 => {
                let mark = self.pop_mark()?;
                let target = self.container_below(mark)?;
                let items: Vec<Value> = self.stack.drain(mark..).collect();
                match &mut self.doc.nodes[target as usize] {
                    Node::Set(v) => v.extend(items),
                    _ => return Err(malformed("ADDITEMS to something that is not a set")),
                }
            }
            // Memo.
            b'h' => {
                let i = self.input.byte()? as usize;
                self.memo_get(i)?;
            }
            b'j' => {
                let i = u32::from_le_bytes(self.input.array()?) as usize;
                self.memo_get(i)?;
            }
            b'g' => {
                let i = parse_text_int(self.input.line()?)?;
                self.memo_get(usize::try_from(i).map_err(|_| malformed("negative GET index"))?)?;
            }
            b'q' => {
                let i = self.input.byte()? as usize;
                self.memo_put_at(i, at)?;
            }
            b'r' => {
                let i = u32::from_le_bytes(self.input.array()?) as usize;
                self.memo_put_at(i, at)?;
            }
            b'p' => {
                let i = parse_text_int(self.input.line()?)?;
                let i = usize::try_from(i).map_err(|_| malformed("negative PUT index"))?;
                self.memo_put_at(i, at)?;
            }
            0x94 => self.memo_put(self.memo_count)?,
            // Code execution and out-of-band data: never.
            b'c' => return Err(DecodeErrorKind::Refused("GLOBAL")),
            0x93 => return Err(DecodeErrorKind::Refused("STACK_GLOBAL")),
            b'R' => return Err(DecodeErrorKind::Refused("REDUCE")),
            b'b' => return Err(DecodeErrorKind::Refused("BUILD")),
            b'i' => return Err(DecodeErrorKind::Refused("INST")),
            b'o' => return Err(DecodeErrorKind::Refused("OBJ")),
            0x81 => return Err(DecodeErrorKind::Refused("NEWOBJ")),
            0x92 => return Err(DecodeErrorKind::Refused("NEWOBJ_EX")),
            b'P' => return Err(DecodeErrorKind::Refused("PERSID")),
            b'Q' => return Err(DecodeErrorKind::Refused("BINPERSID")),
            0x82 => return Err(DecodeErrorKind::Refused("EXT1")),
            0x83 => return Err(DecodeErrorKind::Refused("EXT2")),
            0x84 => return Err(DecodeErrorKind::Refused("EXT4")),
            0x97 => return Err(DecodeErrorKind::Refused("NEXT_BUFFER")),
            0x98 => return Err(DecodeErrorKind::Refused("READONLY_BUFFER")),
            b'{' | b'[' if at == 0 => return Err(DecodeErrorKind::LooksLikeJson),
            other => return Err(DecodeErrorKind::UnknownOpcode(other)),
        }
        Ok(Flow::Continue)
    }

    #[inline]
    fn pop(&mut self) -> Result<Value, DecodeErrorKind> {
        if self.stack.len() <= self.marks.last().copied().unwrap_or(0) {
            return Err(malformed("stack underflow"));
        }
        self.stack.pop().ok_or_else(|| malformed("stack underflow"))
    }

    #[inline]
    fn top(&self) -> Result<Value, DecodeErrorKind> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| malformed("stack underflow"))
    }

    #[inline]
    fn pop_mark(&mut self) -> Result<usize, DecodeErrorKind> {
        self.marks
            .pop()
            .ok_or_else(|| malformed("MARK expected but none is open"))
    }

    /// The container just below stack position `mark`.
    #[inline]
    fn container_below(&self, mark: usize) -> Result<NodeId, DecodeErrorKind> {
        match mark.checked_sub(1).map(|i| self.stack[i]) {
            Some(Value::Node(id)) => Ok(id),
            _ => Err(malformed(
                "items added to something that is not a container",
            )),
        }
    }

    fn len8(&mut self) -> Result<usize, DecodeErrorKind> {
        let n = u64::from_le_bytes(self.input.array()?);
        usize::try_from(n).map_err(|_| malformed("length does not fit in memory"))
    }

    fn long(&mut self, n: usize) -> Step {
        let bytes = self.input.take(n)?;
        let value = if n == 0 {
            Value::Int(0)
        } else if n <= 8 {
            let negative = bytes[n - 1] & 0x80 != 0;
            let mut le = [if negative { 0xff } else { 0 }; 8];
            le[..n].copy_from_slice(bytes);
            Value::Int(i64::from_le_bytes(le))
        } else if let Some(value) = fits_i64(bytes) {
            // Python writes the fewest bytes; another writer may add bytes that only repeat
            // the sign.
            Value::Int(value)
        } else {
            let boxed: Box<[u8]> = bytes.into();
            self.doc.big_ints.push(boxed);
            Value::BigInt((self.doc.big_ints.len() - 1) as u32)
        };
        self.stack.push(value);
        Ok(())
    }

    #[inline]
    fn unicode(&mut self, n: usize) -> Step {
        let bytes = self.input.take(n)?;
        let text = std::str::from_utf8(bytes).map_err(|_| malformed("string is not UTF-8"))?;
        let id = intern_into(&mut self.doc, &mut self.string_ids, text);
        self.stack.push(Value::Str(id));
        Ok(())
    }

    pub(super) fn intern(&mut self, text: &str) -> StrId {
        intern_into(&mut self.doc, &mut self.string_ids, text)
    }

    /// Python 2 `str` (SHORT_BINSTRING / BINSTRING): text when it is UTF-8, else bytes.
    fn legacy_string(&mut self, n: usize) -> Step {
        let bytes = self.input.take(n)?;
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                let text = text.to_string();
                let id = self.intern(&text);
                self.stack.push(Value::Str(id));
                Ok(())
            }
            Err(_) => {
                let boxed: Box<[u8]> = bytes.into();
                self.push_bytes(boxed);
                Ok(())
            }
        }
    }

    fn bytes(&mut self, n: usize) -> Step {
        let boxed: Box<[u8]> = self.input.take(n)?.into();
        self.push_bytes(boxed);
        Ok(())
    }

    fn push_bytes(&mut self, bytes: Box<[u8]>) {
        self.doc.byte_strings.push(bytes);
        let id = (self.doc.byte_strings.len() - 1) as u32;
        self.stack.push(Value::Bytes(id));
    }

    fn new_node(&mut self, node: Node) -> NodeId {
        if let Some(id) = self.free_nodes.pop() {
            self.doc.nodes[id as usize] = node;
            self.node_memo[id as usize] = NO_MEMO;
            self.node_fold[id as usize] = None;
            return id;
        }
        self.doc.nodes.push(node);
        self.node_memo.push(NO_MEMO);
        self.node_fold.push(None);
        (self.doc.nodes.len() - 1) as NodeId
    }

    /// A new empty dict, reusing the storage of a folded one when there is one.
    #[inline]
    pub(super) fn new_dict(&mut self) -> NodeId {
        if let Some(id) = self.free_nodes.pop() {
            let slot = &mut self.doc.nodes[id as usize];
            match slot {
                Node::Dict(pairs) => pairs.clear(),
                other => *other = Node::Dict(Vec::new()),
            }
            self.node_memo[id as usize] = NO_MEMO;
            self.node_fold[id as usize] = None;
            return id;
        }
        self.new_node(Node::Dict(Vec::new()))
    }

    /// Appends `stack[from..]` to the list (or set) just below `from`, offering dicts to the fold.
    fn append_from(&mut self, from: usize) -> Step {
        let list = self.container_below(from)?;
        match &self.doc.nodes[list as usize] {
            Node::List(_) => {}
            Node::Set(_) => {
                let items: Vec<Value> = self.stack.drain(from..).collect();
                if let Node::Set(v) = &mut self.doc.nodes[list as usize] {
                    v.extend(items);
                }
                return Ok(());
            }
            _ => return Err(malformed("APPEND to something that is not a list")),
        }
        // What a fold charges for the rows it adopts is measured against the bytes read so far.
        self.doc.bytes_read = self.input.offset();
        self.fold.appending(&self.doc, &self.stack[..from]);
        for i in from..self.stack.len() {
            let mut item = self.stack[i];
            if let Value::Node(id) = item {
                if let Some(handle) = self.node_fold[id as usize] {
                    item = Value::Folded(handle);
                }
            }
            if let Value::Folded(handle) = item {
                if self.fold.adopt(&self.doc, list, handle) {
                    continue;
                }
            }
            if let Value::Node(id) = item {
                if id != list && matches!(self.doc.nodes[id as usize], Node::Dict(_)) {
                    if let Some(handle) = self.fold.fold(&self.doc, list, id) {
                        let slot = self.node_memo[id as usize];
                        if slot != NO_MEMO {
                            self.memo.set(slot as usize, Value::Folded(handle));
                            if self.flat_keys.contains(&Value::Node(id)) {
                                self.forget_flat_keys();
                            }
                        }
                        self.node_fold[id as usize] = Some(handle);
                        self.free_nodes.push(id);
                        continue;
                    }
                }
            }
            if let Node::List(v) = &mut self.doc.nodes[list as usize] {
                v.push(item);
            }
        }
        self.stack.truncate(from);
        Ok(())
    }

    /// Sets `stack[from..]` as key, value pairs on the dict just below `from`.
    #[inline]
    pub(super) fn set_items_from(&mut self, from: usize) -> Step {
        let dict = self.container_below(from)?;
        if !(self.stack.len() - from).is_multiple_of(2) {
            return Err(malformed("SETITEMS with an odd number of items"));
        }
        let Node::Dict(pairs) = &mut self.doc.nodes[dict as usize] else {
            return Err(malformed("SETITEM on something that is not a dict"));
        };
        pairs.extend(self.stack[from..].chunks_exact(2).map(|kv| (kv[0], kv[1])));
        self.stack.truncate(from);
        Ok(())
    }

    #[inline]
    pub(super) fn memo_get(&mut self, index: usize) -> Step {
        match self.memo.get(index) {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => Err(malformed(format!("memo index {index} was never stored"))),
        }
    }

    /// A PUT, BINPUT or LONG_BINPUT at byte `at` to slot `index`. Python numbers memo slots
    /// from 0 up, one per store, so a real index is below the bytes read so far; a larger one
    /// is refused (it would make the memo grow with the index, not with the input).
    fn memo_put_at(&mut self, index: usize, at: u64) -> Step {
        if index as u64 > at {
            return Err(malformed(format!(
                "memo index {index} is implausibly large (at byte {at})"
            )));
        }
        self.memo_put(index)
    }

    #[inline]
    pub(super) fn memo_put(&mut self, index: usize) -> Step {
        let top = self.top()?;
        self.memo_store(index, top);
        Ok(())
    }

    /// Stores `value` in memo slot `index` (which callers have bounded: see `memo_put_at`).
    #[inline(always)]
    pub(super) fn memo_store(&mut self, index: usize, top: Value) {
        if index == self.memo.len() && !matches!(top, Value::Node(_)) {
            // The common case: a new slot for a scalar, string or folded dict.
            self.memo.push(top);
            self.memo_count += 1;
            return;
        }
        self.memo_store_other(index, top);
    }

    /// A memo slot changed value: the key codes of the last flat dict may now read other keys.
    fn forget_flat_keys(&mut self) {
        self.flat_keys.clear();
        self.flat_shape += 1;
    }

    /// `memo_store` of a node, or into a slot that is not the next one.
    #[inline(never)]
    fn memo_store_other(&mut self, index: usize, top: Value) {
        if self.memo.set(index, top) {
            self.memo_count += 1;
        } else {
            self.forget_flat_keys();
        }
        if let Value::Node(id) = top {
            self.node_memo[id as usize] = index as u32;
        }
    }
}

/// The id of `text` in the document's string table, adding it if new. A free function so
/// that `text` may borrow the input while the table is changed.
fn intern_into(doc: &mut Document, ids: &mut FxHashMap<Box<str>, StrId>, text: &str) -> StrId {
    if let Some(&id) = ids.get(text) {
        return id;
    }
    let id = doc.strings.len() as StrId;
    doc.strings.push(text.into());
    ids.insert(text.into(), id);
    id
}

/// Whether decoding goes on after an opcode.
enum Flow {
    Continue,
    Stop,
}

/// The value of a little-endian two's complement integer of more than 8 bytes, when it fits
/// in an i64: every byte past the eighth repeats the sign.
fn fits_i64(bytes: &[u8]) -> Option<i64> {
    let (low, high) = bytes.split_at_checked(8)?;
    let value = i64::from_le_bytes(low.try_into().ok()?);
    let sign = if value < 0 { 0xff } else { 0 };
    high.iter().all(|&b| b == sign).then_some(value)
}
