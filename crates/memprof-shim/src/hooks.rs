//! The interposed driver entry points.
//!
//! Each hooked function has a module holding: the exported symbol (the real function found by
//! `driver.rs`, wherever the driver was loaded), and two wrappers handed out by `cuGetProcAddress(_v2)` (each forwarding to
//! the pointer the real lookup returned; two because the legacy and per-thread-stream variants
//! can both be asked for). The same wrappers serve pointers found by `dlsym(handle, ...)`. The wrapper bodies (`alloc`, `free`, ...) forward the call unchanged and
//! record it afterwards; calls that give memory back (`free`, `free_async`, `release`,
//! `range_call`) take their time before the call (`recorder::Stamp`).

use crate::context;
use crate::driver;
use crate::recorder::{record, record_stamped, stamp, Guard, Stamp};
use memprof_wire::{Kind, Record, FLAG_LOOKED_UP, FLAG_PER_THREAD_STREAM};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

/// `CUDA_ERROR_NOT_FOUND`, returned only when the real function does not exist at all.
const CUDA_ERROR_NOT_FOUND: u32 = 500;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD_DEFAULT_STREAM: u64 = 2;

type AllocFn = unsafe extern "C" fn(*mut u64, usize) -> u32;
type FreeFn = unsafe extern "C" fn(u64) -> u32;
type AllocAsyncFn = unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> u32;
type FreeAsyncFn = unsafe extern "C" fn(u64, *mut c_void) -> u32;
type CreateFn = unsafe extern "C" fn(*mut u64, usize, *const c_void, u64) -> u32;
type MapFn = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> u32;
type UnmapFn = unsafe extern "C" fn(u64, usize) -> u32;
type ReleaseFn = unsafe extern "C" fn(u64) -> u32;
type PitchFn = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, u32) -> u32;
type ManagedFn = unsafe extern "C" fn(*mut u64, usize, u32) -> u32;
type PoolAllocFn = unsafe extern "C" fn(*mut u64, usize, *mut c_void, *mut c_void) -> u32;
type ReserveFn = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> u32;
type AddressFreeFn = unsafe extern "C" fn(u64, usize) -> u32;
type HostAllocFn = unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> u32;
type AllocHostFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> u32;
type HostRegisterFn = unsafe extern "C" fn(*mut c_void, usize, u32) -> u32;
type HostPtrFn = unsafe extern "C" fn(*mut c_void) -> u32;
type GetInfoFn = unsafe extern "C" fn(*mut usize, *mut usize) -> u32;
type CtxSetCurrentFn = unsafe extern "C" fn(*mut c_void) -> u32;
type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32;
type CtxCreateFn = unsafe extern "C" fn(*mut *mut c_void, u32, c_int) -> u32;
type ProcAddressFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> u32;
type ProcAddressV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;

/// A real function, resolved once however the driver was loaded (`driver.rs`).
struct Next(AtomicUsize);

impl Next {
    const fn new() -> Next {
        Next(AtomicUsize::new(0))
    }

    /// The real `name`; `ours` is the shim's export of it.
    fn get(&self, name: &CStr, ours: usize) -> usize {
        let cached = self.0.load(Ordering::Acquire);
        if cached != 0 {
            return cached;
        }
        let found = driver::lookup(name, ours);
        if found != 0 {
            self.0.store(found, Ordering::Release);
        }
        found
    }
}

/// A pointer handed out by the real `cuGetProcAddress`, with the flags its wrapper records.
struct Handed {
    real: AtomicUsize,
    flags: AtomicU16,
}

impl Handed {
    const fn new() -> Handed {
        Handed {
            real: AtomicUsize::new(0),
            flags: AtomicU16::new(0),
        }
    }

    /// Claims this slot for `real` (or finds it already holds it).
    fn claim(&self, real: usize, flags: u16) -> bool {
        match self
            .real
            .compare_exchange(0, real, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                self.flags.store(flags, Ordering::Release);
                true
            }
            Err(held) => held == real,
        }
    }
}

