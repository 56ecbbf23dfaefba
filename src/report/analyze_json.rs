//! The `analyze --json` document (docs/json/analyze.md, `schema_version` 2).

use crate::account::DeviceReport;
use crate::analysis::compare::{compare, Candidate, Comparison};
use crate::analysis::version::VersionRange;
use serde::Serialize;

/// Version of the JSON layout; bumped when a field changes meaning.
pub const SCHEMA_VERSION: u32 = 2;

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
    /// The origin of the input's one time axis: the time of the first trace entry of any device
    /// (µs since the Unix epoch); every `seconds` of the input counts from it. `None` when no
    /// entry has a time.
    pub time_origin_us: Option<i64>,
    pub devices: Vec<DeviceReport>,
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
    /// The document of `inputs`; `one_run` when they are one run seen twice (a recording and
    /// the snapshot joined with it), which has no devices to compare.
    pub fn new(inputs: Vec<InputReport>, one_run: bool) -> AnalyzeReport {
        // Devices that held no memory at any moment are not ranks of the job.
        let rows: Vec<Candidate<'_>> = inputs
            .iter()
            .flat_map(|i| {
                i.devices
                    .iter()
                    .filter(|d| d.account.holds_memory())
                    .map(move |d| Candidate {
                        input: i.path.as_str(),
                        analysis: &d.analysis,
                        peak_bytes: d.account.peaks.requested.bytes,
                        peak_reserved_bytes: d.account.peaks.reserved.bytes,
                    })
            })
            .collect();
        let comparison = if one_run { None } else { compare(&rows) };
        AnalyzeReport {
            schema_version: SCHEMA_VERSION,
            tool: Tool::this(),
            inputs,
            comparison,
        }
    }
}
