//! How a caller takes dicts out of the decoded tree while decoding (`Fold`).

use super::value::{Document, NodeId, Value};

/// A flat dict offered to `Fold::fold_flat`: its keys and values, in the pickle's order.
///
/// `shape` numbers the key sequence: it stays the same as long as consecutive flat dicts have
/// the same keys in the same order (the trace entries of a file nearly always do), and changes
/// whenever they differ, so a fold can keep what it learned from the keys without comparing
/// them again. Numbers are per `decode`: a fold used for two decodes must forget between them.
#[derive(Clone, Copy)]
pub struct FlatDict<'a> {
    pub shape: u64,
    pub keys: &'a [Value],
    pub values: &'a [Value],
}

/// Takes over dicts while they are appended to lists.
///
/// Dicts reach a fold in one of two ways, and the fold sees every dict of a list in list order:
/// - a flat dict (only scalars and memo references as values) is first offered as soon as it
///   is decoded, as keys and values (`fold_flat`), before any node is made for it; a fold that
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
    fn fold_flat(&mut self, _doc: &Document, _dict: FlatDict) -> Option<u32> {
        None
    }

    /// A dict the fold took (by `fold_flat`, or by `fold` and then named again through the
    /// memo or the stack) was appended to `list`; `doc` has read `doc.bytes_read()` bytes.
    /// `false` if the fold does not take it there; it then stays in the list as a value.
    fn adopt(&mut self, _doc: &Document, _list: NodeId, _handle: u32) -> bool {
        false
    }

    /// Called at each append to a list, before its items are offered, with the decoder's stack
    /// below them (`open`: the outermost value first, usually the pickle's root container, then
    /// the values pushed above it and not yet set into it, the list appended to last); `doc`
    /// has read `doc.bytes_read()` bytes. A pickler writes a value whole before the next one,
    /// so a value with another above it is complete (a hostile pickle may still add to it
    /// later through the memo).
    fn appending(&mut self, _doc: &Document, _open: &[Value]) {}
}

/// A `Fold` that takes nothing.
pub struct KeepAll;

impl Fold for KeepAll {
    fn fold(&mut self, _: &Document, _: NodeId, _: NodeId) -> Option<u32> {
        None
    }
}
