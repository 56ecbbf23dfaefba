//! A pickle protocol-4 encoder for plain data (no classes, no globals): the opcodes CPython's
//! `pickle.dump` writes for dicts, lists, pair tuples, strings, integers, floats, bools and
//! `None`, with `FRAME` chunks, a memo for every container and string, and batches of 1000.

use rustc_hash::FxHashMap;
use std::io::{self, Write};

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINFLOAT: u8 = b'G';
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const APPEND: u8 = b'a';
const APPENDS: u8 = b'e';
const SETITEM: u8 = b's';
const SETITEMS: u8 = b'u';
const TUPLE2: u8 = 0x86;
const MEMOIZE: u8 = 0x94;
const BINGET: u8 = b'h';
const LONG_BINGET: u8 = b'j';

/// Items per `APPENDS` / `SETITEMS`, as CPython batches them.
const BATCH: usize = 1000;
/// A frame is closed once it holds this much (CPython's `_FRAME_SIZE_TARGET`).
const FRAME_TARGET: usize = 64 * 1024;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    List,
    Dict,
}

/// A container being written: how many elements it was announced with and has so far.
struct Open {
    kind: Kind,
    len: usize,
    done: usize,
}

/// Writes one pickle. Containers announce their length, so batches can be closed as CPython
/// closes them (`APPEND` / `SETITEM` for a batch of one).
pub struct PickleWriter<W: Write> {
    out: W,
    frame: Vec<u8>,
    memo_len: u32,
    strings: FxHashMap<String, u32>,
    open: Vec<Open>,
}

impl<W: Write> PickleWriter<W> {
    /// Starts a protocol-4 pickle on `out`.
    pub fn new(mut out: W) -> io::Result<PickleWriter<W>> {
        out.write_all(&[PROTO, 4])?;
        Ok(PickleWriter {
            out,
            frame: Vec::with_capacity(FRAME_TARGET + 1024),
            memo_len: 0,
            strings: FxHashMap::default(),
            open: Vec::new(),
        })
    }

    /// Writes `STOP`, the last frame, and flushes. Fails if a container is still open.
    pub fn finish(mut self) -> io::Result<W> {
        if !self.open.is_empty() {
            return Err(invalid("the pickle ends inside a container"));
        }
        self.frame.push(STOP);
        self.commit_frame()?;
        self.out.flush()?;
        Ok(self.out)
    }

    pub fn none(&mut self) -> io::Result<()> {
        self.op(&[NONE])
    }

    pub fn bool(&mut self, value: bool) -> io::Result<()> {
        self.op(&[if value { NEWTRUE } else { NEWFALSE }])
    }

