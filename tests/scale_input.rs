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
