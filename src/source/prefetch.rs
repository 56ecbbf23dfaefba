//! A reader that reads ahead on a second thread, so the kernel's copying of the file overlaps
//! decoding instead of adding to it.

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread;

/// Bytes per chunk handed from the reading thread.
const CHUNK: usize = 1 << 20;
/// Chunks in flight: enough to hide read latency, little enough to keep memory flat.
const DEPTH: usize = 2;

/// Reads `inner` on a background thread in large chunks.
pub struct Prefetch {
    chunks: Receiver<io::Result<Vec<u8>>>,
    current: Vec<u8>,
    pos: usize,
}

impl Prefetch {
    pub fn new<R: Read + Send + 'static>(mut inner: R) -> Prefetch {
        let (tx, rx) = sync_channel(DEPTH);
        thread::spawn(move || loop {
            let mut chunk = vec![0u8; CHUNK];
            let mut filled = 0;
            let result = loop {
                match inner.read(&mut chunk[filled..]) {
                    Ok(0) => break Ok(()),
                    Ok(n) => {
                        filled += n;
                        if filled == CHUNK {
                            break Ok(());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => break Err(e),
                }
            };
            chunk.truncate(filled);
            let done = filled < CHUNK || result.is_err();
            let message = result.map(|()| chunk);
            // The receiver hangs up when the decoder stops early; then there is nothing to do.
            if tx.send(message).is_err() || done {
                return;
            }
        });
        Prefetch {
            chunks: rx,
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
                    self.current = chunk;
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
