//! A streaming decoder for data-only Python pickles (protocols 0 to 5).
//!
//! Purpose-built rather than `serde-pickle` because real snapshots share frame objects through
//! the memo thousands of times (a generic decoder copies them per reference) and hold millions
//! of small trace dicts that must become compact rows while decoding to keep memory near the
//! file's size; `benches/snapshot_parse.rs` measures both.

mod decode;
mod error;
mod fast;
mod fold;
mod input;
mod memo;
mod text;
mod value;

pub use decode::decode;
pub use error::{DecodeError, DecodeErrorKind};
pub use fold::{FlatDict, Fold, KeepAll};
pub use input::Refill;
pub use value::{Document, Node, NodeId, StrId, Value, RENDER_MAX};

#[cfg(test)]
mod tests;
