//! The pickle virtual machine for data-only pickles (protocols 0 to 5).
//!
//! It honours the memo (a memoized object is stored once and shared), streams its input, and
//! refuses every opcode that would import or call Python code, so opening someone else's
//! snapshot can never run anything. A `Fold` may take over dicts as they are appended to lists,
//! which lets a caller turn millions of small records into compact typed rows while decoding.

use super::input::{Input, InputError};
use super::value::{Document, Node, NodeId, StrId, Value};
use rustc_hash::FxHashMap;
use std::fmt;
use std::io::Read;

/// Takes over dicts while they are appended to lists.
///
/// Dicts reach a fold in one of two ways, and the fold sees every dict of a list in list order:
/// - a flat dict (only scalars and memo references as values) is first offered as soon as it
///   is decoded, as key/value pairs (`fold_flat`), before any node is made for it; a fold that
///   takes it returns a handle, and later `adopt`s it when it is appended to its list;
/// - any other dict (or a flat one not taken) is offered when it is appended (`fold`).
pub trait Fold {
    /// Offered each dict appended to `list`. Returning a handle takes the dict over: it is left
    /// out of the list, its node is reused, and a memo reference to it reads `Value::Folded`.
    fn fold(&mut self, doc: &Document, list: NodeId, dict: NodeId) -> Option<u32>;

    /// Whether this fold takes flat dicts early (`fold_flat`); the decoder skips the look-ahead
    /// otherwise.
    fn wants_flat(&self) -> bool {
        false
    }

    /// Offered each flat dict as it is decoded. Returning a handle takes it: the decoder makes
    /// no node, pushes `Value::Folded(handle)`, and calls `adopt` when it is appended to a list.
    fn fold_flat(&mut self, _doc: &Document, _pairs: &[(Value, Value)]) -> Option<u32> {
        None
    }

    /// A dict taken by `fold_flat` was appended to `list`. `false` if the handle is not one
    /// awaiting adoption (the same dict appended twice); it then stays in the list as a value.
    fn adopt(&mut self, _list: NodeId, _handle: u32) -> bool {
        false
    }
}

/// A `Fold` that takes nothing.
pub struct KeepAll;

impl Fold for KeepAll {
    fn fold(&mut self, _: &Document, _: NodeId, _: NodeId) -> Option<u32> {
        None
    }
}

