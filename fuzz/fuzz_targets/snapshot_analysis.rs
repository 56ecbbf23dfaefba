//! Fuzzes what follows the snapshot decoder: every input that `torch_snapshot::read` accepts
//! goes through `analysis::analyze_snapshot` (replay, peak, categories, phases, diagnosis), and
//! its pinned host allocator data through `analysis::host_pinned`.
//!
//! Slower per input than the `snapshot` target (the whole analysis runs), so it gets fewer
//! executions; only panics (and aborts, OOM, timeouts) count as findings.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::source::torch_snapshot;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = torch_snapshot::read(data) {
        let _ = memprof::analysis::analyze_snapshot(&parsed.snapshot, 10, None);
        if let Some(host) = &parsed.host {
            let _ = memprof::analysis::host_pinned::host_pinned(host);
        }
    }
});
