//! Operands of the text opcodes of protocol 0 (INT, LONG, GET, PUT, UNICODE).

use super::error::{malformed, DecodeErrorKind};

pub(super) fn parse_text_int(line: &[u8]) -> Result<i64, DecodeErrorKind> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .ok_or_else(|| malformed("bad or too large integer text"))
}

/// Decodes Python's raw-unicode-escape: Latin-1 bytes plus `\uXXXX` and `\UXXXXXXXX`.
pub(super) fn raw_unicode_escape(line: &[u8]) -> Result<String, DecodeErrorKind> {
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        let width = match (b, line.get(i + 1)) {
            (b'\\', Some(b'u')) => 4,
            (b'\\', Some(b'U')) => 8,
            _ => 0,
        };
        if width == 0 {
            out.push(b as char);
            i += 1;
            continue;
        }
        let hex = line
            .get(i + 2..i + 2 + width)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u32::from_str_radix(h, 16).ok())
            .and_then(char::from_u32)
            .ok_or_else(|| malformed("bad escape in UNICODE"))?;
        out.push(hex);
        i += 2 + width;
    }
    Ok(out)
}
