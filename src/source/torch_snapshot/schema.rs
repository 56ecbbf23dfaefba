//! The typed view of a decoded snapshot: segments, blocks, traces, settings and annotations,
//! for every layout from PyTorch 2.0 (block `history`) to 2.11. Unknown keys are ignored.

use super::budget::{Budget, Expansion, ITEM};
use super::fold::TraceFolder;
use super::host;
use super::intern::Interner;
use super::SnapshotError;
use crate::model::{
    AllocatorSettings, Annotation, Block, BlockState, FormatKeys, HostAllocator, PoolKind, Segment,
    SettingValue, Snapshot, SnapshotFormat, Timeline, TraceEntry,
};
use crate::source::pickle::{Document, NodeId, Value, RENDER_MAX};
use rustc_hash::FxHashMap;
use std::ops::Range;

/// A snapshot whose shape is not what PyTorch writes; the message says where.
#[derive(Debug, thiserror::Error)]
#[error("not a PyTorch memory snapshot: {0}")]
pub struct ShapeError(pub String);

fn shape<T>(message: impl Into<String>) -> Result<T, SnapshotError> {
    Err(ShapeError(message.into()).into())
}

/// What `build` read: the snapshot, warnings, which version-telling keys the file had, and
/// the pinned host memory of PyTorch's host allocator when the file carries some.
pub type Built = (Snapshot, Vec<String>, FormatKeys, Option<HostAllocator>);

/// What a failure while converting means: the bound was passed (`budget`), or the snapshot
/// has the wrong shape.
fn refusal(budget: &Budget, message: String) -> SnapshotError {
    match budget.exceeded() {
        true => Expansion { place: message }.into(),
        false => ShapeError(message).into(),
    }
}

