//! A chunked byte reader for the pickle decoder: reads the file in large pieces so the whole
//! file never sits in memory, and knows the byte offset of everything it hands out.
//!
//! Hand-written rather than `BufReader` because the decoder needs contiguous slices of any
//! length (a string may be larger than one buffer) plus the absolute offset, without copying.

use std::io::{self, Read};

const CHUNK: usize = 1 << 20;

/// Where the decoder's bytes come from. Every `Read` is one (its bytes are copied into the
/// buffer); a source that already holds its bytes in buffers (`source::prefetch::Prefetch`)
/// can hand a whole buffer over instead of copying it.
pub trait Refill {
    /// The unconsumed bytes are `buf[start..end]`. Makes at least one more byte available
    /// right after them and returns where those same bytes and the new ones now are
    /// (`(new_start, new_end)`), or `None` at the end of the input. Bytes before `start` may be
    /// dropped and `buf` may be replaced; `buf` grows only by bytes that actually arrived, so a
    /// bogus length in a damaged file ends in truncation, not in a huge allocation.
    fn refill(
        &mut self,
        buf: &mut Vec<u8>,
        start: usize,
        end: usize,
    ) -> io::Result<Option<(usize, usize)>>;
}

impl<R: Read> Refill for R {
    fn refill(
        &mut self,
        buf: &mut Vec<u8>,
        start: usize,
        end: usize,
    ) -> io::Result<Option<(usize, usize)>> {
        buf.copy_within(start..end, 0);
        let kept = end - start;
        if kept == buf.len() {
            // Full of unconsumed bytes: at most doubles what has arrived.
            buf.resize(buf.len().saturating_mul(2).max(CHUNK), 0);
        }
        loop {
            match self.read(&mut buf[kept..]) {
                Ok(0) => return Ok(None),
                Ok(k) => return Ok(Some((0, kept + k))),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Why the input ended early or failed.
#[derive(Debug)]
pub enum InputError {
    /// The input ended before `needed` more bytes could be read.
    Truncated,
    Io(io::Error),
}

/// Buffered input with absolute offsets.
pub struct Input<R> {
    source: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    /// Absolute offset of `buf[0]`, modulo 2^64 (a source may put the first byte of the file
    /// past `buf[0]`, so this can be "negative").
    base: u64,
}

impl<R: Refill> Input<R> {
    pub fn new(source: R) -> Input<R> {
        Input {
            source,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            base: 0,
        }
    }

    /// Absolute offset of the next byte.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.base.wrapping_add(self.pos as u64)
    }

    /// Makes at least `n` bytes available after `pos`, or fails with `Truncated`.
    #[cold]
    fn fill(&mut self, n: usize) -> Result<(), InputError> {
        while self.end - self.pos < n {
            let at = self.offset();
            match self.source.refill(&mut self.buf, self.pos, self.end) {
                Ok(Some((start, end))) => {
                    self.base = at.wrapping_sub(start as u64);
                    self.pos = start;
                    self.end = end;
                }
                Ok(None) => return Err(InputError::Truncated),
                Err(e) => return Err(InputError::Io(e)),
            }
        }
        Ok(())
    }

    /// The offset in the input of the buffer's first byte, modulo 2^64: a buffer with room
    /// kept before its data starts before offset 0 (add positions with `wrapping_add`).
    #[inline]
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Lends out the buffer with the read position and the end of valid data, for a caller
    /// that decodes straight from it; `put_window` must give it back.
    #[inline]
    pub fn take_window(&mut self) -> (Vec<u8>, usize, usize) {
        (std::mem::take(&mut self.buf), self.pos, self.end)
    }

    /// Takes the buffer back with the new read position.
    #[inline]
    pub fn put_window(&mut self, buf: Vec<u8>, pos: usize) {
        debug_assert!(pos <= self.end);
        self.buf = buf;
        self.pos = pos;
    }

    /// The next byte.
    #[inline]
    pub fn byte(&mut self) -> Result<u8, InputError> {
        if self.pos == self.end {
            self.fill(1)?;
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    /// Whether the input has no more bytes.
    pub fn at_end(&mut self) -> Result<bool, InputError> {
        if self.pos < self.end {
            return Ok(false);
        }
        match self.fill(1) {
            Ok(()) => Ok(false),
            Err(InputError::Truncated) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// The next `n` bytes, valid until the next call.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&[u8], InputError> {
        if self.end - self.pos < n {
            self.fill(n)?;
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..start + n])
    }

    /// The next `N` bytes as an array.
    #[inline]
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], InputError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    /// Bytes up to (not including) the next `\n`, which is consumed.
    pub fn line(&mut self) -> Result<&[u8], InputError> {
        let mut scanned = 0;
        loop {
            if let Some(i) = self.buf[self.pos + scanned..self.end]
                .iter()
                .position(|&b| b == b'\n')
            {
                let start = self.pos;
                let len = scanned + i;
                self.pos += len + 1;
                return Ok(&self.buf[start..start + len]);
            }
            scanned = self.end - self.pos;
            self.fill(scanned + 1)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_across_chunk_boundaries() {
        let data: Vec<u8> = (0..(3 * CHUNK + 17)).map(|i| (i % 251) as u8).collect();
        let mut input = Input::new(&data[..]);
        assert_eq!(input.take(CHUNK - 3).map(|s| s.len()).ok(), Some(CHUNK - 3));
        let big = input.take(2 * CHUNK).map(|s| s.to_vec()).ok();
        assert_eq!(big.as_deref(), Some(&data[CHUNK - 3..3 * CHUNK - 3]));
        assert_eq!(input.offset(), (3 * CHUNK - 3) as u64);
        assert_eq!(input.byte().ok(), Some(data[3 * CHUNK - 3]));
        assert!(matches!(input.take(100), Err(InputError::Truncated)));
    }

    #[test]
    fn a_huge_length_is_truncation_not_an_allocation() {
        let mut input = Input::new(&b"short"[..]);
        assert!(matches!(
            input.take(usize::MAX / 2),
            Err(InputError::Truncated)
        ));
        let mut input = Input::new(&b"short"[..]);
        assert!(matches!(input.take(usize::MAX), Err(InputError::Truncated)));
    }

    #[test]
    fn reads_lines() {
        let mut input = Input::new(&b"I42\nrest"[..]);
        assert_eq!(input.byte().ok(), Some(b'I'));
        assert_eq!(input.line().ok(), Some(&b"42"[..]));
        assert_eq!(input.offset(), 4);
        assert!(matches!(input.line(), Err(InputError::Truncated)));
    }
}
