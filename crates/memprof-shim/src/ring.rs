//! A preallocated, bounded, lock-free multi-producer queue of fixed-size entries of `W` words
//! (Vyukov's bounded queue). Producers never block and never allocate: a full queue makes `push`
//! return false. The single consumer is whoever holds the writer lock.

use std::sync::atomic::{AtomicU64, Ordering};

struct Slot<const W: usize> {
    /// Sequence number, stored minus the slot's index so that all-zero is the initial state.
    seq: AtomicU64,
    words: [AtomicU64; W],
}

impl<const W: usize> Slot<W> {
    const fn new() -> Slot<W> {
        Slot {
            seq: AtomicU64::new(0),
            words: [const { AtomicU64::new(0) }; W],
        }
    }
}

pub struct Ring<const N: usize, const W: usize> {
    slots: [Slot<W>; N],
    enqueue: AtomicU64,
    /// Only the consumer moves it.
    dequeue: AtomicU64,
}

impl<const N: usize, const W: usize> Ring<N, W> {
    /// `N` must be a power of two.
    pub const fn new() -> Ring<N, W> {
        assert!(N.is_power_of_two());
        Ring {
            slots: [const { Slot::new() }; N],
            enqueue: AtomicU64::new(0),
            dequeue: AtomicU64::new(0),
        }
    }

    fn slot(&self, pos: u64) -> (&Slot<W>, u64) {
        let index = (pos as usize) & (N - 1);
        (&self.slots[index], index as u64)
    }

    /// Adds an entry: `words` (at most `W`) fill the slot from its start; the rest keep what an
    /// earlier entry left there (the entry must say how much of it counts). False when full.
    pub fn push(&self, words: &[u64]) -> bool {
        let mut pos = self.enqueue.load(Ordering::Relaxed);
        loop {
            let (slot, index) = self.slot(pos);
            let seq = slot.seq.load(Ordering::Acquire).wrapping_add(index);
            let diff = seq.wrapping_sub(pos) as i64;
            if diff == 0 {
                match self.enqueue.compare_exchange_weak(
                    pos,
                    pos.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        for (word, &value) in slot.words.iter().zip(words) {
                            word.store(value, Ordering::Relaxed);
                        }
                        slot.seq
                            .store(pos.wrapping_add(1).wrapping_sub(index), Ordering::Release);
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

    /// Takes the oldest entry. Only one consumer at a time (the caller holds the writer lock).
    pub fn pop(&self) -> Option<[u64; W]> {
        let pos = self.dequeue.load(Ordering::Relaxed);
        let (slot, index) = self.slot(pos);
        let seq = slot.seq.load(Ordering::Acquire).wrapping_add(index);
        if seq != pos.wrapping_add(1) {
            return None;
        }
        let mut out = [0u64; W];
        for (word, value) in slot.words.iter().zip(out.iter_mut()) {
            *value = word.load(Ordering::Relaxed);
        }
        slot.seq.store(
            pos.wrapping_add(N as u64).wrapping_sub(index),
            Ordering::Release,
        );
        self.dequeue.store(pos.wrapping_add(1), Ordering::Relaxed);
        Some(out)
    }
}

impl<const N: usize, const W: usize> Default for Ring<N, W> {
    fn default() -> Ring<N, W> {
        Ring::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn record(n: u64) -> [u64; 8] {
        let mut out = [n; 8];
        out[7] = !n;
        out
    }

    fn number(record: &[u64; 8]) -> u64 {
        assert_eq!(record[7], !record[0], "torn record");
        record[0]
    }

    #[test]
    fn fifo_and_full() {
        let ring = Ring::<4, 8>::new();
        assert!(ring.pop().is_none());
        for lap in 0..3u64 {
            for i in 0..4 {
                assert!(ring.push(&record(lap * 10 + i)));
            }
            assert!(!ring.push(&record(99)), "a full ring refuses");
            for i in 0..4 {
                assert_eq!(ring.pop().map(|r| number(&r)), Some(lap * 10 + i));
            }
            assert!(ring.pop().is_none());
        }
    }

    #[test]
    fn concurrent_producers_lose_nothing_they_were_told_was_kept() {
        let ring = Arc::new(Ring::<1024, 8>::new());
        let producers: Vec<_> = (0..4u64)
            .map(|t| {
                let ring = Arc::clone(&ring);
                std::thread::spawn(move || {
                    let mut kept = 0u64;
                    for i in 0..20_000u64 {
                        if ring.push(&record(t << 32 | i)) {
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
            while let Some(r) = ring.pop() {
                let n = number(&r);
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
