//! The LD_PRELOAD shim (`libmemprof_shim.so`) that records CUDA device-memory calls.
//!
//! Load it with `LD_PRELOAD` and name the recording with `MEMPROF_OUT` (`%p` in the name becomes
//! the process id). Without `MEMPROF_OUT` the shim forwards every call and records nothing.
//!
//! What it sees: calls to the exported driver symbols (`cuMemAlloc_v2`, `cuMemFree_v2`,
//! `cuMemAllocAsync[_ptsz]`, `cuMemFreeAsync[_ptsz]`, `cuMemCreate`, `cuMemMap`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemGetInfo_v2`), and calls through pointers handed out by
//! `cuGetProcAddress` / `cuGetProcAddress_v2` when those are reached by symbol. Not yet: lookups
//! through a handle-scoped `dlsym(handle, ...)` (how libcudart finds `cuGetProcAddress_v2`), which
//! needs a `dlsym` interposer; fork handling; stacks.
//!
//! Rules: a hook forwards its arguments unchanged and returns the driver's result unchanged (and
//! keeps `errno`); it never blocks or allocates after the first recorded event (which opens the
//! file and starts the writer thread); a full buffer is a counted drop, written in the trailer.

mod hooks;
mod recorder;
pub mod ring;

/// The recording format version this shim writes.
pub const WIRE_VERSION: u32 = memprof_wire::VERSION;
