//! Chrome trace-event JSON for ui.perfetto.dev (and chrome://tracing): per device, one process
//! (pid = device + 1: Perfetto reads pid 0 as the idle process) with counter tracks for
//! requested bytes (of the live allocations) and reserved bytes, computed by the model's
//! `Replay`, and instant events for the account's moments (the peaks, each OOM and OOM retry, each `empty_cache()`
//! call, with the account's figures there) and earlier snapshot calls.
//!
//! Time is `time_us` relative to the earliest entry of any device in the file: one origin for
//! all devices. A device whose trace has no times uses the entry index as `ts`; its tracks
//! say so in their names, and `otherData` says which devices those are. Entries that share a
//! timestamp are coalesced into one counter sample, preceded by the group's high-water mark
//! when the group rose above where it ended; the end value then follows 1 µs later, so the
//! peak keeps a visible width.
//!
//! Perfetto names a counter track after the event's name and its argument key joined by a
//! space, so events are named "requested" and "reserved" with the argument "bytes".

use crate::account::{InputAccount, Moment, MomentKind};
use crate::model::{replay_device, Action, Snapshot, TraceEntry};
use serde::Serialize;
use serde_json::{json, Value};
use std::io::{self, Write};

/// Name of the counter events of live requested bytes (the track reads "requested bytes").
pub const REQUESTED: &str = "requested";
/// Name of the counter events of bytes reserved from the driver ("reserved bytes").
pub const RESERVED: &str = "reserved";
/// What counter tracks of a trace without times add to their names.
pub const UNTIMED: &str = " (ts = entry index)";
/// The argument every counter event carries its value in.
pub const VALUE_KEY: &str = "bytes";

/// Writes the trace as `{"traceEvents": [...], ...}`, its markers the moments of `account`.
pub fn write<W: Write>(snapshot: &Snapshot, account: &InputAccount, mut out: W) -> io::Result<()> {
    let devices = snapshot.devices();
    let untimed: Vec<String> = devices
        .iter()
        .filter(|&&d| !is_timed(snapshot.timeline.device(d as usize)))
        .map(|d| format!("GPU {d}"))
        .collect();
    let mut other = serde_json::Map::new();
    other.insert("generator".into(), json!("memprof"));
    if untimed.len() < devices.len() || devices.is_empty() {
        other.insert(
            "ts".into(),
            json!("microseconds from the earliest trace entry of any device: one origin for all devices"),
        );
    }
    if !untimed.is_empty() {
        other.insert(
            "ts_untimed".into(),
            json!(format!(
                "{}: the trace has no times, so ts is the trace entry index, not microseconds",
                untimed.join(", ")
            )),
        );
    }
    out.write_all(b"{\"displayTimeUnit\":\"ms\",\"otherData\":")?;
    serde_json::to_writer(&mut out, &Value::Object(other)).map_err(io::Error::from)?;
    out.write_all(b",\"traceEvents\":[")?;
    let mut events = Events {
        out: &mut out,
        first: true,
    };
    let origin = devices
        .iter()
        .flat_map(|&d| snapshot.timeline.device(d as usize))
        .filter_map(TraceEntry::time_us)
        .min();
    for device in devices {
        let moments: &[Moment] = account
            .devices
            .iter()
            .find(|d| d.device == device)
            .map_or(&[], |d| &d.account.moments);
        events.device(snapshot, device, origin, moments)?;
    }
    out.write_all(b"]}\n")?;
    out.flush()
}

/// The name of a moment's marker, in the account's words.
fn marker_name(kind: MomentKind) -> &'static str {
    match kind {
        MomentKind::PeakRequested => "peak requested",
        MomentKind::PeakAllocated => "peak allocated",
        MomentKind::PeakReserved => "peak reserved",
        MomentKind::Oom => "OOM",
        MomentKind::OomRetry => "OOM retry",
        MomentKind::EmptyCache => "empty_cache()",
        MomentKind::Dump => "dump",
    }
}

/// Whether a trace has times (an empty one counts as timed: it has no track).
fn is_timed(entries: &[TraceEntry]) -> bool {
    entries.is_empty() || entries.iter().any(|e| e.time_us().is_some())
}

/// Writes events as the elements of one JSON array.
struct Events<'w, W: Write> {
    out: &'w mut W,
    first: bool,
}

/// A counter's last written value, the high and end values of the current group, and an end
/// value held back to keep the peak before it visible.
struct Counter {
    name: String,
    written: Option<u64>,
    high: u64,
    now: u64,
    pending: Option<(i64, u64)>,
}

