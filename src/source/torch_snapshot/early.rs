//! The dump before the trace: a snapshot's segments, handed on as a snapshot of their own (no
//! trace) as soon as the decoder has read them, while it goes on with the rest of the file.
//! PyTorch writes `segments` before `device_traces`, and the segments are a small part of a big
//! file, so `memprof view` can show the dump's figures long before the trace is read.

use super::fold::TraceFolder;
use super::schema;
use crate::model::Snapshot;
use crate::source::pickle::{Document, FlatDict, Fold, NodeId, Value};

/// A `TraceFolder` that also hands the segments to `sink`, once, when it sees them complete.
pub struct Early<'s> {
    pub folder: TraceFolder,
    sink: Option<&'s mut dyn FnMut(Snapshot)>,
}

impl<'s> Early<'s> {
    pub fn new(sink: &'s mut dyn FnMut(Snapshot)) -> Early<'s> {
        Early {
            folder: TraceFolder::new(),
            sink: Some(sink),
        }
    }
}

/// Where the segments are, as an append happens.
#[derive(Debug, PartialEq)]
enum Look {
    /// Not read yet, or not known to be complete.
    NotYet,
    /// Read whole: this value.
    Read(Value),
    /// The pickle is not a dict of lists (a list of segments is the whole file): never early.
    Never,
}

/// Whether the root dict's `segments` value is complete, given the decoder's stack `open`
/// (`Fold::appending`): set into the dict already (protocols 0 and 1 set each pair on its
/// own), or pending on the stack with the dict's next key pushed after it (protocol 2 and up
/// set the pairs together at the end). Above a list being built sit its own items until they
/// are appended; those of `segments` are dicts, so a string there is the next key.
fn look(doc: &Document, open: &[Value]) -> Look {
    let Some(pairs) = open.first().and_then(|&root| doc.as_dict(root)) else {
        return Look::Never;
    };
    if let Some(segments) = doc.get(pairs, "segments") {
        return Look::Read(segments);
    }
    let pending = &open[1..];
    for (i, pair) in pending.chunks_exact(2).enumerate() {
        let Some(key) = doc.as_str(pair[0]) else {
            break;
        };
        if key == "segments" {
            let next = pending.get(2 * i + 2).and_then(|&v| doc.as_str(v));
            return match next {
                Some(_) => Look::Read(pair[1]),
                None => Look::NotYet,
            };
        }
    }
    Look::NotYet
}

impl Fold for Early<'_> {
    #[inline]
    fn fold(&mut self, doc: &Document, list: NodeId, dict: NodeId) -> Option<u32> {
        self.folder.fold(doc, list, dict)
    }

    #[inline]
    fn wants_flat(&self) -> bool {
        self.folder.wants_flat()
    }

    #[inline]
    fn fold_flat(&mut self, doc: &Document, dict: FlatDict) -> Option<u32> {
        self.folder.fold_flat(doc, dict)
    }

    #[inline]
    fn adopt(&mut self, doc: &Document, list: NodeId, handle: u32) -> bool {
        self.folder.adopt(doc, list, handle)
    }

