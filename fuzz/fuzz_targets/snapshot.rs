//! Fuzzes the snapshot decoder: the pickle VM and the snapshot schema.
//!
//! For every input:
//! 1. `pickle::decode` with `KeepAll` (the raw pickle VM, no folding) must not panic;
//! 2. `torch_snapshot::read` (pickle VM with the trace folder, then the schema) must not panic.
//!
//! Returned errors are fine; only panics (and aborts, OOM, timeouts) count as findings. What
//! the analysis does with a decoded snapshot is the `snapshot_analysis` target's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::source::{pickle, torch_snapshot};

fuzz_target!(|data: &[u8]| {
    let _ = pickle::decode(data, &mut pickle::KeepAll);
    let _ = torch_snapshot::read(data);
});
