//! The decoded pickle: scalars inline, containers in an arena, shared objects shared.
//!
//! Objects the pickle memo refers to many times (stack frames, frame lists, key strings) are
//! stored once and referenced by id, never copied per reference.

/// Index of a container in `Document::nodes`.
pub type NodeId = u32;
/// Index of an interned string in `Document::strings`.
pub type StrId = u32;

/// A decoded value. Sixteen bytes; containers and strings live in the `Document`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside i64, as little-endian two's complement bytes in `Document::big_ints`.
    BigInt(u32),
    Float(f64),
    Str(StrId),
    /// A `bytes`/`bytearray` value, index into `Document::byte_strings`.
    Bytes(u32),
    Node(NodeId),
    /// A dict taken over by a `Fold` while decoding; the number is the fold's own handle.
    Folded(u32),
}

/// Longest rendering of a value, see `Document::render`.
const RENDER_LIMIT: usize = 4096;
/// What `Document::render` returns is never longer than this (the limit, the "..." and the
/// closing brackets of the nesting it stops in).
pub const RENDER_MAX: usize = RENDER_LIMIT + 64;

/// A container.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    Set(Vec<Value>),
}

/// Everything decoded from one pickle.
#[derive(Debug, Default)]
pub struct Document {
    pub(super) nodes: Vec<Node>,
    pub(super) strings: Vec<Box<str>>,
    pub(super) byte_strings: Vec<Box<[u8]>>,
    pub(super) big_ints: Vec<Box<[u8]>>,
    /// How many bytes of the pickle had been read when this document was last handed out
    /// (to a `Fold` while decoding, or whole at the end): what the pickle has paid for so far.
    pub(super) bytes_read: u64,
}

impl Document {
    /// Bytes of the pickle read so far (all of it once `decode` has returned).
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    pub fn str(&self, id: StrId) -> &str {
        &self.strings[id as usize]
    }

    /// The string a value holds, if it is one.
    pub fn as_str(&self, value: Value) -> Option<&str> {
        match value {
            Value::Str(id) => Some(self.str(id)),
            _ => None,
        }
    }

    /// The items of a list, tuple or set.
    pub fn as_seq(&self, value: Value) -> Option<&[Value]> {
        match value {
            Value::Node(id) => match self.node(id) {
                Node::List(v) | Node::Tuple(v) | Node::Set(v) => Some(v),
                Node::Dict(_) => None,
            },
            _ => None,
        }
    }

    /// The items of a dict.
    pub fn as_dict(&self, value: Value) -> Option<&[(Value, Value)]> {
        match value {
            Value::Node(id) => match self.node(id) {
                Node::Dict(v) => Some(v),
                _ => None,
            },
            _ => None,
        }
    }

    /// The value of a string key in a dict (the last one, as Python keeps).
    pub fn get(&self, dict: &[(Value, Value)], key: &str) -> Option<Value> {
        dict.iter()
            .rev()
            .find(|(k, _)| self.as_str(*k) == Some(key))
            .map(|(_, v)| *v)
    }

    /// An integer value as u64 (non-negative ints, and big ints that fit).
    pub fn as_u64(&self, value: Value) -> Option<u64> {
        match value {
            Value::Int(i) => u64::try_from(i).ok(),
            Value::Bool(b) => Some(b as u64),
            Value::BigInt(i) => {
                let bytes = &self.big_ints[i as usize];
                let negative = bytes.last().is_some_and(|b| b & 0x80 != 0);
                let significant = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
                if negative || significant > 8 {
                    return None;
                }
                let mut le = [0u8; 8];
                le[..significant].copy_from_slice(&bytes[..significant]);
                Some(u64::from_le_bytes(le))
            }
            _ => None,
        }
    }

    /// An integer value as i64.
    pub fn as_i64(&self, value: Value) -> Option<i64> {
        match value {
            Value::Int(i) => Some(i),
            Value::Bool(b) => Some(b as i64),
            _ => None,
        }
    }

    /// A Python-like rendering of a value, for messages and for free-form metadata.
    /// At most `RENDER_LIMIT` characters (plus "..."): a container that holds itself through
    /// the memo would otherwise render exponentially.
    pub fn render(&self, value: Value) -> String {
        let mut out = String::new();
        self.render_into(value, &mut out, 0);
        out
    }

    fn render_into(&self, value: Value, out: &mut String, depth: usize) {
        use std::fmt::Write;
        if out.len() >= RENDER_LIMIT {
            if !out.ends_with("...") {
                out.push_str("...");
            }
            return;
        }
        if depth > 16 {
            out.push_str("...");
            return;
        }
        let seq = |out: &mut String, items: &[Value], open: &str, close: &str| {
            out.push_str(open);
            for (i, v) in items.iter().enumerate() {
                if out.len() >= RENDER_LIMIT {
                    out.push_str("...");
                    break;
                }
                if i > 0 {
                    out.push_str(", ");
                }
                self.render_into(*v, out, depth + 1);
            }
            out.push_str(close);
        };
        match value {
            Value::None => out.push_str("None"),
            Value::Bool(b) => out.push_str(if b { "True" } else { "False" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::BigInt(_) => match self.as_u64(value) {
                Some(u) => {
                    let _ = write!(out, "{u}");
                }
                None => out.push_str("<big int>"),
            },
            Value::Float(f) => {
                let _ = write!(out, "{f:?}");
            }
            Value::Str(id) => {
                // Only as much of a long string as fits: its escaped form may be longer.
                let text = self.str(id);
                let room = RENDER_LIMIT - out.len();
                let cut = (0..=room.min(text.len()))
                    .rev()
                    .find(|&i| text.is_char_boundary(i))
                    .unwrap_or(0);
                let _ = write!(out, "{:?}", &text[..cut]);
                if out.len() > RENDER_LIMIT {
                    let keep = (0..=RENDER_LIMIT)
                        .rev()
                        .find(|&i| out.is_char_boundary(i))
                        .unwrap_or(0);
                    out.truncate(keep);
                    out.push_str("...");
                }
            }
            Value::Bytes(i) => {
                let _ = write!(out, "<{} bytes>", self.byte_strings[i as usize].len());
            }
            Value::Folded(_) => out.push_str("<trace entry>"),
            Value::Node(id) => match self.node(id) {
                Node::List(v) => seq(out, v, "[", "]"),
                Node::Tuple(v) => seq(out, v, "(", ")"),
                Node::Set(v) => seq(out, v, "{", "}"),
                Node::Dict(pairs) => {
                    out.push('{');
                    for (i, (k, v)) in pairs.iter().enumerate() {
                        if out.len() >= RENDER_LIMIT {
                            out.push_str("...");
                            break;
                        }
                        if i > 0 {
                            out.push_str(", ");
                        }
                        self.render_into(*k, out, depth + 1);
                        out.push_str(": ");
                        self.render_into(*v, out, depth + 1);
                    }
                    out.push('}');
                }
            },
        }
    }
}
