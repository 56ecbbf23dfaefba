//! The pickle memo: a tag byte and a payload word per slot.
//!
//! Nine bytes a slot instead of the sixteen of an `Option<Value>`, for the millions of memoized
//! trace dicts of a big snapshot, and a slot is written with two plain stores: an enum built in
//! memory and copied whole makes the CPU stall (store forwarding fails) on every memoized dict.

use super::value::Value;
use crate::source::prefault::Prefaulter;

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
    payloads: Vec<u64>,
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
            INT => Value::Int(payload as i64),
            BIG_INT => Value::BigInt(payload as u32),
            FLOAT => Value::Float(f64::from_bits(payload)),
            STR => Value::Str(payload as u32),
            BYTES => Value::Bytes(payload as u32),
            NODE => Value::Node(payload as u32),
            FOLDED => Value::Folded(payload as u32),
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
        let (tag, payload) = encode(value);
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
        let (tag, payload) = encode(value);
        let was_empty = self.tags[index] == EMPTY;
        self.tags[index] = tag;
        self.payloads[index] = payload;
        was_empty
    }
}

#[inline(always)]
fn encode(value: Value) -> (u8, u64) {
    match value {
        Value::None => (NONE, 0),
        Value::Bool(b) => (BOOL, b as u64),
        Value::Int(i) => (INT, i as u64),
        Value::BigInt(id) => (BIG_INT, id.into()),
        Value::Float(f) => (FLOAT, f.to_bits()),
        Value::Str(id) => (STR, id.into()),
        Value::Bytes(id) => (BYTES, id.into()),
        Value::Node(id) => (NODE, id.into()),
        Value::Folded(handle) => (FOLDED, handle.into()),
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