    fn appending(&mut self, doc: &Document, open: &[Value]) {
        if self.sink.is_none() {
            return;
        }
        match look(doc, open) {
            Look::NotYet => {}
            Look::Never => self.sink = None,
            Look::Read(segments) => {
                // Segments the full read refuses are reported by it, with their place.
                let built = schema::build(doc, segments, TraceFolder::new());
                if let (Some(sink), Ok((snapshot, ..))) = (self.sink.take(), built) {
                    sink(snapshot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::read_early;
    use crate::model::Snapshot;

    /// `pickle.dumps({'segments': [seg], 'device_traces': [[entry]]}, protocol=0)` by CPython,
    /// with one 2 MiB segment (one 1 KiB block allocated, the rest free): each pair is set
    /// into the root dict on its own.
    const PROTOCOL_0: &[u8] = b"(dp0\nVsegments\np1\n(lp2\n(dp3\nVdevice\np4\nI0\nsVaddress\np5\nI4096\nsVtotal_size\np6\nI2097152\nsVallocated_size\np7\nI1024\nsVactive_size\np8\nI1024\nsVrequested_size\np9\nI1000\nsVstream\np10\nI0\nsVsegment_type\np11\nVsmall\np12\nsVblocks\np13\n(lp14\n(dp15\ng5\nI4096\nsVsize\np16\nI1024\nsg9\nI1000\nsVstate\np17\nVactive_allocated\np18\nsVframes\np19\n(lp20\nsa(dp21\ng5\nI5120\nsg16\nI2096128\nsg9\nI0\nsg17\nVinactive\np22\nsg19\n(lp23\nsasasVdevice_traces\np24\n(lp25\n(lp26\n(dp27\nVaction\np28\nValloc\np29\nsVaddr\np30\nI4096\nsg16\nI1024\nsg10\nI0\nsg19\n(lp31\nsaas.";

    /// The same at protocol 1: the pairs are set together at the end, so `segments` is
    /// complete once the next key is on the stack.
    const PROTOCOL_1: &[u8] = b"}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02}q\x03(X\x06\x00\x00\x00deviceq\x04K\x00X\x07\x00\x00\x00addressq\x05M\x00\x10X\n\x00\x00\x00total_sizeq\x06J\x00\x00 \x00X\x0e\x00\x00\x00allocated_sizeq\x07M\x00\x04X\x0b\x00\x00\x00active_sizeq\x08M\x00\x04X\x0e\x00\x00\x00requested_sizeq\tM\xe8\x03X\x06\x00\x00\x00streamq\nK\x00X\x0c\x00\x00\x00segment_typeq\x0bX\x05\x00\x00\x00smallq\x0cX\x06\x00\x00\x00blocksq\r]q\x0e(}q\x0f(h\x05M\x00\x10X\x04\x00\x00\x00sizeq\x10M\x00\x04h\tM\xe8\x03X\x05\x00\x00\x00stateq\x11X\x10\x00\x00\x00active_allocatedq\x12X\x06\x00\x00\x00framesq\x13]q\x14u}q\x15(h\x05M\x00\x14h\x10J\x00\xfc\x1f\x00h\tK\x00h\x11X\x08\x00\x00\x00inactiveq\x16h\x13]q\x17ueuaX\r\x00\x00\x00device_tracesq\x18]q\x19]q\x1a}q\x1b(X\x06\x00\x00\x00actionq\x1cX\x05\x00\x00\x00allocq\x1dX\x04\x00\x00\x00addrq\x1eM\x00\x10h\x10M\x00\x04h\nK\x00h\x13]q\x1fuaau.";

    #[test]
    fn the_segments_are_handed_on_whole_before_the_trace_at_protocols_0_and_1() {
        for (protocol, bytes) in [(0, PROTOCOL_0), (1, PROTOCOL_1)] {
            let mut early: Vec<Snapshot> = Vec::new();
            let parsed = read_early(bytes, &mut |dump| early.push(dump)).expect("parses");
            assert_eq!(early.len(), 1, "protocol {protocol}");
            let dump = &early[0];
            assert_eq!(
                dump.segments, parsed.snapshot.segments,
                "protocol {protocol}"
            );
            assert_eq!(dump.segments[0].blocks.len(), 2, "protocol {protocol}");
            assert_eq!(dump.timeline.device(0).len(), 0, "protocol {protocol}");
            assert_eq!(parsed.snapshot.timeline.device(0).len(), 1);
        }
    }

    #[test]
    fn a_list_of_segments_is_never_early() {
        // pickle.dumps([seg], protocol=2), one free 2 MiB segment: the PyTorch 2.0 layout,
        // where the whole file is the segments.
        let bytes = b"\x80\x02]q\x00}q\x01(X\x06\x00\x00\x00deviceq\x02K\x00X\x07\x00\x00\x00addressq\x03M\x00\x10X\n\x00\x00\x00total_sizeq\x04J\x00\x00 \x00X\x06\x00\x00\x00streamq\x05K\x00X\x0c\x00\x00\x00segment_typeq\x06X\x05\x00\x00\x00smallq\x07X\x06\x00\x00\x00blocksq\x08]q\t}q\n(h\x03M\x00\x10X\x04\x00\x00\x00sizeq\x0bJ\x00\x00 \x00X\x05\x00\x00\x00stateq\x0cX\x08\x00\x00\x00inactiveq\ruaua.";
        let mut called = false;
        let parsed = read_early(&bytes[..], &mut |_| called = true).expect("parses");
        assert!(!called);
        assert_eq!(parsed.snapshot.segments.len(), 1);
    }
}
