//! The `analyze --json` document (`design/CLI.md`, `schema_version` 1).

use crate::analysis::compare::{compare, Comparison};
use crate::analysis::version::VersionRange;
use crate::analysis::DeviceAnalysis;
use serde::Serialize;

/// Version of the JSON layout; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Serialize)]
pub struct Tool {
    pub name: &'static str,
    pub version: &'static str,
}

impl Tool {
    pub fn this() -> Tool {
        Tool {
            name: "memprof",
            version: env!("CARGO_PKG_VERSION"),
        }
    }
}

/// Which kind of file an input was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    TorchSnapshot,
    MemprofRecording,
}

/// One analyzed file.
#[derive(Debug, Serialize)]
pub struct InputReport {
    pub path: String,
    pub kind: InputKind,
    pub bytes: u64,
    /// `history` (PyTorch 2.0), `modern` (2.1+), `segments_only` or `recording` (a memprof
    /// recording of driver calls).
    pub format: &'static str,
    /// The allocator settings string recorded in the file, when present.
    pub alloc_conf: Option<String>,
    /// The PyTorch releases that could have written the file, from the keys it holds
    /// (`None` for a recording).
    pub torch_version: Option<VersionRange>,
    /// The recorded process, for a memprof recording (absent for a snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessReport>,
    pub devices: Vec<DeviceAnalysis>,
    /// The whole-process ledger of a memprof recording (absent for a snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<LedgerReport>,
    /// The pinned host memory of PyTorch's host allocator, for a snapshot that carries
    /// `host_segments` or `host_traces` entries (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_host_allocator: Option<crate::analysis::host_pinned::HostPinnedReport>,
    pub warnings: Vec<String>,
}

/// A recording's ledger and the PyTorch snapshot joined with it.
#[derive(Debug, Serialize)]
pub struct LedgerReport {
    /// The snapshot joined, `None` when there was none.
    pub snapshot: Option<String>,
    pub devices: Vec<crate::analysis::ledger::DeviceLedger>,
}

/// The process a memprof recording was made of.
#[derive(Debug, Serialize)]
pub struct ProcessReport {
    pub pid: u32,
    /// `None` in a version-1 recording, as are the others.
    pub host: Option<String>,
    /// The command line, program first; `None` when not recorded (a version-1 recording, or
    /// /proc would not say).
    pub command: Option<Vec<String>>,
    /// When recording started, µs since the Unix epoch.
    pub start_time_us: Option<i64>,
}

/// The whole document.
#[derive(Debug, Serialize)]
pub struct AnalyzeReport {
    pub schema_version: u32,
    pub tool: Tool,
    pub inputs: Vec<InputReport>,
    /// Every device of every input side by side; `None` for a single device.
    pub comparison: Option<Comparison>,
}

impl AnalyzeReport {
    pub fn new(inputs: Vec<InputReport>) -> AnalyzeReport {
        let rows: Vec<(&str, &DeviceAnalysis)> = inputs
            .iter()
            .flat_map(|i| i.devices.iter().map(move |d| (i.path.as_str(), d)))
            .collect();
        let comparison = compare(&rows);
        AnalyzeReport {
            schema_version: SCHEMA_VERSION,
            tool: Tool::this(),
            inputs,
            comparison,
        }
    }
}
