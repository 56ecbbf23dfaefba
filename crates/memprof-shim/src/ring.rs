//! A preallocated, bounded, lock-free multi-producer queue of entries (Vyukov's bounded queue).
//! Producers never block and never allocate: a full queue makes `push` return false. The single
//! consumer is whoever holds the writer lock.
//!
//! An entry is a head of `H` words, whose last word counts the words of its tail (at most `T`).
//! Heads sit next to their sequence numbers; tails live in a separate array, so an entry without
//! a tail touches as little memory as a queue of heads alone would (the ring is larger than the
//! caches: every slot touched is a miss).

use std::sync::atomic::{AtomicU64, Ordering};

struct Slot<const H: usize> {
    /// Sequence number, stored minus the slot's index so that all-zero is the initial state.
    seq: AtomicU64,
    head: [AtomicU64; H],
}

impl<const H: usize> Slot<H> {
    const fn new() -> Slot<H> {
        Slot {
            seq: AtomicU64::new(0),
            head: [const { AtomicU64::new(0) }; H],
        }
    }
}

pub struct Ring<const N: usize, const H: usize, const T: usize> {
    slots: [Slot<H>; N],
    tails: [[AtomicU64; T]; N],
    enqueue: AtomicU64,
    /// Only the consumer moves it.
    dequeue: AtomicU64,
}

impl<const N: usize, const H: usize, const T: usize> Ring<N, H, T> {
    /// `N` must be a power of two, `H` at least 1.
    pub const fn new() -> Ring<N, H, T> {
        assert!(N.is_power_of_two() && H > 0);
        Ring {
            slots: [const { Slot::new() }; N],
            tails: [const { [const { AtomicU64::new(0) }; T] }; N],
            enqueue: AtomicU64::new(0),
            dequeue: AtomicU64::new(0),
        }
    }

