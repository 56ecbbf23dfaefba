//! `host_segments` and `host_traces`: the pinned host memory of PyTorch's caching host
//! allocator (PyTorch PR #182407). Host segments are segment dicts as the device's are, with
//! `device` -1 and one block each; host trace entries are trace-entry dicts in one flat list
//! (the folder has already turned them into rows, with the device traces' entries). Unknown keys
//! are ignored; a snapshot whose two lists are absent or empty has no host allocator data.

use super::budget::{Budget, ITEM};
use super::fold::Run;
use crate::model::{HostAllocator, HostSegment, TraceEntry};
use crate::source::pickle::{Document, NodeId, Value};

/// The folded entries that came out of the `host_traces` list (`host`), taken out of `entries`
/// and `runs` so that the device timeline holds only its own. Nothing moves when no entry did.
pub fn take_entries(
    entries: Vec<TraceEntry>,
    runs: Vec<Run>,
    host: Option<NodeId>,
) -> (Vec<TraceEntry>, Vec<Run>, Vec<TraceEntry>) {
    let Some(host) = host.filter(|&h| runs.iter().any(|r| r.list == h)) else {
        return (entries, runs, Vec::new());
    };
    let mut device_entries = Vec::with_capacity(entries.len());
    let mut device_runs = Vec::with_capacity(runs.len());
    let mut host_entries = Vec::new();
    for r in runs {
        let rows = &entries[r.start..r.end];
        if r.list == host {
            host_entries.extend_from_slice(rows);
        } else {
            let start = device_entries.len();
            device_entries.extend_from_slice(rows);
            device_runs.push(Run {
                list: r.list,
                start,
                end: device_entries.len(),
            });
        }
    }
    (device_entries, device_runs, host_entries)
}

/// The host allocator's data, `None` when the snapshot has neither host segments nor host trace
/// entries. `traces` is the `host_traces` value, checked to be a list that held only entries.
pub fn read(
    doc: &Document,
    budget: &mut Budget,
    segments: Option<Value>,
    traces: Option<Value>,
    trace: Vec<TraceEntry>,
    describe: impl Fn(Value) -> String,
) -> Result<Option<HostAllocator>, String> {
    if let Some(v) = traces.filter(|&v| v != Value::None) {
        match doc.as_seq(v) {
            Some([]) => {}
            Some([first, ..]) => {
                return Err(format!(
                    "'host_traces' holds {}, expected trace-entry dicts with an 'action'",
                    describe(*first)
                ))
            }
            None => return Err(format!("'host_traces' is {}, expected a list", describe(v))),
        }
    }
    let items = match segments.filter(|&v| v != Value::None) {
        None => &[][..],
        Some(v) => doc
            .as_seq(v)
            .ok_or_else(|| format!("'host_segments' is {}, expected a list", describe(v)))?,
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, &item) in items.iter().enumerate() {
        let segment = segment(doc, budget, item, &describe)
            .map_err(|why| format!("host_segments[{i}]: {why}"))?;
        out.push(segment);
    }
    if out.is_empty() && trace.is_empty() {
        return Ok(None);
    }
    out.sort_by_key(|s| s.address);
    Ok(Some(HostAllocator {
        segments: out,
        trace,
    }))
}

fn uint(
    doc: &Document,
    pairs: &[(Value, Value)],
    key: &str,
    describe: &impl Fn(Value) -> String,
) -> Result<Option<u64>, String> {
    match doc.get(pairs, key) {
        None => Ok(None),
        Some(v) => doc
            .as_u64(v)
            .map(Some)
            .ok_or_else(|| format!("'{key}' is not a non-negative integer: {}", describe(v))),
    }
}

/// One host segment dict. `allocated_size` is read, else the sizes of its blocks in state
/// `active_allocated`; `device`, `stream`, `frames` and other keys are not needed.
fn segment(
    doc: &Document,
    budget: &mut Budget,
    value: Value,
    describe: &impl Fn(Value) -> String,
) -> Result<HostSegment, String> {
    let pairs = doc
        .as_dict(value)
        .ok_or_else(|| format!("is {}, expected a dict", describe(value)))?;
    let held = std::mem::size_of::<HostSegment>() as u64;
    budget.charge(doc, pairs.len() as u64 * ITEM + held, "a host segment")?;
    let address = uint(doc, pairs, "address", describe)?.ok_or("'address' is missing")?;
    let size = uint(doc, pairs, "total_size", describe)?.ok_or("'total_size' is missing")?;
    let allocated = match uint(doc, pairs, "allocated_size", describe)? {
        Some(bytes) => bytes,
        None => blocks_allocated(doc, budget, pairs, describe)?,
    };
    if allocated > size {
        return Err(format!(
            "'allocated_size' {allocated} is larger than 'total_size' {size}"
        ));
    }
    let pool_id = match doc.get(pairs, "segment_pool_id") {
        None | Some(Value::None) => (0, 0),
        Some(v) => match doc.as_seq(v) {
            Some(&[a, b]) => match (doc.as_i64(a), doc.as_i64(b)) {
                (Some(a), Some(b)) => (a, b),
                _ => return Err(format!("'segment_pool_id' is {}", describe(v))),
            },
            _ => {
                return Err(format!(
                    "'segment_pool_id' is {}, expected a pair",
                    describe(v)
                ))
            }
        },
    };
    Ok(HostSegment {
        address,
        size,
        allocated,
        pool_id,
    })
}

