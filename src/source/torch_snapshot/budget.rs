//! The bound on what one snapshot can make memprof hold: a stated multiple of its size.
//!
//! A pickle shares an object by a two-byte memo reference, so a small file can name one
//! segment, block, string or list thousands of times. The decoder keeps such objects shared;
//! turning them into the model copies them, once per reference. Every copy the snapshot reader
//! makes (rows, segments, blocks, frames, text) and every dict it looks into is charged here,
//! and reading stops with one line once the charges pass `PER_INPUT_BYTE` bytes for each byte
//! of the pickle read so far, plus `FLOOR`.

use crate::source::pickle::Document;

/// Bytes of model (and dict items looked at, 16 bytes each) allowed per byte of pickle.
/// PyTorch's own snapshots need a few (the real ones `tests/real_snapshots.rs` reads pass).
pub const PER_INPUT_BYTE: u64 = 32;
/// Allowed whatever the size of the file, so that small files are never refused.
pub const FLOOR: u64 = 64 << 20;
/// What looking at one dict or list item is charged, as bytes.
pub const ITEM: u64 = 16;

/// The snapshot names its shared objects so often that reading it would pass the bound.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the snapshot expands past memprof's bound ({PER_INPUT_BYTE} bytes per file byte, plus \
     {floor} MiB) while reading {place}: it shares its objects too often to be a PyTorch \
     snapshot",
    floor = FLOOR >> 20
)]
pub struct Expansion {
    pub place: String,
}

/// What has been charged so far.
#[derive(Debug, Default)]
pub struct Budget {
    spent: u64,
    /// Set once a charge failed; every later charge fails too.
    exceeded: bool,
}

impl Budget {
    /// Charges `bytes`; fails, with `what` as the message, once the total passes the bound for
    /// the bytes of `doc` read so far.
    #[inline]
    pub fn charge(&mut self, doc: &Document, bytes: u64, what: &str) -> Result<(), String> {
        self.spent = self.spent.saturating_add(bytes);
        if self.exceeded || self.spent > limit(doc.bytes_read()) {
            self.exceeded = true;
            return Err(what.to_string());
        }
        Ok(())
    }

    /// Fails as `charge` would for `held` bytes more, charging nothing: for what is charged
    /// once it is complete (the trace rows), checked while it grows.
    #[inline]
    pub fn check(&mut self, doc: &Document, held: u64, what: &str) -> Result<(), String> {
        if self.exceeded || self.spent.saturating_add(held) > limit(doc.bytes_read()) {
            self.exceeded = true;
            return Err(what.to_string());
        }
        Ok(())
    }

    /// Charges `count` items of `size` bytes each.
    #[inline]
    pub fn charge_items(
        &mut self,
        doc: &Document,
        count: usize,
        size: usize,
        what: &str,
    ) -> Result<(), String> {
        let bytes = (count as u64).saturating_mul(size as u64);
        self.charge(doc, bytes, what)
    }

    /// Whether a charge failed: the error that came back is then an `Expansion`.
    pub fn exceeded(&self) -> bool {
        self.exceeded
    }
}

/// Bytes the reader may hold after reading `bytes_read` bytes of pickle.
pub fn limit(bytes_read: u64) -> u64 {
    bytes_read
        .saturating_mul(PER_INPUT_BYTE)
        .saturating_add(FLOOR)
}