/// What went wrong, without the position.
#[derive(Debug)]
pub enum DecodeErrorKind {
    Empty,
    Truncated,
    Io(std::io::Error),
    /// An opcode that imports or calls code, or needs out-of-band data.
    Refused(&'static str),
    UnknownOpcode(u8),
    UnsupportedProtocol(u8),
    LooksLikeJson,
    Malformed(String),
}

/// A decode failure at a byte offset.
#[derive(Debug)]
pub struct DecodeError {
    /// Offset of the opcode being decoded.
    pub offset: u64,
    pub kind: DecodeErrorKind,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.offset;
        match &self.kind {
            DecodeErrorKind::Empty => write!(f, "the file is empty"),
            DecodeErrorKind::Truncated => write!(
                f,
                "truncated pickle: the data ends inside the opcode at byte {at}"
            ),
            DecodeErrorKind::Io(e) => write!(f, "read error near byte {at}: {e}"),
            DecodeErrorKind::Refused(op) => write!(
                f,
                "refused opcode {op} at byte {at}: it would import or call Python code, and \
                 memprof reads data-only pickles"
            ),
            DecodeErrorKind::UnknownOpcode(op) => {
                write!(f, "not a pickle: unknown opcode 0x{op:02x} at byte {at}")
            }
            DecodeErrorKind::UnsupportedProtocol(p) => {
                write!(
                    f,
                    "unsupported pickle protocol {p} at byte {at} (known: 0 to 5)"
                )
            }
            DecodeErrorKind::LooksLikeJson => write!(
                f,
                "not a pickle: the file looks like JSON (byte {at}); expected a PyTorch memory \
                 snapshot pickle"
            ),
            DecodeErrorKind::Malformed(why) => write!(f, "malformed pickle at byte {at}: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

type Step = Result<(), DecodeErrorKind>;

fn malformed(why: impl Into<String>) -> DecodeErrorKind {
    DecodeErrorKind::Malformed(why.into())
}

impl From<InputError> for DecodeErrorKind {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Truncated => DecodeErrorKind::Truncated,
            InputError::Io(e) => DecodeErrorKind::Io(e),
        }
    }
}

/// Decodes one pickle from `reader`, offering dicts appended to lists to `fold`.
pub fn decode<R: Read, F: Fold>(reader: R, fold: &mut F) -> Result<(Document, Value), DecodeError> {
    let mut vm = Machine {
        input: Input::new(reader),
        doc: Document::default(),
        stack: Vec::with_capacity(1024),
        marks: Vec::new(),
        memo: Vec::new(),
        memo_count: 0,
        node_memo: Vec::new(),
        free_nodes: Vec::new(),
        string_ids: FxHashMap::default(),
        flat_pairs: Vec::with_capacity(FLAT_PAIRS),
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
    Ok((vm.doc, root))
}

const NO_MEMO: u32 = u32::MAX;

struct Machine<'f, R, F> {
    input: Input<R>,
    doc: Document,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Vec<Option<Value>>,
    memo_count: usize,
    /// For each node, the memo slot that holds it (`NO_MEMO` if none), so a folded dict's slot
    /// can be updated.
    node_memo: Vec<u32>,
    free_nodes: Vec<NodeId>,
    string_ids: FxHashMap<Box<str>, StrId>,
    /// Scratch space of `flat_dict`, kept to avoid allocating per dict.
    flat_pairs: Vec<(Value, Value)>,
    flat_stores: Vec<(usize, Value)>,
    fold: &'f mut F,
}

impl<R: Read, F: Fold> Machine<'_, R, F> {
    fn run(&mut self) -> Result<Value, DecodeError> {
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

    /// Executes the opcodes that make up almost all of a snapshot (memo gets, small ints,
    /// marks, memoize, setitems) straight from the input buffer, until one needs more bytes
    /// than are buffered, is another opcode, or would fail; the general `step` then takes over
    /// (and reports any error with its offset), since the fast path never half-applies one.
    fn run_fast(&mut self) {
        // The buffer is moved out for the loop so the machine's other fields stay borrowable.
        let (buf, mut i, end) = self.input.take_window();
        while end - i >= 16 {
            let op = buf[i];
            let len = match op {
                b'h' => {
                    if self.memo_get(buf[i + 1] as usize).is_err() {
                        break;
                    }
                    2
                }
                b'j' => {
                    let index =
                        u32::from_le_bytes([buf[i + 1], buf[i + 2], buf[i + 3], buf[i + 4]]);
                    if self.memo_get(index as usize).is_err() {
                        break;
                    }
                    5
                }
                b'K' => {
                    self.stack.push(Value::Int(buf[i + 1] as i64));
                    2
                }
                b'M' => {
                    self.stack.push(Value::Int(
                        u16::from_le_bytes([buf[i + 1], buf[i + 2]]) as i64
                    ));
                    3
                }
                b'J' => {
                    let v = i32::from_le_bytes([buf[i + 1], buf[i + 2], buf[i + 3], buf[i + 4]]);
                    self.stack.push(Value::Int(v as i64));
                    5
                }
                0x8a if buf[i + 1] as usize <= 8 && buf[i + 1] > 0 => {
                    let n = buf[i + 1] as usize;
                    let negative = buf[i + 1 + n] & 0x80 != 0;
                    let mut le = [if negative { 0xff } else { 0 }; 8];
                    le[..n].copy_from_slice(&buf[i + 2..i + 2 + n]);
                    self.stack.push(Value::Int(i64::from_le_bytes(le)));
                    2 + n
                }
                b'(' => {
                    self.marks.push(self.stack.len());
                    1
                }
                0x94 => {
                    if self.memo_put(self.memo_count).is_err() {
                        break;
                    }
                    1
                }
                b'u' => {
                    let Some(&mark) = self.marks.last() else {
                        break;
                    };
                    if self.set_items_from(mark).is_err() {
                        break;
                    }
                    self.marks.pop();
                    1
                }
                b'}' => {
                    if self.fold.wants_flat() {
                        if let Some(next) = self.flat_dict(&buf, i, end) {
                            i = next;
                            continue;
                        }
                    }
                    let id = self.new_dict();
                    self.stack.push(Value::Node(id));
                    1
                }
                b'N' => {
                    self.stack.push(Value::None);
                    1
                }
                0x88 | 0x89 => {
                    self.stack.push(Value::Bool(op == 0x88));
                    1
                }
                _ => break,
            };
            i += len;
        }
        self.input.put_window(buf, i);
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
                self.memo_put(i)?;
            }
            b'r' => {
                let i = u32::from_le_bytes(self.input.array()?) as usize;
                self.memo_put(i)?;
            }
            b'p' => {
                let i = parse_text_int(self.input.line()?)?;
                self.memo_put(usize::try_from(i).map_err(|_| malformed("negative PUT index"))?)?;
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
        let id = match self.string_ids.get(text) {
            Some(&id) => id,
            None => {
                let id = self.doc.strings.len() as StrId;
                self.doc.strings.push(text.into());
                self.string_ids.insert(text.into(), id);
                id
            }
        };
        self.stack.push(Value::Str(id));
        Ok(())
    }

    fn intern(&mut self, text: &str) -> StrId {
        if let Some(&id) = self.string_ids.get(text) {
            return id;
        }
        let id = self.doc.strings.len() as StrId;
        self.doc.strings.push(text.into());
        self.string_ids.insert(text.into(), id);
        id
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
            return id;
        }
        self.doc.nodes.push(node);
        self.node_memo.push(NO_MEMO);
        (self.doc.nodes.len() - 1) as NodeId
    }