/// Reads the root value of a decoded snapshot.
pub fn build(doc: &Document, root: Value, folder: TraceFolder) -> Result<Built, SnapshotError> {
    let mut warnings = Vec::new();
    let entry_keys = folder.entry_keys();
    let TraceFolder {
        mut interner,
        entries,
        runs,
        unknown_actions,
        first_problem,
        problems,
        ..
    } = folder;
    let (mut host_segments, mut host_traces) = (None, None);
    let (segments_value, traces_value, settings_value, annotations_value) =
        if doc.as_seq(root).is_some() {
            (root, None, None, None)
        } else if let Some(top) = doc.as_dict(root) {
            host_segments = doc.get(top, "host_segments");
            host_traces = doc.get(top, "host_traces");
            let Some(segments) = doc.get(top, "segments") else {
                let keys: Vec<String> = top.iter().map(|(k, _)| doc.render(*k)).collect();
                return Err(ShapeError(format!(
                    "the top-level dict has no 'segments' key (keys: {})",
                    keys.join(", ")
                ))
                .into());
            };
            (
                segments,
                doc.get(top, "device_traces"),
                doc.get(top, "allocator_settings"),
                doc.get(top, "external_annotations"),
            )
        } else {
            return Err(ShapeError(format!(
                "the pickle holds {}, expected a dict with 'segments' and 'device_traces' or a \
                 list of segments",
                describe(doc, root)
            ))
            .into());
        };

    let segment_items = doc.as_seq(segments_value).ok_or_else(|| {
        ShapeError(format!(
            "'segments' is {}, expected a list",
            describe(doc, segments_value)
        ))
    })?;
    let mut segments = Vec::with_capacity(segment_items.len());
    let mut history_format = false;
    for (i, &item) in segment_items.iter().enumerate() {
        let (segment, history) = segment(doc, item, &mut interner)
            .map_err(|why| refusal(&interner.budget, format!("segments[{i}]: {why}")))?;
        history_format |= history;
        segments.push(segment);
    }
    segments.sort_by_key(|s| (s.device, s.address));

    if let Some(problem) = &first_problem {
        let device = traces_value
            .and_then(|t| doc.as_seq(t))
            .and_then(|lists| lists.iter().position(|&l| l == Value::Node(problem.list)));
        let place = match device {
            Some(d) => format!("device_traces[{d}][{}]", problem.position),
            None if host_traces == Some(Value::Node(problem.list)) => {
                format!("host_traces[{}]", problem.position)
            }
            None => format!("trace entry {}", problem.position),
        };
        if interner.budget.exceeded() {
            return Err(Expansion {
                place: format!("{place}: {}", problem.message),
            }
            .into());
        }
        return Err(ShapeError(format!(
            "{place}: {}{}",
            problem.message,
            if problems > 1 {
                format!(" (and {} more bad entries)", problems - 1)
            } else {
                String::new()
            }
        ))
        .into());
    }
    interner
        .budget
        .charge_items(
            doc,
            entries.len(),
            std::mem::size_of::<TraceEntry>(),
            "the trace entries",
        )
        .map_err(|why| refusal(&interner.budget, why))?;
    for (action, count) in unknown_actions {
        warnings.push(format!(
            "skipped {count} trace entries with unknown action '{action}'"
        ));
    }

    // A list object that is also a device's trace (a pickle may share it) stays the device's.
    let device_list = |list| {
        traces_value
            .and_then(|t| doc.as_seq(t))
            .is_some_and(|lists| lists.contains(&list))
    };
    let host_list = match host_traces {
        Some(list @ Value::Node(id)) if !device_list(list) => Some(id),
        _ => None,
    };
    let (entries, runs, mut host_entries) = host::take_entries(entries, runs, host_list);
    interner.parked.drop_from(&mut host_entries);
    let host = host::read(
        doc,
        &mut interner.budget,
        host_segments,
        host_traces,
        host_entries,
        |v| describe(doc, v),
    )
    .map_err(|why| refusal(&interner.budget, why))?;

    let timeline = match traces_value {
        None | Some(Value::None) => Timeline::new(Vec::new(), Vec::new()),
        Some(traces) => {
            let lists = doc.as_seq(traces).ok_or_else(|| {
                ShapeError(format!(
                    "'device_traces' is {}, expected a list",
                    describe(doc, traces)
                ))
            })?;
            // Each list's runs, gathered in one pass so that the loop below stays linear in
            // the number of lists.
            let mut runs_of: FxHashMap<NodeId, Vec<Range<usize>>> = FxHashMap::default();
            for r in &runs {
                runs_of.entry(r.list).or_default().push(r.start..r.end);
            }
            let mut device_lists = Vec::with_capacity(lists.len());
            for (d, &list) in lists.iter().enumerate() {
                let Value::Node(id) = list else {
                    return shape(format!(
                        "device_traces[{d}] is {}, expected a list",
                        describe(doc, list)
                    ));
                };
                match doc.as_seq(list) {
                    Some([]) => {}
                    Some([first, ..]) => {
                        return shape(format!(
                        "device_traces[{d}] holds {}, expected trace-entry dicts with an 'action'",
                        describe(doc, *first)
                    ))
                    }
                    None => return shape(format!("device_traces[{d}] is not a list")),
                }
                device_lists.push(id);
            }
            let (mut entries, ranges) = arrange(entries, &device_lists, &runs_of);
            let extra_at = interner.parked.restore(&mut entries).map_err(ShapeError)?;
            let mut timeline = Timeline::new(entries, ranges);
            timeline.set_streams(std::mem::take(&mut interner.streams));
            timeline.set_extras(std::mem::take(&mut interner.extras), extra_at);
            timeline.set_pools(std::mem::take(&mut interner.pools));
            timeline
        }
    };

    let settings = match settings_value {
        Some(v) if v != Value::None => Some(allocator_settings(doc, v).map_err(ShapeError)?),
        _ => None,
    };
    let annotations = match annotations_value {
        Some(v) => annotations(doc, v, &mut interner.budget)
            .map_err(|why| refusal(&interner.budget, why))?,
        None => Vec::new(),
    };
    let format = if traces_value.is_none() && doc.as_seq(root).is_some() {
        SnapshotFormat::SegmentsOnly
    } else if history_format {
        SnapshotFormat::History
    } else {
        SnapshotFormat::Modern
    };
    let settings_dict = settings_value
        .filter(|&v| v != Value::None)
        .and_then(|v| doc.as_dict(v));
    let keys = FormatKeys {
        allocator_settings: settings_dict.is_some(),
        external_annotations: annotations_value.is_some_and(|v| v != Value::None),
        settings_stream_reuse: settings_dict.is_some_and(|pairs| {
            doc.get(pairs, "graph_capture_record_stream_reuse")
                .is_some()
        }),
        entry_time_us: entry_keys.time_us,
        entry_compile_context: entry_keys.compile_context,
        entry_user_metadata: entry_keys.user_metadata,
    };
    let snapshot = Snapshot {
        format,
        segments,
        timeline,
        stacks: interner.stacks,
        settings,
        annotations,
    };
    Ok((snapshot, warnings, keys, host))
}