/// One hookable entry of `cuGetProcAddress`: base name, the lowest version whose ABI the
/// wrappers have, and the two (slot, wrapper) pairs.
struct Entry {
    base: &'static CStr,
    min_version: c_int,
    wrappers: [(&'static Handed, usize); 2],
}

macro_rules! hook {
    (
        $module:ident, $export:ident, $name:literal, $ty:ty, $body:path, $sym_flags:expr,
        ($($arg:ident: $arg_ty:ty),*)
    ) => {
        // The per-thread-stream modules export a symbol only; `cuGetProcAddress` uses the
        // wrappers of the base module.
        #[allow(non_snake_case, dead_code)]
        pub mod $module {
            use super::*;

            static NEXT: Next = Next::new();
            pub(super) static HANDED: [Handed; 2] = [Handed::new(), Handed::new()];

            /// # Safety
            /// Same contract as the driver function of this name.
            #[no_mangle]
            pub unsafe extern "C" fn $export($($arg: $arg_ty),*) -> u32 {
                let real = NEXT.get($name, $export as $ty as usize);
                if real == 0 {
                    return CUDA_ERROR_NOT_FOUND;
                }
                // SAFETY: `real` is the next definition of this very symbol, so it has this ABI.
                let real = unsafe { std::mem::transmute::<usize, $ty>(real) };
                $body(real, $sym_flags, $($arg),*)
            }

            pub(super) unsafe extern "C" fn handed0($($arg: $arg_ty),*) -> u32 {
                forward(&HANDED[0], $($arg),*)
            }

            pub(super) unsafe extern "C" fn handed1($($arg: $arg_ty),*) -> u32 {
                forward(&HANDED[1], $($arg),*)
            }

            fn forward(slot: &Handed, $($arg: $arg_ty),*) -> u32 {
                let real = slot.real.load(Ordering::Acquire);
                let flags = slot.flags.load(Ordering::Acquire);
                // SAFETY: a wrapper is handed out only after its slot holds the real pointer the
                // driver returned for this function at a version with this ABI.
                let real = unsafe { std::mem::transmute::<usize, $ty>(real) };
                $body(real, flags | FLAG_LOOKED_UP, $($arg),*)
            }

            pub(super) fn exported() -> usize {
                $export as $ty as usize
            }

            pub(super) fn wrappers() -> [(&'static Handed, usize); 2] {
                [
                    (&HANDED[0], handed0 as $ty as usize),
                    (&HANDED[1], handed1 as $ty as usize),
                ]
            }
        }
    };
}

hook!(mem_alloc, cuMemAlloc_v2, c"cuMemAlloc_v2", AllocFn, alloc, 0, (dptr: *mut u64, size: usize));
hook!(mem_free, cuMemFree_v2, c"cuMemFree_v2", FreeFn, free, 0, (dptr: u64));
hook!(mem_alloc_async, cuMemAllocAsync, c"cuMemAllocAsync", AllocAsyncFn, alloc_async, 0,
    (dptr: *mut u64, size: usize, stream: *mut c_void));
hook!(mem_alloc_async_ptsz, cuMemAllocAsync_ptsz, c"cuMemAllocAsync_ptsz", AllocAsyncFn,
    alloc_async, FLAG_PER_THREAD_STREAM, (dptr: *mut u64, size: usize, stream: *mut c_void));
hook!(mem_free_async, cuMemFreeAsync, c"cuMemFreeAsync", FreeAsyncFn, free_async, 0,
    (dptr: u64, stream: *mut c_void));
hook!(mem_free_async_ptsz, cuMemFreeAsync_ptsz, c"cuMemFreeAsync_ptsz", FreeAsyncFn,
    free_async, FLAG_PER_THREAD_STREAM, (dptr: u64, stream: *mut c_void));
hook!(mem_create, cuMemCreate, c"cuMemCreate", CreateFn, create, 0,
    (handle: *mut u64, size: usize, prop: *const c_void, flags: u64));
hook!(mem_map, cuMemMap, c"cuMemMap", MapFn, map, 0,
    (ptr: u64, size: usize, offset: usize, handle: u64, flags: u64));
hook!(mem_unmap, cuMemUnmap, c"cuMemUnmap", UnmapFn, unmap, 0, (ptr: u64, size: usize));
hook!(mem_release, cuMemRelease, c"cuMemRelease", ReleaseFn, release, 0, (handle: u64));
hook!(mem_get_info, cuMemGetInfo_v2, c"cuMemGetInfo_v2", GetInfoFn, get_info, 0,
    (free: *mut usize, total: *mut usize));
hook!(ctx_set_current, cuCtxSetCurrent, c"cuCtxSetCurrent", CtxSetCurrentFn, set_current, 0,
    (ctx: *mut c_void));
hook!(primary_ctx_retain, cuDevicePrimaryCtxRetain, c"cuDevicePrimaryCtxRetain",
    PrimaryCtxRetainFn, primary_retain, 0, (pctx: *mut *mut c_void, dev: c_int));
// Exported symbol and dlsym only: through cuGetProcAddress, "cuCtxCreate" may name the _v3 or _v4
// ABI, which this wrapper does not have.
hook!(ctx_create, cuCtxCreate_v2, c"cuCtxCreate_v2", CtxCreateFn, ctx_create_v2, 0,
    (pctx: *mut *mut c_void, ctx_flags: u32, dev: c_int));

hook!(
    mem_alloc_pitch,
    cuMemAllocPitch_v2,
    c"cuMemAllocPitch_v2",
    PitchFn,
    alloc_pitch,
    0,
    (dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, element: u32)
);
hook!(
    mem_alloc_managed,
    cuMemAllocManaged,
    c"cuMemAllocManaged",
    ManagedFn,
    alloc_managed,
    0,
    (dptr: *mut u64, size: usize, flags: u32)
);
hook!(
    mem_alloc_from_pool_async,
    cuMemAllocFromPoolAsync,
    c"cuMemAllocFromPoolAsync",
    PoolAllocFn,
    alloc_from_pool,
    0,
    (dptr: *mut u64, size: usize, pool: *mut c_void, stream: *mut c_void)
);
hook!(
    mem_alloc_from_pool_async_ptsz,
    cuMemAllocFromPoolAsync_ptsz,
    c"cuMemAllocFromPoolAsync_ptsz",
    PoolAllocFn,
    alloc_from_pool,
    FLAG_PER_THREAD_STREAM,
    (dptr: *mut u64, size: usize, pool: *mut c_void, stream: *mut c_void)
);
hook!(
    mem_address_reserve,
    cuMemAddressReserve,
    c"cuMemAddressReserve",
    ReserveFn,
    address_reserve,
    0,
    (ptr: *mut u64, size: usize, alignment: usize, addr: u64, flags: u64)
);
hook!(
    mem_address_free,
    cuMemAddressFree,
    c"cuMemAddressFree",
    AddressFreeFn,
    address_free,
    0,
    (ptr: u64, size: usize)
);

hook!(mem_host_alloc, cuMemHostAlloc, c"cuMemHostAlloc", HostAllocFn, host_alloc, 0,
    (pp: *mut *mut c_void, size: usize, flags: u32));
hook!(mem_alloc_host, cuMemAllocHost_v2, c"cuMemAllocHost_v2", AllocHostFn, alloc_host, 0,
    (pp: *mut *mut c_void, size: usize));
hook!(mem_free_host, cuMemFreeHost, c"cuMemFreeHost", HostPtrFn, free_host, 0,
    (p: *mut c_void));
hook!(mem_host_register, cuMemHostRegister_v2, c"cuMemHostRegister_v2", HostRegisterFn,
    host_register, 0, (p: *mut c_void, size: usize, flags: u32));
hook!(mem_host_unregister, cuMemHostUnregister, c"cuMemHostUnregister", HostPtrFn,
    host_unregister, 0, (p: *mut c_void));

fn host_alloc(real: HostAllocFn, flags: u16, pp: *mut *mut c_void, size: usize, f: u32) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(pp, size, f) };
    emit(&guard, Kind::HostAlloc, flags, result, |event| {
        event.size = size as u64;
        event.aux = u64::from(f);
        event.ptr = read_out(result, pp.cast::<u64>());
    });
    result
}

fn alloc_host(real: AllocHostFn, flags: u16, pp: *mut *mut c_void, size: usize) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(pp, size) };
    emit(&guard, Kind::HostAlloc, flags, result, |event| {
        event.size = size as u64;
        event.ptr = read_out(result, pp.cast::<u64>());
    });
    result
}

