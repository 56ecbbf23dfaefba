//! `analyze --at MOMENT --json`: the account's state of each device at one moment, as a
//! JSON document (docs/json/analyze-at.md).

use crate::account::at::StateAt;
use crate::account::{MomentKind, Resolved};
use crate::report::analyze_json::SCHEMA_VERSION;
use serde::Serialize;

/// The moment's name: one of the account's moments, or `entry` for an entry or a time it
/// has no name for.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(untagged)]
pub enum MomentName {
    Account(MomentKind),
    Other(&'static str),
}

#[derive(Debug, Serialize)]
pub struct MomentShown {
    pub kind: MomentName,
    pub entry: Option<usize>,
    pub seconds: Option<f64>,
}

impl From<&Resolved> for MomentShown {
    fn from(r: &Resolved) -> MomentShown {
        MomentShown {
            kind: r
                .kind
                .map_or(MomentName::Other("entry"), MomentName::Account),
            entry: r.entry,
            seconds: r.offset_us.map(|us| us as f64 / 1e6),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DeviceAt {
    pub device: u32,
    pub moment: MomentShown,
    #[serde(flatten)]
    pub state: StateAt,
}

#[derive(Debug, Serialize)]
pub struct AtReport {
    pub schema_version: u32,
    pub kind: &'static str,
    pub path: String,
    /// The moment as the user gave it.
    pub at: String,
    pub devices: Vec<DeviceAt>,
}

impl AtReport {
    pub fn new(path: String, at: String, devices: Vec<DeviceAt>) -> AtReport {
        AtReport {
            schema_version: SCHEMA_VERSION,
            kind: "memprof_analyze_at",
            path,
            at,
            devices,
        }
    }
}