/// Each device's range of entries, from the runs of its list. A list of one run is that run,
/// in place (the usual case); otherwise every list's runs are copied together. A list object
/// that several devices share (a pickle may hold the same list more than once) has one range
/// for all of them, so the entries stay as many as the file holds.
fn arrange(
    entries: Vec<TraceEntry>,
    device_lists: &[NodeId],
    runs_of: &FxHashMap<NodeId, Vec<Range<usize>>>,
) -> (Vec<TraceEntry>, Vec<Range<usize>>) {
    if runs_of.values().all(|runs| runs.len() == 1) {
        let ranges = device_lists
            .iter()
            .map(|id| runs_of.get(id).and_then(|runs| runs.first()).cloned())
            .map(|range| range.unwrap_or(0..0))
            .collect();
        return (entries, ranges);
    }
    let mut arranged = Vec::with_capacity(entries.len());
    let mut placed: FxHashMap<NodeId, Range<usize>> = FxHashMap::default();
    let ranges = device_lists
        .iter()
        .map(|id| {
            placed
                .entry(*id)
                .or_insert_with(|| {
                    let start = arranged.len();
                    for r in runs_of.get(id).into_iter().flatten() {
                        arranged.extend_from_slice(&entries[r.clone()]);
                    }
                    start..arranged.len()
                })
                .clone()
        })
        .collect();
    (arranged, ranges)
}