fn host_register(real: HostRegisterFn, flags: u16, p: *mut c_void, size: usize, f: u32) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(p, size, f) };
    emit(&guard, Kind::HostRegister, flags, result, |event| {
        event.ptr = p as u64;
        event.size = size as u64;
        event.aux = u64::from(f);
    });
    result
}

fn free_host(real: HostPtrFn, flags: u16, p: *mut c_void) -> u32 {
    host_release(Kind::HostFree, real, flags, p)
}

fn host_unregister(real: HostPtrFn, flags: u16, p: *mut c_void) -> u32 {
    host_release(Kind::HostUnregister, real, flags, p)
}

/// A call that gives pinned host memory back (`cuMemFreeHost`, `cuMemHostUnregister`): stamped,
/// forwarded, then recorded as `kind`.
fn host_release(kind: Kind, real: HostPtrFn, flags: u16, p: *mut c_void) -> u32 {
    let guard = Guard::enter();
    let before = stamp_before(&guard);
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(p) };
    emit_stamped(before, kind, flags, result, |event| {
        event.ptr = p as u64;
    });
    result
}

fn alloc_pitch(
    real: PitchFn,
    flags: u16,
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element: u32,
) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr, pitch, width, height, element) };
    emit(&guard, Kind::AllocPitch, flags, result, |event| {
        event.ptr = read_out(result, dptr);
        let row = read_out(result, pitch.cast::<u64>());
        event.aux = row;
        // The request when it failed; pitch x height when it succeeded.
        event.size = if result == 0 {
            row.saturating_mul(height as u64)
        } else {
            (width as u64).saturating_mul(height as u64)
        };
    });
    result
}

