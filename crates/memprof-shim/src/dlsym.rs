//! The `dlsym` interposer: programs that `dlopen` the driver and look functions up with
//! `dlsym(handle, ...)` (libcudart looks up `cuGetProcAddress_v2` that way; cudarc and NCCL look
//! up driver functions) bypass LD_PRELOAD, so the shim exports `dlsym` too.
//!
//! `dlsym` is an assembly trampoline (x86_64 only): `dlsym(RTLD_NEXT, ...)` tail-jumps to the
//! real `dlsym`, so glibc still sees the original caller's return address and resolves "next"
//! relative to the caller, not to this shim. Every other lookup goes through the real `dlsym`;
//! when it returns the driver's definition of a function this shim wraps, the caller gets the
//! shim's exported wrapper instead. Anything else is returned unchanged.

use crate::hooks::wrapper_for;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The real `dlsym`, resolved on first use.
static MEMPROF_SHIM_REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Finds the real `dlsym` (in libc since glibc 2.34, in libdl before) by version.
extern "C" fn memprof_shim_resolve_dlsym() -> usize {
    let cached = MEMPROF_SHIM_REAL_DLSYM.load(Ordering::Acquire);
    if cached != 0 {
        return cached;
    }
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: both strings are NUL-terminated; dlvsym is not interposed by this shim.
        let found =
            unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) } as usize;
        if found != 0 {
            MEMPROF_SHIM_REAL_DLSYM.store(found, Ordering::Release);
            return found;
        }
    }
    0
}

/// `dlsym(handle, name)` by the real `dlsym`, without this interposer's wrappers; 0 when it
/// is not found (or the real `dlsym` is not).
pub(crate) fn real(handle: *mut c_void, name: &CStr) -> usize {
    let real = memprof_shim_resolve_dlsym();
    if real == 0 {
        return 0;
    }
    // SAFETY: `real` is glibc's dlsym, which has this signature.
    let real = unsafe { std::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: the caller's handle and a NUL-terminated name.
    unsafe { real(handle, name.as_ptr()) as usize }
}

/// `dlsym` for every handle but `RTLD_NEXT`.
extern "C" fn memprof_shim_dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let real = memprof_shim_resolve_dlsym();
    if real == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: `real` is glibc's dlsym, which has this signature.
    let real = unsafe { std::mem::transmute::<usize, DlsymFn>(real) };
    // SAFETY: forwards the caller's arguments unchanged.
    let found = unsafe { real(handle, name) };
    if found.is_null() || name.is_null() {
        return found;
    }
    // SAFETY: dlsym found a symbol by this name, so it is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(name) };
    if !name.to_bytes().starts_with(b"cu") {
        return found;
    }
    match wrapper_for(name, found as usize) {
        Some(wrapper) => wrapper as *mut c_void,
        None => found,
    }
}

/// The exported `dlsym`: a trampoline, so that `dlsym(RTLD_NEXT, ...)` tail-jumps to the real
/// one with the caller's return address still on the stack.
///
/// # Safety
/// Same contract as glibc's `dlsym`.
// SAFETY: the body only compares the first argument, then jumps (arguments untouched) to the
// real dlsym or to `memprof_shim_dlsym`, which has the same signature; the slow path keeps the
// stack 16-byte aligned for the call and restores the argument registers.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    std::arch::naked_asm!(
        "cmp rdi, -1",
        "je 2f",
        "jmp {dlsym_impl}",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 4f",
        "jmp rax",
        "4:",
        "xor eax, eax",
        "ret",
        dlsym_impl = sym memprof_shim_dlsym,
        real = sym MEMPROF_SHIM_REAL_DLSYM,
        resolve = sym memprof_shim_resolve_dlsym,
    )
}
