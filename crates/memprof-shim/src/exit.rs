//! `_exit` and `_Exit` interposers: a program that ends with them skips `atexit`, which would
//! lose the events still in the buffers and the trailer, so the shim flushes first (waiting at most
//! about 100 ms for the writer) and then calls the real function with the same status.
//!
//! `exit()` reaches glibc's `_exit` without going through these symbols, so a normal exit is
//! flushed by the `atexit` handler alone.
//!
//! `_exit` is async-signal-safe and programs call it from signal handlers. The flush takes no
//! lock it could wait on forever (the writer lock is only tried), looks nothing up (the next
//! `_exit` is resolved at load time) and leaves the live socket's bookkeeping alone. One risk
//! remains: the flush may allocate (a call stack not seen before goes into the writer's stack
//! table; the writer's buffers grow when more events wait than they held before), so an `_exit`
//! from a handler that interrupted `malloc` could block in the allocator. Without the shim the
//! same program would not.

use crate::recorder::flush_before_exit;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// The next `_exit` and `_Exit` (libc's), looked up when the shim is loaded: at exit time a
/// `dlsym` would take the loader's lock, which a signal handler or a `vfork` child (Python's
/// subprocess ends its failed children with `_exit`) must not wait for. 0: none found.
static NEXT_EXIT: AtomicUsize = AtomicUsize::new(0);
static NEXT_UNDERSCORE_EXIT: AtomicUsize = AtomicUsize::new(0);

/// Looks up the next `_exit` and `_Exit`; called once from the shim's constructor.
pub fn resolve() {
    for (name, slot) in [(c"_exit", &NEXT_EXIT), (c"_Exit", &NEXT_UNDERSCORE_EXIT)] {
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT looks past this library; called from the
        // constructor, where the loader allows dlsym.
        let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        slot.store(next, Ordering::Release);
    }
}

/// # Safety
/// Same contract as libc's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    flush_before_exit();
    // SAFETY: forwards to the next `_exit` with the caller's status.
    unsafe { next_exit(&NEXT_EXIT, status) }
}

/// # Safety
/// Same contract as libc's `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    flush_before_exit();
    // SAFETY: as above.
    unsafe { next_exit(&NEXT_UNDERSCORE_EXIT, status) }
}

/// Calls the next definition resolved into `slot`, or ends the process with the system call
/// when there is none.
unsafe fn next_exit(slot: &AtomicUsize, status: c_int) -> ! {
    let next = slot.load(Ordering::Acquire);
    if next != 0 {
        // SAFETY: the next definition of `_exit` / `_Exit` has this signature.
        let next = unsafe { std::mem::transmute::<usize, ExitFn>(next) };
        // SAFETY: the caller's status, unchanged.
        unsafe { next(status) }
    }
    loop {
        // SAFETY: exit_group takes the status and does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}