fn alloc_managed(real: ManagedFn, flags: u16, dptr: *mut u64, size: usize, f: u32) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr, size, f) };
    emit(&guard, Kind::AllocManaged, flags, result, |event| {
        event.size = size as u64;
        event.aux = f as u64;
        event.ptr = read_out(result, dptr);
    });
    result
}

fn alloc_from_pool(
    real: PoolAllocFn,
    flags: u16,
    dptr: *mut u64,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr, size, pool, stream) };
    emit(&guard, Kind::AllocFromPoolAsync, flags, result, |event| {
        event.size = size as u64;
        event.stream = stream as u64;
        event.aux = pool as u64;
        event.ptr = read_out(result, dptr);
    });
    result
}

fn address_reserve(
    real: ReserveFn,
    flags: u16,
    ptr: *mut u64,
    size: usize,
    alignment: usize,
    addr: u64,
    f: u64,
) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(ptr, size, alignment, addr, f) };
    emit(&guard, Kind::AddressReserve, flags, result, |event| {
        event.size = size as u64;
        event.aux = addr;
        event.ptr = read_out(result, ptr);
    });
    result
}

fn address_free(real: AddressFreeFn, flags: u16, ptr: u64, size: usize) -> u32 {
    range_call(Kind::AddressFree, real, flags, ptr, size)
}

/// A call on the range `[ptr, ptr + size)` that returns only its result (`cuMemUnmap`,
/// `cuMemAddressFree`): stamped, forwarded, then recorded as `kind`.
fn range_call(
    kind: Kind,
    real: unsafe extern "C" fn(u64, usize) -> u32,
    flags: u16,
    ptr: u64,
    size: usize,
) -> u32 {
    let guard = Guard::enter();
    let before = stamp_before(&guard);
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(ptr, size) };
    emit_stamped(before, kind, flags, result, |event| {
        event.ptr = ptr;
        event.size = size as u64;
    });
    result
}

/// The `cuGetProcAddress` names this shim wraps.
fn entries() -> [Entry; 21] {
    [
        Entry {
            base: c"cuMemHostAlloc",
            min_version: 0,
            wrappers: mem_host_alloc::wrappers(),
        },
        Entry {
            base: c"cuMemAllocHost",
            min_version: 3020,
            wrappers: mem_alloc_host::wrappers(),
        },
        Entry {
            base: c"cuMemFreeHost",
            min_version: 0,
            wrappers: mem_free_host::wrappers(),
        },
        Entry {
            base: c"cuMemHostRegister",
            min_version: 6050,
            wrappers: mem_host_register::wrappers(),
        },
        Entry {
            base: c"cuMemHostUnregister",
            min_version: 0,
            wrappers: mem_host_unregister::wrappers(),
        },
        Entry {
            base: c"cuCtxSetCurrent",
            min_version: 4000,
            wrappers: ctx_set_current::wrappers(),
        },
        Entry {
            base: c"cuDevicePrimaryCtxRetain",
            min_version: 7000,
            wrappers: primary_ctx_retain::wrappers(),
        },
        Entry {
            base: c"cuMemAllocPitch",
            min_version: 3020,
            wrappers: mem_alloc_pitch::wrappers(),
        },
        Entry {
            base: c"cuMemAllocManaged",
            min_version: 0,
            wrappers: mem_alloc_managed::wrappers(),
        },
        Entry {
            base: c"cuMemAllocFromPoolAsync",
            min_version: 0,
            wrappers: mem_alloc_from_pool_async::wrappers(),
        },
        Entry {
            base: c"cuMemAddressReserve",
            min_version: 0,
            wrappers: mem_address_reserve::wrappers(),
        },
        Entry {
            base: c"cuMemAddressFree",
            min_version: 0,
            wrappers: mem_address_free::wrappers(),
        },
        Entry {
            base: c"cuMemAlloc",
            min_version: 3020,
            wrappers: mem_alloc::wrappers(),
        },
        Entry {
            base: c"cuMemFree",
            min_version: 3020,
            wrappers: mem_free::wrappers(),
        },
        Entry {
            base: c"cuMemAllocAsync",
            min_version: 0,
            wrappers: mem_alloc_async::wrappers(),
        },
        Entry {
            base: c"cuMemFreeAsync",
            min_version: 0,
            wrappers: mem_free_async::wrappers(),
        },
        Entry {
            base: c"cuMemCreate",
            min_version: 0,
            wrappers: mem_create::wrappers(),
        },
        Entry {
            base: c"cuMemMap",
            min_version: 0,
            wrappers: mem_map::wrappers(),
        },
        Entry {
            base: c"cuMemUnmap",
            min_version: 0,
            wrappers: mem_unmap::wrappers(),
        },
        Entry {
            base: c"cuMemRelease",
            min_version: 0,
            wrappers: mem_release::wrappers(),
        },
        Entry {
            base: c"cuMemGetInfo",
            min_version: 3020,
            wrappers: mem_get_info::wrappers(),
        },
    ]
}

