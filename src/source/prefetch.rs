//! A reader that reads ahead on a second thread, so the kernel's copying of the file overlaps
//! decoding instead of adding to it.

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread;

/// Bytes per chunk handed from the reading thread.
const CHUNK: usize = 1 << 20;
/// Chunks in flight: enough to hide read latency, little enough to keep memory flat.
const DEPTH: usize = 2;

/// Reads `inner` on a background thread in large chunks. Chunk buffers go back to the reading
/// thread once consumed, so the same few buffers are filled again and again: no allocation,
/// zeroing or page faults per megabyte read.
pub struct Prefetch {
    chunks: Receiver<io::Result<Vec<u8>>>,
    spent: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

/// Fills `chunk` (emptied first) with up to `CHUNK` bytes; `Ok(false)` at the end of input.
fn fill<R: Read>(inner: &mut R, chunk: &mut Vec<u8>) -> io::Result<bool> {
    chunk.clear();
    // `read_to_end` reads into the spare capacity without zeroing it first.
    inner.take(CHUNK as u64).read_to_end(chunk)?;
    Ok(chunk.len() == CHUNK)
}

impl Prefetch {
    pub fn new<R: Read + Send + 'static>(mut inner: R) -> Prefetch {
        let (tx, rx) = sync_channel(DEPTH);
        // Room for every buffer that can be out at once (in the channel, being read, held by
        // the consumer), so handing one back never blocks.
        let (spent_tx, spent_rx) = sync_channel::<Vec<u8>>(DEPTH + 2);
        thread::spawn(move || loop {
            let mut chunk = spent_rx
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(CHUNK));
            let result = fill(&mut inner, &mut chunk);
            let done = !matches!(result, Ok(true));
            let message = result.map(|_| chunk);
            // The receiver hangs up when the decoder stops early; then there is nothing to do.
            if tx.send(message).is_err() || done {
                return;
            }
        });
        Prefetch {
            chunks: rx,
            spent: spent_tx,
            current: Vec::new(),
            pos: 0,
        }
    }
}

impl Read for Prefetch {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.chunks.recv() {
                Ok(Ok(chunk)) if chunk.is_empty() => return Ok(0),
                Ok(Ok(chunk)) => {
                    let spent = std::mem::replace(&mut self.current, chunk);
                    // The reader may have finished; then the buffer is simply dropped.
                    if spent.capacity() == CHUNK {
                        let _ = self.spent.try_send(spent);
                    }
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                // The reading thread finished after its last chunk.
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len() - self.pos);
        out[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_everything_in_order() {
        let data: Vec<u8> = (0..(3 * CHUNK + 123))
            .map(|i| (i * 7 % 256) as u8)
            .collect();
        let mut out = Vec::new();
        Prefetch::new(io::Cursor::new(data.clone()))
            .read_to_end(&mut out)
            .expect("reads");
        assert_eq!(out, data);
        let mut empty = Vec::new();
        Prefetch::new(io::empty())
            .read_to_end(&mut empty)
            .expect("reads");
        assert!(empty.is_empty());
    }
}
