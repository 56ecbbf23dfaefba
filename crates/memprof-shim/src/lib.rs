//! The LD_PRELOAD shim (`libmemprof_shim.so`) that records CUDA device-memory calls.
//!
//! Load it with `LD_PRELOAD` and name the recording with `MEMPROF_OUT` (`%p` in the name becomes
//! the process id). Without `MEMPROF_OUT` the shim forwards every call and records nothing. The
//! file is created on the first recorded call and never overwritten: when it exists, the process
//! records to `MEMPROF_OUT.<pid>` (so a CUDA program started by the recorded one gets its own
//! file), and when that exists too (a program that replaced, by `exec`, one that recorded), to
//! the first free `MEMPROF_OUT.<pid>.<n>`. When none can be created, the process records nothing
//! and, if `MEMPROF_REPORT` names an abstract datagram socket (`memprof run` sets it), sends it
//! one line saying which file and why, without waiting. A forked child that does not exec records nothing,
//! unless `MEMPROF_FORK=record`: then it records to a file of its own (`MEMPROF_OUT.<pid>`, or
//! `MEMPROF_OUT` with its pid for `%p`), from its first call on, and `fork` (not a hook) holds
//! the writer lock across the fork (`fork.rs`).
//!
//! What it sees: calls to the exported driver symbols (`cuMemAlloc_v2`, `cuMemFree_v2`,
//! `cuMemAllocAsync[_ptsz]`, `cuMemFreeAsync[_ptsz]`, `cuMemCreate`, `cuMemMap`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemGetInfo_v2`, `cuMemAllocPitch_v2`, `cuMemAllocManaged`,
//! `cuMemAllocFromPoolAsync[_ptsz]`, `cuMemAddressReserve`, `cuMemAddressFree`), and calls through
//! pointers handed out by `cuGetProcAddress` / `cuGetProcAddress_v2`, and (x86_64 Linux) through
//! pointers found by a handle-scoped `dlsym(handle, ...)`, which is how libcudart finds
//! `cuGetProcAddress_v2`: the shim exports `dlsym` (see `dlsym.rs`). It also follows
//! `cuDevicePrimaryCtxRetain`, `cuCtxCreate_v2` and `cuCtxSetCurrent` (recording nothing for them)
//! so that each record carries the device of the calling thread's current context (`context.rs`).
//! Each allocation (and `cuMemMap`) carries the native call stack of its caller, found by a
//! frame-pointer walk (`stack.rs`; x86_64 and aarch64; `MEMPROF_STACKS=0` turns it off); the writer
//! thread gives each distinct stack an id and writes the executable mappings needed to symbolize it
//! (`stacks.rs`). Not yet: `dlsym` on other architectures, context push/pop, context events in the
//! recording, stacks of code built without frame pointers (partial). A program ending with `_exit` / `_Exit` is
//! flushed first (`exit.rs`).
//!
//! While it records, the shim also streams the same bytes to clients of a Unix socket named after
//! its pid (`live.rs`; `MEMPROF_LISTEN=0` turns it off); only the writer thread serves it.
//!
//! Each hook forwards to the real driver function, found once however the driver was loaded:
//! in the global scope, or only in the local scope of a library loaded with `dlopen(RTLD_LOCAL)`
//! (a Python extension module; `driver.rs`).
//!
//! Rules: a hook forwards its arguments unchanged and returns the driver's result unchanged (and
//! keeps `errno`); it never takes a lock or allocates after the first recorded event (which opens
//! the file and starts the writer thread), except once per thread: its first event claims a
//! buffer and registers the thread-local destructor that gives it back (glibc allocates for
//! that), and its first allocation looks up its stack bounds (`pthread_getattr_np`, which
//! allocates; see `stack.rs`). Events go to the calling thread's own buffer (a thread beyond the
//! 64 buffers uses a shared spill; `buffers.rs`); when it is full the hook yields to the writer
//! until there is room (counted as delayed) for as long as a writer drains them (or, up to a
//! second, is being started), and without one (it could not be started, died, or was closed by
//! the final flush, or the hook runs on the writer thread) drops the event (counted); both
//! counts are in the trailer. The writer writes events in timestamp order, each thread's always
//! in its own order (`buffers.rs` says when another thread's can still come out of order).

mod buffers;
mod context;
mod definitions;
#[cfg(all(target_arch = "x86_64", target_os = "linux", not(test)))]
mod dlsym;
mod driver;
#[cfg(not(test))]
mod exit;
mod fork;
mod hooks;
mod live;
mod live_client;
mod recorder;
pub mod ring;
mod stack;
mod stacks;
mod table;

/// The recording format version this shim writes.
pub const WIRE_VERSION: u32 = memprof_wire::VERSION;