    /// The smallest of `BININT1`, `BININT2`, `BININT` and `LONG1` that holds `value`.
    pub fn int(&mut self, value: i128) -> io::Result<()> {
        self.boundary()?;
        if let Ok(small) = u8::try_from(value) {
            self.frame.extend_from_slice(&[BININT1, small]);
        } else if let Ok(short) = u16::try_from(value) {
            self.frame.push(BININT2);
            self.frame.extend_from_slice(&short.to_le_bytes());
        } else if let Ok(word) = i32::try_from(value) {
            self.frame.push(BININT);
            self.frame.extend_from_slice(&word.to_le_bytes());
        } else {
            let bytes = value.to_le_bytes();
            // Drop high bytes that only repeat the sign of the byte below them.
            let mut n = bytes.len();
            while n > 1 {
                let top = bytes[n - 1];
                let sign_below = bytes[n - 2] & 0x80 != 0;
                if (top == 0 && !sign_below) || (top == 0xff && sign_below) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.frame.extend_from_slice(&[LONG1, n as u8]);
            self.frame.extend_from_slice(&bytes[..n]);
        }
        Ok(())
    }

    pub fn float(&mut self, value: f64) -> io::Result<()> {
        self.boundary()?;
        self.frame.push(BINFLOAT);
        self.frame.extend_from_slice(&value.to_be_bytes());
        Ok(())
    }

    /// A string; the same text written again is a memo reference to the first.
    pub fn str(&mut self, text: &str) -> io::Result<()> {
        if let Some(&index) = self.strings.get(text) {
            return self.get(index);
        }
        self.boundary()?;
        let bytes = text.as_bytes();
        if let Ok(n) = u8::try_from(bytes.len()) {
            self.frame.extend_from_slice(&[SHORT_BINUNICODE, n]);
        } else {
            let n = u32::try_from(bytes.len()).map_err(|_| invalid("a string over 4 GiB"))?;
            self.frame.push(BINUNICODE);
            self.frame.extend_from_slice(&n.to_le_bytes());
        }
        self.frame.extend_from_slice(bytes);
        let index = self.memoize();
        self.strings.insert(text.to_string(), index);
        Ok(())
    }

    /// A reference to a memoized object (a container shared by several parents).
    pub fn get(&mut self, index: u32) -> io::Result<()> {
        self.boundary()?;
        if let Ok(small) = u8::try_from(index) {
            self.frame.extend_from_slice(&[BINGET, small]);
        } else {
            self.frame.push(LONG_BINGET);
            self.frame.extend_from_slice(&index.to_le_bytes());
        }
        Ok(())
    }

    /// A pair tuple of two integers (`segment_pool_id`).
    pub fn int_pair(&mut self, a: i128, b: i128) -> io::Result<()> {
        self.int(a)?;
        self.int(b)?;
        self.op(&[TUPLE2])?;
        self.memoize();
        Ok(())
    }

    /// Opens a list of `len` items; call `item` before each one and `end` after the last.
    /// Returns the list's memo index.
    pub fn begin_list(&mut self, len: usize) -> io::Result<u32> {
        self.begin(Kind::List, len)
    }

    /// Starts the next item of the innermost list.
    pub fn item(&mut self) -> io::Result<()> {
        self.element(Kind::List)
    }

    /// Opens a dict of `len` pairs; start each pair with `key`, call `end` after the last.
    /// Returns the dict's memo index.
    pub fn begin_dict(&mut self, len: usize) -> io::Result<u32> {
        self.begin(Kind::Dict, len)
    }

    /// Starts the next pair of the innermost dict with its key.
    pub fn key(&mut self, key: &str) -> io::Result<()> {
        self.element(Kind::Dict)?;
        self.str(key)
    }

    fn begin(&mut self, kind: Kind, len: usize) -> io::Result<u32> {
        self.op(&[match kind {
            Kind::List => EMPTY_LIST,
            Kind::Dict => EMPTY_DICT,
        }])?;
        let index = self.memoize();
        self.open.push(Open { kind, len, done: 0 });
        Ok(index)
    }

    /// Called before each element: closes a full batch and opens the next.
    fn element(&mut self, kind: Kind) -> io::Result<()> {
        let Some(top) = self.open.last_mut() else {
            return Err(invalid("an element outside any container"));
        };
        if top.kind != kind || top.done == top.len {
            return Err(invalid("more elements than the container announced"));
        }
        let (done, len) = (top.done, top.len);
        top.done += 1;
        if done % BATCH == 0 {
            if done > 0 {
                self.close_batch(kind, BATCH)?;
            }
            if (len - done).min(BATCH) > 1 {
                self.op(&[MARK])?;
            }
        }
        Ok(())
    }

    /// Closes the innermost list or dict; fails if it got more or fewer elements than announced.
    pub fn end(&mut self) -> io::Result<()> {
        let Some(top) = self.open.pop() else {
            return Err(invalid("closing a container that is not open"));
        };
        if top.done != top.len {
            return Err(invalid("fewer elements than the container announced"));
        }
        if top.done > 0 {
            self.close_batch(top.kind, top.done - (top.done - 1) / BATCH * BATCH)?;
        }
        Ok(())
    }

    fn close_batch(&mut self, kind: Kind, size: usize) -> io::Result<()> {
        self.op(&[match (kind, size > 1) {
            (Kind::List, true) => APPENDS,
            (Kind::List, false) => APPEND,
            (Kind::Dict, true) => SETITEMS,
            (Kind::Dict, false) => SETITEM,
        }])
    }

    fn op(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.boundary()?;
        self.frame.extend_from_slice(bytes);
        Ok(())
    }

    fn memoize(&mut self) -> u32 {
        self.frame.push(MEMOIZE);
        self.memo_len += 1;
        self.memo_len - 1
    }

    /// Between opcodes: closes the frame once it is big enough.
    fn boundary(&mut self) -> io::Result<()> {
        if self.frame.len() >= FRAME_TARGET {
            self.commit_frame()?;
        }
        Ok(())
    }

    fn commit_frame(&mut self) -> io::Result<()> {
        if self.frame.is_empty() {
            return Ok(());
        }
        self.out.write_all(&[FRAME])?;
        self.out
            .write_all(&(self.frame.len() as u64).to_le_bytes())?;
        self.out.write_all(&self.frame)?;
        self.frame.clear();
        Ok(())
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(bytes: &[u8]) -> &[u8] {
        // PROTO 4, FRAME + 8-byte length, ..., STOP
        assert_eq!(&bytes[..3], &[PROTO, 4, FRAME]);
        &bytes[11..]
    }

    #[test]
    fn integers_use_the_smallest_opcode() {
        let mut w = PickleWriter::new(Vec::new()).expect("writer");
        let values = [
            0i128,
            255,
            256,
            65535,
            65536,
            -1,
            1 << 40,
            -(1 << 40),
            1 << 63,
        ];
        w.begin_list(values.len()).expect("list");
        for v in values {
            w.item().expect("item");
            w.int(v).expect("int");
        }
        w.end().expect("end");
        let out = w.finish().expect("finish");
        let want: Vec<u8> = [
            &[EMPTY_LIST, MEMOIZE, MARK][..],
            &[BININT1, 0, BININT1, 255, BININT2, 0, 1, BININT2, 255, 255],
            &[BININT, 0, 0, 1, 0, BININT, 255, 255, 255, 255],
            &[LONG1, 6, 0, 0, 0, 0, 0, 1],
            &[LONG1, 6, 0, 0, 0, 0, 0, 0xff],
            &[LONG1, 9, 0, 0, 0, 0, 0, 0, 0, 0x80, 0],
            &[APPENDS, STOP],
        ]
        .concat();
        assert_eq!(body(&out), &want[..]);
    }

    #[test]
    fn strings_are_memoized_and_batches_close_like_cpython() {
        let mut w = PickleWriter::new(Vec::new()).expect("writer");
        w.begin_dict(1).expect("dict");
        w.key("k").expect("key");
        w.begin_list(1001).expect("list");
        for _ in 0..1001 {
            w.item().expect("item");
            w.str("k").expect("str");
        }
        w.end().expect("end list");
        w.end().expect("end dict");
        let out = w.finish().expect("finish");
        let b = body(&out);
        assert_eq!(
            &b[..6],
            &[EMPTY_DICT, MEMOIZE, SHORT_BINUNICODE, 1, b'k', MEMOIZE]
        );
        // list: EMPTY_LIST MEMOIZE MARK, 1000 x BINGET 1, APPENDS, BINGET 1, APPEND
        assert_eq!(&b[6..9], &[EMPTY_LIST, MEMOIZE, MARK]);
        assert_eq!(&b[9..11], &[BINGET, 1]);
        assert_eq!(&b[2009..], &[APPENDS, BINGET, 1, APPEND, SETITEM, STOP]);
    }

    #[test]
    fn large_output_is_framed() {
        let mut w = PickleWriter::new(Vec::new()).expect("writer");
        w.begin_list(50_000).expect("list");
        for i in 0..50_000i128 {
            w.item().expect("item");
            w.int(i << 20).expect("int");
        }
        w.end().expect("end");
        let out = w.finish().expect("finish");
        let first = u64::from_le_bytes(out[3..11].try_into().expect("8 bytes")) as usize;
        assert!(first >= FRAME_TARGET);
        assert_eq!(out[11 + first], FRAME);
    }

    #[test]
    fn an_independent_decoder_reads_every_kind_of_value() {
        use serde_pickle::{DeOptions, HashableValue as H, Value as V};
        let mut w = PickleWriter::new(Vec::new()).expect("writer");
        w.begin_dict(2).expect("dict");
        w.key("values").expect("key");
        w.begin_list(9).expect("list");
        for step in 0..9 {
            w.item().expect("item");
            match step {
                0 => w.int(-5),
                1 => w.int(1 << 40),
                2 => w.float(3.5),
                3 => w.bool(true),
                4 => w.bool(false),
                5 => w.none(),
                6 | 7 => w.str("shared é"),
                _ => w.int_pair(1, 2),
            }
            .expect("value");
        }
        w.end().expect("end list");
        w.key("long").expect("key");
        w.str(&"z".repeat(300)).expect("long string");
        w.end().expect("end dict");
        let bytes = w.finish().expect("finish");
        let value = serde_pickle::value_from_slice(&bytes, DeOptions::new())
            .expect("serde-pickle reads it");
        let V::Dict(top) = value else {
            panic!("a dict: {value:?}")
        };
        let values = &top[&H::String("values".into())];
        let want = V::List(vec![
            V::I64(-5),
            V::I64(1 << 40),
            V::F64(3.5),
            V::Bool(true),
            V::Bool(false),
            V::None,
            V::String("shared é".into()),
            V::String("shared é".into()),
            V::Tuple(vec![V::I64(1), V::I64(2)]),
        ]);
        assert_eq!(values, &want);
        assert_eq!(top[&H::String("long".into())], V::String("z".repeat(300)));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        #[test]
        fn serde_pickle_reads_back_any_ints_and_strings(
            items in proptest::collection::vec((proptest::num::i64::ANY, "[a-c]{0,3}"), 0..1200)
        ) {
            use serde_pickle::{DeOptions, Value as V};
            let mut w = PickleWriter::new(Vec::new()).expect("writer");
            w.begin_list(items.len()).expect("list");
            for (n, text) in &items {
                w.item().expect("item");
                w.begin_list(2).expect("pair");
                for step in 0..2 {
                    w.item().expect("item");
                    if step == 0 { w.int((*n).into()) } else { w.str(text) }.expect("value");
                }
                w.end().expect("end pair");
            }
            w.end().expect("end");
            let bytes = w.finish().expect("finish");
            let got = serde_pickle::value_from_slice(&bytes, DeOptions::new()).expect("decodes");
            let want = V::List(
                items
                    .iter()
                    .map(|(n, t)| V::List(vec![V::I64(*n), V::String(t.clone())]))
                    .collect(),
            );
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_miscounted_container_is_an_error() {
        let mut w = PickleWriter::new(Vec::new()).expect("writer");
        w.begin_dict(2).expect("dict");
        w.key("only").expect("key");
        w.none().expect("value");
        assert!(w.end().is_err());
    }
}
