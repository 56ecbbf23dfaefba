//! The `simulate` reports (`design/CLI.md`): the `--validate` document, the what-if runs
//! document, and their human text.

use super::analyze_json::{Tool, SCHEMA_VERSION};
use crate::model::{Bytes, ReplayIssue};
use crate::sim::replay::{
    CapacitySource, FragmentationAtPeak, Mismatch, OomAt, Prepared, RunResult,
};
use serde::Serialize;
use std::fmt::Write;

/// One device of `--validate`.
#[derive(Debug, Serialize)]
pub struct ValidateDevice {
    pub device: u32,
    pub alloc_events: u64,
    pub alloc_address_matches: u64,
    pub segment_alloc_events: u64,
    pub segment_alloc_matches: u64,
    pub segment_free_events: u64,
    pub segment_free_matches: u64,
    pub segment_map_events: u64,
    pub segment_map_matches: u64,
    pub segment_unmap_events: u64,
    pub segment_unmap_matches: u64,
    pub oom_events: u64,
    pub oom_matches: u64,
    pub first_mismatch: Option<Mismatch>,
    pub final_layout_matches: bool,
    pub recorded_peak_reserved_bytes: u64,
    pub simulated_peak_reserved_bytes: u64,
    pub capacity_bytes: Option<u64>,
    pub capacity_source: CapacitySource,
    pub warnings: Vec<String>,
}

impl ValidateDevice {
    pub fn new(p: &Prepared) -> ValidateDevice {
        let v = &p.validation;
        ValidateDevice {
            device: p.device,
            alloc_events: v.alloc.events,
            alloc_address_matches: v.alloc.matches,
            segment_alloc_events: v.segment_alloc.events,
            segment_alloc_matches: v.segment_alloc.matches,
            segment_free_events: v.segment_free.events,
            segment_free_matches: v.segment_free.matches,
            segment_map_events: v.segment_map.events,
            segment_map_matches: v.segment_map.matches,
            segment_unmap_events: v.segment_unmap.events,
            segment_unmap_matches: v.segment_unmap.matches,
            oom_events: v.oom.events,
            oom_matches: v.oom.matches,
            first_mismatch: v.first_mismatch.clone(),
            final_layout_matches: v.final_layout_matches,
            recorded_peak_reserved_bytes: p.recorded_peak_reserved_bytes,
            simulated_peak_reserved_bytes: p.recorded_run.peak_reserved_bytes,
            capacity_bytes: p.capacity,
            capacity_source: p.capacity_source,
            warnings: warnings(p.issues.iter().chain(&p.recorded_run.issues)),
        }
    }
}

/// Issues as "entry I: message" lines.
pub fn warnings<'a>(issues: impl IntoIterator<Item = &'a ReplayIssue>) -> Vec<String> {
    issues
        .into_iter()
        .map(|i| format!("entry {}: {}", i.entry_index, i.message))
        .collect()
}

#[derive(Debug, Serialize)]
pub struct ValidateBody {
    pub devices: Vec<ValidateDevice>,
}

#[derive(Debug, Serialize)]
pub struct ValidateReport {
    pub schema_version: u32,
    pub tool: Tool,
    pub validate: ValidateBody,
}

impl ValidateReport {
    pub fn new(devices: Vec<ValidateDevice>) -> ValidateReport {
        ValidateReport {
            schema_version: SCHEMA_VERSION,
            tool: Tool::this(),
            validate: ValidateBody { devices },
        }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        for d in &self.validate.devices {
            let pair = |m: u64, e: u64| format!("{m}/{e}");
            let _ = writeln!(
                out,
                "device {}: alloc addresses {}, segment_alloc {}, segment_free {}, segment_map {}, segment_unmap {}, oom {}; peak reserved {} recorded, {} simulated",
                d.device,
                pair(d.alloc_address_matches, d.alloc_events),
                pair(d.segment_alloc_matches, d.segment_alloc_events),
                pair(d.segment_free_matches, d.segment_free_events),
                pair(d.segment_map_matches, d.segment_map_events),
                pair(d.segment_unmap_matches, d.segment_unmap_events),
                pair(d.oom_matches, d.oom_events),
                Bytes(d.recorded_peak_reserved_bytes),
                Bytes(d.simulated_peak_reserved_bytes),
            );
            match &d.first_mismatch {
                None => {
                    let layout = if d.final_layout_matches {
                        "and the final layout"
                    } else {
                        "but the final layout differs"
                    };
                    let _ = writeln!(out, "  every decision reproduced, {layout}");
                }
                Some(m) => {
                    let _ = writeln!(
                        out,
                        "  first mismatch at entry {}: {} (expected {}, got {})",
                        m.entry_index,
                        m.reason,
                        view(m.expected.as_ref()),
                        view(m.got.as_ref())
                    );
                }
            }
        }
        out
    }
}

