//! Fuzzes the snapshot reader end to end.
//!
//! For every input:
//! 1. `pickle::decode` with `KeepAll` (the raw pickle VM, no folding) must not panic;
//! 2. `torch_snapshot::read` (pickle VM with the trace folder, then the schema) must not panic;
//! 3. when `read` succeeds, `analysis::analyze_snapshot(&snapshot, 10, None)` must not panic.
//! Returned errors are fine; only panics (and aborts, OOM, timeouts) count as findings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::source::{pickle, torch_snapshot};

fuzz_target!(|data: &[u8]| {
    let _ = pickle::decode(data, &mut pickle::KeepAll);

    if let Ok(parsed) = torch_snapshot::read(data) {
        let _ = memprof::analysis::analyze_snapshot(&parsed.snapshot, 10, None);
    }
});
