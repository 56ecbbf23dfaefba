//! Fuzz target: the agent's HTTP request path. Every input is one client's bytes, given by
//! `memprof::agent::answer_bytes` to the same connection code the agent serves the network
//! with (hyper's HTTP/1 parser with the agent's limits, the write deadline, the routes), over an
//! in-memory pipe that closes the client's sending side after the input. A finding: a panic,
//! a connection the server does not close (`answer_bytes` fails), output that does not start
//! with an HTTP/1 status line, or more answers than the input has request heads.
#![no_main]

use libfuzzer_sys::fuzz_target;
use memprof::agent::{answer_bytes, Cache};
use std::sync::{Arc, OnceLock};

/// A cache holding a small exposition, as after the first sample.
fn cache() -> Arc<Cache> {
    static CACHE: OnceLock<Arc<Cache>> = OnceLock::new();
    Arc::clone(CACHE.get_or_init(|| {
        let cache = Arc::new(Cache::default());
        cache.store("# TYPE memprof_up gauge\nmemprof_up 1\n# EOF\n".to_owned());
        cache
    }))
}

fuzz_target!(|data: &[u8]| {
    let output = answer_bytes(data, cache()).expect("the server closes the connection");
    if output.is_empty() {
        return;
    }
    assert!(
        output.starts_with(b"HTTP/1.0 ") || output.starts_with(b"HTTP/1.1 "),
        "not a status line: {:?}",
        String::from_utf8_lossy(&output[..output.len().min(64)])
    );
    // Neither the answers nor the exposition echo the input, so each "HTTP/1." is one answer;
    // a request head ends with a blank line, so has at least one '\n' (an error answer may
    // come after the last one).
    let answers = output.windows(7).filter(|w| w == b"HTTP/1.").count();
    let newlines = data.iter().filter(|b| **b == b'\n').count();
    assert!(
        answers <= newlines + 1,
        "{answers} answers to {newlines} lines"
    );
});
