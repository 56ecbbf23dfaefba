//! Helpers: paths of fixtures and a runner for the built binary.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Every snapshot in fixtures/snapshots (a test checks the list is complete).
pub const FIXTURES: [&str; 12] = [
    "v2_0_history",
    "v2_1_basic",
    "expandable",
    "oom",
    "multi_device",
    "private_pool",
    "pending_free",
    "v2_11_full",
    "segments_only",
    "protocol2",
    "protocol5",
    "demo_oom",
];

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(rel: &str) -> PathBuf {
    repo().join("fixtures").join(rel)
}

/// Why a test on the real snapshots is skipped where they are absent, in one wording for all
/// (fixtures/README.md says what they are and where a checkout finds them).
pub const NO_REAL_SNAPSHOTS: &str =
    "real snapshots from public runs: not in this repository, see fixtures/README.md";

/// The folder of real snapshots beside the checkout (`real` in the project's shared fixtures,
/// see fixtures/README.md), when it is there; when not, skips the test saying so.
pub fn real_fixtures() -> Option<PathBuf> {
    let dir = repo().join("../shared/fixtures/real");
    if !dir.is_dir() {
        skip(NO_REAL_SNAPSHOTS);
        return None;
    }
    Some(dir)
}

/// The real snapshot `rel` (a path under [`real_fixtures`]); `None`, saying so, when absent.
pub fn real_file(rel: &str) -> Option<PathBuf> {
    let path = real_fixtures()?.join(rel);
    if !path.is_file() {
        skip(&format!(
            "the real snapshot {rel}: not among the real snapshots here, see fixtures/README.md"
        ));
        return None;
    }
    Some(path)
}

