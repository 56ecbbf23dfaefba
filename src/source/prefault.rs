//! Page faults taken off the thread that fills a long vector: a helper thread asks the kernel
//! to map the vector's spare room a little ahead of where it is being written, so the writer
//! finds its pages already there.
//!
//! A vector that grows to hundreds of megabytes (a big trace's entries) is memory the kernel
//! maps and zeroes page by page as it is first written, a fault each 4 KiB; on a virtual
//! machine each costs microseconds, a sizeable share of reading a file. The helper takes that
//! cost on the second core. At most `AHEAD` bytes past the last entry are mapped early, so
//! the memory held grows by no more than that.

use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::thread;

/// How far past the write position the helper maps.
const AHEAD: usize = 2 << 20;
/// A new range is asked for once the mapped room ahead is less than this.
const LOW: usize = 1 << 20;
/// `follow` looks at a vector only when its length is a multiple of this (a power of two):
/// each look costs a few instructions, and 4,096 elements of up to 64 bytes are well within
/// `AHEAD - LOW`.
const EVERY: usize = 4096;

/// The helper thread, started on first use; it lives as long as the process, waiting.
static HELPER: OnceLock<SyncSender<(usize, usize)>> = OnceLock::new();

/// Follows one growing vector (see `follow`); the ranges go to the one helper thread.
#[derive(Clone, Debug, Default)]
pub struct Prefaulter {
    /// The vector's buffer when last followed, and the end of the room asked for in it.
    buffer: usize,
    asked_until: usize,
    /// Set once the helper is gone (the kernel refused: before Linux 5.14).
    off: bool,
}

impl Prefaulter {
    /// Notes that `vec` is being filled at its end: asks for the room ahead of its length to
    /// be mapped when too little of it is. Cheap enough to call after every push.
    #[inline]
    pub fn follow<T>(&mut self, vec: &Vec<T>) {
        if vec.len() & (EVERY - 1) != 0 {
            return;
        }
        let start = vec.as_ptr() as usize;
        let size = std::mem::size_of::<T>();
        let written = start + vec.len() * size;
        if self.buffer == start && written + LOW <= self.asked_until {
            return;
        }
        self.ask(start, written, start + vec.capacity() * size);
    }

    #[cold]
    fn ask(&mut self, start: usize, written: usize, room_end: usize) {
        // A small vector is not worth a request (nor the helper thread, for a small input).
        if self.off || room_end - start < AHEAD {
            return;
        }
        if self.buffer != start {
            // A new buffer (the vector grew and moved, or this is the first call).
            self.buffer = start;
            self.asked_until = written;
        }
        let from = self.asked_until.max(written);
        let until = room_end.min(written + AHEAD);
        if until <= from {
            return;
        }
        match HELPER
            .get_or_init(spawn_helper)
            .try_send((from, until - from))
        {
            // Busy: the next call asks again.
            Err(TrySendError::Full(_)) => {}
            Err(TrySendError::Disconnected(_)) => self.off = true,
            Ok(()) => self.asked_until = until,
        }
    }
}

/// The helper: maps each range it is sent, until the kernel refuses.
fn spawn_helper() -> SyncSender<(usize, usize)> {
    let (tx, rx) = sync_channel::<(usize, usize)>(4);
    thread::spawn(move || {
        while let Ok((addr, len)) = rx.recv() {
            if !populate(addr, len) {
                return;
            }
        }
    });
    tx
}

/// Maps the pages of `len` bytes at `addr` writable, as a first write would; false when the
/// kernel does not know how (then the helper stops). A range that is no longer mapped (the
/// vector moved meanwhile) fails, which is fine.
#[cfg(target_os = "linux")]
fn populate(addr: usize, len: usize) -> bool {
    let page = 4096;
    let first = addr & !(page - 1);
    let len = addr + len - first;
    // SAFETY: MADV_POPULATE_WRITE only maps pages (as a write fault would, zeroed for
    // anonymous memory never written); it changes no byte of memory, so it cannot disturb
    // any object whatever the range holds by the time it runs. The kernel checks the range:
    // unmapped or read-only pages make it fail, not fault.
    let result =
        unsafe { libc::madvise(first as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    result == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
}

#[cfg(not(target_os = "linux"))]
fn populate(_addr: usize, _len: usize) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_followed_vector_keeps_its_contents_through_growth_and_moves() {
        let mut prefaulter = Prefaulter::default();
        let mut v: Vec<u64> = Vec::new();
        for i in 0..3_000_000u64 {
            v.push(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            prefaulter.follow(&v);
        }
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        // Room was asked for in the last buffer, never more than `AHEAD` past the end.
        let end = v.as_ptr() as usize + v.len() * 8;
        assert!(
            !prefaulter.off,
            "the kernel maps ahead (Linux 5.14 and later)"
        );
        assert!(prefaulter.asked_until > end - LOW);
        assert!(prefaulter.asked_until <= end + AHEAD);
    }
}