fn describe(doc: &Document, value: Value) -> String {
    let kind = match value {
        Value::None => "None",
        Value::Bool(_) => "a bool",
        Value::Int(_) | Value::BigInt(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Str(_) => "a string",
        Value::Bytes(_) => "bytes",
        Value::Folded(_) => "a trace entry",
        Value::Node(_) if doc.as_dict(value).is_some() => "a dict",
        Value::Node(_) => "a list",
    };
    let mut text = doc.render(value);
    if text.len() > 60 {
        let cut = (0..=60)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push_str("...");
    }
    format!("{kind} ({text})")
}

fn uint(doc: &Document, pairs: &[(Value, Value)], key: &str) -> Result<Option<u64>, String> {
    match doc.get(pairs, key) {
        None => Ok(None),
        Some(v) => doc.as_u64(v).map(Some).ok_or_else(|| {
            format!(
                "'{key}' is not a non-negative integer: {}",
                describe(doc, v)
            )
        }),
    }
}

fn required(doc: &Document, pairs: &[(Value, Value)], key: &str) -> Result<u64, String> {
    uint(doc, pairs, key)?.ok_or_else(|| format!("'{key}' is missing"))
}

/// One segment dict; the bool says whether its blocks used the 2.0 `history` layout.
fn segment(
    doc: &Document,
    value: Value,
    interner: &mut Interner,
) -> Result<(Segment, bool), String> {
    let pairs = doc
        .as_dict(value)
        .ok_or_else(|| format!("is {}, expected a dict", describe(doc, value)))?;
    let looked = pairs.len() as u64 * ITEM;
    let held = std::mem::size_of::<Segment>() as u64;
    interner.budget.charge(doc, looked + held, "a segment")?;
    let address = required(doc, pairs, "address")?;
    let total_size = required(doc, pairs, "total_size")?;
    let device = required(doc, pairs, "device")?;
    let device = u32::try_from(device).map_err(|_| "'device' is too large".to_string())?;
    let stream = doc
        .get(pairs, "stream")
        .map(|v| doc.as_i64(v).map(|s| s as u64).or_else(|| doc.as_u64(v)))
        .unwrap_or(Some(0))
        .ok_or("'stream' is not an integer")?;
    let pool = match doc.get(pairs, "segment_type").and_then(|v| doc.as_str(v)) {
        Some("small") => PoolKind::Small,
        Some("large") | None => PoolKind::Large,
        Some(other) => return Err(format!("unknown segment_type '{other}'")),
    };
    let pool_id = match doc.get(pairs, "segment_pool_id") {
        None | Some(Value::None) => (0, 0),
        Some(v) => match doc.as_seq(v) {
            Some(&[a, b]) => (doc.as_i64(a).unwrap_or(0), doc.as_i64(b).unwrap_or(0)),
            _ => {
                return Err(format!(
                    "'segment_pool_id' is {}, expected a pair",
                    describe(doc, v)
                ))
            }
        },
    };
    let is_expandable = matches!(doc.get(pairs, "is_expandable"), Some(Value::Bool(true)));
    let stack = match doc.get(pairs, "frames") {
        Some(frames) => interner.stack(doc, frames)?,
        None => None,
    };
    let block_values = match doc.get(pairs, "blocks") {
        Some(v) => doc
            .as_seq(v)
            .ok_or_else(|| format!("'blocks' is {}, expected a list", describe(doc, v)))?,
        None => &[],
    };
    let mut blocks = Vec::with_capacity(block_values.len());
    let mut next_address = address;
    let mut history_format = false;
    for (j, &b) in block_values.iter().enumerate() {
        let (block, history) =
            block(doc, b, next_address, interner).map_err(|why| format!("blocks[{j}]: {why}"))?;
        history_format |= history;
        next_address = block.address.saturating_add(block.size);
        blocks.push(block);
    }
    let segment = Segment {
        device,
        address,
        total_size,
        stream,
        pool,
        pool_id,
        is_expandable,
        stack,
        blocks,
    };
    Ok((segment, history_format))
}

/// One block dict. 2.0 blocks have no address (they tile the segment in order) and keep the
/// request and stack in `history[0]`.
fn block(
    doc: &Document,
    value: Value,
    next_address: u64,
    interner: &mut Interner,
) -> Result<(Block, bool), String> {
    let pairs = doc
        .as_dict(value)
        .ok_or_else(|| format!("is {}, expected a dict", describe(doc, value)))?;
    let looked = pairs.len() as u64 * ITEM;
    let held = std::mem::size_of::<Block>() as u64;
    interner.budget.charge(doc, looked + held, "a block")?;
    let size = required(doc, pairs, "size")?;
    let state_value = doc.get(pairs, "state").ok_or("'state' is missing")?;
    let state_name = doc.as_str(state_value).ok_or("'state' is not a string")?;
    let state = BlockState::from_torch_name(state_name)
        .ok_or_else(|| format!("unknown block state '{state_name}'"))?;
    let recorded_address = uint(doc, pairs, "address")?;
    let address = recorded_address.unwrap_or(next_address);
    let history = doc
        .get(pairs, "history")
        .and_then(|h| doc.as_seq(h))
        .and_then(|h| h.first().copied());
    // A 2.0 block (no address) without history counts its size (docs/json/analyze.md).
    let mut requested_size = match recorded_address {
        Some(_) => uint(doc, pairs, "requested_size")?,
        None => None,
    };
    let mut frames = doc.get(pairs, "frames");
    if let Some(first) = history {
        let entry = doc.as_dict(first).ok_or("'history' entry is not a dict")?;
        if let Some(real) = uint(doc, entry, "real_size")? {
            requested_size = Some(real);
        }
        frames = frames.or_else(|| doc.get(entry, "frames"));
    }
    let stack = match frames {
        Some(frames) => interner.stack(doc, frames)?,
        None => None,
    };
    let block = Block {
        address,
        size,
        requested_size: requested_size.unwrap_or(size),
        state,
        stack,
    };
    Ok((block, doc.get(pairs, "history").is_some()))
}

fn allocator_settings(doc: &Document, value: Value) -> Result<AllocatorSettings, String> {
    let pairs = doc.as_dict(value).ok_or_else(|| {
        format!(
            "'allocator_settings' is {}, expected a dict",
            describe(doc, value)
        )
    })?;
    let mut settings = AllocatorSettings {
        alloc_conf: doc
            .get(pairs, "PYTORCH_CUDA_ALLOC_CONF")
            .and_then(|v| doc.as_str(v))
            .map(str::to_string),
        expandable_segments: match doc.get(pairs, "expandable_segments") {
            Some(Value::Bool(b)) => Some(b),
            _ => None,
        },
        max_split_size: doc
            .get(pairs, "max_split_size")
            .and_then(|v| doc.as_i64(v))
            .and_then(|v| u64::try_from(v).ok()),
        garbage_collection_threshold: match doc.get(pairs, "garbage_collection_threshold") {
            Some(Value::Float(f)) => Some(f),
            Some(Value::Int(i)) => Some(i as f64),
            _ => None,
        },
        roundup_power2_divisions: Vec::new(),
        other: other_settings(doc, pairs),
    };
    if let Some(divisions) = doc
        .get(pairs, "roundup_power2_divisions")
        .and_then(|v| doc.as_dict(v))
    {
        for &(k, v) in divisions {
            let interval = doc
                .as_str(k)
                .and_then(|s| s.parse::<u64>().ok())
                .or_else(|| doc.as_u64(k));
            if let (Some(interval), Some(div)) = (interval, doc.as_u64(v)) {
                if div > 0 {
                    settings.roundup_power2_divisions.push((interval, div));
                }
            }
        }
        settings.roundup_power2_divisions.sort_unstable();
    }
    Ok(settings)
}

/// The settings `allocator_settings` reads into named fields.
const INTERPRETED_SETTINGS: [&str; 5] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "expandable_segments",
    "max_split_size",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
];

