//! Decode errors: what went wrong and at which byte.

use super::input::InputError;
use std::fmt;

/// What went wrong, without the position.
#[derive(Debug)]
pub enum DecodeErrorKind {
    Empty,
    Truncated,
    Io(std::io::Error),
    /// An opcode that imports or calls code, or needs out-of-band data.
    Refused(&'static str),
    UnknownOpcode(u8),
    UnsupportedProtocol(u8),
    LooksLikeJson,
    Malformed(String),
}

/// A decode failure at a byte offset.
#[derive(Debug)]
pub struct DecodeError {
    /// Offset of the opcode being decoded.
    pub offset: u64,
    pub kind: DecodeErrorKind,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = self.offset;
        match &self.kind {
            DecodeErrorKind::Empty => write!(f, "the file is empty"),
            DecodeErrorKind::Truncated => write!(
                f,
                "truncated pickle: the data ends inside the opcode at byte {at}"
            ),
            DecodeErrorKind::Io(e) => write!(f, "read error near byte {at}: {e}"),
            DecodeErrorKind::Refused(op) => write!(
                f,
                "refused opcode {op} at byte {at}: it would import or call Python code, and \
                 memprof reads data-only pickles"
            ),
            DecodeErrorKind::UnknownOpcode(op) => {
                write!(f, "not a pickle: unknown opcode 0x{op:02x} at byte {at}")
            }
            DecodeErrorKind::UnsupportedProtocol(p) => {
                write!(
                    f,
                    "unsupported pickle protocol {p} at byte {at} (known: 0 to 5)"
                )
            }
            DecodeErrorKind::LooksLikeJson => write!(
                f,
                "not a pickle: the file looks like JSON (byte {at}); expected a PyTorch memory \
                 snapshot pickle"
            ),
            DecodeErrorKind::Malformed(why) => write!(f, "malformed pickle at byte {at}: {why}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The result of one opcode's work.
pub(super) type Step = Result<(), DecodeErrorKind>;

pub(super) fn malformed(why: impl Into<String>) -> DecodeErrorKind {
    DecodeErrorKind::Malformed(why.into())
}

impl From<InputError> for DecodeErrorKind {
    fn from(e: InputError) -> Self {
        match e {
            InputError::Truncated => DecodeErrorKind::Truncated,
            InputError::Io(e) => DecodeErrorKind::Io(e),
        }
    }
}
