//! `_exit` and `_Exit` interposers: a program that ends with them skips `atexit`, which would
//! lose the events still in the ring and the trailer, so the shim flushes first (waiting at most
//! about 100 ms for the writer) and then calls the real function with the same status.
//!
//! `exit()` reaches glibc's `_exit` without going through these symbols, so a normal exit is
//! flushed by the `atexit` handler alone.

use crate::recorder::flush_before_exit;
use std::ffi::{c_int, CStr};

type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// # Safety
/// Same contract as libc's `_exit`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    flush_before_exit();
    // SAFETY: forwards to the next `_exit` with the caller's status.
    unsafe { next_exit(c"_exit", status) }
}

/// # Safety
/// Same contract as libc's `_Exit`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    flush_before_exit();
    // SAFETY: as above.
    unsafe { next_exit(c"_Exit", status) }
}

/// Calls the next definition of `name`, or ends the process with the system call when there
/// is none.
unsafe fn next_exit(name: &CStr, status: c_int) -> ! {
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT looks past this library.
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
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