fn alloc(real: AllocFn, flags: u16, dptr: *mut u64, size: usize) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr, size) };
    emit(&guard, Kind::Alloc, flags, result, |event| {
        event.size = size as u64;
        event.ptr = read_out(result, dptr);
    });
    result
}

fn free(real: FreeFn, flags: u16, dptr: u64) -> u32 {
    let guard = Guard::enter();
    let before = stamp_before(&guard);
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr) };
    emit_stamped(before, Kind::Free, flags, result, |event| {
        event.ptr = dptr;
    });
    result
}

fn alloc_async(
    real: AllocAsyncFn,
    flags: u16,
    dptr: *mut u64,
    size: usize,
    stream: *mut c_void,
) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr, size, stream) };
    emit(&guard, Kind::AllocAsync, flags, result, |event| {
        event.size = size as u64;
        event.stream = stream as u64;
        event.ptr = read_out(result, dptr);
    });
    result
}

fn free_async(real: FreeAsyncFn, flags: u16, dptr: u64, stream: *mut c_void) -> u32 {
    let guard = Guard::enter();
    let before = stamp_before(&guard);
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(dptr, stream) };
    emit_stamped(before, Kind::FreeAsync, flags, result, |event| {
        event.ptr = dptr;
        event.stream = stream as u64;
    });
    result
}

fn create(
    real: CreateFn,
    flags: u16,
    handle: *mut u64,
    size: usize,
    prop: *const c_void,
    f: u64,
) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(handle, size, prop, f) };
    emit(&guard, Kind::VmmCreate, flags, result, |event| {
        event.size = size as u64;
        event.aux = read_out(result, handle);
        if result == 0 && !prop.is_null() {
            // SAFETY: `prop` is a CUmemAllocationProp the driver just accepted; `location.id`
            // (an int) sits at byte 12 (after `type`, `requestedHandleTypes`, `location.type`).
            event.device = unsafe { prop.cast::<u8>().add(12).cast::<i32>().read_unaligned() };
        }
    });
    result
}

fn map(real: MapFn, flags: u16, ptr: u64, size: usize, offset: usize, handle: u64, f: u64) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(ptr, size, offset, handle, f) };
    emit(&guard, Kind::VmmMap, flags, result, |event| {
        event.ptr = ptr;
        event.size = size as u64;
        event.stream = offset as u64;
        event.aux = handle;
    });
    result
}

fn unmap(real: UnmapFn, flags: u16, ptr: u64, size: usize) -> u32 {
    range_call(Kind::VmmUnmap, real, flags, ptr, size)
}

fn release(real: ReleaseFn, flags: u16, handle: u64) -> u32 {
    let guard = Guard::enter();
    let before = stamp_before(&guard);
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(handle) };
    emit_stamped(before, Kind::VmmRelease, flags, result, |event| {
        event.aux = handle;
    });
    result
}

fn get_info(real: GetInfoFn, flags: u16, free: *mut usize, total: *mut usize) -> u32 {
    let guard = Guard::enter();
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(free, total) };
    emit(&guard, Kind::MemGetInfo, flags, result, |event| {
        event.aux = read_out(result, free.cast::<u64>());
        event.size = read_out(result, total.cast::<u64>());
    });
    result
}

fn set_current(real: CtxSetCurrentFn, _flags: u16, ctx: *mut c_void) -> u32 {
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(ctx) };
    if result == 0 {
        context::set_current(ctx as u64);
    }
    result
}

fn primary_retain(
    real: PrimaryCtxRetainFn,
    _flags: u16,
    pctx: *mut *mut c_void,
    dev: c_int,
) -> u32 {
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(pctx, dev) };
    context::learn(read_out(result, pctx.cast::<u64>()), dev);
    result
}

