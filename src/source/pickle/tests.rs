//! Decoder tests on byte literals written by CPython's `pickle.dumps`.

use super::*;

fn decode_all(bytes: &[u8]) -> Result<(Document, Value), DecodeError> {
    decode(bytes, &mut KeepAll)
}

#[test]
fn decodes_every_scalar_and_container_of_protocol_4() {
    // pickle.dumps({'a':[1,'a',(2,3)],'b':None,'c':True,'d':-5,'e':1.5,'f':2**40,'g':b'xy'}, 4)
    let bytes = b"\x80\x04\x95L\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01h\x01K\x02K\x03\x86\x94e\x8c\x01b\x94N\x8c\x01c\x94\x88\x8c\x01d\x94J\xfb\xff\xff\xff\x8c\x01e\x94G?\xf8\x00\x00\x00\x00\x00\x00\x8c\x01f\x94\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x01g\x94C\x02xy\x94u.";
    let (doc, root) = decode_all(bytes).expect("decodes");
    assert_eq!(
        doc.render(root),
        "{\"a\": [1, \"a\", (2, 3)], \"b\": None, \"c\": True, \"d\": -5, \"e\": 1.5, \
         \"f\": 1099511627776, \"g\": <2 bytes>}"
    );
}

#[test]
fn memo_references_share_one_object() {
    // x = ['s']; pickle.dumps([x, x], 4)
    let bytes = b"\x80\x04\x95\x0e\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94\x8c\x01s\x94ah\x01e.";
    let (doc, root) = decode_all(bytes).expect("decodes");
    let items = doc.as_seq(root).expect("a list");
    assert_eq!(items.len(), 2);
    assert_eq!(
        items[0], items[1],
        "both items are the same node, not copies"
    );
    assert_eq!(doc.nodes.len(), 2);
}

#[test]
fn decodes_protocol_2_binput_and_protocol_0_text() {
    // pickle.dumps([{'k':1},{'k':2}], 2)
    let p2 = b"\x80\x02]q\x00(}q\x01X\x01\x00\x00\x00kq\x02K\x01s}q\x03h\x02K\x02se.";
    let (doc, root) = decode_all(p2).expect("decodes");
    assert_eq!(doc.render(root), "[{\"k\": 1}, {\"k\": 2}]");
    // pickle.dumps({'a':[1,2]}, 0)
    let p0 = b"(dp0\nVa\np1\n(lp2\nI1\naI2\nas.";
    let (doc, root) = decode_all(p0).expect("decodes");
    assert_eq!(doc.render(root), "{\"a\": [1, 2]}");
}

#[test]
fn big_integers_keep_their_value() {
    // pickle.dumps(2**64 - 1, 2): LONG1 with nine bytes.
    let (doc, root) =
        decode_all(b"\x80\x02\x8a\t\xff\xff\xff\xff\xff\xff\xff\xff\x00.").expect("decodes");
    assert_eq!(doc.as_u64(root), Some(u64::MAX));
    // pickle.dumps(-2**70, 2) does not fit u64.
    let (doc, root) =
        decode_all(b"\x80\x02\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00\xc0.").expect("decodes");
    assert_eq!(doc.as_u64(root), None);
    // 2**60 and -2**60 in nine bytes, the ninth only repeating the sign (a writer other than
    // Python's): integers like any other.
    for (bytes, value) in [
        (
            &b"\x80\x02\x8a\t\x00\x00\x00\x00\x00\x00\x00\x10\x00."[..],
            1i64 << 60,
        ),
        (
            b"\x80\x02\x8a\t\x00\x00\x00\x00\x00\x00\x00\xf0\xff.",
            -(1i64 << 60),
        ),
    ] {
        let (doc, root) = decode_all(bytes).expect("decodes");
        assert_eq!(
            (doc.as_i64(root), doc.render(root)),
            (Some(value), value.to_string())
        );
    }
}