/// The bytes of a segment's blocks in state `active_allocated` (0 without blocks).
fn blocks_allocated(
    doc: &Document,
    budget: &mut Budget,
    pairs: &[(Value, Value)],
    describe: &impl Fn(Value) -> String,
) -> Result<u64, String> {
    let Some(blocks) = doc.get(pairs, "blocks").filter(|&v| v != Value::None) else {
        return Ok(0);
    };
    let items = doc
        .as_seq(blocks)
        .ok_or_else(|| format!("'blocks' is {}, expected a list", describe(blocks)))?;
    let mut bytes = 0u64;
    for (j, &b) in items.iter().enumerate() {
        let block = doc
            .as_dict(b)
            .ok_or_else(|| format!("blocks[{j}] is {}, expected a dict", describe(b)))?;
        budget.charge(doc, block.len() as u64 * ITEM + ITEM, "a host block")?;
        let allocated =
            doc.get(block, "state").and_then(|s| doc.as_str(s)) == Some("active_allocated");
        if allocated {
            let size = uint(doc, block, "size", describe)?
                .ok_or_else(|| format!("blocks[{j}]: 'size' is missing"))?;
            bytes = bytes.saturating_add(size);
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use crate::model::{Action, HostSegment};
    use crate::report::export::pickle::PickleWriter;
    use crate::source::torch_snapshot::{read, Parsed, SnapshotError};
    use std::io;

    type W = PickleWriter<Vec<u8>>;

    fn entry(w: &mut W, action: &str, addr: i128, size: i128, t: i128) -> io::Result<()> {
        w.begin_dict(9)?;
        for (key, value) in [
            ("addr", addr),
            ("size", size),
            ("stream", 0),
            ("time_us", t),
        ] {
            w.key(key)?;
            w.int(value)?;
        }
        w.key("action")?;
        w.str(action)?;
        w.key("compile_context")?;
        w.str("N/A")?;
        w.key("user_metadata")?;
        w.str("")?;
        w.key("pool_id")?;
        w.int_pair(0, 0)?;
        w.key("frames")?;
        w.begin_list(0)?;
        w.end()?;
        w.end()
    }

    /// A host segment as PyTorch writes one: device -1, one block, keys the reader does not need.
    fn host_segment(w: &mut W, address: i128, size: i128, allocated: bool) -> io::Result<()> {
        w.begin_dict(11)?;
        for (key, value) in [
            ("device", -1),
            ("address", address),
            ("total_size", size),
            ("allocated_size", if allocated { size } else { 0 }),
            ("active_size", if allocated { size } else { 0 }),
            ("requested_size", 0),
            ("stream", 0),
        ] {
            w.key(key)?;
            w.int(value)?;
        }
        w.key("segment_type")?;
        w.str("small")?;
        w.key("segment_pool_id")?;
        w.int_pair(0, 0)?;
        w.key("is_expandable")?;
        w.bool(false)?;
        w.key("blocks")?;
        w.begin_list(1)?;
        w.item()?;
        w.begin_dict(4)?;
        w.key("address")?;
        w.int(address)?;
        w.key("size")?;
        w.int(size)?;
        w.key("requested_size")?;
        w.int(size)?;
        w.key("state")?;
        w.str(if allocated {
            "active_allocated"
        } else {
            "inactive"
        })?;
        w.end()?;
        w.end()?;
        w.end()
    }

    /// A snapshot with one device segment and entry, and the host data `host` writes into
    /// `host_segments` and `host_traces`; the host keys come first, so that the host entries are
    /// folded before the device's.
    fn snapshot(host: impl Fn(&mut W) -> io::Result<()>) -> Result<Parsed, SnapshotError> {
        let bytes = (|| -> io::Result<Vec<u8>> {
            let mut w = PickleWriter::new(Vec::new())?;
            w.begin_dict(4)?;
            host(&mut w)?;
            w.key("segments")?;
            w.begin_list(1)?;
            w.item()?;
            w.begin_dict(4)?;
            for (key, value) in [("device", 0), ("address", 1 << 30), ("total_size", 2 << 20)] {
                w.key(key)?;
                w.int(value)?;
            }
            w.key("blocks")?;
            w.begin_list(0)?;
            w.end()?;
            w.end()?;
            w.end()?;
            w.key("device_traces")?;
            w.begin_list(1)?;
            w.item()?;
            w.begin_list(1)?;
            w.item()?;
            entry(&mut w, "segment_alloc", 1 << 30, 2 << 20, 5)?;
            w.end()?;
            w.end()?;
            w.end()?;
            w.finish()
        })()
        .expect("written");
        read(&bytes[..])
    }

    fn good_host(w: &mut W) -> io::Result<()> {
        w.key("host_segments")?;
        w.begin_list(2)?;
        w.item()?;
        host_segment(w, 0x9000_0000, 8192, false)?;
        w.item()?;
        host_segment(w, 0x7000_0000, 4096, true)?;
        w.end()?;
        w.key("host_traces")?;
        w.begin_list(3)?;
        w.item()?;
        entry(w, "segment_alloc", 0x7000_0000, 4096, 10)?;
        w.item()?;
        entry(w, "alloc", 0x7000_0000, 4096, 11)?;
        w.item()?;
        entry(w, "segment_alloc", 0x9000_0000, 8192, 12)?;
        w.end()
    }

    #[test]
    fn host_segments_and_traces_are_read_apart_from_the_device_trace() {
        let parsed = snapshot(good_host).expect("reads");
        let host = parsed.host.expect("host data");
        assert_eq!(
            host.segments,
            [
                HostSegment {
                    address: 0x7000_0000,
                    size: 4096,
                    allocated: 4096,
                    pool_id: (0, 0)
                },
                HostSegment {
                    address: 0x9000_0000,
                    size: 8192,
                    allocated: 0,
                    pool_id: (0, 0)
                },
            ]
        );
        let actions: Vec<(Action, Option<u64>, Option<i64>)> = (host.trace.iter())
            .map(|e| (e.action(), e.addr(), e.time_us()))
            .collect();
        assert_eq!(
            actions,
            [
                (Action::SegmentAlloc, Some(0x7000_0000), Some(10)),
                (Action::Alloc, Some(0x7000_0000), Some(11)),
                (Action::SegmentAlloc, Some(0x9000_0000), Some(12)),
            ]
        );
        let timeline = &parsed.snapshot.timeline;
        assert_eq!(timeline.device_count(), 1);
        let device: Vec<Option<u64>> = timeline.device(0).iter().map(|e| e.addr()).collect();
        assert_eq!(
            device,
            [Some(1 << 30)],
            "the host entries are not the device's"
        );
    }

    #[test]
    fn empty_host_lists_are_no_host_data() {
        let parsed = snapshot(|w| {
            w.key("host_segments")?;
            w.begin_list(0)?;
            w.end()?;
            w.key("host_traces")?;
            w.begin_list(0)?;
            w.end()
        })
        .expect("reads");
        assert_eq!(parsed.host, None);
        assert_eq!(parsed.snapshot.timeline.device(0).len(), 1);
    }

    #[test]
    fn a_bad_host_segment_or_entry_is_named() {
        let bad_segment = snapshot(|w| {
            w.key("host_segments")?;
            w.begin_list(1)?;
            w.item()?;
            w.begin_dict(1)?;
            w.key("address")?;
            w.int(4096)?;
            w.end()?;
            w.end()?;
            w.key("host_traces")?;
            w.begin_list(0)?;
            w.end()
        })
        .expect_err("refused");
        assert_eq!(
            bad_segment.to_string(),
            "not a PyTorch memory snapshot: host_segments[0]: 'total_size' is missing"
        );
        let bad_entry = snapshot(|w| {
            w.key("host_segments")?;
            w.begin_list(0)?;
            w.end()?;
            w.key("host_traces")?;
            w.begin_list(2)?;
            w.item()?;
            entry(w, "alloc", 4096, 64, 1)?;
            w.item()?;
            entry(w, "alloc", 4096, -64, 2)?;
            w.end()
        })
        .expect_err("refused");
        assert!(
            bad_entry.to_string().contains("host_traces[1]: 'size'"),
            "{bad_entry}"
        );
        let not_a_list = snapshot(|w| {
            w.key("host_segments")?;
            w.int(3)?;
            w.key("host_traces")?;
            w.none()
        })
        .expect_err("refused");
        assert!(
            not_a_list
                .to_string()
                .contains("'host_segments' is an integer (3)"),
            "{not_a_list}"
        );
    }
}
