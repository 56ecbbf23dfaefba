//! Where hooks put events: one buffer per thread, a shared spill, and the writer's merge of them
//! into one stream ordered by time.
//!
//! A thread claims one of `LANES` preallocated single-producer rings (`Spsc`, 512 KiB each,
//! touched as it fills) on its first event, with a compare-and-swap, and gives it back when it
//! exits (its thread-local destructor marks it released; the writer frees it once drained).
//! The events of threads without one (more than `LANES` at once, or a thread whose thread-locals
//! are gone) go to the shared spill (`Ring`, many producers). A thread whose ring (or the spill)
//! is full waits for the writer (`recorder::publish`). The writer takes everything from both
//! each round.
//!
//! Order: readers apply records in file order (an allocation at an address still held, or a free
//! of an address not held, counts as a lost record), so the writer merges by timestamp. Calls
//! that give memory back are stamped before they are made, the others after they return, so a
//! free comes before an allocation in another thread that gets its address back. An event is
//! written only once no thread can still publish an older one. A thread marks itself busy
//! before it reads the clock and clears the mark after it published the event; each round the
//! writer reads the clock (`now`), then for each lane reads the mark and then empties the ring.
//! A lane that was not busy can only publish events stamped after `now`; a busy one can publish
//! one stamped at or after the last it published. So entries older than the least of those
//! bounds (the floor) go out in time order, the rest wait for the next round. A thread without a
//! lane takes one of `MARKS` marks while it publishes and writes its event's time there, which
//! bounds the floor the same way; the floor does not move while a mark has no time yet, or while
//! a spill slot is taken and not yet written (the entries behind it may be older). A thread held
//! inside the hook for longer than `STALE_NS` (stopped, starved of CPU, or in a call that gives
//! memory back and takes that long: it is marked busy from its stamp on) no longer holds the
//! others back: the floor is at least `now - STALE_NS`, and an event of that thread published
//! later comes out of order. So does the oldest of more than `MAX_STAGED` waiting entries. The
//! final flush writes everything held.

use crate::ring::{Ring, Spsc};
use crate::stack::MAX_DEPTH;
use memprof_wire::RECORD_LEN;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Words of a record.
pub const RECORD_WORDS: usize = RECORD_LEN / 8;
/// Words of an entry's head: the record and the stack depth.
pub const HEAD_WORDS: usize = RECORD_WORDS + 1;
/// The head word holding the record's timestamp (bytes 8..16 of a record).
const TS_WORD: usize = 1;

/// Per-thread rings.
const LANES: usize = 64;
/// Words in each ring (512 KiB: 7,281 entries without a stack, 1,780 with 32 frames).
const LANE_WORDS: usize = 1 << 16;
/// Entries in the shared spill (344 bytes each: 5.4 MiB).
const SPILL_SLOTS: usize = 1 << 14;
/// How long a thread inside the hook may hold back the others' events.
const STALE_NS: u64 = 1_000_000_000;
/// Entries the writer holds back at most; beyond, the oldest go out.
const MAX_STAGED: usize = 1 << 18;

/// Lane states.
const FREE: u8 = 0;
const OWNED: u8 = 1;
/// Its thread has exited; freed once drained.
const RELEASED: u8 = 2;

struct Lane<const W: usize> {
    ring: Spsc<W, HEAD_WORDS, MAX_DEPTH>,
    owner: AtomicU8,
    /// Set while the owner is between reading the clock and publishing the event.
    busy: AtomicBool,
}

/// Marks of threads without a lane that are publishing: the time of their event, or `PENDING`
/// before they read the clock, or `UNMARKED`.
const MARKS: usize = 64;
const UNMARKED: u64 = 0;
const PENDING: u64 = u64::MAX;

/// Where a publishing thread is marked busy: its lane, or one of the marks.
#[derive(Clone, Copy)]
enum Mark {
    Lane(usize),
    Unpooled(usize),
}

/// The buffers: `L` lanes of `W` words and a spill of `S` entries.
pub struct Pool<const L: usize, const W: usize, const S: usize> {
    lanes: [Lane<W>; L],
    spill: Ring<S, HEAD_WORDS, MAX_DEPTH>,
    unpooled: [AtomicU64; MARKS],
}

impl<const L: usize, const W: usize, const S: usize> Pool<L, W, S> {
    pub const fn new() -> Pool<L, W, S> {
        Pool {
            lanes: [const {
                Lane {
                    ring: Spsc::new(),
                    owner: AtomicU8::new(FREE),
                    busy: AtomicBool::new(false),
                }
            }; L],
            spill: Ring::new(),
            unpooled: [const { AtomicU64::new(UNMARKED) }; MARKS],
        }
    }