#[test]
fn refuses_code_execution_with_offset() {
    // pickle.dumps(datetime.date(2020, 1, 1), 2) starts with GLOBAL at byte 2.
    let bytes = b"\x80\x02cdatetime\ndate\nq\x00c_codecs\nencode\nq\x01X\x05\x00\x00\x00\x07\xc3\xa4\x01\x01q\x02X\x06\x00\x00\x00latin1q\x03\x86q\x04Rq\x05\x85q\x06Rq\x07.";
    let err = decode_all(bytes).expect_err("refused");
    assert_eq!(err.offset, 2);
    assert!(matches!(err.kind, DecodeErrorKind::Refused("GLOBAL")));
    assert!(
        err.to_string().contains("refused opcode GLOBAL at byte 2"),
        "{err}"
    );
    for (bytes, op) in [
        (&b"\x80\x04\x93."[..], "STACK_GLOBAL"),
        (b"\x80\x02NNR.", "REDUCE"),
        (b"\x80\x02NNb.", "BUILD"),
        (b"\x80\x02NN\x81.", "NEWOBJ"),
    ] {
        let err = decode_all(bytes).expect_err("refused");
        assert!(
            matches!(err.kind, DecodeErrorKind::Refused(o) if o == op),
            "{err}"
        );
    }
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = b"\x80\x04\x95L\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01h\x01K\x02K\x03\x86\x94e\x8c\x01b\x94N\x8c\x01c\x94\x88\x8c\x01d\x94J\xfb\xff\xff\xff\x8c\x01e\x94G?\xf8\x00\x00\x00\x00\x00\x00\x8c\x01f\x94\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x01g\x94C\x02xy\x94u.";
    for cut in 0..bytes.len() {
        let err = decode_all(&bytes[..cut]).expect_err("truncated input fails");
        assert!(
            err.offset <= cut as u64,
            "offset {} past cut {cut}",
            err.offset
        );
        if cut == 0 {
            assert!(matches!(err.kind, DecodeErrorKind::Empty));
        }
    }
}

#[test]
fn malformed_streams_are_errors() {
    let cases: [(&[u8], &str); 7] = [
        (b"{\"segments\": []}", "looks like JSON"),
        (b"\x80\x09N.", "unsupported pickle protocol 9"),
        (b"\x80\x02h\x05.", "memo index 5 was never stored"),
        (b"\x80\x02e.", "MARK expected"),
        (b"\x80\x02.", "STOP with an empty stack"),
        (b"\x80\x02a.", "stack underflow"),
        (b"\x80\x02\xff", "unknown opcode 0xff"),
    ];
    for (bytes, want) in cases {
        let err = decode_all(bytes).expect_err("fails");
        assert!(err.to_string().contains(want), "{:?}: {err}", bytes);
    }
}

/// A fold that takes dicts with a key "take" and numbers them.
struct TakeMarked(u32);

impl Fold for TakeMarked {
    fn fold(&mut self, doc: &Document, _: NodeId, dict: NodeId) -> Option<u32> {
        let Node::Dict(pairs) = doc.node(dict) else {
            return None;
        };
        let marked = pairs.iter().any(|(k, _)| doc.as_str(*k) == Some("take"));
        marked.then(|| {
            self.0 += 1;
            self.0
        })
    }
}

#[test]
fn fold_takes_dicts_out_of_lists_and_reuses_their_nodes() {
    // pickle.dumps([{'take': 1}, {'keep': 2}, {'take': 3}], 4)
    let bytes = b"\x80\x04\x95$\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94\x8c\x04take\x94K\x01s}\x94\x8c\x04keep\x94K\x02s}\x94h\x02K\x03se.";
    let mut fold = TakeMarked(0);
    let (doc, root) = decode(&bytes[..], &mut fold).expect("decodes");
    assert_eq!(fold.0, 2);
    assert_eq!(doc.render(root), "[{\"keep\": 2}]");
}