    /// A new empty dict, reusing the storage of a folded one when there is one.
    #[inline]
    fn new_dict(&mut self) -> NodeId {
        if let Some(id) = self.free_nodes.pop() {
            let slot = &mut self.doc.nodes[id as usize];
            match slot {
                Node::Dict(pairs) => pairs.clear(),
                other => *other = Node::Dict(Vec::new()),
            }
            self.node_memo[id as usize] = NO_MEMO;
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
        for i in from..self.stack.len() {
            let item = self.stack[i];
            if let Value::Folded(handle) = item {
                if self.fold.adopt(list, handle) {
                    continue;
                }
            }
            if let Value::Node(id) = item {
                if id != list && matches!(self.doc.nodes[id as usize], Node::Dict(_)) {
                    if let Some(handle) = self.fold.fold(&self.doc, list, id) {
                        let slot = self.node_memo[id as usize];
                        if slot != NO_MEMO {
                            self.memo[slot as usize] = Some(Value::Folded(handle));
                        }
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
    fn set_items_from(&mut self, from: usize) -> Step {
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
    fn memo_get(&mut self, index: usize) -> Step {
        match self.memo.get(index) {
            Some(Some(v)) => {
                self.stack.push(*v);
                Ok(())
            }
            _ => Err(malformed(format!("memo index {index} was never stored"))),
        }
    }

    #[inline]
    fn memo_put(&mut self, index: usize) -> Step {
        let top = self.top()?;
        self.memo_store(index, top)
    }

    /// Stores `value` in memo slot `index`.
    #[inline]
    fn memo_store(&mut self, index: usize, top: Value) -> Step {
        if index == self.memo.len() {
            self.memo.push(None);
        } else if index > self.memo.len() {
            if index > self.memo.len() + (1 << 24) {
                return Err(malformed(format!(
                    "memo index {index} is implausibly large"
                )));
            }
            self.memo.resize(index + 1, None);
        }
        if self.memo[index].replace(top).is_none() {
            self.memo_count += 1;
        }
        if let Value::Node(id) = top {
            self.node_memo[id as usize] = index as u32;
        }
        Ok(())
    }
}

/// Most pairs a flat dict may have on the fast path (trace entries have about ten keys).
const FLAT_PAIRS: usize = 16;

impl<R: Read, F: Fold> Machine<'_, R, F> {
    /// Tries to decode the dict starting at `buf[start]` (EMPTY_DICT) as a flat dict and offer
    /// it to the fold: `[memo put] MARK (key value [memo put])* SETITEMS`, where keys and values
    /// are small scalars, short strings or memo references. Returns the position after it when
    /// the fold took it; `None` (having changed nothing that matters) to decode it generally.
    fn flat_dict(&mut self, buf: &[u8], start: usize, end: usize) -> Option<usize> {
        let buf = buf.get(..end)?;
        let mut p = start + 1;
        // Memo stores are applied only if the fold takes the dict, so a fallback redoes them.
        let mut pairs = std::mem::take(&mut self.flat_pairs);
        let mut stores = std::mem::take(&mut self.flat_stores);
        pairs.clear();
        stores.clear();
        let taken = self.scan_flat_dict(buf, &mut p, &mut pairs, &mut stores);
        let handle = taken.and_then(|dict_slot| {
            let handle = self.fold.fold_flat(&self.doc, &pairs)?;
            for &(slot, value) in &stores {
                self.memo_store(slot, value).ok()?;
            }
            if let Some(slot) = dict_slot {
                self.memo_store(slot, Value::Folded(handle)).ok()?;
            }
            Some(handle)
        });
        self.flat_pairs = pairs;
        self.flat_stores = stores;
        self.stack.push(Value::Folded(handle?));
        Some(p)
    }

    /// Reads a flat dict's pairs and memo stores without changing the machine; returns the
    /// dict's own memo slot (if it has one), or `None` if the dict is not flat.
    fn scan_flat_dict(
        &mut self,
        buf: &[u8],
        p: &mut usize,
        pairs: &mut Vec<(Value, Value)>,
        stores: &mut Vec<(usize, Value)>,
    ) -> Option<Option<usize>> {
        let mut next_memoize = self.memo_count;
        let dict_slot = self.flat_memo_op(buf, p, &mut next_memoize)?;
        if *buf.get(*p)? != b'(' {
            return None;
        }
        *p += 1;
        loop {
            if *buf.get(*p)? == b'u' {
                *p += 1;
                return Some(dict_slot);
            }
            if pairs.len() == FLAT_PAIRS {
                return None;
            }
            let mut pair = [Value::None; 2];
            for item in &mut pair {
                let (value, len) = self.flat_value(buf, *p)?;
                *p += len;
                if let Some(slot) = self.flat_memo_op(buf, p, &mut next_memoize)? {
                    stores.push((slot, value));
                }
                *item = value;
            }
            pairs.push((pair[0], pair[1]));
        }
    }

    /// An optional memo store at `buf[*p]` (MEMOIZE, BINPUT, LONG_BINPUT): `Some(None)` when
    /// there is none, `Some(Some(slot))` with `*p` moved past it, `None` to give up.
    #[inline]
    fn flat_memo_op(
        &self,
        buf: &[u8],
        p: &mut usize,
        next_memoize: &mut usize,
    ) -> Option<Option<usize>> {
        let slot = match *buf.get(*p)? {
            0x94 => {
                let slot = *next_memoize;
                *next_memoize += 1;
                *p += 1;
                slot
            }
            b'q' => {
                let slot = *buf.get(*p + 1)? as usize;
                *p += 2;
                slot
            }
            b'r' => {
                let b = buf.get(*p + 1..*p + 5)?;
                *p += 5;
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
            }
            _ => return Some(None),
        };
        // A slot already in use would make MEMOIZE numbering differ from the general path.
        if self.memo.get(slot).is_some_and(Option::is_some) {
            return None;
        }
        Some(Some(slot))
    }

    /// One key or value of a flat dict at `buf[p]` and its length in bytes.
    #[inline]
    fn flat_value(&mut self, buf: &[u8], p: usize) -> Option<(Value, usize)> {
        // One bounds check for the longest fixed-size operand; short strings are checked apart.
        let w: &[u8; 10] = buf.get(p..p + 10)?.try_into().ok()?;
        let value = match w[0] {
            b'h' => (self.memo.get(w[1] as usize).copied().flatten()?, 2),
            b'j' => {
                let index = u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as usize;
                (self.memo.get(index).copied().flatten()?, 5)
            }
            b'K' => (Value::Int(w[1] as i64), 2),
            b'M' => (Value::Int(u16::from_le_bytes([w[1], w[2]]) as i64), 3),
            b'J' => (
                Value::Int(i32::from_le_bytes([w[1], w[2], w[3], w[4]]) as i64),
                5,
            ),
            0x8a => {
                let n = w[1] as usize;
                if n == 0 || n > 8 {
                    return None;
                }
                let fill = if w[1 + n] & 0x80 != 0 { 0xff } else { 0 };
                let mut le = [fill; 8];
                le[..n].copy_from_slice(&w[2..2 + n]);
                (Value::Int(i64::from_le_bytes(le)), 2 + n)
            }
            b'G' => {
                let b = [w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]];
                (Value::Float(f64::from_be_bytes(b)), 9)
            }
            b'N' => (Value::None, 1),
            0x88 => (Value::Bool(true), 1),
            0x89 => (Value::Bool(false), 1),
            0x8c => {
                let n = w[1] as usize;
                let text = std::str::from_utf8(buf.get(p + 2..p + 2 + n)?).ok()?;
                (Value::Str(self.intern(text)), 2 + n)
            }
            _ => return None,
        };
        Some(value)
    }
}

/// Whether decoding goes on after an opcode.
enum Flow {
    Continue,
    Stop,
}

fn parse_text_int(line: &[u8]) -> Result<i64, DecodeErrorKind> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| malformed("bad or too large integer text"))
}

/// Decodes Python's raw-unicode-escape: Latin-1 bytes plus `\uXXXX` and `\UXXXXXXXX`.
fn raw_unicode_escape(line: &[u8]) -> Result<String, DecodeErrorKind> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        let width = match (b, line.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        if width == 0 {
            out.push(b as char);
            i += 1;
            continue;
        }
        let hex = line
            .get(i + 2..i + 2 + width)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .and_then(char::from_u32)
            .ok_or_else(|| malformed("bad escape in UNICODE"))?;
        out.push(hex);
        i += 2 + width;
    }
    Ok(out)
}
