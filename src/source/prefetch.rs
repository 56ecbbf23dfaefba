//! A source that reads ahead on a second thread, so the kernel's copying of the file overlaps
//! decoding instead of adding to it, and hands its buffers to the decoder whole instead of
//! copying them (or, as a `Read`, serves them to a reader of small records).

use crate::source::pickle::Refill;
use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread;

/// Bytes of file per chunk handed from the reading thread.
const CHUNK: usize = 1 << 20;
/// Room kept free before each chunk's bytes, where the decoder's unconsumed bytes of the
/// previous chunk (an opcode or string cut at the boundary) are put, so the chunk itself is
/// never copied. Longer leftovers (a string over 64 KiB cut in two) take the copying path.
const HEAD: usize = 64 << 10;
/// Chunks in flight: enough to hide read latency, little enough to keep memory flat.
const DEPTH: usize = 2;

/// Reads `inner` on a background thread in large chunks. Buffers the decoder is done with go
/// back to the reading thread to be filled again: no allocation, zeroing or page faults per
/// megabyte read.
pub struct Prefetch {
    chunks: Receiver<io::Result<Vec<u8>>>,
    spent: SyncSender<Vec<u8>>,
}

/// Refills `chunk` with `HEAD` bytes of room and then up to `CHUNK` bytes of input;
/// `Ok(false)` at the end of input.
///
/// The bytes are read with `read` into the buffer's initialized length, which a recycled
/// buffer keeps: it is zeroed once when made, not before every read (`read_to_end` into
/// spare capacity zeroes it each time for a source without its own `read_buf`, as the
/// counting and progress wrappers around the file are).
fn fill<R: Read>(inner: &mut R, chunk: &mut Vec<u8>) -> io::Result<bool> {
    chunk.resize(HEAD + CHUNK, 0);
    let mut filled = HEAD;
    while filled < chunk.len() {
        match inner.read(&mut chunk[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    chunk.truncate(filled);
    Ok(filled == HEAD + CHUNK)
}

impl Prefetch {
    pub fn new<R: Read + Send + 'static>(mut inner: R) -> Prefetch {
        let (tx, rx) = sync_channel(DEPTH);
        // Room for every buffer that can be out at once (in the channel, being filled, held
        // by the decoder), so handing one back never blocks.
        let (spent_tx, spent_rx) = sync_channel::<Vec<u8>>(DEPTH + 2);
        thread::spawn(move || loop {
            let mut chunk = spent_rx
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(HEAD + CHUNK));
            let result = fill(&mut inner, &mut chunk);
            let done = !matches!(result, Ok(true));
            let message = result.map(|_| chunk);
            // The decoder hangs up when it stops early; then there is nothing to do.
            if tx.send(message).is_err() || done {
                return;
            }
        });
        Prefetch {
            chunks: rx,
            spent: spent_tx,
        }
    }

    /// Gives a buffer back for refilling; one of another size (the decoder's own) is dropped.
    fn recycle(&self, buf: Vec<u8>) {
        if buf.capacity() == HEAD + CHUNK {
            // Full (or the reader is gone): then the buffer is simply dropped.
            let _ = self.spent.try_send(buf);
        }
    }
}

impl Refill for Prefetch {
    fn refill(
        &mut self,
        buf: &mut Vec<u8>,
        start: usize,
        end: usize,
    ) -> io::Result<Option<(usize, usize)>> {
        let mut chunk = match self.chunks.recv() {
            Ok(Ok(chunk)) => chunk,
            Ok(Err(e)) => return Err(e),
            // The reading thread finished after its last chunk.
            Err(_) => return Ok(None),
        };
        if chunk.len() == HEAD {
            self.recycle(chunk);
            return Ok(None);
        }
        let left = end - start;
        if left <= HEAD {
            chunk[HEAD - left..HEAD].copy_from_slice(&buf[start..end]);
            let len = chunk.len();
            self.recycle(std::mem::replace(buf, chunk));
            Ok(Some((HEAD - left, len)))
        } else {
            buf.copy_within(start..end, 0);
            buf.truncate(left);
            buf.extend_from_slice(&chunk[HEAD..]);
            self.recycle(chunk);
            Ok(Some((0, buf.len())))
        }
    }
}

/// `Prefetch` as a plain `Read`, for a reader that takes its input in small pieces (a
/// recording's 64-byte records): each read is served from the chunk at hand.
pub struct PrefetchReader {
    prefetch: Prefetch,
    chunk: Vec<u8>,
    /// The next byte of `chunk` to serve.
    pos: usize,
}

impl PrefetchReader {
    pub fn new<R: Read + Send + 'static>(inner: R) -> PrefetchReader {
        PrefetchReader {
            prefetch: Prefetch::new(inner),
            chunk: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for PrefetchReader {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.chunk.len() {
            let next = match self.prefetch.chunks.recv() {
                Ok(Ok(chunk)) => chunk,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            };
            self.prefetch
                .recycle(std::mem::replace(&mut self.chunk, next));
            self.pos = HEAD.min(self.chunk.len());
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drains a source the way the decoder does, leaving `keep` bytes unconsumed at each
    /// refill (as when an opcode or a string straddles the boundary), and checks that those
    /// bytes come back in front of the new ones.
    fn drain(mut source: impl Refill, keep: usize) -> Vec<u8> {
        let (mut buf, mut out) = (Vec::new(), Vec::new());
        let (mut start, mut end) = (0, 0);
        loop {
            let consume_to = end - keep.min(end - start);
            out.extend_from_slice(&buf[start..consume_to]);
            let kept = buf[consume_to..end].to_vec();
            match source.refill(&mut buf, consume_to, end) {
                Ok(Some((s, e))) => {
                    assert!(e > s + kept.len(), "at least one new byte");
                    assert_eq!(&buf[s..s + kept.len()], &kept[..], "kept bytes in front");
                    (start, end) = (s, e);
                }
                Ok(None) => {
                    out.extend_from_slice(&kept);
                    return out;
                }
                Err(e) => panic!("read failed: {e}"),
            }
        }
    }

    #[test]
    fn hands_over_every_byte_in_order_whatever_is_left_unconsumed() {
        let data: Vec<u8> = (0..(3 * CHUNK + 123))
            .map(|i| (i * 7 % 256) as u8)
            .collect();
        for keep in [0, 1, 9, HEAD, HEAD + 1, 3 * HEAD] {
            let out = drain(Prefetch::new(io::Cursor::new(data.clone())), keep);
            assert_eq!(out.len(), data.len(), "keep {keep}");
            assert!(out == data, "keep {keep}: bytes differ");
        }
        assert!(drain(Prefetch::new(io::empty()), 0).is_empty());
        let exact = vec![5u8; 2 * CHUNK];
        assert!(drain(Prefetch::new(io::Cursor::new(exact.clone())), 3) == exact);
    }

    #[test]
    fn as_a_reader_it_serves_every_byte_in_order_in_pieces_of_any_size() {
        let data: Vec<u8> = (0..(2 * CHUNK + 77))
            .map(|i| (i * 13 % 256) as u8)
            .collect();
        for piece in [1, 64, 4096, CHUNK + 5] {
            let mut reader = PrefetchReader::new(io::Cursor::new(data.clone()));
            let (mut out, mut buf) = (Vec::new(), vec![0u8; piece]);
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => out.extend_from_slice(&buf[..n]),
                    Err(e) => panic!("read failed: {e}"),
                }
            }
            assert!(out == data, "pieces of {piece}: bytes differ");
        }
        let mut empty = PrefetchReader::new(io::empty());
        assert_eq!(empty.read(&mut [0u8; 8]).ok(), Some(0));
    }
}
