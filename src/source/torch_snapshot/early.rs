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
