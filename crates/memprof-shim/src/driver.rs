//! Finds the real driver function a hook forwards to, however the driver was loaded.
//!
//! First `dlsym(RTLD_NEXT)`: the next definition in the global scope, what the caller would have
//! bound to without the shim when the driver is global (a program linked against it, or
//! `dlopen(RTLD_GLOBAL)`). A library loaded with `dlopen(RTLD_LOCAL)` (a Python extension
//! module, a `ctypes` library) that links `libcuda.so.1` has the driver in its local scope only;
//! its calls still bind to the shim's exports (the global scope comes first), and `RTLD_NEXT`
//! cannot see that driver. Then the driver is found by its name: `dlopen("libcuda.so.1",
//! RTLD_NOLOAD)` (which matches a loaded driver by its soname, whatever its path) and a lookup on
//! that handle, which is what the caller's own scope holds. Only when no `libcuda.so.1` is
//! loaded at all is it loaded (`RTLD_LAZY | RTLD_LOCAL`), as the program would get by loading
//! it. The handle is kept (so the driver is never unloaded under a cached pointer).
//!
//! Lookups on the handle go to the real `dlsym`, never through the shim's own `dlsym`
//! interposer (`dlsym.rs`), which would hand back the shim's wrappers instead of the driver. A
//! driver call made while the driver is being opened (by a constructor it runs) finds only what
//! `RTLD_NEXT` finds, so opening never recurses. When no driver defines the function, the hook
//! returns `CUDA_ERROR_NOT_FOUND`: without the shim, no call could have been bound to it.

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The handle of the driver found by name, once opened (0 before).
static DRIVER: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread is opening the driver: a driver call made meanwhile (by a constructor,
    /// or another library's `dlopen` interposer) does not open it again.
    static OPENING: Cell<bool> = const { Cell::new(false) };
}

/// The real definition of driver function `name`, or 0 when no driver defines it. `ours` is the
/// shim's own export of that name, never returned.
pub fn lookup(name: &CStr, ours: usize) -> usize {
    // SAFETY: `name` is a NUL-terminated string; RTLD_NEXT looks past this library (the
    // exported `dlsym` hands RTLD_NEXT to the real one with this library as the caller).
    let next = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    if next != 0 && next != ours {
        return next;
    }
    if OPENING
        .try_with(|opening| opening.replace(true))
        .unwrap_or(true)
    {
        return 0;
    }
    let found = driver().map_or(0, |driver| real_dlsym(driver, name));
    let _ = OPENING.try_with(|opening| opening.set(false));
    if found == ours {
        0
    } else {
        found
    }
}

/// The driver's handle: the loaded `libcuda.so.1`, or the one loading it gives.
fn driver() -> Option<*mut c_void> {
    let cached = DRIVER.load(Ordering::Acquire);
    if cached != 0 {
        return Some(cached as *mut c_void);
    }
    let name = c"libcuda.so.1";
    // SAFETY: `name` is NUL-terminated; RTLD_NOLOAD only finds an object already loaded.
    let mut handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
    if handle.is_null() {
        // SAFETY: as above; loads the driver in a scope of its own, as a dlopen of it would.
        handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    }
    if handle.is_null() {
        return None;
    }
    // Two threads may both open it: the extra reference only keeps the driver loaded.
    DRIVER.store(handle as usize, Ordering::Release);
    Some(handle)
}

/// `dlsym(handle, name)` by glibc itself.
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(test)))]
fn real_dlsym(handle: *mut c_void, name: &CStr) -> usize {
    crate::dlsym::real(handle, name)
}

/// `dlsym(handle, name)` by glibc itself (no interposer is built here).
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(test))))]
fn real_dlsym(handle: *mut c_void, name: &CStr) -> usize {
    // SAFETY: `handle` came from dlopen and is never closed; `name` is NUL-terminated.
    unsafe { libc::dlsym(handle, name.as_ptr()) as usize }
}