fn ctx_create_v2(
    real: CtxCreateFn,
    _flags: u16,
    pctx: *mut *mut c_void,
    ctx_flags: u32,
    dev: c_int,
) -> u32 {
    // SAFETY: forwards the caller's arguments unchanged to the real function.
    let result = unsafe { real(pctx, ctx_flags, dev) };
    let ctx = read_out(result, pctx.cast::<u64>());
    if ctx != 0 {
        // A created context is made current in the calling thread.
        context::learn(ctx, dev);
        context::set_current(ctx);
    }
    result
}

/// Records the event of a hooked call, unless the call came from inside the shim (no guard):
/// kind, path flags and the driver's result, plus what `fill` adds. Never allocates.
fn emit(
    guard: &Option<Guard>,
    kind: Kind,
    flags: u16,
    result: u32,
    fill: impl FnOnce(&mut Record),
) {
    if guard.is_some() {
        record(event(kind, flags, result, fill));
    }
}

/// Stamps a call that gives memory back, before it is made (see `Stamp`), unless it came from
/// inside the shim (no guard) or nothing is recorded.
fn stamp_before(guard: &Option<Guard>) -> Option<Stamp> {
    guard.as_ref().and_then(|_| stamp())
}

/// As `emit`, for a call stamped by `stamp_before`.
fn emit_stamped(
    before: Option<Stamp>,
    kind: Kind,
    flags: u16,
    result: u32,
    fill: impl FnOnce(&mut Record),
) {
    if let Some(before) = before {
        record_stamped(event(kind, flags, result, fill), before);
    }
}

/// The event of a call: kind, path flags, result, what `fill` adds, and the calling thread's
/// device when the call does not name one.
fn event(kind: Kind, flags: u16, result: u32, fill: impl FnOnce(&mut Record)) -> Record {
    let mut event = Record::new(kind);
    event.flags = flags;
    event.result = result;
    fill(&mut event);
    if event.device < 0 {
        event.device = context::current_device();
    }
    event
}

/// Reads an out-parameter the driver filled in; 0 when the call failed or it is NULL.
fn read_out(result: u32, out: *mut u64) -> u64 {
    if result != 0 || out.is_null() {
        return 0;
    }
    // SAFETY: the call succeeded, so the driver wrote a value through this non-NULL pointer.
    unsafe { out.read_unaligned() }
}

static NEXT_PROC_ADDRESS: Next = Next::new();
static NEXT_PROC_ADDRESS_V2: Next = Next::new();
/// `cuGetProcAddress` / `_v2` pointers handed out by `dlsym(handle, ...)`.
static HANDED_PROC_ADDRESS: [Handed; 2] = [Handed::new(), Handed::new()];
static HANDED_PROC_ADDRESS_V2: [Handed; 2] = [Handed::new(), Handed::new()];

fn proc_address(
    real: ProcAddressFn,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> u32 {
    // SAFETY: forwards the caller's arguments unchanged.
    let result = unsafe { real(symbol, pfn, version, flags) };
    if result == 0 {
        redirect(symbol, pfn, version, flags);
    }
    result
}

fn proc_address_v2(
    real: ProcAddressV2Fn,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    // SAFETY: forwards the caller's arguments unchanged.
    let result = unsafe { real(symbol, pfn, version, flags, status) };
    // SAFETY: a non-NULL status was written by the driver on success.
    let found = status.is_null() || unsafe { status.read() } == 0;
    if result == 0 && found {
        redirect(symbol, pfn, version, flags);
    }
    result
}

/// # Safety
/// Same contract as the driver's 4-argument `cuGetProcAddress`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> u32 {
    let real = NEXT_PROC_ADDRESS.get(
        c"cuGetProcAddress",
        cuGetProcAddress as ProcAddressFn as usize,
    );
    if real == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the next definition of this symbol has this ABI.
    let real = unsafe { std::mem::transmute::<usize, ProcAddressFn>(real) };
    proc_address(real, symbol, pfn, version, flags)
}

/// # Safety
/// Same contract as the driver's `cuGetProcAddress_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> u32 {
    let real = NEXT_PROC_ADDRESS_V2.get(
        c"cuGetProcAddress_v2",
        cuGetProcAddress_v2 as ProcAddressV2Fn as usize,
    );
    if real == 0 {
        return CUDA_ERROR_NOT_FOUND;
    }
    // SAFETY: the next definition of this symbol has this ABI.
    let real = unsafe { std::mem::transmute::<usize, ProcAddressV2Fn>(real) };
    proc_address_v2(real, symbol, pfn, version, flags, status)
}

