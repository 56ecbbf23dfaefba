//! The binary's allocator: the system allocator, with large blocks marked for transparent huge
//! pages, so the hundreds of megabytes of rows and memo a big snapshot fills cost one page
//! fault per 2 MiB instead of one per 4 KiB.
//!
//! Measured on a 117 MB generated snapshot (`benches/compare_python.sh`): about 32,000 page
//! faults and 17% of `analyze`'s CPU time went to faulting in 4 KiB pages; with the hint, about
//! 5,600 faults, and peak RSS within 4% of before. Hand-written because it is one `madvise`
//! call around `System`; allocator crates that do this (mimalloc, jemalloc) also change how
//! small blocks are kept, which raised peak RSS to twice the file's size in the same test.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether large blocks get the hint; `MEMPROF_HUGE_PAGES=0` turns it off (see `configure`).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Reads `MEMPROF_HUGE_PAGES` once at start-up: `0` turns the hint off. The kernel backs
/// hinted memory with huge pages only when it can; where huge pages must first be made by
/// compaction (a machine whose memory is fragmented and whose `defrag` setting is `madvise`),
/// faulting them in can cost more than it saves.
pub fn configure() {
    if std::env::var_os("MEMPROF_HUGE_PAGES").is_some_and(|v| v == "0") {
        ENABLED.store(false, Ordering::Relaxed);
    }
}

/// Blocks at least this large get the hint; smaller ones never span a whole huge page.
const HINT_FROM_BYTES: usize = 4 << 20;

/// The base page size on x86_64 and on aarch64 as Linux distributions configure it.
const BASE_PAGE: usize = 4 << 10;

/// `System`, plus `madvise(MADV_HUGEPAGE)` on the pages of large blocks.
/// The hint never changes what memory holds; where the kernel has huge pages off (or the call
/// fails), nothing changes at all.
pub struct HugePageHint;

#[cfg(target_os = "linux")]
fn hint(ptr: *mut u8, size: usize) {
    if ptr.is_null() || size < HINT_FROM_BYTES || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    // Whole base pages, from the one holding the block's first byte: advising only the
    // huge-page-aligned interior would split the block's mapping in three, and glibc's
    // `realloc` could then no longer `mremap` it and would copy instead.
    let first = ptr as usize / BASE_PAGE * BASE_PAGE;
    let last = (ptr as usize + size).next_multiple_of(BASE_PAGE);
    // SAFETY: [first, last) are the pages holding the block the allocator just handed out
    // (and possibly its neighbours' bytes in the first and last page); MADV_HUGEPAGE only
    // changes how the kernel backs those pages, never their contents, and its result (e.g.
    // EINVAL with huge pages compiled out) is ignorable.
    unsafe {
        libc::madvise(
            first as *mut libc::c_void,
            last - first,
            libc::MADV_HUGEPAGE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn hint(_ptr: *mut u8, _size: usize) {}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and returns
// its result; `hint` only advises the kernel about pages of the returned block.
unsafe impl GlobalAlloc for HugePageHint {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `alloc`'s contract, which we pass on as is.
        let ptr = unsafe { System.alloc(layout) };
        hint(ptr, layout.size());
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        hint(ptr, layout.size());
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller passes a block from this allocator, i.e. from `System`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller upholds `realloc`'s contract, which we pass on as is.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        hint(new, new_size);
        new
    }
}