#[test]
fn a_dict_taken_by_the_fold_and_named_again_in_one_appends_is_its_handle() {
    // d = {'take': 1, 'l': [1]}; pickle.dumps({'a': [d, d, d], 'b': [{'x': 1}, {'y': 2}]}, 4):
    // the two memo references to d reach the stack before the APPENDS that takes d, so they
    // name a node the fold took and freed. They read as its handle, and the node is freed
    // once, so the two dicts of 'b' get nodes of their own.
    let bytes = b"\x80\x04\x95A\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(}\x94(\x8c\x04take\x94K\x01\x8c\x01l\x94]\x94K\x01auh\x03h\x03e\x8c\x01b\x94]\x94(}\x94\x8c\x01x\x94K\x01s}\x94\x8c\x01y\x94K\x02seu.";
    let mut fold = TakeMarked(0);
    let (doc, root) = decode(&bytes[..], &mut fold).expect("decodes");
    assert_eq!(fold.0, 1, "d is read once");
    assert_eq!(
        doc.render(root),
        "{\"a\": [<trace entry>, <trace entry>], \"b\": [{\"x\": 1}, {\"y\": 2}]}"
    );
}

/// A fold that takes dicts with a "take" key, flat ones early, and records the order in which
/// taken dicts reach their list.
#[derive(Default)]
struct OrderedTake {
    staged: Vec<(u32, i64)>,
    appended: Vec<i64>,
    next: u32,
}

impl OrderedTake {
    fn taken<'a>(
        doc: &Document,
        mut pairs: impl Iterator<Item = (&'a Value, &'a Value)>,
    ) -> Option<i64> {
        pairs
            .find(|(k, _)| doc.as_str(**k) == Some("take"))
            .and_then(|(_, v)| doc.as_i64(*v))
    }
}

impl Fold for OrderedTake {
    fn fold(&mut self, doc: &Document, _: NodeId, dict: NodeId) -> Option<u32> {
        let Node::Dict(pairs) = doc.node(dict) else {
            return None;
        };
        let n = Self::taken(doc, pairs.iter().map(|(k, v)| (k, v)))?;
        self.appended.push(n);
        Some(u32::MAX)
    }

    fn wants_flat(&self) -> bool {
        true
    }

    fn fold_flat(&mut self, doc: &Document, dict: FlatDict) -> Option<u32> {
        assert_eq!(dict.keys.len(), dict.values.len());
        let n = Self::taken(doc, dict.keys.iter().zip(dict.values))?;
        self.next += 1;
        self.staged.push((self.next, n));
        Some(self.next)
    }

    fn adopt(&mut self, _: &Document, _: NodeId, handle: u32) -> bool {
        let Some(i) = self.staged.iter().position(|&(h, _)| h == handle) else {
            return false;
        };
        let (_, n) = self.staged.remove(i);
        self.appended.push(n);
        true
    }
}

#[test]
fn flat_and_nested_dicts_reach_the_fold_in_list_order() {
    // pickle.dumps([{'take':1,'n':0}, {'take':2,'x':[1]}, {'take':3,'n':0}, {'keep':4,'n':0}], 4)
    let bytes = b"\x80\x04\x95F\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94(\x8c\x04take\x94K\x01\x8c\x01n\x94K\x00u}\x94(h\x02K\x02\x8c\x01x\x94]\x94K\x01au}\x94(h\x02K\x03h\x03K\x00u}\x94(\x8c\x04keep\x94K\x04h\x03K\x00ue.";
    let mut fold = OrderedTake::default();
    let (doc, root) = decode(&bytes[..], &mut fold).expect("decodes");
    // 1 and 3 are flat and taken early, 2 holds a list and is taken on append: the fold still
    // sees them in list order, and the untaken flat dict stays in the list with its memo keys.
    assert_eq!(fold.appended, [1, 2, 3]);
    assert!(fold.staged.is_empty());
    assert_eq!(doc.render(root), "[{\"keep\": 4, \"n\": 0}]");
}

#[test]
fn rendering_a_self_referencing_list_is_bounded() {
    // x = []; x += [x, x]; pickle.dumps(x, 2) then nested deeper through the memo: the
    // rendering of shared references would double at every level without a bound.
    let bytes = b"\x80\x02]q\x00(h\x00h\x00e.";
    let (doc, root) = decode_all(bytes).expect("decodes");
    let text = doc.render(root);
    assert!(text.len() < 5000, "{} chars", text.len());
    assert!(text.ends_with("...]") || text.contains("..."), "{text}");
}

