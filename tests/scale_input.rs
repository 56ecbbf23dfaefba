//! The input of the device-count scale test and bench: `lists` device trace lists in one small
//! pickle, all one list object (memoized, then referenced) holding one OOM entry of `request`
//! bytes with nothing free on the device. `tests/scale.rs` checks the results on it and
//! `benches/snapshot_parse.rs` (`many_device_lists`) times it.

use memprof::report::export::pickle::PickleWriter;

pub fn shared_oom_lists(lists: usize, request: u64) -> std::io::Result<Vec<u8>> {
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(2)?;
    w.key("segments")?;
    w.begin_list(0)?;
    w.end()?;
    w.key("device_traces")?;
    w.begin_list(lists)?;
    w.item()?;
    let shared = w.begin_list(1)?;
    w.item()?;
    w.begin_dict(5)?;
    for (key, value) in [
        ("addr", 0),
        ("size", i128::from(request)),
        ("stream", 0),
        ("device_free", 0),
    ] {
        w.key(key)?;
        w.int(value)?;
    }
    w.key("action")?;
    w.str("oom")?;
    w.end()?;
    w.end()?;
    for _ in 1..lists {
        w.item()?;
        w.get(shared)?;
    }
    w.end()?;
    w.end()?;
    w.finish()
}

/// One device whose trace is `ooms` `oom` entries and nothing else, the `i`-th asking for
/// `request + 512 i` bytes with nothing free on the device: the shape that once made the
/// OOM replay of `diagnose` and `simulate --sweep` quadratic (`tests/scale.rs`).
pub fn many_ooms(ooms: usize, request: u64) -> std::io::Result<Vec<u8>> {
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(2)?;
    w.key("segments")?;
    w.begin_list(0)?;
    w.end()?;
    w.key("device_traces")?;
    w.begin_list(1)?;
    w.item()?;
    w.begin_list(ooms)?;
    for i in 0..ooms {
        w.item()?;
        w.begin_dict(6)?;
        w.key("action")?;
        w.str("oom")?;
        for (key, value) in [
            ("addr", 0),
            ("size", i128::from(request) + 512 * i as i128),
            ("stream", 0),
            ("device_free", 0),
            ("time_us", i as i128),
        ] {
            w.key(key)?;
            w.int(value)?;
        }
        w.end()?;
    }
    w.end()?;
    w.end()?;
    w.end()?;
    w.finish()
}
