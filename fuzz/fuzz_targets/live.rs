//! Fuzz target: the live-socket client's decoder. Every input is the bytes a shim's socket
//! sends (header, process block, records), read by `memprof::source::live::LiveClient` over an
//! in-memory stream; the records are folded as `memprof attach` and the dashboards fold them
//! (the live tally and the driver fold), and the model taken at the end is analyzed. Errors
//! are fine; a panic, an abort, a timeout or unbounded memory is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::source::live::{LiveClient, LiveEvent};
use memprof::source::live_tally::LiveTally;
use memprof::source::recording::DriverFold;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(mut client) = LiveClient::over(data, Path::new("fuzz.sock")) else {
        return;
    };
    let mut fold = DriverFold::new(client.header.start_ns, None);
    let mut tally = LiveTally::default();
    while let Ok(Some(event)) = client.next_event() {
        tally.apply(&event);
        if let LiveEvent::Record(record) = event {
            fold.apply(&record);
        }
    }
    let _ = (
        tally.largest(5),
        tally.alive(),
        fold.held_bytes(),
        fold.warnings(),
    );
    let snapshot = fold.into_snapshot(Default::default(), &Default::default());
    let _ = memprof::analysis::analyze_snapshot(&snapshot, 10, None);
});
