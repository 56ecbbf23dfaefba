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

    fn adopt(&mut self, _: NodeId, handle: u32) -> bool {
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