impl Counter {
    fn new(name: String, now: u64) -> Counter {
        Counter {
            name,
            written: None,
            high: now,
            now,
            pending: None,
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

    fn device(
        &mut self,
        snapshot: &Snapshot,
        device: u32,
        origin: Option<i64>,
        moments: &[Moment],
    ) -> io::Result<()> {
        let pid = device + 1;
        let meta = |name: &str, args: Value| json!({"ph": "M", "name": name, "pid": pid, "tid": 0, "args": args});
        self.event(&meta(
            "process_name",
            json!({"name": format!("GPU {device}")}),
        ))?;
        self.event(&meta("process_sort_index", json!({"sort_index": device})))?;
        self.event(&meta("thread_name", json!({"name": "allocator"})))?;

        let entries = snapshot.timeline.device(device as usize);
        let has_times = is_timed(entries);
        let clock = |index: usize, last: i64| -> i64 {
            match (has_times, entries[index].time_us(), origin) {
                (false, _, _) => index as i64,
                (true, Some(t), Some(o)) => t.saturating_sub(o),
                // An entry without a time in a timed trace stays at the previous time.
                (true, _, _) => last,
            }
        };
        let suffix = if has_times { "" } else { UNTIMED };
        let mut replay = replay_device(snapshot, device);
        let mut requested = Counter::new(format!("{REQUESTED}{suffix}"), replay.live().total());
        let mut reserved = Counter::new(format!("{RESERVED}{suffix}"), replay.reserved());
        // The moments at an entry, by entry: each entry's are taken as the replay passes it.
        let mut at_entries: Vec<&Moment> = moments.iter().filter(|m| m.entry.is_some()).collect();
        at_entries.sort_by_key(|m| m.entry);
        let mut marks = at_entries.into_iter().peekable();
        let mut group_ts = if entries.is_empty() { 0 } else { clock(0, 0) };
        while let Some(index) = replay.step() {
            let ts = clock(index, group_ts);
            if ts != group_ts {
                self.flush(pid, group_ts, &mut requested)?;
                self.flush(pid, group_ts, &mut reserved)?;
                group_ts = ts;
            }
            requested.set(replay.live().total());
            reserved.set(replay.reserved());
            let entry = &entries[index];
            if entry.action() == Action::Snapshot {
                self.event(&json!({
                    "ph": "i", "s": "p", "name": "snapshot", "pid": pid, "tid": 0, "ts": ts,
                    "args": {"entry": index, "active_bytes": entry.size},
                }))?;
            }
            while let Some(m) = marks.next_if(|m| m.entry == Some(index)) {
                let mut args = json!({"entry": index, "figures": m.figures});
                if m.kind == MomentKind::Oom {
                    args["request_bytes"] = json!(entry.size);
                    args["device_free_bytes"] = json!(entry.device_free());
                }
                self.event(&json!({
                    "ph": "i", "s": "p", "name": marker_name(m.kind), "pid": pid, "tid": 0,
                    "ts": ts, "args": args,
                }))?;
            }
        }
        for counter in [&mut requested, &mut reserved] {
            self.flush(pid, group_ts, counter)?;
            self.release(pid, counter, i64::MAX)?;
        }
        Ok(())
    }

    /// Writes one sample of a counter when it changes the track.
    fn sample(&mut self, pid: u32, ts: i64, counter: &mut Counter, value: u64) -> io::Result<()> {
        if counter.written == Some(value) {
            return Ok(());
        }
        self.event(&json!({
            "ph": "C", "name": counter.name, "pid": pid, "tid": 0, "ts": ts,
            "args": {VALUE_KEY: value},
        }))?;
        counter.written = Some(value);
        Ok(())
    }

    /// Writes the held-back end value if it comes before `next` (the next sample's time);
    /// at `next` itself the next sample replaces it.
    fn release(&mut self, pid: u32, counter: &mut Counter, next: i64) -> io::Result<()> {
        match counter.pending.take() {
            Some((ts, value)) if ts < next => self.sample(pid, ts, counter, value),
            _ => Ok(()),
        }
    }

    /// Ends a group of entries at `ts`: its high-water mark if the group came down from it
    /// (the end value held back to 1 µs later), else where it ended.
    fn flush(&mut self, pid: u32, ts: i64, counter: &mut Counter) -> io::Result<()> {
        self.release(pid, counter, ts)?;
        let (high, now) = (counter.high, counter.now);
        if high != now {
            self.sample(pid, ts, counter, high)?;
            counter.pending = Some((ts.saturating_add(1), now));
        } else {
            self.sample(pid, ts, counter, now)?;
        }
        counter.high = now;
        Ok(())
    }
}
