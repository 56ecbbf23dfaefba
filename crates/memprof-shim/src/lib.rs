//! The LD_PRELOAD shim (`libmemprof_shim.so`) that will record CUDA device-memory calls.
//!
//! Not built yet: this crate only fixes its place in the workspace and its dependency rule
//! (`libc` and `memprof-wire` only). The agent issue fills it in. Loading it today records
//! nothing and changes nothing.

/// The recording format version this shim will write.
pub const WIRE_VERSION: u32 = memprof_wire::VERSION;