pub fn memprof(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(args)
        .output()
        .expect("the memprof binary runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `memprof analyze --json FILE...`, asserts success, returns the document.
pub fn analyze_json(files: &[PathBuf]) -> Value {
    let mut args = vec!["analyze".to_string(), "--json".to_string()];
    args.extend(files.iter().map(|f| f.display().to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = memprof(&refs);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("stdout is one JSON document")
}

/// The device entries of the first input of an analyze document.
pub fn devices(doc: &Value) -> &Vec<Value> {
    doc["inputs"][0]["devices"]
        .as_array()
        .expect("devices is a list")
}

/// Asserts that analyze's device entries equal the flat expected values written by
/// `fixtures/gen/expected_stats.py`, field by field.
pub fn assert_devices_match(name: &str, got: &[Value], want: &[Value]) {
    assert_eq!(got.len(), want.len(), "{name}: device count");
    for (g, w) in got.iter().zip(want) {
        let dev = &w["device"];
        let pairs = [
            ("device", &g["device"]),
            ("reserved_bytes", &g["reserved_bytes"]),
            ("allocated_bytes", &g["allocated_bytes"]),
            ("active_bytes", &g["active_bytes"]),
            ("requested_bytes", &g["requested_bytes"]),
            ("segments", &g["segments"]),
            ("blocks", &g["blocks"]),
            ("internal_bytes", &g["fragmentation"]["internal_bytes"]),
            ("external_bytes", &g["fragmentation"]["external_bytes"]),
            (
                "largest_free_block_bytes",
                &g["fragmentation"]["largest_free_block_bytes"],
            ),
            ("trace_entries", &g["trace"]["entries"]),
            ("peak_active_bytes", &g["trace"]["peak_active_bytes"]),
            ("peak_entry_index", &g["trace"]["peak_entry_index"]),
            ("peak_time_us", &g["trace"]["peak_time_us"]),
            ("peak_reserved_bytes", &g["trace"]["peak_reserved_bytes"]),
        ];
        for (key, value) in pairs {
            assert_eq!(value, &w[key], "{name} device {dev}: {key}");
        }
        assert_eq!(
            g["trace"]["inconsistencies"], 0,
            "{name} device {dev}: trace replays cleanly"
        );
    }
}

/// A fresh directory for one test under the test target's tmp directory, removed with all it
/// holds (recordings, sockets left by killed processes) when dropped, so runs leave nothing
/// behind. Derefs to its path.
pub struct Scratch(tempfile::TempDir);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("a scratch directory");
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<std::ffi::OsStr> for Scratch {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.0.path().as_os_str()
    }
}

/// A directory inside a scratch directory, which it keeps (and removes once dropped). Derefs
/// to its path.
pub struct Within {
    _scratch: Scratch,
    path: PathBuf,
}

impl Within {
    pub fn new(scratch: Scratch, path: PathBuf) -> Within {
        Within {
            _scratch: scratch,
            path,
        }
    }
}

impl std::ops::Deref for Within {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for Within {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

/// Connects to the Unix socket at `path`, however deep the checkout or runtime folder puts it:
/// the address handed to `connect` is `path` when it fits a socket address (`sun_path`, 107
/// bytes and a NUL), else a short one through a descriptor of its folder
/// (`memprof_wire::at_socket_path`, as memprof's own clients do). Every test connects (and binds, [`bind_socket`]) through
/// here (`tests/live.rs` checks that none connects or binds by a path of its own), and fails
/// if the address would not fit.
pub fn connect_socket(path: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    memprof_wire::at_socket_path(path, |address| {
        assert!(
            address.as_os_str().len() <= memprof_wire::MAX_SOCKET_PATH,
            "the socket address {} is longer than a socket address holds",
            address.display()
        );
        std::os::unix::net::UnixStream::connect(address)
    })
}

/// Listens on a Unix socket at `path`, however deep, as [`connect_socket`] connects.
pub fn bind_socket(path: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    memprof_wire::at_socket_path(path, |address| {
        assert!(
            address.as_os_str().len() <= memprof_wire::MAX_SOCKET_PATH,
            "the socket address {} is longer than a socket address holds",
            address.display()
        );
        std::os::unix::net::UnixListener::bind(address)
    })
}

/// Says, in the one form `.ci/run` collects, that the running test is skipped and why. Written
/// straight to stderr, past the test harness's capture, so the line is in the log of a passing
/// run too. The harness names each test's thread after the test.
pub fn skip(reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let line = format!("SKIPPED: {test}: {reason}\n");
    // A closed stderr must not fail the test.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}

/// Whether `tool` runs here (`tool --version` starts; what it prints does not matter); when it
/// does not, skips the test saying it needs it.
pub fn have(tool: &str) -> bool {
    let started = Command::new(tool)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output();
    let found = started.is_ok();
    if !found {
        skip(&format!("needs {tool}, which is not installed"));
    }
    found
}

/// A single-device snapshot of what memprof's allocator model did: its trace (`entries`, as
/// `CachingAllocator::take_events` gives them) and its final `segments`.
pub fn model_snapshot(
    entries: Vec<memprof::model::TraceEntry>,
    segments: Vec<memprof::model::Segment>,
    stacks: memprof::model::StackTable,
    settings: Option<memprof::model::AllocatorSettings>,
) -> memprof::model::Snapshot {
    let n = entries.len();
    memprof::model::Snapshot {
        format: memprof::model::SnapshotFormat::Modern,
        segments,
        timeline: memprof::model::Timeline::new(entries, std::iter::once(0..n).collect()),
        stacks,
        settings,
        annotations: Vec::new(),
    }
}

/// Writes `snapshot` as a PyTorch snapshot pickle at `path`.
pub fn write_snapshot(snapshot: &memprof::model::Snapshot, path: &Path) {
    let file = std::fs::File::create(path).expect("writable");
    memprof::report::export::torch_snapshot::write(
        snapshot,
        &memprof::model::FormatKeys::default(),
        std::io::BufWriter::new(file),
    )
    .expect("written");
}

/// Adds the stack of a parameter moved to the GPU (`Module.to`, in torch's `module`, the path
/// of `nn/modules/module.py`) from a training script to `stacks`.
pub fn module_to_stack(
    stacks: &mut memprof::model::StackTable,
    module: &str,
) -> Option<memprof::model::StackId> {
    add_stack(
        stacks,
        &[(module, "_apply"), (module, "to"), ("/w/train.py", "main")],
    )
}

/// Adds the stack of `frames` (file and function, innermost first, each at line 7) to `stacks`.
pub fn add_stack(
    stacks: &mut memprof::model::StackTable,
    frames: &[(&str, &str)],
) -> Option<memprof::model::StackId> {
    let ids = frames
        .iter()
        .map(|&(filename, name)| {
            stacks.add_frame(memprof::model::Frame {
                filename: filename.into(),
                line: 7,
                name: name.into(),
            })
        })
        .collect();
    stacks.add_stack(ids)
}

/// The text of a drawn screen, one line per row.
pub fn screen(t: &ratatui::Terminal<ratatui::backend::TestBackend>) -> String {
    let buf = t.backend().buffer();
    (0..buf.area.height)
        .map(|y| {
            (0..buf.area.width)
                .map(|x| buf[(x, y)].symbol())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Writes a trace entry's `frames` key and a list of one frame, `train.py:7` in `step`.
pub fn write_one_frame(
    w: &mut memprof::report::export::pickle::PickleWriter<Vec<u8>>,
) -> std::io::Result<()> {
    w.key("frames")?;
    w.begin_list(1)?;
    w.item()?;
    w.begin_dict(3)?;
    w.key("filename")?;
    w.str("train.py")?;
    w.key("line")?;
    w.int(7)?;
    w.key("name")?;
    w.str("step")?;
    w.end()?;
    w.end()
}