fn view(e: Option<&crate::sim::replay::EntryView>) -> String {
    match e {
        None => "nothing".into(),
        Some(e) => match e.addr {
            Some(a) => format!("{} 0x{a:x} {}", e.action, Bytes(e.size)),
            None => format!("{} {}", e.action, Bytes(e.size)),
        },
    }
}

/// One device of one run.
#[derive(Debug, Serialize)]
pub struct RunDevice {
    pub device: u32,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fragmentation_at_peak: FragmentationAtPeak,
    pub oom: Option<OomAt>,
    pub capacity_bytes: Option<u64>,
    pub warnings: Vec<String>,
}

impl RunDevice {
    pub fn new(device: u32, r: &RunResult, capacity: Option<u64>) -> RunDevice {
        RunDevice {
            device,
            peak_reserved_bytes: r.peak_reserved_bytes,
            peak_allocated_bytes: r.peak_allocated_bytes,
            fragmentation_at_peak: r.fragmentation_at_peak.clone(),
            oom: r.oom.clone(),
            capacity_bytes: capacity,
            warnings: warnings(&r.issues),
        }
    }
}

/// Where a run's settings came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunSource {
    Recorded,
    Given,
    Sweep,
}

/// One setting's replay on every device.
#[derive(Debug, Serialize)]
pub struct Run {
    pub alloc_conf: String,
    pub source: RunSource,
    pub devices: Vec<RunDevice>,
}

impl Run {
    /// Total peak reserved over devices.
    pub fn peak_reserved(&self) -> u64 {
        self.devices.iter().map(|d| d.peak_reserved_bytes).sum()
    }

    pub fn has_oom(&self) -> bool {
        self.devices.iter().any(|d| d.oom.is_some())
    }
}

#[derive(Debug, Serialize)]
pub struct RunsReport {
    pub schema_version: u32,
    pub tool: Tool,
    pub runs: Vec<Run>,
}

impl RunsReport {
    pub fn new(runs: Vec<Run>) -> RunsReport {
        RunsReport {
            schema_version: SCHEMA_VERSION,
            tool: Tool::this(),
            runs,
        }
    }

    /// One block per run; with several runs, a last line naming the best against
    /// `recorded_peak` (the recorded settings' total peak reserved).
    pub fn text(&self, recorded_peak: u64) -> String {
        let mut out = String::new();
        for run in &self.runs {
            let conf = if run.alloc_conf.is_empty() {
                "(defaults)"
            } else {
                &run.alloc_conf
            };
            let _ = writeln!(out, "{conf} [{:?}]", run.source);
            for d in &run.devices {
                let oom = match &d.oom {
                    None => "no OOM".to_string(),
                    Some(o) => format!(
                        "OOM at entry {} (request {}, {} reserved)",
                        o.entry_index,
                        Bytes(o.request_bytes),
                        Bytes(o.reserved_bytes)
                    ),
                };
                let f = &d.fragmentation_at_peak;
                let _ = writeln!(
                    out,
                    "  device {}: peak reserved {}, peak allocated {}, at peak {} free in cache (largest block {}), {}",
                    d.device,
                    Bytes(d.peak_reserved_bytes),
                    Bytes(d.peak_allocated_bytes),
                    Bytes(f.external_bytes),
                    Bytes(f.largest_free_block_bytes),
                    oom
                );
            }
        }
        if self.runs.len() > 1 {
            if let Some(best) = self.best() {
                let peak = best.peak_reserved();
                let conf = if best.alloc_conf.is_empty() {
                    "the default settings"
                } else {
                    &best.alloc_conf
                };
                let _ = if peak < recorded_peak {
                    let saved = recorded_peak - peak;
                    writeln!(
                        out,
                        "best: {conf} saves {} of peak reserved ({:.1}%) against the recorded settings",
                        Bytes(saved),
                        saved as f64 * 100.0 / recorded_peak.max(1) as f64
                    )
                } else {
                    writeln!(
                        out,
                        "best: the recorded settings; no setting tried lowers peak reserved"
                    )
                };
            }
        }
        out
    }

    /// The run without OOM with the lowest total peak reserved.
    pub fn best(&self) -> Option<&Run> {
        self.runs
            .iter()
            .filter(|r| !r.has_oom())
            .min_by_key(|r| r.peak_reserved())
    }
}