#[test]
fn memo_numbering_is_the_same_on_the_fast_path_after_a_binput() {
    // [{'take': 1, 'n': 0, 'm': 2}, {'m': 5, 'take': 9}], the first dict storing 'n' with
    // BINPUT 7 and 'm' with MEMOIZE, which counts the BINPUT (slot 4); the second dict reads
    // 'm' back from slot 4.
    let bytes = b"\x80\x04]\x94(}\x94(\x8c\x04take\x94K\x01\x8c\x01nq\x07K\x00\x8c\x01m\x94K\x02u}(h\x04K\x05h\x02K\x09ue.";
    let (doc, root) = decode_all(bytes).expect("decodes without a fold");
    assert_eq!(
        doc.render(root),
        "[{\"take\": 1, \"n\": 0, \"m\": 2}, {\"m\": 5, \"take\": 9}]"
    );
    let mut fold = OrderedTake::default();
    decode(&bytes[..], &mut fold).expect("decodes with flat dicts taken early");
    assert_eq!(fold.appended, [1, 9]);
}

#[test]
fn a_key_read_through_an_overwritten_memo_slot_is_the_new_key() {
    // [{'take': 1}, {'take': 5}, {'x': 9}, 32 * 'p']: the second and third dicts read their key
    // from memo slot 2, which BINPUT overwrites with 'x' between them (the string at the end
    // keeps the third dict away from the end of the input, on the fast path).
    let mut bytes = b"\x80\x04]q\x00(}q\x01(\x8c\x04takeq\x02K\x01u}q\x03(h\x02K\x05u\x8c\x01xq\x020}q\x04(h\x02K\x09u\x8c\x20".to_vec();
    bytes.extend([b'p'; 32]);
    bytes.extend(b"e.");
    let pad = "p".repeat(32);
    let (doc, root) = decode_all(&bytes).expect("decodes without a fold");
    assert_eq!(
        doc.render(root),
        format!("[{{\"take\": 1}}, {{\"take\": 5}}, {{\"x\": 9}}, \"{pad}\"]")
    );
    let mut fold = OrderedTake::default();
    let (doc, root) = decode(&bytes[..], &mut fold).expect("decodes with flat dicts taken early");
    assert_eq!(fold.appended, [1, 5]);
    assert_eq!(doc.render(root), format!("[{{\"x\": 9}}, \"{pad}\"]"));
}

/// A fold that takes every dict, flat ones early, and keeps each one's rendering in the order
/// the dicts reach their list.
/// It also checks the shape numbers: a flat dict with the shape number of the previous one
/// has the same keys, bit for bit.
#[derive(Default)]
struct RenderAll {
    staged: Vec<(u32, String)>,
    next: u32,
    taken: Vec<String>,
    /// The last shape number seen and the keys it stood for, rendered with their bits.
    shape: Option<(u64, Vec<String>)>,
}

/// A key as text that tells `0.0` from `-0.0`.
fn key_bits(doc: &Document, key: Value) -> String {
    match key {
        Value::Float(f) => format!("float {:#x}", f.to_bits()),
        other => doc.render(other),
    }
}

fn render_pairs<'a>(doc: &Document, pairs: impl Iterator<Item = (&'a Value, &'a Value)>) -> String {
    let items: Vec<String> = pairs
        .map(|(k, v)| format!("{}: {}", doc.render(*k), doc.render(*v)))
        .collect();
    format!("{{{}}}", items.join(", "))
}

impl Fold for RenderAll {
    fn fold(&mut self, doc: &Document, _: NodeId, dict: NodeId) -> Option<u32> {
        let Node::Dict(pairs) = doc.node(dict) else {
            return None;
        };
        self.taken
            .push(render_pairs(doc, pairs.iter().map(|(k, v)| (k, v))));
        Some(u32::MAX)
    }

    fn wants_flat(&self) -> bool {
        true
    }

