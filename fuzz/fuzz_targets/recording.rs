//! Fuzz target: the recording reader. Every input goes through `memprof_wire::decode_recording`
//! and, when that succeeds, `memprof::source::recording::from_recording` (the driver fold and the
//! symbolizer: mapping paths in the input name files that are opened only when regular) and the
//! analysis; and through the ledger's streaming walk (`ledger_of`, what `analyze` joins with a
//! recording). Errors are fine; a panic, an abort, a timeout or unbounded memory is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = memprof::analysis::ledger::ledger_of(data, &[], &[]);
    let Ok(recording) = memprof_wire::decode_recording(data) else {
        return;
    };
    if let Ok(read) = memprof::source::recording::from_recording(&recording) {
        let _ = memprof::analysis::analyze_snapshot(&read.parsed.snapshot, 10, None);
    }
});
