//! Native call stacks in the hook: a bounded frame-pointer walk of the calling thread's stack.
//!
//! Why frame pointers and not `_Unwind_Backtrace` (libgcc, found with `dlsym`): the unwinder
//! takes the loader's lock (`dl_iterate_phdr`) and may allocate on its first use in a library,
//! so it can block or re-enter the allocator on the hot path; a frame-pointer walk reads a few
//! words per frame (tens of ns for 30 frames) and cannot block. Its failure modes: code built
//! without frame pointers (`-fomit-frame-pointer`, the default of optimized C and C++, including
//! the CUDA runtime and most PyTorch builds) hides its own frame and may end the walk early or
//! skip frames; the walk then stops at the first frame pointer that is not plausible (below the
//! previous one, outside the thread's stack, misaligned), so it never reads outside the stack,
//! but a stack can be short or, through a frame whose register happened to hold a stack address,
//! hold a wrong frame. The shim itself is built with frame pointers (`.cargo/config.toml`): its
//! hooks need a frame for the walk to find the function that called the driver.
//!
//! The thread's stack bounds are looked up once per thread, on its first recorded allocation
//! (`pthread_getattr_np`, which allocates and, in the main thread, reads `/proc/self/maps`);
//! after that the walk neither allocates nor makes a system call.

use std::cell::Cell;

/// The most return addresses kept per stack (the outermost frames are cut).
pub const MAX_DEPTH: usize = 32;

thread_local! {
    /// This thread's stack, `(low, high)`; `(0, 0)` before the lookup, `(1, 0)` when it failed.
    static BOUNDS: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// `(low, high)` of the calling thread's stack, looked up once per thread.
fn bounds() -> Option<(usize, usize)> {
    let known = BOUNDS.try_with(Cell::get).ok()?;
    let (low, high) = if known == (0, 0) {
        let found = lookup_bounds().unwrap_or((1, 0));
        let _ = BOUNDS.try_with(|b| b.set(found));
        found
    } else {
        known
    };
    (low < high).then_some((low, high))
}

fn lookup_bounds() -> Option<(usize, usize)> {
    // SAFETY: all-zero is a valid bit pattern for pthread_attr_t, which pthread_getattr_np
    // initializes before use.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: `attr` is writable; pthread_self is the calling thread.
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut attr) } != 0 {
        return None;
    }
    let mut base: *mut libc::c_void = std::ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: `attr` was initialized by pthread_getattr_np; `base` and `size` are writable.
    let rc = unsafe { libc::pthread_attr_getstack(&attr, &mut base, &mut size) };
    // SAFETY: `attr` was initialized above and is destroyed once.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    (rc == 0).then(|| (base as usize, (base as usize).saturating_add(size)))
}

/// The frame pointer of the calling function.
#[inline(always)]
fn frame_pointer() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let fp: usize;
        // SAFETY: reads a register; touches no memory, stack or flags.
        unsafe {
            std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags))
        };
        Some(fp)
    }
    #[cfg(target_arch = "aarch64")]
    {
        let fp: usize;
        // SAFETY: reads a register; touches no memory, stack or flags.
        unsafe {
            std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags))
        };
        Some(fp)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// Fills `out` with the return addresses of the calling thread, innermost first (the shim's own
/// frames included: the writer drops them); returns how many. 0 when the walk is not possible.
#[inline(never)]
pub fn capture(out: &mut [u64; MAX_DEPTH]) -> usize {
    let Some((low, high)) = bounds() else {
        return 0;
    };
    let Some(mut fp) = frame_pointer() else {
        return 0;
    };
    // Frames below this function's are not part of the walk.
    let here = &low as *const usize as usize;
    let mut floor = here.max(low);
    let mut depth = 0;
    while depth < MAX_DEPTH {
        // A frame record is two words: the caller's frame pointer, then the return address.
        let plausible =
            fp >= floor && fp % 8 == 0 && fp.checked_add(16).is_some_and(|end| end <= high);
        if !plausible {
            break;
        }
        let record = fp as *const usize;
        // SAFETY: `fp .. fp + 16` lies inside this thread's stack (checked above), which is
        // mapped and readable for the thread's whole life.
        let (next, ret) = unsafe { (record.read(), record.add(1).read()) };
        if ret == 0 {
            break;
        }
        out[depth] = ret as u64;
        depth += 1;
        // The next record must be further up the stack, or the walk would loop.
        floor = fp + 16;
        fp = next;
    }
    depth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn inner(out: &mut [u64; MAX_DEPTH]) -> usize {
        std::hint::black_box(capture(out))
    }

    #[inline(never)]
    fn outer(out: &mut [u64; MAX_DEPTH]) -> usize {
        std::hint::black_box(inner(out))
    }

    #[test]
    fn the_walk_sees_its_callers_and_stays_bounded() {
        let mut out = [0u64; MAX_DEPTH];
        let depth = outer(&mut out);
        // capture's return into inner, inner's into outer, outer's into this test at least.
        assert!(depth >= 3, "depth {depth}");
        let inner_at = inner as fn(&mut [u64; MAX_DEPTH]) -> usize as usize as u64;
        let outer_at = outer as fn(&mut [u64; MAX_DEPTH]) -> usize as usize as u64;
        // Return addresses lie just after the call, inside the calling function.
        assert!(
            out[0] > inner_at && out[0] < inner_at + 256,
            "{:#x}",
            out[0]
        );
        assert!(
            out[1] > outer_at && out[1] < outer_at + 256,
            "{:#x}",
            out[1]
        );
        assert!(out[..depth].iter().all(|&a| a != 0));
    }

    #[test]
    fn every_thread_has_its_own_bounds() {
        let main = bounds();
        let other = std::thread::spawn(bounds).join().expect("thread");
        let (Some(main), Some(other)) = (main, other) else {
            panic!("bounds not found: {main:?} {other:?}");
        };
        assert_ne!(main, other);
        let here = &main as *const _ as usize;
        assert!(main.0 <= here && here < main.1);
    }
}