    fn fold_flat(&mut self, doc: &Document, dict: FlatDict) -> Option<u32> {
        assert_eq!(dict.keys.len(), dict.values.len());
        let keys: Vec<String> = dict.keys.iter().map(|&k| key_bits(doc, k)).collect();
        if let Some((shape, known)) = &self.shape {
            if *shape == dict.shape {
                assert_eq!(known, &keys, "shape {shape} stands for other keys");
            }
        }
        self.shape = Some((dict.shape, keys));
        let handle = self.next;
        self.next += 1;
        let text = render_pairs(doc, dict.keys.iter().zip(dict.values));
        self.staged.push((handle, text));
        Some(handle)
    }

    fn adopt(&mut self, _: &Document, _: NodeId, handle: u32) -> bool {
        match self.staged.iter().position(|&(h, _)| h == handle) {
            Some(i) => {
                let (_, text) = self.staged.swap_remove(i);
                self.taken.push(text);
                true
            }
            None => false,
        }
    }
}

/// Writes a memo opcode for `slot`: the one-byte form (`short`, BINGET or BINPUT) when the slot
/// fits in a byte, else the four-byte one (LONG_BINGET or LONG_BINPUT).
fn memo_op(out: &mut Vec<u8>, slot: u32, short: bool, one_byte: u8, four_bytes: u8) {
    match u8::try_from(slot) {
        Ok(slot) if short => out.extend([one_byte, slot]),
        _ => {
            out.push(four_bytes);
            out.extend(slot.to_le_bytes());
        }
    }
}

/// Writes a list of flat dicts as a pickle, driven by `choices`: keys inline or through the
/// memo, scalar values, memo stores after any item (MEMOIZE, BINPUT and LONG_BINPUT, to new
/// slots and to used ones), and memo slots overwritten between dicts. Memo references only
/// name slots holding strings or scalars, never a dict.
fn flat_dicts_pickle(choices: &[u8]) -> Vec<u8> {
    let mut choices = choices.iter().copied();
    let mut next = move || choices.next();
    let mut out = b"\x80\x04]\x94(".to_vec();
    // Slots that hold a string or scalar (readable as keys or values), and all filled slots
    // (their number is the next MEMOIZE's slot).
    let mut readable: Vec<u32> = Vec::new();
    let mut filled: Vec<u32> = vec![0];
    let mut store = |out: &mut Vec<u8>, choice: u8, readable: &mut Vec<u32>, item: bool| {
        // Mostly none or MEMOIZE, as real pickles have: a store to a used slot sends the
        // dict to the general path.
        let slot = match choice % 16 {
            0..=2 => filled.len() as u32,
            3 => u32::from(choice / 16 % 8),
            4 => 300 + u32::from(choice / 16 % 4),
            _ => return,
        };
        match choice % 16 {
            0..=2 => out.push(0x94),
            _ => memo_op(out, slot, true, b'q', b'r'),
        }
        if !filled.contains(&slot) {
            filled.push(slot);
        }
        readable.retain(|&s| s != slot);
        if item {
            readable.push(slot);
        }
    };
    while let Some(dict) = next() {
        if dict % 5 == 0 {
            // A string stored outside any dict, then popped: a new slot, or one that a key
            // may have been read from.
            out.extend(b"\x8c\x01z");
            let c = next().unwrap_or(1);
            match readable.get(usize::from(c) % readable.len().clamp(1, 4)) {
                Some(&slot) if c % 2 == 0 => memo_op(&mut out, slot, true, b'q', b'r'),
                _ => store(&mut out, c, &mut readable, true),
            }
            out.push(b'0');
        }
        out.push(b'}');
        store(&mut out, next().unwrap_or(3), &mut readable, false);
        out.push(b'(');
        for _ in 0..next().unwrap_or(0) % 6 {
            for is_key in [true, false] {
                let c = next().unwrap_or(0);
                match c % 8 {
                    // Keys mostly from the first few slots, as trace entries read theirs.
                    0..=1 if !readable.is_empty() => {
                        let slot = readable[usize::from(c / 8) % readable.len()];
                        memo_op(&mut out, slot, c % 2 == 0, b'h', b'j');
                    }
                    6 if is_key => {
                        let key: f64 = if c % 16 < 8 { 0.0 } else { -0.0 };
                        out.push(b'G');
                        out.extend(key.to_be_bytes());
                    }
                    2..=5 if is_key && !readable.is_empty() => {
                        let slot = readable[usize::from(c / 8) % readable.len().min(4)];
                        memo_op(&mut out, slot, c % 2 == 0, b'h', b'j');
                    }
                    2 if !is_key => out.push(b'N'),
                    3 if !is_key => out.extend([b'J', c, 0xff, 0x12, 0x80]),
                    4 if !is_key => out.extend([0x8a, 8, c, 1, 2, 3, 4, 5, 6, 0x87]),
                    5 if !is_key => out.push(0x88),
                    _ => out.extend([0x8c, 2, b'k', b'a' + c % 6]),
                }
                store(&mut out, next().unwrap_or(3), &mut readable, true);
            }
        }
        out.push(b'u');
    }
    // Enough bytes after the last dict for the fast path to see it.
    out.extend(b"\x8c\x20");
    out.extend([b'p'; 32]);
    out.extend(b"e.");
    out
}

