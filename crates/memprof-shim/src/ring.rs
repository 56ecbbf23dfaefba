//! Preallocated, bounded, lock-free queues of entries; producers never block and never allocate
//! (a full queue makes `push` return false), and the single consumer is whoever holds the writer
//! lock.
//!
//! `Ring` takes many producers (Vyukov's bounded queue): the shared spill of `buffers.rs`. `Spsc`
//! takes one producer (one thread's buffer) and stores entries back to back, so an entry without
//! a tail takes only its head's words.
//!
//! An entry is a head of `H` words, whose last word counts the words of its tail (at most `T`).
//! In `Ring`, heads sit next to their sequence numbers; tails live in a separate array, so an
//! entry without a tail touches as little memory as a queue of heads alone would (the ring is
//! larger than the caches: every slot touched is a miss).

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

    /// Whether every entry producers have started to add was taken (none is half written).
    /// The consumer's question.
    pub fn is_drained(&self) -> bool {
        self.enqueue.load(Ordering::SeqCst) == self.dequeue.load(Ordering::Relaxed)
    }
}

impl<const N: usize, const H: usize, const T: usize> Default for Ring<N, H, T> {
    fn default() -> Ring<N, H, T> {
        Ring::new()
    }
}

/// Aligns its content to a cache line of its own, so the producer's and the consumer's indices
/// do not share one.
#[repr(align(64))]
struct Line<T>(T);

/// A single-producer, single-consumer queue of variable-length entries in `W` words.
pub struct Spsc<const W: usize, const H: usize, const T: usize> {
    words: [AtomicU64; W],
    /// The producer's: words published so far (a running count, not wrapped).
    written: Line<AtomicU64>,
    /// The producer's copy of `read`: it may write up to `W` words past it before it looks at
    /// `read` again.
    seen_read: AtomicU64,
    /// The consumer's: words taken so far.
    read: Line<AtomicU64>,
}

impl<const W: usize, const H: usize, const T: usize> Spsc<W, H, T> {
    /// `W` must be a power of two that holds the longest entry, `H` at least 1.
    pub const fn new() -> Spsc<W, H, T> {
        assert!(W.is_power_of_two() && H > 0 && H + T <= W);
        Spsc {
            words: [const { AtomicU64::new(0) }; W],
            written: Line(AtomicU64::new(0)),
            // All zero: the queues live in .bss, not in the library file.
            seen_read: AtomicU64::new(0),
            read: Line(AtomicU64::new(0)),
        }
    }

    /// Adds an entry; false when it does not fit. Only one producer at a time. `head[H - 1]` is
    /// the tail's length: only that many words of `tail` are kept.
    pub fn push(&self, head: &[u64; H], tail: &[u64]) -> bool {
        let kept = (head[H - 1] as usize).min(T).min(tail.len());
        let start = self.written.0.load(Ordering::Relaxed);
        let end = start + (H + kept) as u64;
        if end > self.seen_read.load(Ordering::Relaxed) + W as u64 {
            let read = self.read.0.load(Ordering::Acquire);
            self.seen_read.store(read, Ordering::Relaxed);
            if end > read + W as u64 {
                return false;
            }
        }
        let word = |i: usize| &self.words[(start as usize + i) & (W - 1)];
        for (i, &value) in head[..H - 1].iter().enumerate() {
            word(i).store(value, Ordering::Relaxed);
        }
        // The stored length is what was kept.
        word(H - 1).store(kept as u64, Ordering::Relaxed);
        for (i, &value) in tail[..kept].iter().enumerate() {
            word(H + i).store(value, Ordering::Relaxed);
        }
        self.written.0.store(end, Ordering::Release);
        true
    }

    /// Drops every entry published so far. Only where no other thread can push or pop: in a
    /// forked child (`fork.rs`), whose entries are the parent's.
    pub fn discard(&self) {
        let written = self.written.0.load(Ordering::Relaxed);
        self.read.0.store(written, Ordering::Relaxed);
        self.seen_read.store(written, Ordering::Relaxed);
    }

    /// Takes every entry published so far, oldest first, handing each head and tail to `take`;
    /// returns how many. Only one consumer at a time (the caller holds the writer lock).
    pub fn pop_all(&self, mut take: impl FnMut(&[u64; H], &[u64])) -> usize {
        let mut at = self.read.0.load(Ordering::Relaxed);
        let end = self.written.0.load(Ordering::Acquire);
        let (mut head, mut tail) = ([0u64; H], [0u64; T]);
        let mut count = 0;
        while at < end {
            for (value, i) in head.iter_mut().zip(at..) {
                *value = self.words[i as usize & (W - 1)].load(Ordering::Relaxed);
            }
            let len = (head[H - 1] as usize).min(T);
            let from = at + H as u64;
            for (value, i) in tail[..len].iter_mut().zip(from..) {
                *value = self.words[i as usize & (W - 1)].load(Ordering::Relaxed);
            }
            take(&head, &tail[..len]);
            at = from + len as u64;
            count += 1;
        }
        self.read.0.store(at, Ordering::Release);
        count
    }
}

impl<const W: usize, const H: usize, const T: usize> Default for Spsc<W, H, T> {
    fn default() -> Spsc<W, H, T> {
        Spsc::new()
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
        assert!(ring.is_drained());
        assert!(push(&ring, 7));
        assert!(!ring.is_drained());
        assert_eq!(pop(&ring), Some(7));
        assert!(ring.is_drained());
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

    /// An entry of `Spsc`: head n, !n, tail length `n % 5`; tail n + 1, n + 2, ...
    fn push_spsc<const W: usize>(ring: &Spsc<W, 3, 3>, n: u64) -> bool {
        let tail: Vec<u64> = (1..=n % 5).map(|i| n + i).collect();
        ring.push(&[n, !n, n % 5], &tail)
    }

    /// Pops the entries of `push_spsc`'s shape and returns their n.
    fn pop_spsc<const W: usize>(ring: &Spsc<W, 3, 3>) -> Vec<u64> {
        let mut out = Vec::new();
        ring.pop_all(|head, tail| {
            let n = head[0];
            assert_eq!(head[1], !n, "torn head");
            // A tail of 4 words was cut to the 3 that fit.
            let want: Vec<u64> = (1..=(n % 5).min(3)).map(|i| n + i).collect();
            assert_eq!(tail, want, "tail of {n}");
            out.push(n);
        });
        out
    }

    #[test]
    fn spsc_keeps_entries_of_any_length_in_order_and_refuses_what_does_not_fit() {
        let ring = Spsc::<16, 3, 3>::new();
        assert!(pop_spsc(&ring).is_empty());
        let mut next = 0u64;
        for _ in 0..20 {
            // Fill it, wrapping around the end, then take everything.
            let mut kept = Vec::new();
            while push_spsc(&ring, next) {
                kept.push(next);
                next += 1;
            }
            assert!(!kept.is_empty());
            assert_eq!(pop_spsc(&ring), kept);
            // The refused entry fits now.
            assert!(push_spsc(&ring, next));
            assert_eq!(pop_spsc(&ring), [next]);
            next += 1;
        }
    }

    #[test]
    fn spsc_hands_over_every_entry_between_threads() {
        let ring = Arc::new(Spsc::<64, 3, 3>::new());
        let producer = {
            let ring = Arc::clone(&ring);
            std::thread::spawn(move || {
                for n in 0..50_000u64 {
                    while !push_spsc(&ring, n) {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let mut seen = Vec::new();
        while seen.len() < 50_000 {
            seen.extend(pop_spsc(&ring));
        }
        producer.join().expect("producer");
        assert!(seen.iter().copied().eq(0..50_000));
    }
}