macro_rules! handed_proc_address {
    ($name:ident, $slot:expr) => {
        unsafe extern "C" fn $name(
            symbol: *const c_char,
            pfn: *mut *mut c_void,
            version: c_int,
            flags: u64,
        ) -> u32 {
            let real = $slot.real.load(Ordering::Acquire);
            // SAFETY: the slot holds what dlsym returned for "cuGetProcAddress".
            let real = unsafe { std::mem::transmute::<usize, ProcAddressFn>(real) };
            proc_address(real, symbol, pfn, version, flags)
        }
    };
}

macro_rules! handed_proc_address_v2 {
    ($name:ident, $slot:expr) => {
        unsafe extern "C" fn $name(
            symbol: *const c_char,
            pfn: *mut *mut c_void,
            version: c_int,
            flags: u64,
            status: *mut c_int,
        ) -> u32 {
            let real = $slot.real.load(Ordering::Acquire);
            // SAFETY: the slot holds what dlsym returned for "cuGetProcAddress_v2".
            let real = unsafe { std::mem::transmute::<usize, ProcAddressV2Fn>(real) };
            proc_address_v2(real, symbol, pfn, version, flags, status)
        }
    };
}

handed_proc_address!(handed_proc_address0, HANDED_PROC_ADDRESS[0]);
handed_proc_address!(handed_proc_address1, HANDED_PROC_ADDRESS[1]);
handed_proc_address_v2!(handed_proc_address_v2_0, HANDED_PROC_ADDRESS_V2[0]);
handed_proc_address_v2!(handed_proc_address_v2_1, HANDED_PROC_ADDRESS_V2[1]);

