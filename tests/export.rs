//! `memprof export`: every committed fixture and the real snapshots in
//! `../shared/fixtures/real/` go through `--to torch-snapshot` and come back with the same
//! figures (from `analyze` and from Python's `pickle` with `fixtures/gen/expected_stats.py`);
//! `--to perfetto` is a valid Chrome trace whose counters peak where `analyze` says; `--to json`
//! reads back into the entries and segments of the source.

use crate::util::{analyze_json, fixture, memprof, real_fixtures, repo, skip, stderr};
use memprof::model::{Action, Snapshot};
use memprof::source::torch_snapshot;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch directory of this test process, removed and made again.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("memprof-export-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

pub(crate) fn export(input: &Path, to: &str, output: &Path) {
    let out = memprof(&[
        "export",
        &input.display().to_string(),
        "--to",
        to,
        "-o",
        &output.display().to_string(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "export {} --to {to}: {}",
        input.display(),
        stderr(&out)
    );
}

fn python(args: &[&str]) -> String {
    let out = Command::new("python3")
        .args(args)
        .current_dir(repo())
        .output()
        .expect("python3 runs (it is on every machine)");
    assert!(
        out.status.success(),
        "python3 {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `expected_stats.py FILE`'s per-device figures.
fn python_stats(file: &Path) -> Value {
    let text = python(&[
        "fixtures/gen/expected_stats.py",
        &file.display().to_string(),
    ]);
    let doc: Value = serde_json::from_str(&text).expect("expected_stats prints JSON");
    let (_, report) = doc
        .as_object()
        .and_then(|o| o.iter().next())
        .expect("one file");
    report["devices"].clone()
}

/// analyze's devices and format, which must survive an export unchanged.
fn analyze_figures(file: &Path) -> (Value, Value) {
    let doc = analyze_json(&[file.to_path_buf()]);
    let input = &doc["inputs"][0];
    (input["devices"].clone(), input["format"].clone())
}

fn load(file: &Path) -> Snapshot {
    let bytes = std::fs::read(file).expect("readable");
    torch_snapshot::read(&bytes[..])
        .expect("a snapshot")
        .snapshot
}

/// Exports `source` to a snapshot pickle and checks analyze and the Python oracle agree.
fn round_trip(name: &str, source: &Path, dir: &Path) {
    let exported = dir.join(format!("{name}.pickle"));
    export(source, "torch-snapshot", &exported);
    let head = std::fs::read(&exported).expect("export written");
    assert_eq!(&head[..3], b"\x80\x04\x95", "{name}: protocol 4, framed");

    let (devices, format) = analyze_figures(source);
    let (again, again_format) = analyze_figures(&exported);
    assert_eq!(
        again, devices,
        "{name}: analyze figures after the round trip"
    );
    // A 2.0 file and a bare segment list are written in the modern dict layout; everything
    // else keeps its layout.
    match format.as_str() {
        Some("history" | "segments_only") => assert_eq!(again_format, "modern", "{name}"),
        _ => assert_eq!(again_format, format, "{name}: layout"),
    }
    assert_eq!(
        python_stats(&exported),
        python_stats(source),
        "{name}: expected_stats.py on the export"
    );
    // Exporting the export changes nothing: the writer loses nothing the reader keeps.
    let again = dir.join(format!("{name}.again.pickle"));
    export(&exported, "torch-snapshot", &again);
    assert!(
        std::fs::read(&again).expect("written") == head,
        "{name}: a second export is byte-identical"
    );
}

#[test]
fn torch_snapshot_round_trips_every_fixture() {
    let dir = scratch("fixtures");
    for name in crate::util::FIXTURES {
        let source = fixture(&format!("snapshots/{name}.pickle"));
        round_trip(name, &source, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn torch_snapshot_round_trips_the_real_snapshots() {
    let Some(real) = real_fixtures() else {
        return;
    };
    let dir = scratch("real");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&real)
        .expect("readable dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    if files.is_empty() {
        skip(crate::util::NO_REAL_SNAPSHOTS);
    }
    for (i, file) in files.iter().enumerate() {
        round_trip(&format!("real{i}"), file, &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every real snapshot under `../shared/fixtures/real/` (and `more/`), in name order.
pub(crate) fn all_real_snapshots() -> Vec<PathBuf> {
    let Some(real) = real_fixtures() else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = [real.clone(), real.join("more")]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl"))
        .collect();
    files.sort();
    if files.is_empty() {
        skip(crate::util::NO_REAL_SNAPSHOTS);
    }
    files
}

/// Every real file's torch-snapshot export loads in Python (`pickle`, no torch) with every key
/// of the input: `fixtures/gen/same_keys.py` walks both and compares dict keys and list
/// lengths everywhere (a 2.0 file's blocks come out in the newer layout, which it allows).
#[test]
fn python_reads_every_real_export_with_the_keys_of_its_input() {
    if !crate::util::have("python3") {
        return;
    }
    let files = all_real_snapshots();
    let dir = scratch("same-keys");
    let exported = dir.join("export.pickle");
    for file in &files {
        export(file, "torch-snapshot", &exported);
        let out = Command::new("python3")
            .arg("fixtures/gen/same_keys.py")
            .arg(file)
            .arg(&exported)
            .current_dir(repo())
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "{}: {}{}",
            file.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The committed fixtures too, but for the one that holds keys no PyTorch writes (a
    // 'future_key' and frame keys memprof does not keep).
    for name in crate::util::FIXTURES {
        if name == "v2_11_full" {
            continue;
        }
        let source = fixture(&format!("snapshots/{name}.pickle"));
        export(&source, "torch-snapshot", &exported);
        let out = python(&[
            "fixtures/gen/same_keys.py",
            &source.display().to_string(),
            &exported.display().to_string(),
        ]);
        assert_eq!(out, "", "{name}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recording sees only the driver's side of a free: its export pairs each `free_completed`
/// with a `free_requested` just before it, as PyTorch writes them, so memory_viz does not show
/// the block waiting on another stream.
#[test]
fn a_recording_export_pairs_every_completed_free_with_its_request() {
    if !crate::util::have("python3") {
        return;
    }
    let dir = scratch("pairs");
    let exported = dir.join("run.pickle");
    export(
        &fixture("recordings/peak_oom_v2.memprof"),
        "torch-snapshot",
        &exported,
    );
    let script = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
completed = 0
for trace in d["device_traces"]:
    pending = set()
    for e in trace:
        if e["action"] == "free_requested":
            pending.add(e["addr"])
        elif e["action"] == "free_completed":
            assert e["addr"] in pending, e
            pending.remove(e["addr"])
            completed += 1
print(completed)
"#;
    let out = python(&["-c", script, &exported.display().to_string()]);
    let completed: usize = out.trim().parse().expect("a count");
    assert!(completed > 0, "the recording frees memory");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Python loads the export and finds the recording in it: segments, blocks, every trace entry
/// with its frames, settings; and frame lists are shared objects, as in PyTorch's files.
const PY_COMPARE: &str = r#"
import pickle, sys
orig = pickle.load(open(sys.argv[1], "rb"))
new = pickle.load(open(sys.argv[2], "rb"))
def frames(fs):
    return [(f["filename"], f["line"], f["name"]) for f in fs or []]
SEG = ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
       "stream", "segment_type", "is_expandable")
assert len(orig["segments"]) == len(new["segments"])
for a, b in zip(orig["segments"], new["segments"]):
    for k in SEG:
        assert a.get(k, False) == b[k], (k, a.get(k), b[k])
    assert tuple(a.get("segment_pool_id", (0, 0))) == b["segment_pool_id"]
    assert frames(a.get("frames")) == frames(b["frames"])
    assert len(a["blocks"]) == len(b["blocks"])
    for x, y in zip(a["blocks"], b["blocks"]):
        for k in ("address", "size", "requested_size", "state"):
            assert x[k] == y[k], (k, x[k], y[k])
        assert frames(x.get("frames")) == frames(y["frames"])
ta, tb = orig["device_traces"], new["device_traces"]
assert len(ta) == len(tb)
n = 0
for la, lb in zip(ta, tb):
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        for k in ("action", "addr", "device_free", "size", "stream", "time_us"):
            assert x.get(k) == y.get(k), (k, x.get(k), y.get(k))
        assert frames(x.get("frames")) == frames(y.get("frames"))
        n += 1
sa, sb = orig.get("allocator_settings"), new.get("allocator_settings")
assert (sa is None) == (sb is None)
if sa:
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "expandable_segments"):
        assert sa[k] == sb[k], k
lists = [e["frames"] for l in tb for e in l if "frames" in e]
if lists:
    assert len({id(l) for l in lists}) < len(lists), "frame lists are shared"
    dicts = [f for l in lists for f in l]
    assert len({id(f) for f in dicts}) < len(dicts), "frame dicts are shared"
print(n)
"#;

#[test]
fn python_pickle_loads_the_export_and_finds_the_recording() {
    let dir = scratch("python");
    for name in [
        "v2_1_basic",
        "expandable",
        "oom",
        "multi_device",
        "private_pool",
        "pending_free",
        "v2_11_full",
        "demo_oom",
    ] {
        let source = fixture(&format!("snapshots/{name}.pickle"));
        let exported = dir.join(format!("{name}.pickle"));
        export(&source, "torch-snapshot", &exported);
        let compared = python(&[
            "-c",
            PY_COMPARE,
            &source.display().to_string(),
            &exported.display().to_string(),
        ]);
        let entries: usize = compared.trim().parse().expect("a count");
        let want: usize = {
            let s = load(&source);
            (0..s.timeline.device_count())
                .map(|d| s.timeline.device(d).len())
                .sum()
        };
        assert_eq!(entries, want, "{name}: entries compared");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perfetto_counters_peak_where_analyze_says() {
    let dir = scratch("perfetto");
    for name in [
        "v2_1_basic",
        "oom",
        "multi_device",
        "v2_11_full",
        "segments_only",
        "demo_oom",
        "expandable",
    ] {
        let source = fixture(&format!("snapshots/{name}.pickle"));
        let out = dir.join(format!("{name}.json"));
        export(&source, "perfetto", &out);
        let trace: Value =
            serde_json::from_slice(&std::fs::read(&out).expect("written")).expect("valid JSON");
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        let snapshot = load(&source);
        let devices = snapshot.devices();
        let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
        assert_eq!(count("M"), 3 * devices.len(), "{name}: metadata events");
        // A marker for each `snapshot` call and each moment of the account at an entry.
        let calls = devices
            .iter()
            .flat_map(|&d| snapshot.timeline.device(d as usize))
            .filter(|e| e.action() == Action::Snapshot)
            .count();
        let analyzed = crate::util::memprof(&["analyze", "--json", &source.display().to_string()]);
        let analyzed: Value = serde_json::from_slice(&analyzed.stdout).expect("analyze JSON");
        let moments = analyzed["inputs"][0]["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .flat_map(|d| d["moments"].as_array().cloned().unwrap_or_default())
            .filter(|m| !m["entry"].is_null())
            .count();
        assert_eq!(count("i"), calls + moments, "{name}: instant events");
        let oom_events = events
            .iter()
            .filter(|e| e["ph"] == "i" && e["name"] == "OOM")
            .count();
        if name.contains("oom") {
            assert!(oom_events > 0, "{name}: an OOM marker");
        }

        let first_ts = events
            .iter()
            .filter(|e| e["ph"] == "C")
            .filter_map(|e| e["ts"].as_i64())
            .min();
        assert_eq!(first_ts, Some(0), "{name}: time starts at the first entry");

        let first_ts = events
            .iter()
            .filter(|e| e["ph"] == "C")
            .filter_map(|e| e["ts"].as_i64())
            .min();
        assert_eq!(first_ts, Some(0), "{name}: time starts at the first entry");

        let (analyzed, _) = analyze_figures(&source);
        for dev in analyzed.as_array().expect("devices") {
            // GPU N is process N + 1: Perfetto reads pid 0 as the idle process.
            let pid = dev["device"].as_u64().expect("device") + 1;
            let track = |counter: &str| -> Vec<(i64, u64)> {
                events
                    .iter()
                    .filter(|e| e["ph"] == "C" && e["pid"] == pid)
                    .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with(counter)))
                    .map(|e| {
                        (
                            e["ts"].as_i64().expect("ts"),
                            e["args"]["bytes"].as_u64().expect("bytes"),
                        )
                    })
                    .collect()
            };
            let max = |t: &[(i64, u64)]| t.iter().map(|&(_, v)| v).max();
            let requested = track("requested");
            let reserved = track("reserved");
            assert_eq!(
                max(&requested),
                dev["trace"]["peak_active_bytes"].as_u64(),
                "{name} device {pid}: peak requested"
            );
            assert_eq!(
                max(&reserved),
                dev["trace"]["peak_reserved_bytes"].as_u64(),
                "{name} device {pid}: reserved peak"
            );
            for t in [&requested, &reserved] {
                assert!(t.windows(2).all(|w| w[0].0 <= w[1].0), "{name}: time order");
                // Coalesced, and a high-water mark keeps a width: one value per timestamp.
                assert!(t.windows(2).all(|w| w[0].0 < w[1].0), "{name}: coalesced");
                assert!(
                    t.windows(2).all(|w| w[0].1 != w[1].1),
                    "{name}: only changes"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reader of `--to json` documents: what a script would declare.
#[derive(Deserialize)]
struct EventsDoc {
    schema_version: u32,
    kind: String,
    frames: Vec<JsonFrame>,
    devices: Vec<JsonDevice>,
    segments: Vec<JsonSegment>,
}

#[derive(Deserialize)]
struct JsonFrame {
    filename: String,
    line: i64,
    name: String,
}

#[derive(Deserialize)]
struct JsonDevice {
    device: u32,
    entries: Vec<JsonEntry>,
}

#[derive(Deserialize)]
struct JsonEntry {
    index: usize,
    action: String,
    addr: Option<u64>,
    size: u64,
    stream: u64,
    time_us: Option<i64>,
    device_free: Option<u64>,
    frames: Vec<u32>,
}

#[derive(Deserialize)]
struct JsonSegment {
    device: u32,
    address: u64,
    total_size: u64,
    stream: u64,
    pool_id: (i64, i64),
    is_expandable: bool,
    blocks: Vec<JsonBlock>,
}

#[derive(Deserialize)]
struct JsonBlock {
    address: u64,
    size: u64,
    requested_size: u64,
    state: String,
    frames: Vec<u32>,
}

type FrameKey = (String, i64, String);

fn model_frames(s: &Snapshot, stack: Option<memprof::model::StackId>) -> Vec<FrameKey> {
    stack.map_or_else(Vec::new, |id| {
        s.stacks
            .frames(id)
            .map(|f| (f.filename.clone(), f.line, f.name.clone()))
            .collect()
    })
}

fn json_frames(doc: &EventsDoc, indices: &[u32]) -> Vec<FrameKey> {
    indices
        .iter()
        .map(|&i| {
            let f = &doc.frames[i as usize];
            (f.filename.clone(), f.line, f.name.clone())
        })
        .collect()
}

#[test]
fn json_events_read_back_into_the_source() {
    let dir = scratch("json");
    for name in crate::util::FIXTURES {
        let source = fixture(&format!("snapshots/{name}.pickle"));
        let out = dir.join(format!("{name}.json"));
        export(&source, "json", &out);
        let doc: EventsDoc =
            serde_json::from_slice(&std::fs::read(&out).expect("written")).expect("the schema");
        assert_eq!(doc.schema_version, 1);
        assert_eq!(doc.kind, "memprof_events");
        let s = load(&source);

        let devices: Vec<u32> = doc.devices.iter().map(|d| d.device).collect();
        assert_eq!(devices, s.devices(), "{name}: devices");
        for dev in &doc.devices {
            let entries = s.timeline.device(dev.device as usize);
            assert_eq!(dev.entries.len(), entries.len(), "{name}: entry count");
            for (i, (j, e)) in dev.entries.iter().zip(entries).enumerate() {
                let at = format!("{name} device {} entry {i}", dev.device);
                assert_eq!(j.index, i, "{at}");
                assert_eq!(j.action, e.action().torch_name(), "{at}");
                assert_eq!(j.addr, e.addr(), "{at}");
                assert_eq!(j.size, e.size, "{at}");
                assert_eq!(j.stream, s.timeline.stream(e.stream), "{at}");
                assert_eq!(j.time_us, e.time_us(), "{at}");
                assert_eq!(j.device_free, e.device_free(), "{at}");
                assert_eq!(
                    json_frames(&doc, &j.frames),
                    model_frames(&s, e.stack),
                    "{at}"
                );
            }
        }

        assert_eq!(doc.segments.len(), s.segments.len(), "{name}: segments");
        for (j, seg) in doc.segments.iter().zip(&s.segments) {
            let at = format!("{name} segment 0x{:x}", seg.address);
            assert_eq!(
                (
                    j.device,
                    j.address,
                    j.total_size,
                    j.stream,
                    j.pool_id,
                    j.is_expandable
                ),
                (
                    seg.device,
                    seg.address,
                    seg.total_size,
                    seg.stream,
                    seg.pool_id,
                    seg.is_expandable
                ),
                "{at}"
            );
            assert_eq!(j.blocks.len(), seg.blocks.len(), "{at}");
            for (jb, b) in j.blocks.iter().zip(&seg.blocks) {
                let state = serde_json::to_value(b.state).expect("state");
                assert_eq!(
                    (jb.address, jb.size, jb.requested_size, jb.state.as_str()),
                    (
                        b.address,
                        b.size,
                        b.requested_size,
                        state.as_str().unwrap_or("")
                    ),
                    "{at}"
                );
                assert_eq!(
                    json_frames(&doc, &jb.frames),
                    model_frames(&s, b.stack),
                    "{at}"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_format_and_unreadable_input_exit_2_with_one_line() {
    let dir = scratch("errors");
    let out_path = dir.join("out");
    let out_arg = out_path.display().to_string();
    let good = fixture("snapshots/oom.pickle").display().to_string();
    let missing = dir.join("missing.pickle").display().to_string();
    let truncated = fixture("invalid/truncated.pickle").display().to_string();
    let cases: [(&[&str], &str); 3] = [
        (
            &["export", &good, "--to", "svg", "-o", &out_arg],
            "unknown --to 'svg'",
        ),
        (
            &["export", &missing, "--to", "json", "-o", &out_arg],
            "cannot open",
        ),
        (
            &["export", &truncated, "--to", "perfetto", "-o", &out_arg],
            "truncated pickle",
        ),
    ];
    for (args, says) in cases {
        let out = memprof(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!out_path.exists(), "{args:?}: no output left behind");
    }
    let unwritable = dir.join("no-such-dir/out").display().to_string();
    let out = memprof(&["export", &good, "--to", "json", "-o", &unwritable]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three device lists (the first list object twice) and a host list, whose entries carry
/// metadata: a dict with a frames list and a flat one, each named again in the second list
/// (memo references), and a host entry with metadata of its own.
fn metadata_named_again() -> std::io::Result<Vec<u8>> {
    use memprof::report::export::pickle::PickleWriter;
    type Writer = PickleWriter<Vec<u8>>;
    fn entry(
        w: &mut Writer,
        addr: i128,
        metadata: Option<&str>,
        frames: bool,
    ) -> std::io::Result<u32> {
        let id = w.begin_dict(5 + usize::from(metadata.is_some()) + usize::from(frames))?;
        w.key("action")?;
        w.str("alloc")?;
        for (key, value) in [("addr", addr), ("size", 512), ("stream", 7)] {
            w.key(key)?;
            w.int(value)?;
        }
        w.key("time_us")?;
        w.int(1_700_000_000_000_000 + addr)?;
        if let Some(text) = metadata {
            w.key("user_metadata")?;
            w.str(text)?;
        }
        if frames {
            crate::util::write_one_frame(w)?;
        }
        w.end()?;
        Ok(id)
    }
    let mut w = PickleWriter::new(Vec::new())?;
    w.begin_dict(3)?;
    w.key("segments")?;
    w.begin_list(0)?;
    w.end()?;
    w.key("device_traces")?;
    w.begin_list(3)?;
    w.item()?;
    let first = w.begin_list(2)?;
    w.item()?;
    let framed = entry(&mut w, 1024, Some("weights"), true)?;
    w.item()?;
    let flat = entry(&mut w, 2048, Some("optimizer"), false)?;
    w.end()?;
    w.item()?;
    w.begin_list(4)?;
    w.item()?;
    entry(&mut w, 4096, None, false)?;
    w.item()?;
    w.get(flat)?;
    w.item()?;
    w.get(framed)?;
    w.item()?;
    entry(&mut w, 8192, Some("activations"), false)?;
    w.end()?;
    w.item()?;
    w.get(first)?;
    w.end()?;
    w.key("host_traces")?;
    w.begin_list(1)?;
    w.item()?;
    entry(&mut w, 16384, Some("pinned"), false)?;
    w.end()?;
    w.end()?;
    w.finish()
}

/// Each device's entries as (address, user metadata), as the model holds them.
fn addresses_and_metadata(s: &Snapshot) -> Vec<Vec<(Option<u64>, Option<String>)>> {
    (0..s.timeline.device_count())
        .map(|d| {
            s.timeline
                .device(d)
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let extra = s.timeline.extra_at(d, i);
                    assert_eq!(extra.is_some(), e.has_extra(), "device {d} entry {i}");
                    (e.addr(), extra.and_then(|x| x.user_metadata.clone()))
                })
                .collect()
        })
        .collect()
}

#[test]
fn entry_metadata_follows_entries_named_again_and_survives_the_export() {
    let dir = crate::util::Scratch::new("export_metadata_named_again");
    let source = dir.join("named_again.pickle");
    std::fs::write(&source, metadata_named_again().expect("written")).expect("written");
    let parsed =
        torch_snapshot::read(&std::fs::read(&source).expect("written")[..]).expect("reads");
    let s = parsed.snapshot;
    let text = |t: &str| Some(t.to_string());
    let first = vec![
        (Some(1024), text("weights")),
        (Some(2048), text("optimizer")),
    ];
    let second = vec![
        (Some(4096), None),
        (Some(2048), text("optimizer")),
        (Some(1024), text("weights")),
        (Some(8192), text("activations")),
    ];
    let want = vec![first.clone(), second, first];
    assert_eq!(addresses_and_metadata(&s), want);
    for d in 0..3 {
        assert!(s
            .timeline
            .device(d)
            .iter()
            .all(|e| e.stream.0 != 0 && e.pool().is_none()));
    }
    let host = parsed.host.as_ref().expect("a host trace");
    assert_eq!(host.trace.len(), 1);
    assert!(!host.trace[0].has_extra() && host.trace[0].stream.0 != 0);

    let exported = dir.join("exported.pickle");
    export(&source, "torch-snapshot", &exported);
    assert_eq!(addresses_and_metadata(&load(&exported)), want);
}
