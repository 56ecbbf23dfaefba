//! The fast path of the decoder: the opcodes that make up almost all of a snapshot, run
//! straight from the input buffer, and flat dicts handed to the fold without building a node.

use super::decode::Machine;
use super::fold::{FlatDict, Fold};
use super::input::Refill;
use super::value::Value;

impl<R: Refill, F: Fold> Machine<'_, R, F> {
    /// Executes the opcodes that make up almost all of a snapshot (memo gets, small ints,
    /// marks, memoize, setitems) straight from the input buffer, until one needs more bytes
    /// than are buffered, is another opcode, or would fail; the general `step` then takes over
    /// (and reports any error with its offset), since the fast path never half-applies one.
    pub(super) fn run_fast(&mut self) {
        // The buffer is moved out for the loop so the machine's other fields stay borrowable.
        self.window_base = self.input.base();
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
                    let eight = [
                        buf[i + 2],
                        buf[i + 3],
                        buf[i + 4],
                        buf[i + 5],
                        buf[i + 6],
                        buf[i + 7],
                        buf[i + 8],
                        buf[i + 9],
                    ];
                    self.stack.push(Value::Int(long1(eight, n)));
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
}

/// Most pairs a flat dict may have on the fast path (trace entries have about ten keys).
pub(super) const FLAT_PAIRS: usize = 16;

impl<R: Refill, F: Fold> Machine<'_, R, F> {
    /// Tries to decode the dict starting at `buf[start]` (EMPTY_DICT) as a flat dict and offer
    /// it to the fold: `[memo put] MARK (key value [memo put])* SETITEMS`, where keys and values
    /// are small scalars, short strings or memo references. Returns the position after it when
    /// the fold took it; `None` (having changed nothing that matters) to decode it generally.
    fn flat_dict(&mut self, buf: &[u8], start: usize, end: usize) -> Option<usize> {
        let buf = buf.get(..end)?;
        let mut p = start + 1;
        // Memo stores are applied only if the fold takes the dict, so a fallback redoes them.
        let mut stores = std::mem::take(&mut self.flat_stores);
        stores.clear();
        let scanned = self.scan_flat_dict(buf, &mut p, &mut stores);
        let handle = scanned.and_then(|(dict_slot, len)| {
            let dict = FlatDict {
                shape: self.flat_shape,
                keys: &self.flat_keys,
                values: &self.flat_values[..len],
            };
            self.doc.bytes_read = self.window_base.wrapping_add(start as u64);
            let handle = self.fold.fold_flat(&self.doc, dict)?;
            for &(slot, value) in &stores {
                self.memo_store(slot, value);
            }
            if let Some(slot) = dict_slot {
                self.memo_store(slot, Value::Folded(handle));
            }
            Some(handle)
        });
        self.flat_stores = stores;
        self.stack.push(Value::Folded(handle?));
        Some(p)
    }

    /// Reads a flat dict's keys (into `flat_keys`, renumbering `flat_shape` when they differ
    /// from the last flat dict's), values (into `flat_values`) and memo stores without changing
    /// the memo; returns the dict's own memo slot (if it has one) and its number of pairs, or
    /// `None` if the dict is not flat.
    fn scan_flat_dict(
        &mut self,
        buf: &[u8],
        p: &mut usize,
        stores: &mut Vec<(usize, Value)>,
    ) -> Option<(Option<usize>, usize)> {
        let mut next_memoize = self.memo_count;
        let dict_slot = self.flat_memo_op(buf, p, &mut next_memoize, &[], None)?;
        if *buf.get(*p)? != b'(' {
            return None;
        }
        *p += 1;
        let mut len = 0;
        loop {
            if *buf.get(*p)? == b'u' {
                *p += 1;
                if self.flat_keys.len() != len {
                    self.flat_keys.truncate(len);
                    self.flat_shape += 1;
                }
                return Some((dict_slot, len));
            }
            if len == FLAT_PAIRS {
                return None;
            }
            let code = self.flat_key_codes[len];
            if len < self.flat_keys.len() && code.matches(buf, *p) {
                // The same memo reference as the last dict's key here: the same key.
                *p += code.len;
                let key = self.flat_keys[len];
                if let Some(slot) =
                    self.flat_memo_op(buf, p, &mut next_memoize, stores, dict_slot)?
                {
                    stores.push((slot, key));
                }
            } else {
                let start = *p;
                let key = self.flat_item(buf, p, &mut next_memoize, stores, dict_slot)?;
                self.flat_key_codes[len] = KeyCode::of(buf, start);
                match self.flat_keys.get_mut(len) {
                    Some(known) if same_key(known, &key) => {}
                    Some(known) => {
                        *known = key;
                        self.flat_shape += 1;
                    }
                    None => {
                        self.flat_keys.push(key);
                        self.flat_shape += 1;
                    }
                }
            }
            self.flat_values[len] = self.flat_item(buf, p, &mut next_memoize, stores, dict_slot)?;
            len += 1;
        }
    }

    /// One key or value of a flat dict and the memo store that may follow it.
    #[inline(always)]
    fn flat_item(
        &mut self,
        buf: &[u8],
        p: &mut usize,
        next_memoize: &mut usize,
        stores: &mut Vec<(usize, Value)>,
        dict_slot: Option<usize>,
    ) -> Option<Value> {
        let (value, len) = self.flat_value(buf, *p)?;
        *p += len;
        if let Some(slot) = self.flat_memo_op(buf, p, next_memoize, stores, dict_slot)? {
            stores.push((slot, value));
        }
        Some(value)
    }

    /// An optional memo store at `buf[*p]` (MEMOIZE, BINPUT, LONG_BINPUT): `Some(None)` when
    /// there is none, `Some(Some(slot))` with `*p` moved past it, `None` to give up. Only a
    /// slot that is empty and not stored to earlier in this dict (`pending`, or the dict's own
    /// `dict_slot`) is taken, so each store grows the memo by one, which `next_memoize` (the
    /// next MEMOIZE's slot) counts as the general path does.
    #[inline]
    fn flat_memo_op(
        &self,
        buf: &[u8],
        p: &mut usize,
        next_memoize: &mut usize,
        pending: &[(usize, Value)],
        dict_slot: Option<usize>,
    ) -> Option<Option<usize>> {
        let (slot, len) = match *buf.get(*p)? {
            0x94 => (*next_memoize, 1),
            b'q' => (*buf.get(*p + 1)? as usize, 2),
            b'r' => {
                let b = buf.get(*p + 1..*p + 5)?;
                (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 5)
            }
            _ => return Some(None),
        };
        // A slot the general path refuses (past the bytes read: `memo_put_at`) is left to it,
        // to report.
        let at = self.window_base.wrapping_add(*p as u64);
        let fresh = !self.memo.is_set(slot)
            && pending.iter().all(|&(s, _)| s != slot)
            && dict_slot != Some(slot);
        if slot as u64 > at || !fresh {
            return None;
        }
        *p += len;
        *next_memoize += 1;
        Some(Some(slot))
    }

    /// One key or value of a flat dict at `buf[p]` and its length in bytes.
    #[inline(always)]
    fn flat_value(&mut self, buf: &[u8], p: usize) -> Option<(Value, usize)> {
        // One bounds check for the longest fixed-size operand; short strings are checked apart.
        let w: &[u8; 10] = buf.get(p..p + 10)?.try_into().ok()?;
        let value = match w[0] {
            b'h' => (self.memo.get(w[1] as usize)?, 2),
            b'j' => {
                let index = u32::from_le_bytes([w[1], w[2], w[3], w[4]]) as usize;
                (self.memo.get(index)?, 5)
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
                let eight = [w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9]];
                (Value::Int(long1(eight, n)), 2 + n)
            }
            b'G' => {
                let b = [w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]];
                (Value::Float(f64::from_be_bytes(b)), 9)
            }
            b'N' => (Value::None, 1),
            0x88 => (Value::Bool(true), 1),
            0x89 => (Value::Bool(false), 1),
            0x8c => (self.flat_short_string(buf, p)?, 2 + w[1] as usize),
            _ => return None,
        };
        Some(value)
    }

    /// The SHORT_BINUNICODE string at `buf[p]`, interned (out of line: strings are rare in
    /// trace entries, which refer to their key strings through the memo).
    #[inline(never)]
    fn flat_short_string(&mut self, buf: &[u8], p: usize) -> Option<Value> {
        let n = *buf.get(p + 1)? as usize;
        let text = std::str::from_utf8(buf.get(p + 2..p + 2 + n)?).ok()?;
        Some(Value::Str(self.intern(text)))
    }
}

