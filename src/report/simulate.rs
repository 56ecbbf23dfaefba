//! The `simulate` reports (`design/CLI.md`, `docs/json/simulate.md`): the `--validate`
//! document, the what-if runs document, and their human text. A device whose trace holds
//! nothing to replay says so and why, instead of reporting agreement on nothing.

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
    /// Trace entries of the device (0: nothing was replayed).
    pub replayed_entries: usize,
    /// Of those, `alloc` and `oom` entries (requests to the allocator).
    pub replayed_requests: usize,
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
            replayed_entries: p.replayed_entries,
            replayed_requests: p.replayed_requests,
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

impl ValidateDevice {
    /// Recorded decisions compared (allocs, segment changes, OOMs).
    pub fn decisions(&self) -> u64 {
        self.alloc_events
            + self.segment_alloc_events
            + self.segment_free_events
            + self.segment_map_events
            + self.segment_unmap_events
            + self.oom_events
    }

    /// Whether every compared decision was the model's too.
    pub fn reproduced(&self) -> bool {
        self.first_mismatch.is_none()
    }
}

/// Why a device's trace gave nothing to replay, in words.
fn nothing_to_replay(entries: usize, what: &str) -> String {
    match entries {
        0 => "its trace is empty (memory history was not being recorded)".to_string(),
        1 => format!("its one trace entry is not {what}"),
        n => format!("none of its {n} trace entries is {what}"),
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

    /// Whether every compared decision on every device was the model's too.
    pub fn reproduced(&self) -> bool {
        self.validate.devices.iter().all(ValidateDevice::reproduced)
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.validate.devices.is_empty() {
            out.push_str(NO_DEVICE);
        }
        for d in &self.validate.devices {
            if d.decisions() == 0 {
                let _ = writeln!(
                    out,
                    "device {}: nothing to validate: {}; reserved {} as the snapshot shows",
                    d.device,
                    nothing_to_replay(d.replayed_entries, "an alloc, segment or oom entry"),
                    Bytes(d.recorded_peak_reserved_bytes),
                );
                continue;
            }
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

/// What `--validate` and the runs say for a snapshot without any device.
const NO_DEVICE: &str =
    "nothing to replay: the snapshot has no segments and no trace entries on any device\n";

/// One device of one run.
#[derive(Debug, Serialize)]
pub struct RunDevice {
    pub device: u32,
    /// Trace entries of the device (0: nothing was replayed).
    pub replayed_entries: usize,
    /// Of those, `alloc` and `oom` entries: 0 means every setting leaves the state as the
    /// snapshot shows it.
    pub replayed_requests: usize,
    pub peak_reserved_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub fragmentation_at_peak: FragmentationAtPeak,
    pub oom: Option<OomAt>,
    pub capacity_bytes: Option<u64>,
    pub warnings: Vec<String>,
}

impl RunDevice {
    /// The run `r` of the requests of `p`.
    pub fn new(p: &Prepared, r: &RunResult, capacity: Option<u64>) -> RunDevice {
        RunDevice {
            device: p.device,
            replayed_entries: p.replayed_entries,
            replayed_requests: p.replayed_requests,
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

impl RunSource {
    /// The word the text shows.
    fn word(self) -> &'static str {
        match self {
            RunSource::Recorded => "recorded",
            RunSource::Given => "given",
            RunSource::Sweep => "sweep",
        }
    }
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

    /// The first OOM: (device, entry) of the earliest entry that ran out of memory.
    fn first_oom(&self) -> Option<(u32, usize)> {
        self.devices
            .iter()
            .filter_map(|d| Some((d.device, d.oom.as_ref()?.entry_index)))
            .min_by_key(|&(_, entry)| entry)
    }

    /// The settings as a reader would name them.
    fn name(&self) -> String {
        match (self.alloc_conf.is_empty(), self.source) {
            (true, RunSource::Recorded) => "the recorded settings (the defaults)".into(),
            (true, _) => "the default settings".into(),
            (false, RunSource::Recorded) => format!("the recorded settings ({})", self.alloc_conf),
            (false, _) => self.alloc_conf.clone(),
        }
    }
}

/// Where a run's first OOM is, in words (the device named when there are several).
fn oom_at((device, entry): (u32, usize), devices: usize) -> String {
    match devices {
        1 => format!("entry {entry}"),
        _ => format!("entry {entry} of device {device}"),
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

    /// Whether some device replayed a request: otherwise every setting gives the state the
    /// snapshot shows, and there is nothing to compare.
    pub fn replayed_any(&self) -> bool {
        self.runs
            .iter()
            .flat_map(|r| &r.devices)
            .any(|d| d.replayed_requests > 0)
    }

    /// One block per run; with several runs, a last line naming the best against
    /// `recorded_peak` (the recorded settings' total peak reserved), or saying that every
    /// setting runs out of memory and what the recorded one gets against the defaults.
    pub fn text(&self, recorded_peak: u64) -> String {
        let mut out = String::new();
        let Some(first) = self.runs.first() else {
            return out;
        };
        if first.devices.is_empty() {
            out.push_str(NO_DEVICE);
            return out;
        }
        if !self.replayed_any() {
            for d in &first.devices {
                let _ = writeln!(
                    out,
                    "device {}: nothing replayed: {}; reserved {}, {} allocated, as the snapshot shows",
                    d.device,
                    nothing_to_replay(d.replayed_entries, "an alloc or an oom"),
                    Bytes(d.peak_reserved_bytes),
                    Bytes(d.fragmentation_at_peak.allocated_bytes),
                );
            }
            out.push_str(
                "no allocation to replay, so no setting would change anything; nothing compared\n",
            );
            return out;
        }
        for run in &self.runs {
            let conf = if run.alloc_conf.is_empty() {
                "(defaults)"
            } else {
                &run.alloc_conf
            };
            let _ = writeln!(out, "{conf} [{}]", run.source.word());
            for d in &run.devices {
                if d.replayed_requests == 0 {
                    let _ = writeln!(
                        out,
                        "  device {}: nothing replayed: {}; reserved {} as the snapshot shows",
                        d.device,
                        nothing_to_replay(d.replayed_entries, "an alloc or an oom"),
                        Bytes(d.peak_reserved_bytes),
                    );
                    continue;
                }
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
                let at = match f.entry_index {
                    Some(i) => format!("at entry {i}"),
                    None => "before the first entry".to_string(),
                };
                let _ = writeln!(
                    out,
                    "  device {}: peak reserved {} {at}, with {} allocated and {} free in cache (largest free block {}); {}",
                    d.device,
                    Bytes(d.peak_reserved_bytes),
                    Bytes(f.allocated_bytes),
                    Bytes(f.external_bytes),
                    Bytes(f.largest_free_block_bytes),
                    oom
                );
            }
        }
        if self.runs.len() > 1 {
            let line = match self.best() {
                Some(best) => self.best_line(best, recorded_peak),
                None => self.all_oom_line(),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }

    fn recorded(&self) -> Option<&Run> {
        self.runs.iter().find(|r| r.source == RunSource::Recorded)
    }

    /// The best run against the recorded settings.
    fn best_line(&self, best: &Run, recorded_peak: u64) -> String {
        let peak = best.peak_reserved();
        let conf = if best.alloc_conf.is_empty() {
            "the default settings"
        } else {
            &best.alloc_conf
        };
        if let Some(at) = self.recorded().and_then(Run::first_oom) {
            return format!(
                "best: {conf} avoids the OOM the recorded settings run into at {}, with peak reserved {}",
                oom_at(at, best.devices.len()),
                Bytes(peak)
            );
        }
        if peak < recorded_peak {
            let saved = recorded_peak - peak;
            format!(
                "best: {conf} saves {} of peak reserved ({:.1}%) against the recorded settings",
                Bytes(saved),
                saved as f64 * 100.0 / recorded_peak.max(1) as f64
            )
        } else {
            "best: the recorded settings; no setting tried lowers peak reserved".to_string()
        }
    }

    /// Every run ran out of memory: how far the recorded settings get against the defaults,
    /// and the furthest setting when it is another.
    fn all_oom_line(&self) -> String {
        let mut line = "every setting tried runs out of memory".to_string();
        let Some(recorded) = self.recorded() else {
            return line;
        };
        let Some(r_at) = recorded.first_oom() else {
            return line;
        };
        let at = |a| oom_at(a, recorded.devices.len());
        let defaults = self
            .runs
            .iter()
            .find(|r| r.alloc_conf.is_empty() && r.source != RunSource::Recorded);
        match defaults.and_then(|d| Some((d, d.first_oom()?))) {
            _ if recorded.alloc_conf.is_empty() => {
                let _ = write!(
                    line,
                    "; the recorded settings are the defaults, which run out at {}",
                    at(r_at)
                );
            }
            Some((_, d_at)) => {
                let (r, d) = (r_at.1, d_at.1);
                let how = match r.cmp(&d) {
                    std::cmp::Ordering::Greater => {
                        format!("get {} entries further than the defaults", r - d)
                    }
                    std::cmp::Ordering::Equal => {
                        "run out at the same entry as the defaults".to_string()
                    }
                    std::cmp::Ordering::Less => {
                        format!("run out {} entries sooner than the defaults", d - r)
                    }
                };
                let places = if r_at == d_at {
                    at(r_at)
                } else {
                    format!("{} against {}", at(r_at), at(d_at))
                };
                let _ = write!(line, "; {} {how} ({places})", recorded.name());
            }
            None => {
                let _ = write!(line, "; {} run out at {}", recorded.name(), at(r_at));
            }
        }
        let furthest = self
            .runs
            .iter()
            .filter_map(|r| Some((r, r.first_oom()?)))
            .max_by_key(|&(_, (_, entry))| entry);
        if let Some((run, far)) = furthest.filter(|&(_, far)| far.1 > r_at.1) {
            let _ = write!(line, "; the furthest is {}, to {}", run.name(), at(far));
        }
        line
    }

    /// The run without OOM with the lowest total peak reserved.
    pub fn best(&self) -> Option<&Run> {
        self.runs
            .iter()
            .filter(|r| !r.has_oom())
            .min_by_key(|r| r.peak_reserved())
    }
}
