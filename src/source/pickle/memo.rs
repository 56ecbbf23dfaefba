//! The pickle memo: a tag byte and a 32-bit payload per slot.
//!
//! Five bytes a slot instead of the sixteen of an `Option<Value>`, for the millions of memoized
//! trace dicts of a big snapshot, and a slot is written with two plain stores: an enum built in
//! memory and copied whole makes the CPU stall (store forwarding fails) on every memoized dict.
//! The values whose payload is wider than 32 bits (ints and floats, which Python's pickler never
//! memoizes but a pickle may) keep it in a side table by slot.

use super::value::Value;
use crate::source::prefault::Prefaulter;
use rustc_hash::FxHashMap;

/// What a slot holds: `EMPTY`, or the kind of its value.
const EMPTY: u8 = 0;
const NONE: u8 = 1;
const BOOL: u8 = 2;
const INT: u8 = 3;
const BIG_INT: u8 = 4;
const FLOAT: u8 = 5;
const STR: u8 = 6;
const BYTES: u8 = 7;
const NODE: u8 = 8;
const FOLDED: u8 = 9;

/// Memo slots by index; empty slots are holes a pickle may fill later.
#[derive(Default)]
pub(super) struct Memo {
    tags: Vec<u8>,
    /// The value's id (nothing for `INT` and `FLOAT`, whose payload is in `wide`).
    payloads: Vec<u32>,
    wide: FxHashMap<usize, u64>,
    /// Maps the payloads' room ahead on the second core (the tags are an eighth of them).
    prefaulter: Prefaulter,
}

impl Memo {
    /// One past the highest slot ever stored.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.tags.len()
    }

    /// The value in slot `index`, if it was stored.
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<Value> {
        let tag = *self.tags.get(index)?;
        let payload = *self.payloads.get(index)?;
        Some(match tag {
            NONE => Value::None,
            BOOL => Value::Bool(payload != 0),
            INT => Value::Int(*self.wide.get(&index)? as i64),
            BIG_INT => Value::BigInt(payload),
            FLOAT => Value::Float(f64::from_bits(*self.wide.get(&index)?)),
            STR => Value::Str(payload),
            BYTES => Value::Bytes(payload),
            NODE => Value::Node(payload),
            FOLDED => Value::Folded(payload),
            _ => return None,
        })
    }

    /// Whether slot `index` holds a value.
    #[inline]
    pub(super) fn is_set(&self, index: usize) -> bool {
        self.tags.get(index).is_some_and(|&tag| tag != EMPTY)
    }

    /// Stores `value` in a new slot at the end.
    #[inline(always)]
    pub(super) fn push(&mut self, value: Value) {
        let (tag, payload) = self.encode(self.tags.len(), value);
        self.tags.push(tag);
        self.payloads.push(payload);
        self.prefaulter.follow(&self.payloads);
    }

    /// Stores `value` in slot `index`, making room for it; true when the slot was empty.
    pub(super) fn set(&mut self, index: usize, value: Value) -> bool {
        if index >= self.len() {
            self.tags.resize(index + 1, EMPTY);
            self.payloads.resize(index + 1, 0);
        }
        let (tag, payload) = self.encode(index, value);
        let was_empty = self.tags[index] == EMPTY;
        self.tags[index] = tag;
        self.payloads[index] = payload;
        was_empty
    }

    /// Slot `index`'s tag and payload for `value`, keeping a wide payload in `wide`.
    #[inline(always)]
    fn encode(&mut self, index: usize, value: Value) -> (u8, u32) {
        match value {
            Value::None => (NONE, 0),
            Value::Bool(b) => (BOOL, b.into()),
            Value::Int(i) => self.keep_wide(index, INT, i as u64),
            Value::BigInt(id) => (BIG_INT, id),
            Value::Float(f) => self.keep_wide(index, FLOAT, f.to_bits()),
            Value::Str(id) => (STR, id),
            Value::Bytes(id) => (BYTES, id),
            Value::Node(id) => (NODE, id),
            Value::Folded(handle) => (FOLDED, handle),
        }
    }

    /// Keeps slot `index`'s payload, wider than a slot's, aside.
    #[cold]
    fn keep_wide(&mut self, index: usize, tag: u8, payload: u64) -> (u8, u32) {
        self.wide.insert(index, payload);
        (tag, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_comes_back_as_it_was_stored() {
        let values = [
            Value::None,
            Value::Bool(true),
            Value::Bool(false),
            Value::Int(-1),
            Value::Int(i64::MIN),
            Value::BigInt(7),
            Value::Float(-2.5),
            Value::Str(u32::MAX),
            Value::Bytes(3),
            Value::Node(0),
            Value::Folded(9),
        ];
        let mut memo = Memo::default();
        for value in values {
            memo.push(value);
        }
        // A hole, then a slot filled later.
        assert!(memo.set(values.len() + 2, Value::Int(5)));
        assert!(!memo.set(0, Value::Str(1)));
        assert_eq!(memo.get(0), Some(Value::Str(1)));
        for (i, value) in values.iter().enumerate().skip(1) {
            assert_eq!(memo.get(i), Some(*value));
            assert!(memo.is_set(i));
        }
        assert_eq!(memo.get(values.len()), None);
        assert!(!memo.is_set(values.len() + 1));
        assert_eq!(memo.get(values.len() + 2), Some(Value::Int(5)));
        assert_eq!(memo.get(values.len() + 3), None);
        assert_eq!(memo.len(), values.len() + 3);
    }
}
