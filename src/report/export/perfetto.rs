//! Chrome trace-event JSON for ui.perfetto.dev (and chrome://tracing): per device, one process
//! with counter tracks for active bytes (live requested) and reserved bytes, computed by the
//! model's `Replay`, and instant events for OOMs and earlier snapshot calls.
//!
//! Time is `time_us` relative to the earliest entry of the file; a device whose trace has no
//! times uses the entry index as microseconds. Entries that share a timestamp are coalesced
//! into one counter sample, preceded by the group's high-water mark when the group rose above
//! where it ended, so no peak is lost.

use crate::model::{Action, Replay, Snapshot, TraceEntry};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::{self, Write};

/// Name of the counter track of live requested bytes.
pub const ACTIVE: &str = "active bytes";
/// Name of the counter track of bytes reserved from the driver.
pub const RESERVED: &str = "reserved bytes";

/// Writes the trace as `{"traceEvents": [...], ...}`.
pub fn write<W: Write>(snapshot: &Snapshot, mut out: W) -> io::Result<()> {
    out.write_all(b"{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"memprof\"},")?;
    out.write_all(b"\"traceEvents\":[")?;
    let mut events = Events {
        out: &mut out,
        first: true,
    };
    let origin = snapshot
        .devices()
        .iter()
        .flat_map(|&d| snapshot.timeline.device(d as usize))
        .filter_map(TraceEntry::time_us)
        .min();
    for device in snapshot.devices() {
        events.device(snapshot, device, origin)?;
    }
    out.write_all(b"]}\n")?;
    out.flush()
}

/// Writes events as the elements of one JSON array.
struct Events<'w, W: Write> {
    out: &'w mut W,
    first: bool,
}

/// A counter's last written value and the high and end values of the current group.
#[derive(Clone, Copy)]
struct Counter {
    name: &'static str,
    written: Option<u64>,
    high: u64,
    now: u64,
}

impl Counter {
    fn new(name: &'static str, now: u64) -> Counter {
        Counter {
            name,
            written: None,
            high: now,
            now,
        }
    }

    fn set(&mut self, value: u64) {
        self.now = value;
        self.high = self.high.max(value);
    }
}

impl<W: Write> Events<'_, W> {
    fn event(&mut self, event: &impl Serialize) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut *self.out, event).map_err(io::Error::from)
    }

    fn device(&mut self, snapshot: &Snapshot, device: u32, origin: Option<i64>) -> io::Result<()> {
        let meta = |name: &str, args: Value| json!({"ph": "M", "name": name, "pid": device, "tid": 0, "args": args});
        self.event(&meta(
            "process_name",
            json!({"name": format!("GPU {device}")}),
        ))?;
        self.event(&meta("process_sort_index", json!({"sort_index": device})))?;
        self.event(&meta("thread_name", json!({"name": "allocator"})))?;

        let entries = snapshot.timeline.device(device as usize);
        let has_times = entries.iter().any(|e| e.time_us().is_some());
        let clock = |index: usize, last: i64| -> i64 {
            match (has_times, entries[index].time_us(), origin) {
                (false, _, _) => index as i64,
                (true, Some(t), Some(o)) => t.saturating_sub(o),
                // An entry without a time in a timed trace stays at the previous time.
                (true, _, _) => last,
            }
        };
        let mut replay = Replay::new(entries, snapshot.device_segments(device));
        let mut active = Counter::new(ACTIVE, replay.live().total());
        let mut reserved = Counter::new(RESERVED, replay.reserved());
        let mut group_ts = if entries.is_empty() { 0 } else { clock(0, 0) };
        while let Some(index) = replay.step() {
            let ts = clock(index, group_ts);
            if ts != group_ts {
                self.flush(device, group_ts, &mut active)?;
                self.flush(device, group_ts, &mut reserved)?;
                group_ts = ts;
            }
            active.set(replay.live().total());
            reserved.set(replay.reserved());
            let entry = &entries[index];
            match entry.action {
                Action::Oom => self.event(&json!({
                    "ph": "i", "s": "p", "name": "OOM", "pid": device, "tid": 0, "ts": ts,
                    "args": {"entry": index, "request_bytes": entry.size,
                             "device_free_bytes": entry.device_free()},
                }))?,
                Action::Snapshot => self.event(&json!({
                    "ph": "i", "s": "p", "name": "snapshot", "pid": device, "tid": 0, "ts": ts,
                    "args": {"entry": index, "active_bytes": entry.size},
                }))?,
                _ => {}
            }
        }
        self.flush(device, group_ts, &mut active)?;
        self.flush(device, group_ts, &mut reserved)
    }

    /// Ends a group of entries at `ts`: its high-water mark if the group came down from it,
    /// then where it ended, each only when it changes the track.
    fn flush(&mut self, device: u32, ts: i64, counter: &mut Counter) -> io::Result<()> {
        let values = [counter.high, counter.now];
        let skip_high = counter.high == counter.now;
        for (i, value) in values.into_iter().enumerate() {
            if (i == 0 && skip_high) || counter.written == Some(value) {
                continue;
            }
            self.event(&json!({
                "ph": "C", "name": counter.name, "pid": device, "tid": 0, "ts": ts,
                "args": {"bytes": value},
            }))?;
            counter.written = Some(value);
        }
        counter.high = counter.now;
        Ok(())
    }
}