    /// Claims a free lane for the calling thread.
    fn claim(&self) -> Option<usize> {
        self.lanes.iter().position(|lane| {
            lane.owner.load(Ordering::Relaxed) == FREE
                && lane
                    .owner
                    .compare_exchange(FREE, OWNED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
        })
    }

    /// Gives a claimed lane back; the writer frees it once it has taken what it holds.
    fn release(&self, lane: usize) {
        self.lanes[lane].owner.store(RELEASED, Ordering::Release);
    }

    /// Marks the thread of `lane` (`None`: a thread without one) busy; before it reads the clock.
    /// A thread without a lane takes a free mark, waiting for one if all are taken.
    fn begin(&self, lane: Option<usize>) -> Mark {
        if let Some(i) = lane {
            self.lanes[i].busy.store(true, Ordering::SeqCst);
            return Mark::Lane(i);
        }
        loop {
            let free = self.unpooled.iter().position(|mark| {
                mark.load(Ordering::Relaxed) == UNMARKED
                    && mark
                        .compare_exchange(UNMARKED, PENDING, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
            });
            if let Some(k) = free {
                return Mark::Unpooled(k);
            }
            // More threads without a lane are publishing than there are marks; each holds one
            // for the time it takes to publish.
            std::thread::yield_now();
        }
    }

    /// Tells the writer the time of the event a thread without a lane is publishing.
    fn stamped(&self, mark: Mark, ts: u64) {
        if let Mark::Unpooled(k) = mark {
            self.unpooled[k].store(ts.clamp(1, PENDING - 1), Ordering::Release);
        }
    }

    /// Clears the mark of `begin`, once the event is published (or given up).
    fn end(&self, mark: Mark) {
        match mark {
            Mark::Lane(i) => self.lanes[i].busy.store(false, Ordering::Release),
            Mark::Unpooled(k) => self.unpooled[k].store(UNMARKED, Ordering::Release),
        }
    }

    /// Publishes an entry in the thread's lane (the spill for a thread without one); false when
    /// it is full. A thread with a lane never spills: an entry of its in the spill could stay
    /// hidden there behind a slot another thread has taken and not yet written, while its later
    /// entries, in the lane, went out (the writer writes the oldest when too many wait), out of
    /// the thread's order.
    fn push(&self, lane: Option<usize>, head: &[u64; HEAD_WORDS], tail: &[u64]) -> bool {
        match lane {
            Some(i) => self.lanes[i].ring.push(head, tail),
            None => self.spill.push(head, tail),
        }
    }
}

impl<const L: usize, const W: usize, const S: usize> Default for Pool<L, W, S> {
    fn default() -> Pool<L, W, S> {
        Pool::new()
    }
}

static POOL: Pool<LANES, LANE_WORDS, SPILL_SLOTS> = Pool::new();

/// The lane of the thread inside `fork` (`NO_LANE` when it has none), noted before the fork for
/// the child, whose only thread it is.
static FORKING_LANE: AtomicU32 = AtomicU32::new(NO_LANE);

/// Before a `fork` whose child records (`fork.rs`): notes the forking thread's lane. May
/// allocate (a thread's first look at its lane registers the thread-local's destructor).
pub fn before_fork() {
    let lane = THREAD_LANE
        .try_with(|mine| mine.lane().map_or(NO_LANE, |lane| lane as u32))
        .unwrap_or(NO_LANE);
    FORKING_LANE.store(lane, Ordering::Relaxed);
}

/// In a forked child that records, from its fork handler: drops the parent's events still in
/// the buffers (the parent writes them), frees the lanes of the parent's other threads (they
/// do not exist here) and clears every busy mark, keeping the forking thread's lane, now empty.
/// Atomic stores only.
pub fn discard_in_child() {
    let forking = FORKING_LANE.load(Ordering::Relaxed) as usize;
    for (i, lane) in POOL.lanes.iter().enumerate() {
        lane.ring.discard();
        lane.busy.store(false, Ordering::Relaxed);
        let owner = if i == forking { OWNED } else { FREE };
        lane.owner.store(owner, Ordering::Release);
    }
    for mark in &POOL.unpooled {
        mark.store(UNMARKED, Ordering::Relaxed);
    }
    POOL.spill.discard();
}

/// The lane of the calling thread, claimed on its first event.
struct ThreadLane(Cell<u32>);

/// `ThreadLane` before the thread's first event.
const UNCLAIMED: u32 = u32::MAX;
/// `ThreadLane` of a thread that found every lane taken.
const NO_LANE: u32 = u32::MAX - 1;

impl Drop for ThreadLane {
    fn drop(&mut self) {
        if let Some(lane) = self.lane() {
            POOL.release(lane);
        }
    }
}

impl ThreadLane {
    fn lane(&self) -> Option<usize> {
        let lane = self.0.get();
        (lane < NO_LANE).then_some(lane as usize)
    }
}

thread_local! {
    static THREAD_LANE: ThreadLane = const { ThreadLane(Cell::new(UNCLAIMED)) };
}

/// The calling thread's lane; claimed on its first call (which registers the thread-local's
/// destructor: glibc allocates once). `None` when every lane is taken or the thread is exiting.
fn thread_lane() -> Option<usize> {
    THREAD_LANE
        .try_with(|mine| {
            if mine.0.get() == UNCLAIMED {
                let claimed = POOL.claim().map_or(NO_LANE, |lane| lane as u32);
                mine.0.set(claimed);
            }
            mine.lane()
        })
        .ok()
        .flatten()
}

/// A hook publishing one event: made before it reads the clock, dropped once it published.
pub struct Producing {
    lane: Option<usize>,
    mark: Mark,
}

impl Producing {
    pub fn begin() -> Producing {
        let lane = thread_lane();
        let mark = POOL.begin(lane);
        Producing { lane, mark }
    }

    /// Notes the event's time, `ts` (`CLOCK_MONOTONIC`, read after `begin`); returns it.
    pub fn stamped(&self, ts: u64) -> u64 {
        POOL.stamped(self.mark, ts);
        ts
    }

    /// Publishes the entry; false when the thread's lane (or, without one, the spill) is full.
    pub fn push(&self, head: &[u64; HEAD_WORDS], tail: &[u64]) -> bool {
        POOL.push(self.lane, head, tail)
    }
}

impl Drop for Producing {
    fn drop(&mut self) {
        POOL.end(self.mark);
    }
}

/// An entry the writer holds: where its words start in `Merge::words`.
#[derive(Clone, Copy)]
struct Staged {
    ts: u64,
    at: usize,
}

/// The writer's side: entries taken from the buffers and not yet written, in time order.
pub struct Merge<const L: usize> {
    /// The timestamp of the last entry taken from each lane.
    last: [u64; L],
    /// Entries older than this have been, or can be, written.
    floor: u64,
    /// In the order taken, which breaks ties of time (and keeps each thread's order).
    staged: Vec<Staged>,
    /// Each staged entry's head, then its tail.
    words: Vec<u64>,
    spare: Vec<u64>,
}

/// The merge of the process's buffers.
pub type Merged = Merge<LANES>;

impl<const L: usize> Merge<L> {
    pub const fn new() -> Merge<L> {
        Merge {
            last: [0; L],
            floor: 0,
            staged: Vec::new(),
            words: Vec::new(),
            spare: Vec::new(),
        }
    }

    fn stage(&mut self, head: &[u64; HEAD_WORDS], tail: &[u64]) -> u64 {
        let ts = head[TS_WORD];
        self.staged.push(Staged {
            ts,
            at: self.words.len(),
        });
        self.words.extend_from_slice(head);
        self.words.extend_from_slice(tail);
        ts
    }

    /// Every entry stamped before this has been handed out (or is late: `STALE_NS`).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Takes everything published in `pool` and moves the floor; `now` is `CLOCK_MONOTONIC`,
    /// read before. Returns how many entries it took.
    fn collect<const W: usize, const S: usize>(&mut self, pool: &Pool<L, W, S>, now: u64) -> usize {
        let mut floor = now;
        let mut taken = 0;
        for (i, lane) in pool.lanes.iter().enumerate() {
            let owner = lane.owner.load(Ordering::Acquire);
            if owner == FREE {
                continue;
            }
            let busy = lane.busy.load(Ordering::SeqCst);
            let mut last = self.last[i];
            taken += lane
                .ring
                .pop_all(|head, tail| last = self.stage(head, tail));
            self.last[i] = last;
            if busy {
                floor = floor.min(last);
            } else if owner == RELEASED {
                // Its thread is gone and what it published is taken.
                let _ = lane.owner.compare_exchange(
                    RELEASED,
                    FREE,
                    Ordering::Release,
                    Ordering::Relaxed,
                );
            }
        }
        // Threads without a lane: each can publish one event stamped at or after its mark (or,
        // before it read the clock, after the last floor).
        let mut frozen = false;
        for mark in &pool.unpooled {
            match mark.load(Ordering::SeqCst) {
                UNMARKED => {}
                PENDING => frozen = true,
                ts => floor = floor.min(ts),
            }
        }
        let (mut head, mut tail) = ([0u64; HEAD_WORDS], [0u64; MAX_DEPTH]);
        while let Some(len) = pool.spill.pop(&mut head, &mut tail) {
            self.stage(&head, &tail[..len]);
            taken += 1;
        }
        // A slot taken and not yet filled hides the entries after it, which may be older.
        if frozen || !pool.spill.is_drained() {
            floor = floor.min(self.floor);
        }
        self.floor = self.floor.max(floor).max(now.saturating_sub(STALE_NS));
        taken
    }

    /// Hands `write` the entries that can go out (all of them with `all`), oldest first.
    fn take(&mut self, all: bool, mut write: impl FnMut(&[u64; HEAD_WORDS], &[u64])) {
        // Stable, and quick on what it gets: sorted runs (each lane's, and what waited).
        self.staged.sort_by_key(|s| s.ts);
        let cut = if all {
            self.staged.len()
        } else {
            let floor = self.floor;
            let ready = self.staged.partition_point(|s| s.ts < floor);
            ready.max(self.staged.len().saturating_sub(MAX_STAGED))
        };
        let entry = |words: &[u64], at: usize| {
            let mut head = [0u64; HEAD_WORDS];
            head.copy_from_slice(&words[at..at + HEAD_WORDS]);
            let from = at + HEAD_WORDS;
            (head, from..from + head[HEAD_WORDS - 1] as usize)
        };
        for s in &self.staged[..cut] {
            let (head, tail) = entry(&self.words, s.at);
            write(&head, &self.words[tail]);
        }
        if cut == 0 {
            return;
        }
        self.staged.drain(..cut);
        // Keep only the waiting entries' words.
        self.spare.clear();
        for s in &mut self.staged {
            let (_, tail) = entry(&self.words, s.at);
            let from = s.at;
            s.at = self.spare.len();
            self.spare.extend_from_slice(&self.words[from..tail.end]);
        }
        std::mem::swap(&mut self.words, &mut self.spare);
    }
}

impl Merged {
    /// Takes what the threads published and hands `write` what can go out, oldest first (all
    /// of it with `all`: the final flush). `now`: `CLOCK_MONOTONIC`. Returns how many entries it
    /// took from the buffers. Only one caller at a time (the writer lock's holder).
    pub fn drain(
        &mut self,
        now: u64,
        all: bool,
        write: impl FnMut(&[u64; HEAD_WORDS], &[u64]),
    ) -> usize {
        let taken = self.collect(&POOL, now);
        self.take(all, write);
        taken
    }
}

impl<const L: usize> Default for Merge<L> {
    fn default() -> Merge<L> {
        Merge::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Small = Pool<2, 64, 4>;

    /// Publishes an entry stamped `ts` from `lane`, with a tail of `depth` words.
    fn push(pool: &Small, lane: Option<usize>, ts: u64, depth: usize) -> bool {
        let mut head = [0u64; HEAD_WORDS];
        head[TS_WORD] = ts;
        head[HEAD_WORDS - 1] = depth as u64;
        let tail: Vec<u64> = (0..depth as u64).map(|i| ts + i).collect();
        pool.push(lane, &head, &tail)
    }

    /// What a round writes: the timestamps, checking each tail.
    fn round(merge: &mut Merge<2>, pool: &Small, now: u64, all: bool) -> Vec<u64> {
        merge.collect(pool, now);
        let mut out = Vec::new();
        merge.take(all, |head, tail| {
            let ts = head[TS_WORD];
            assert_eq!(tail.len() as u64, head[HEAD_WORDS - 1]);
            assert!(tail.iter().zip(ts..).all(|(&w, i)| w == i), "tail of {ts}");
            out.push(ts);
        });
        out
    }

    #[test]
    fn an_event_waits_until_no_thread_can_publish_an_older_one() {
        let pool = Small::new();
        let mut merge = Merge::new();
        let (a, b) = (pool.claim(), pool.claim());
        assert!(a.is_some() && b.is_some() && a != b);
        // `a` read the clock (5) and has not published yet; `b` published 10 and 20.
        let busy_a = pool.begin(a);
        let busy_b = pool.begin(b);
        assert!(push(&pool, b, 10, 0) && push(&pool, b, 20, 2));
        pool.end(busy_b);
        assert_eq!(round(&mut merge, &pool, 30, false), [] as [u64; 0]);
        assert!(push(&pool, a, 5, 3));
        pool.end(busy_a);
        // `b` is idle: what it publishes next is stamped after 40.
        assert_eq!(round(&mut merge, &pool, 40, false), [5, 10, 20]);
        // Stamped after the round's clock: waits for the next round.
        let busy_b = pool.begin(b);
        assert!(push(&pool, b, 45, 0));
        pool.end(busy_b);
        assert_eq!(round(&mut merge, &pool, 44, false), [] as [u64; 0]);
        assert_eq!(round(&mut merge, &pool, 50, false), [45]);
    }

    #[test]
    fn a_busy_thread_holds_back_only_events_it_could_precede() {
        let pool = Small::new();
        let mut merge = Merge::new();
        let (a, b) = (pool.claim(), pool.claim());
        assert!(push(&pool, a, 10, 0));
        assert_eq!(round(&mut merge, &pool, 15, false), [10]);
        let busy_a = pool.begin(a);
        assert!(push(&pool, b, 12, 0) && push(&pool, b, 30, 0));
        // `a` was idle at 15, so its event is stamped after 15; 30 waits for it.
        assert_eq!(round(&mut merge, &pool, 40, false), [12]);
        assert!(push(&pool, a, 25, 0));
        pool.end(busy_a);
        assert_eq!(round(&mut merge, &pool, 50, false), [25, 30]);
    }

    #[test]
    fn threads_without_a_lane_hold_back_what_is_newer_than_their_event() {
        let pool = Small::new();
        let mut merge = Merge::new();
        let a = pool.claim();
        assert_eq!(pool.claim().map(|_| ()), Some(()));
        assert_eq!(pool.claim(), None, "two lanes, both taken");
        assert!(push(&pool, a, 10, 0));
        assert_eq!(round(&mut merge, &pool, 20, false), [10]);
        // Before it reads the clock, it holds the floor where it is.
        let unpooled = pool.begin(None);
        assert!(push(&pool, a, 22, 0));
        assert_eq!(round(&mut merge, &pool, 40, false), [] as [u64; 0]);
        // Stamped 25: older events go out, newer ones wait.
        pool.stamped(unpooled, 25);
        assert!(push(&pool, a, 30, 0));
        assert_eq!(round(&mut merge, &pool, 40, false), [22]);
        assert!(push(&pool, None, 25, 1));
        pool.end(unpooled);
        assert_eq!(round(&mut merge, &pool, 50, false), [25, 30]);
    }

    #[test]
    fn a_full_lane_waits_for_the_writer_and_never_spills() {
        let pool = Small::new();
        let mut merge = Merge::new();
        let a = pool.claim();
        // 64 words: seven 9-word heads fit; the next does not, and the spill (for threads
        // without a lane) stays empty.
        let kept: Vec<bool> = (0..9).map(|ts| push(&pool, a, ts, 0)).collect();
        assert_eq!(
            kept,
            [true, true, true, true, true, true, true, false, false]
        );
        assert!(pool.spill.is_drained());
        assert_eq!(
            round(&mut merge, &pool, 100, false),
            (0..7).collect::<Vec<_>>()
        );
        // Drained: room again.
        assert!(push(&pool, a, 101, 32));
        assert_eq!(round(&mut merge, &pool, 200, false), [101]);
    }

    #[test]
    fn a_stuck_thread_holds_the_others_back_for_a_bounded_time_and_the_final_flush_takes_all() {
        let pool = Small::new();
        let mut merge = Merge::new();
        let (a, b) = (pool.claim(), pool.claim());
        let _stuck = pool.begin(a);
        assert!(push(&pool, b, 1_000, 0) && push(&pool, b, 2_000, 0));
        assert_eq!(round(&mut merge, &pool, 3_000, false), [] as [u64; 0]);
        assert_eq!(round(&mut merge, &pool, 1_001 + STALE_NS, false), [1_000]);
        assert!(push(&pool, b, 3_000 + STALE_NS, 0));
        assert_eq!(
            round(&mut merge, &pool, 3_000 + STALE_NS, true),
            [2_000, 3_000 + STALE_NS]
        );
    }

    #[test]
    fn a_released_lane_is_claimed_again_once_drained() {
        let pool = Small::new();
        let mut merge = Merge::new();
        let (a, b) = (pool.claim(), pool.claim());
        assert!(push(&pool, a, 7, 0));
        pool.release(a.expect("a lane"));
        assert_eq!(pool.claim(), None, "not drained yet");
        assert_eq!(round(&mut merge, &pool, 10, false), [7]);
        assert_eq!(pool.claim(), a);
        assert_ne!(a, b);
    }
}
