//! PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot()`) into the model.

mod budget;
mod early;
mod fold;
mod host;
mod intern;
mod marks;
mod parked;
mod schema;

use crate::model::{FormatKeys, HostAllocator, Snapshot};
use crate::source::pickle::{self, DecodeError, Refill};

pub use budget::{Expansion, FLOOR, PER_INPUT_BYTE};
pub use schema::ShapeError;

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Shape(#[from] ShapeError),
    #[error(transparent)]
    Expansion(#[from] Expansion),
}

/// A snapshot and what was odd about it but not fatal.
#[derive(Debug)]
pub struct Parsed {
    pub snapshot: Snapshot,
    pub warnings: Vec<String>,
    /// The version-telling keys the file held (all false for a recording).
    pub keys: FormatKeys,
    /// The pinned host memory of PyTorch's host allocator (`host_segments`, `host_traces`),
    /// when the file carries some.
    pub host: Option<HostAllocator>,
}

/// Reads a snapshot pickle from `reader` (any `Read`, or a `Refill` source such as `Prefetch`),
/// streaming: the file is never held in memory whole.
pub fn read<R: Refill>(reader: R) -> Result<Parsed, SnapshotError> {
    let mut folder = fold::TraceFolder::new();
    let (doc, root) = pickle::decode(reader, &mut folder)?;
    parsed(&doc, root, folder)
}

/// Reads a snapshot as [`read`] does, and hands `dump` the snapshot's segments (as a snapshot
/// without a trace) as soon as they are read, when the file holds them before its trace, as
/// PyTorch writes it; `dump` is called at most once, from this thread.
pub fn read_early<R: Refill>(
    reader: R,
    dump: &mut dyn FnMut(Snapshot),
) -> Result<Parsed, SnapshotError> {
    let mut early = early::Early::new(dump);
    let (doc, root) = pickle::decode(reader, &mut early)?;
    parsed(&doc, root, early.folder)
}

/// The snapshot of a decoded pickle.
fn parsed(
    doc: &pickle::Document,
    root: pickle::Value,
    folder: fold::TraceFolder,
) -> Result<Parsed, SnapshotError> {
    let (snapshot, warnings, keys, host) = schema::build(doc, root, folder)?;
    Ok(Parsed {
        snapshot,
        warnings,
        keys,
        host,
    })
}
