//! Fuzz target: the gate's inputs. An input is a baseline file and a `memprof analyze --json`
//! document, split at the first NUL byte (no NUL: the same text is tried as both). Each is read
//! as `memprof gate` reads it; when both are read, the run is checked against the baseline and
//! the verdict rendered as text, Markdown and JUnit. Errors are fine; a panic, an abort, a
//! timeout or unbounded memory is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::report::gate::{evaluate, GateConfig, Metric};
use memprof::report::gate_input::{parse_analyze_json, parse_baseline};
use memprof::report::gate_output;

fuzz_target!(|data: &[u8]| {
    let (base, doc) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, data),
    };
    let base = String::from_utf8_lossy(base);
    let doc = String::from_utf8_lossy(doc);
    let baseline = parse_baseline(&base).ok();
    let Ok(current) = parse_analyze_json(&doc, "fuzz.json", 0) else {
        return;
    };
    for metric in [Metric::PeakActive, Metric::PeakReserved] {
        let config = GateConfig {
            metric,
            max_increase: 0.05,
            limit: Some(1 << 30),
        };
        if let Ok(checks) = evaluate(&current, baseline.as_ref(), &config) {
            let _ = gate_output::text(&checks);
            let _ = gate_output::markdown(&checks);
            let _ = gate_output::junit(&checks);
        }
    }
});