/// Hands out its bytes a few at a time (sizes from `sizes`, cycled), so that dicts and opcodes
/// are cut at buffer ends.
struct Chunked<'a> {
    bytes: &'a [u8],
    sizes: &'a [u8],
    next: usize,
}

impl std::io::Read for Chunked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = usize::from(self.sizes[self.next % self.sizes.len()]).max(1);
        self.next += 1;
        let n = size.min(buf.len()).min(self.bytes.len());
        buf[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// The fast path that hands flat dicts to the fold reads exactly what the general path
    /// reads, memo numbering included.
    #[test]
    fn flat_dicts_read_on_the_fast_path_equal_the_general_path(
        choices in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400)
    ) {
        let bytes = flat_dicts_pickle(&choices);
        let general = decode_all(&bytes);
        let mut fold = RenderAll::default();
        // Whole, or a few bytes at a time (`choices` again as the sizes).
        let fast = if choices.len() % 2 == 0 {
            decode(&bytes[..], &mut fold)
        } else {
            let sizes = [&choices[..], &[7]].concat();
            decode(Chunked { bytes: &bytes, sizes: &sizes, next: 0 }, &mut fold)
        };
        match (general, fast) {
            (Ok((doc, root)), Ok((fast_doc, fast_root))) => {
                let items = doc.as_seq(root).expect("a list");
                let dicts: Vec<String> = items[..items.len() - 1]
                    .iter()
                    .map(|&v| doc.render(v))
                    .collect();
                proptest::prop_assert_eq!(&fold.taken, &dicts);
                proptest::prop_assert_eq!(fast_doc.as_seq(fast_root).map(<[Value]>::len), Some(1));
            }
            (Err(general), Err(fast)) => {
                proptest::prop_assert_eq!(general.to_string(), fast.to_string());
            }
            (general, fast) => proptest::prop_assert!(
                false,
                "general {:?} but fast {:?}",
                general.map(|_| ()),
                fast.map(|_| ())
            ),
        }
    }
}

#[test]
fn a_memo_index_past_the_bytes_read_is_refused_not_allocated() {
    // None, then LONG_BINPUT 2^24 at byte 3: Python numbers slots from 0, one per store, so no
    // real pickle has an index above its offset; honouring it would allocate 2^24 slots.
    let mut bytes = b"\x80\x04Nr".to_vec();
    bytes.extend((1u32 << 24).to_le_bytes());
    bytes.push(b'.');
    let err = decode_all(&bytes).expect_err("refused");
    assert_eq!(err.offset, 3);
    assert!(
        err.to_string()
            .contains("memo index 16777216 is implausibly large"),
        "{err}"
    );
    // The same inside a flat dict read on the fast path.
    let mut bytes = b"\x80\x04](}(K\x01K\x02r".to_vec();
    bytes.extend((1u32 << 24).to_le_bytes());
    bytes.extend(b"u\x8c\x20");
    bytes.extend([b'p'; 32]);
    bytes.extend(b"e.");
    let mut fold = RenderAll::default();
    let err = decode(&bytes[..], &mut fold).expect_err("refused");
    assert_eq!(err.offset, 10);
    assert!(fold.taken.is_empty() && fold.staged.is_empty());
}