/// Every other setting with a plain value (bool, int, float, string), in file order.
fn other_settings(doc: &Document, pairs: &[(Value, Value)]) -> Vec<(String, SettingValue)> {
    pairs
        .iter()
        .filter_map(|&(k, v)| {
            let key = doc.as_str(k)?;
            if INTERPRETED_SETTINGS.contains(&key) {
                return None;
            }
            let value = match v {
                Value::Bool(b) => SettingValue::Bool(b),
                Value::Int(i) => SettingValue::Int(i),
                Value::Float(f) => SettingValue::Float(f),
                other => SettingValue::Str(doc.as_str(other)?.to_string()),
            };
            Some((key.to_string(), value))
        })
        .collect()
}

/// `external_annotations`; entries that are not dicts are skipped. The text each copies is
/// charged to `budget` first.
fn annotations(
    doc: &Document,
    value: Value,
    budget: &mut Budget,
) -> Result<Vec<Annotation>, String> {
    let Some(items) = doc.as_seq(value) else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .filter_map(|(i, &item)| Some((i, doc.as_dict(item)?)))
        .map(|(i, pairs)| {
            let text_len = |key| {
                doc.get(pairs, key)
                    .map_or(0, |v| doc.as_str(v).map_or(RENDER_MAX, str::len) as u64)
            };
            let cost = text_len("stage")
                + text_len("name")
                + pairs.len() as u64 * ITEM
                + std::mem::size_of::<Annotation>() as u64;
            budget.charge(doc, cost, &format!("external_annotations[{i}]"))?;
            let text = |key| {
                doc.get(pairs, key)
                    .map(|v| doc.as_str(v).map_or_else(|| doc.render(v), str::to_string))
            };
            Ok(Annotation {
                device: doc
                    .get(pairs, "device")
                    .and_then(|v| doc.as_u64(v))
                    .and_then(|d| u32::try_from(d).ok()),
                time_us: doc.get(pairs, "time_us").and_then(|v| doc.as_i64(v)),
                stage: text("stage"),
                name: text("name"),
            })
        })
        .collect()
}