fn proc_address_wrappers() -> [(&'static Handed, usize); 2] {
    [
        (
            &HANDED_PROC_ADDRESS[0],
            handed_proc_address0 as ProcAddressFn as usize,
        ),
        (
            &HANDED_PROC_ADDRESS[1],
            handed_proc_address1 as ProcAddressFn as usize,
        ),
    ]
}

fn proc_address_v2_wrappers() -> [(&'static Handed, usize); 2] {
    [
        (
            &HANDED_PROC_ADDRESS_V2[0],
            handed_proc_address_v2_0 as ProcAddressV2Fn as usize,
        ),
        (
            &HANDED_PROC_ADDRESS_V2[1],
            handed_proc_address_v2_1 as ProcAddressV2Fn as usize,
        ),
    ]
}

/// The wrapper of the first slot that holds or can take `real`.
fn claim(wrappers: [(&'static Handed, usize); 2], real: usize, flags: u16) -> Option<usize> {
    wrappers
        .into_iter()
        .find(|(slot, _)| slot.claim(real, flags))
        .map(|(_, wrapper)| wrapper)
}

/// The wrapper for a lookup of exported name `name` that found `real` (used by `dlsym`), or
/// `None` to hand `real` back unchanged: a name this shim does not wrap, or already the shim's.
pub(crate) fn wrapper_for(name: &CStr, real: usize) -> Option<usize> {
    let (wrappers, flags, ours) = match name.to_bytes() {
        b"cuMemAlloc_v2" => (mem_alloc::wrappers(), 0, mem_alloc::exported()),
        b"cuMemFree_v2" => (mem_free::wrappers(), 0, mem_free::exported()),
        b"cuMemAllocAsync" => (mem_alloc_async::wrappers(), 0, mem_alloc_async::exported()),
        b"cuMemAllocAsync_ptsz" => (
            mem_alloc_async::wrappers(),
            FLAG_PER_THREAD_STREAM,
            mem_alloc_async_ptsz::exported(),
        ),
        b"cuMemFreeAsync" => (mem_free_async::wrappers(), 0, mem_free_async::exported()),
        b"cuMemFreeAsync_ptsz" => (
            mem_free_async::wrappers(),
            FLAG_PER_THREAD_STREAM,
            mem_free_async_ptsz::exported(),
        ),
        b"cuMemCreate" => (mem_create::wrappers(), 0, mem_create::exported()),
        b"cuMemMap" => (mem_map::wrappers(), 0, mem_map::exported()),
        b"cuMemUnmap" => (mem_unmap::wrappers(), 0, mem_unmap::exported()),
        b"cuMemRelease" => (mem_release::wrappers(), 0, mem_release::exported()),
        b"cuMemGetInfo_v2" => (mem_get_info::wrappers(), 0, mem_get_info::exported()),
        b"cuMemAllocPitch_v2" => (mem_alloc_pitch::wrappers(), 0, mem_alloc_pitch::exported()),
        b"cuMemAllocManaged" => (
            mem_alloc_managed::wrappers(),
            0,
            mem_alloc_managed::exported(),
        ),
        b"cuMemAllocFromPoolAsync" => (
            mem_alloc_from_pool_async::wrappers(),
            0,
            mem_alloc_from_pool_async::exported(),
        ),
        b"cuMemAllocFromPoolAsync_ptsz" => (
            mem_alloc_from_pool_async::wrappers(),
            FLAG_PER_THREAD_STREAM,
            mem_alloc_from_pool_async_ptsz::exported(),
        ),
        b"cuMemAddressReserve" => (
            mem_address_reserve::wrappers(),
            0,
            mem_address_reserve::exported(),
        ),
        b"cuMemAddressFree" => (
            mem_address_free::wrappers(),
            0,
            mem_address_free::exported(),
        ),
        b"cuMemHostAlloc" => (mem_host_alloc::wrappers(), 0, mem_host_alloc::exported()),
        b"cuMemAllocHost_v2" => (mem_alloc_host::wrappers(), 0, mem_alloc_host::exported()),
        b"cuMemFreeHost" => (mem_free_host::wrappers(), 0, mem_free_host::exported()),
        b"cuMemHostRegister_v2" => (
            mem_host_register::wrappers(),
            0,
            mem_host_register::exported(),
        ),
        b"cuMemHostUnregister" => (
            mem_host_unregister::wrappers(),
            0,
            mem_host_unregister::exported(),
        ),
        b"cuCtxSetCurrent" => (ctx_set_current::wrappers(), 0, ctx_set_current::exported()),
        b"cuDevicePrimaryCtxRetain" => (
            primary_ctx_retain::wrappers(),
            0,
            primary_ctx_retain::exported(),
        ),
        b"cuCtxCreate_v2" => (ctx_create::wrappers(), 0, ctx_create::exported()),
        b"cuGetProcAddress" => (
            proc_address_wrappers(),
            0,
            cuGetProcAddress as ProcAddressFn as usize,
        ),
        b"cuGetProcAddress_v2" => (
            proc_address_v2_wrappers(),
            0,
            cuGetProcAddress_v2 as ProcAddressV2Fn as usize,
        ),
        _ => return None,
    };
    if real == ours {
        return None;
    }
    claim(wrappers, real, flags)
}

/// After a successful lookup, swaps the returned pointer for a recording wrapper when the name
/// is one this shim wraps at that ABI. Anything else is left exactly as the driver returned it.
fn redirect(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: the driver accepted `symbol` as a NUL-terminated name and wrote `*pfn`.
    let (name, real) = unsafe { (CStr::from_ptr(symbol), *pfn as usize) };
    if real == 0 {
        return;
    }
    let ours = if name == c"cuGetProcAddress" {
        // The lookup function itself: wrap it only when its ABI is known, because it is the
        // exported one or one that dlsym handed out under a versioned name.
        let known =
            |slots: &[Handed; 2]| slots.iter().any(|s| s.real.load(Ordering::Acquire) == real);
        if real
            == NEXT_PROC_ADDRESS_V2.get(
                c"cuGetProcAddress_v2",
                cuGetProcAddress_v2 as ProcAddressV2Fn as usize,
            )
            || known(&HANDED_PROC_ADDRESS_V2)
        {
            claim(proc_address_v2_wrappers(), real, 0)
        } else if real
            == NEXT_PROC_ADDRESS.get(
                c"cuGetProcAddress",
                cuGetProcAddress as ProcAddressFn as usize,
            )
            || known(&HANDED_PROC_ADDRESS)
        {
            claim(proc_address_wrappers(), real, 0)
        } else {
            None
        }
    } else {
        let record_flags = if flags & PER_THREAD_DEFAULT_STREAM != 0 {
            FLAG_PER_THREAD_STREAM
        } else {
            0
        };
        entries()
            .into_iter()
            .find(|entry| entry.base == name && version >= entry.min_version)
            .and_then(|entry| claim(entry.wrappers, real, record_flags))
    };
    if let Some(ours) = ours {
        // SAFETY: `pfn` is the caller's out-parameter, already written by the driver; the
        // wrapper has the ABI of `real`.
        unsafe { *pfn = ours as *mut c_void };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlsym_results_get_a_wrapper_per_real_pointer_and_never_more_than_two() {
        assert_eq!(wrapper_for(c"cuMemRelease", mem_release::exported()), None);
        assert_eq!(wrapper_for(c"cuDeviceGet", 0x1000), None);
        let first = wrapper_for(c"cuMemRelease", 0x1000).expect("a slot");
        assert_eq!(wrapper_for(c"cuMemRelease", 0x1000), Some(first));
        let second = wrapper_for(c"cuMemRelease", 0x2000).expect("the other slot");
        assert_ne!(first, second);
        assert_eq!(
            wrapper_for(c"cuMemRelease", 0x3000),
            None,
            "full: left unwrapped"
        );
    }
}