    /// Adds an entry; false when the queue is full. `head[H - 1]` is the tail's length: only
    /// that many words of `tail` are kept.
    pub fn push(&self, head: &[u64; H], tail: &[u64]) -> bool {
        let mut pos = self.enqueue.load(Ordering::Relaxed);
        loop {
            let index = (pos as usize) & (N - 1);
            let slot = &self.slots[index];
            let seq = slot.seq.load(Ordering::Acquire).wrapping_add(index as u64);
            let diff = seq.wrapping_sub(pos) as i64;
            if diff == 0 {
                match self.enqueue.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        for (word, &value) in slot.head.iter().zip(head) {
                            word.store(value, Ordering::Relaxed);
                        }
                        let len = (head[H - 1] as usize).min(T).min(tail.len());
                        for (word, &value) in self.tails[index].iter().zip(&tail[..len]) {
                            word.store(value, Ordering::Relaxed);
                        }
                        slot.seq.store(
                            pos.wrapping_add(1).wrapping_sub(index as u64),
                            Ordering::Release,
                        );
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return false;
            } else {
                pos = self.enqueue.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest entry: its head into `head`, its tail into the start of `tail`; returns
    /// the tail's length (what the head says, at most `T`). Only one consumer at a time (the
    /// caller holds the writer lock).
    pub fn pop(&self, head: &mut [u64; H], tail: &mut [u64; T]) -> Option<usize> {
        let pos = self.dequeue.load(Ordering::Relaxed);
        let index = (pos as usize) & (N - 1);
        let slot = &self.slots[index];
        let seq = slot.seq.load(Ordering::Acquire).wrapping_add(index as u64);
        if seq != pos.wrapping_add(1) {
            return None;
        }
        for (word, value) in slot.head.iter().zip(head.iter_mut()) {
            *value = word.load(Ordering::Relaxed);
        }
        let len = (head[H - 1] as usize).min(T);
        for (word, value) in self.tails[index][..len].iter().zip(tail.iter_mut()) {
            *value = word.load(Ordering::Relaxed);
        }
        slot.seq.store(
            pos.wrapping_add(N as u64).wrapping_sub(index as u64),
            Ordering::Release,
        );
        self.dequeue.store(pos.wrapping_add(1), Ordering::Relaxed);
        Some(len)
    }

    /// Drops every entry pushed so far, finished or not, and makes their slots free again. Only
    /// where no other thread can push or pop: in a forked child (`fork.rs`), whose only thread
    /// must not inherit the parent's entries, nor wait on a slot that a thread missing there had
    /// claimed and not yet filled.
    pub fn discard(&self) {
        let end = self.enqueue.load(Ordering::Relaxed);
        let mut pos = self.dequeue.load(Ordering::Relaxed);
        while pos != end {
            let index = (pos as usize) & (N - 1);
            // As `pop` leaves a slot it took.
            self.slots[index].seq.store(
                pos.wrapping_add(N as u64).wrapping_sub(index as u64),
                Ordering::Release,
            );
            pos = pos.wrapping_add(1);
        }
        self.dequeue.store(end, Ordering::Relaxed);
    }
}

impl<const N: usize, const H: usize, const T: usize> Default for Ring<N, H, T> {
    fn default() -> Ring<N, H, T> {
        Ring::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// An entry: head n, n, !n, tail length 2; tail n + 1, n + 2.
    fn push<const N: usize>(ring: &Ring<N, 4, 3>, n: u64) -> bool {
        ring.push(&[n, n, !n, 2], &[n + 1, n + 2])
    }

    /// Pops one entry of `push`'s shape and returns its n.
    fn pop<const N: usize>(ring: &Ring<N, 4, 3>) -> Option<u64> {
        let (mut head, mut tail) = ([0u64; 4], [0u64; 3]);
        let len = ring.pop(&mut head, &mut tail)?;
        let n = head[0];
        assert_eq!((head[1], head[2], len), (n, !n, 2), "torn head");
        assert_eq!(tail[..2], [n + 1, n + 2], "torn tail");
        Some(n)
    }

    #[test]
    fn fifo_and_full() {
        let ring = Ring::<4, 4, 3>::new();
        assert!(pop(&ring).is_none());
        for lap in 0..3u64 {
            for i in 0..4 {
                assert!(push(&ring, lap * 10 + i));
            }
            assert!(!push(&ring, 99), "a full ring refuses");
            for i in 0..4 {
                assert_eq!(pop(&ring), Some(lap * 10 + i));
            }
            assert!(pop(&ring).is_none());
        }
    }

    #[test]
    fn tails_are_as_long_as_their_heads_say() {
        let ring = Ring::<2, 2, 3>::new();
        let (mut head, mut tail) = ([0u64; 2], [0u64; 3]);
        assert!(ring.push(&[1, 0], &[]));
        assert_eq!(ring.pop(&mut head, &mut tail), Some(0));
        assert!(ring.push(&[2, 3], &[20, 21, 22]));
        assert_eq!(ring.pop(&mut head, &mut tail), Some(3));
        assert_eq!((head, tail), ([2, 3], [20, 21, 22]));
        // A head claiming more than the tail given, or than fits, is cut to what there is.
        assert!(ring.push(&[3, 99], &[30]));
        assert_eq!(ring.pop(&mut head, &mut tail), Some(3));
        assert_eq!(tail[0], 30);
    }

    #[test]
    fn discard_drops_finished_and_unfinished_entries() {
        let ring = Ring::<4, 4, 3>::new();
        assert!(push(&ring, 1));
        assert!(push(&ring, 2));
        assert_eq!(pop(&ring), Some(1));
        // A producer that claimed a slot and never filled it (a thread missing in a forked
        // child): the consumer stops there for good.
        ring.enqueue.fetch_add(1, Ordering::Relaxed);
        assert!(push(&ring, 3));
        assert_eq!(pop(&ring), Some(2));
        assert_eq!(pop(&ring), None);
        ring.discard();
        assert_eq!(pop(&ring), None);
        for lap in 0..2u64 {
            for i in 0..4 {
                assert!(push(&ring, 10 * lap + i), "every slot is free again");
            }
            assert!(!push(&ring, 99));
            for i in 0..4 {
                assert_eq!(pop(&ring), Some(10 * lap + i));
            }
        }
    }

    #[test]
    fn concurrent_producers_lose_nothing_they_were_told_was_kept() {
        let ring = Arc::new(Ring::<1024, 4, 3>::new());
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let ring = Arc::clone(&ring);
                std::thread::spawn(move || {
                    let mut kept = 0u64;
                    for i in 0..20_000u64 {
                        if push(&ring, t << 32 | i) {
                            kept += 1;
                        }
                    }
                    kept
                })
            })
            .collect();
        let mut seen = 0u64;
        let mut last = [None::<u64>; 4];
        let mut kept = 0u64;
        let mut done = false;
        while !done {
            done = producers.iter().all(|p| p.is_finished());
            while let Some(n) = pop(&ring) {
                let (t, i) = ((n >> 32) as usize, n & 0xffff_ffff);
                assert!(last[t].is_none_or(|prev| prev < i), "per-thread order kept");
                last[t] = Some(i);
                seen += 1;
            }
        }
        for p in producers {
            kept += p.join().expect("producer");
        }
        assert_eq!(seen, kept);
    }
}
