//! Fuzz target: the size parser of flags and files (`80GiB`, `1.5GB`, plain bytes: the
//! model's `Bytes`, which `--limit`, `--capacity` and `memprof plan`'s sizes go through). A
//! size that parses is printed, and what is printed must parse back to within the rounding of
//! its two decimals. Errors are fine; a panic, an abort or a size memprof prints but cannot
//! read is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::model::Bytes;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(size) = text.parse::<Bytes>() else {
        return;
    };
    let shown = size.to_string();
    let again: Bytes = shown
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} is {} B, printed {shown:?}: {e}", size.0));
    // Two decimals of a value of at least 1 in its unit: within 0.5%.
    let error = again.0.abs_diff(size.0) as f64;
    assert!(
        error <= size.0 as f64 / 200.0 + 1.0,
        "{text:?} is {} B, printed {shown:?}, read back as {} B",
        size.0,
        again.0
    );
});