/// Whether two keys are the same key: floats bit for bit (`-0.0` is not `0.0`, a NaN is itself).
fn same_key(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// The bytes of the memo reference (BINGET or LONG_BINGET) that read a flat dict's key, so that
/// the same key in the next dict is known from its bytes, without a memo lookup. Valid while the
/// memo slot keeps its value: the decoder forgets all codes when a slot is overwritten.
#[derive(Clone, Copy, Default)]
pub(super) struct KeyCode {
    word: u64,
    mask: u64,
    /// 0 for a key read some other way: it never matches.
    len: usize,
}

impl KeyCode {
    /// The code of the key read at `buf[start]`.
    fn of(buf: &[u8], start: usize) -> KeyCode {
        let len = match buf.get(start) {
            Some(b'h') => 2,
            Some(b'j') => 5,
            _ => return KeyCode::default(),
        };
        match buf.get(start..start + 8) {
            Some(eight) => {
                let mask = u64::MAX >> (64 - 8 * len);
                KeyCode {
                    word: word_at(eight) & mask,
                    mask,
                    len,
                }
            }
            None => KeyCode::default(),
        }
    }

    /// Whether the bytes at `buf[p]` are this code.
    #[inline(always)]
    fn matches(&self, buf: &[u8], p: usize) -> bool {
        self.len != 0
            && buf
                .get(p..p + 8)
                .is_some_and(|eight| word_at(eight) & self.mask == self.word)
    }
}

/// The little-endian word in the first eight bytes of `bytes` (which has at least eight).
#[inline(always)]
fn word_at(bytes: &[u8]) -> u64 {
    let mut eight = [0u8; 8];
    eight.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(eight)
}

/// A LONG1 operand of `n` bytes (1 to 8), little-endian two's complement, read from the eight
/// bytes that start with it (reading a whole word and shifting avoids a variable-length copy).
#[inline]
fn long1(eight: [u8; 8], n: usize) -> i64 {
    let shift = 64 - 8 * n as u32;
    ((u64::from_le_bytes(eight) << shift) as i64) >> shift
}

#[cfg(test)]
mod tests {
    use super::long1;

    #[test]
    fn long1_sign_extends_every_width() {
        let cases: [(i64, usize); 8] = [
            (0x7f, 1),
            (-1, 1),
            (-129, 2),
            (1_700_000_000_112_459, 7),
            (139_641_923_194_880, 6),
            (i64::MIN, 8),
            (i64::MAX, 8),
            (-(1 << 40), 6),
        ];
        for (value, n) in cases {
            let mut eight = value.to_le_bytes();
            // Bytes past the operand belong to the next opcodes and must not matter.
            for b in &mut eight[n..] {
                *b = 0xa5;
            }
            assert_eq!(long1(eight, n), value, "{value} in {n} bytes");
        }
    }
}
