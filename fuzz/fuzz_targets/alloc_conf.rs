//! Fuzz target: the `PYTORCH_CUDA_ALLOC_CONF` parser. A setting that parses must write back
//! as a string that parses to the same settings, and answer a rounding question for any size.
//! Errors are fine; a panic, an abort, a mismatch or a timeout is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::sim::alloc_conf::AllocatorConfig;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(config) = AllocatorConfig::parse(&text) else {
        return;
    };
    let written = config.to_conf_string();
    let again = AllocatorConfig::parse(&written)
        .unwrap_or_else(|e| panic!("{text:?} wrote {written:?}, which does not parse: {e}"));
    assert_eq!(again, config, "{text:?} wrote {written:?}");
    for size in [0, 1, 512, 1 << 20, 3 << 30, u64::MAX] {
        let _ = config.divisions_for(size);
    }
});
