//! Fuzz target: the OOM-log reader. An input is a log (read as `memprof diagnose --log` reads
//! it, lossily as UTF-8); every PyTorch OOM message found is diagnosed and the report rendered
//! as text and JSON. Errors are fine; a panic, an abort, a timeout or unbounded memory is a
//! finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::diagnose::diagnose_log;
use memprof::report::diagnose::DiagnoseReport;
use memprof::source::oom_log::parse_log;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let messages = parse_log(&text);
    let report = DiagnoseReport::new(diagnose_log(&messages), Vec::new(), None, None);
    let _ = report.text("fuzz.log");
    let _ = serde_json::to_string(&report);
});
