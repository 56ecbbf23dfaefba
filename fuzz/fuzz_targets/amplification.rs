//! Fuzzes for amplification: a snapshot that makes memprof hold or work more than its stated
//! bound per input byte. The snapshot reader charges what it copies out of the pickle against
//! `torch_snapshot::PER_INPUT_BYTE` bytes per byte plus `torch_snapshot::FLOOR`
//! (src/source/torch_snapshot/budget.rs); this target counts the heap in use at its peak while
//! reading and analyzing each input, with the decoder's arena and the analysis on top of the
//! model, and fails when it passes `HELD_PER_BYTE` bytes per input byte plus the floor, or
//! when the work takes longer than `TIME_PER_BYTE` per byte plus `TIME_FLOOR`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::source::torch_snapshot::{self, FLOOR, PER_INPUT_BYTE};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The model's bound, doubled for the decoder's arena and doubled again for the analysis.
const HELD_PER_BYTE: u64 = 4 * PER_INPUT_BYTE;
/// Generous for a debug-assertions build on a shared core: linear work stays far below it.
const TIME_PER_BYTE: Duration = Duration::from_micros(200);
const TIME_FLOOR: Duration = Duration::from_secs(2);

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes in use and their peak.
struct Counting;

// SAFETY: every call is passed to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        q
    }
}

fn grew(bytes: usize) {
    let now = IN_USE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fuzz_target!(|data: &[u8]| {
    let before = IN_USE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let start = Instant::now();
    if let Ok(parsed) = torch_snapshot::read(data) {
        let _ = memprof::analysis::analyze_snapshot(&parsed.snapshot, 10, None);
    }
    let took = start.elapsed();
    let held = PEAK.load(Ordering::Relaxed).saturating_sub(before) as u64;
    let bytes = data.len() as u64;
    let bound = bytes * HELD_PER_BYTE + FLOOR;
    assert!(
        held <= bound,
        "{bytes} input bytes made memprof hold {held} bytes, past {bound}"
    );
    let time_bound = TIME_FLOOR + TIME_PER_BYTE * data.len() as u32;
    assert!(
        took <= time_bound,
        "{bytes} input bytes took {took:?}, past {time_bound:?}"
    );
});
