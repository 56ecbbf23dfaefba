//! The `simulate` reports (docs/json/simulate.md): the `--validate`
//! document, the what-if runs document, and their human text. A device whose trace holds
//! nothing to replay says so and why, instead of reporting agreement on nothing.

use super::analyze_json::{Tool, SCHEMA_VERSION};
use crate::model::{count, Bytes, ReplayIssue};
use crate::sim::replay::{
    CapacitySource, FragmentationAtPeak, Mismatch, OomAt, Prepared, RunResult, UpperBound,
};
use crate::sim::sweep::Outcome;
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
        0 => "its trace is empty (the file kept no trace entry; `analyze` says why)".to_string(),
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
    /// OOM retries that got their request (each a full cache flush and a device synchronize).
    pub oom_retries: u64,
    /// `torch.cuda.empty_cache()` calls (the program's; each a synchronize too).
    pub empty_cache_calls: u64,
    /// The device memory the replay could reserve (`None`: no limit).
    pub capacity_bytes: Option<u64>,
    /// Where it came from: `given` (`--capacity`), `inferred` (the peak of reserved memory,
    /// which the trace's retries or `oom` entries show the device was at) or `unlimited`.
    pub capacity_source: CapacitySource,
    pub warnings: Vec<String>,
}

impl RunDevice {
    /// The run `r` of the requests of `p`, under `p`'s capacity.
    pub fn new(p: &Prepared, r: &RunResult) -> RunDevice {
        RunDevice {
            device: p.device,
            replayed_entries: p.replayed_entries,
            replayed_requests: p.replayed_requests,
            peak_reserved_bytes: r.peak_reserved_bytes,
            peak_allocated_bytes: r.peak_allocated_bytes,
            fragmentation_at_peak: r.fragmentation_at_peak.clone(),
            oom: r.oom.clone(),
            oom_retries: r.oom_retries,
            empty_cache_calls: r.empty_cache_calls,
            capacity_bytes: p.capacity,
            capacity_source: p.capacity_source,
            warnings: warnings(&r.issues),
        }
    }

    fn outcome(&self) -> Outcome {
        Outcome {
            devices_out_of_memory: usize::from(self.oom.is_some()),
            oom_retries: self.oom_retries,
            empty_cache_calls: self.empty_cache_calls,
            peak_reserved_bytes: self.peak_reserved_bytes,
        }
    }
}

/// The capacity each replay of `p`'s device used and where it came from, in words.
pub fn capacity_line(p: &Prepared) -> String {
    let why = match (p.capacity_source, p.capacity_upper_from) {
        (CapacitySource::Given, _) => "as given with --capacity".to_string(),
        (CapacitySource::Unlimited, _) => {
            return format!(
                "device {}: every replay runs without a device limit (the trace shows no OOM \
                 retry and no `oom` entry to infer one from; give --capacity)",
                p.device
            )
        }
        (CapacitySource::Inferred, from) => {
            let shown = match from {
                Some(UpperBound::Retry) => "its OOM retries show",
                _ => "its `oom` entry shows",
            };
            let below = p
                .capacity_upper_bytes
                .map(|u| format!(", below {}", Bytes(u)))
                .unwrap_or_default();
            format!(
                "inferred: the peak of reserved memory, the least the device held, as {shown} \
                 the allocator was at the device's limit{below}"
            )
        }
    };
    match p.capacity {
        Some(c) => format!(
            "device {}: every replay may reserve {} ({why})",
            p.device,
            Bytes(c)
        ),
        None => format!(
            "device {}: every replay runs without a device limit",
            p.device
        ),
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
    /// The settings string the user sets (the recorded settings with the change).
    pub alloc_conf: String,
    /// Python the program runs as well, where a setting is a call rather than a key the
    /// file's PyTorch accepts (the memory fraction before 2.9).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    pub source: RunSource,
    pub devices: Vec<RunDevice>,
}

impl Run {
    /// Total peak reserved over devices.
    pub fn peak_reserved(&self) -> u64 {
        self.devices.iter().map(|d| d.peak_reserved_bytes).sum()
    }

    /// The outcome over every device, as the one ranker reads it.
    pub fn outcome(&self) -> Outcome {
        Outcome::sum(self.devices.iter().map(RunDevice::outcome))
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

    /// The settings and the call the program makes with them, as the text shows them.
    fn shown(&self) -> String {
        let conf = if self.alloc_conf.is_empty() {
            "the default settings".to_string()
        } else {
            self.alloc_conf.clone()
        };
        match &self.code {
            Some(code) => format!("{conf} with {code}"),
            None => conf,
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
    /// Per device, the capacity the replays used and where it came from, in words (each
    /// device's `capacity_bytes` and `capacity_source` hold the figures).
    #[serde(skip)]
    pub capacities: Vec<String>,
}

impl RunsReport {
    pub fn new(runs: Vec<Run>, capacities: Vec<String>) -> RunsReport {
        RunsReport {
            schema_version: SCHEMA_VERSION,
            tool: Tool::this(),
            runs,
            capacities,
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
        for line in &self.capacities {
            let _ = writeln!(out, "{line}");
        }
        for run in &self.runs {
            let conf = if run.alloc_conf.is_empty() {
                "(defaults)"
            } else {
                &run.alloc_conf
            };
            let code = run
                .code
                .as_deref()
                .map(|c| format!(" with {c}"))
                .unwrap_or_default();
            let _ = writeln!(out, "{conf}{code} [{}]", run.source.word());
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
                    "  device {}: peak reserved {} {at}, with {} allocated and {} free in cache (largest free block {}); {}; {}, {}",
                    d.device,
                    Bytes(d.peak_reserved_bytes),
                    Bytes(f.allocated_bytes),
                    Bytes(f.external_bytes),
                    Bytes(f.largest_free_block_bytes),
                    oom,
                    count(d.oom_retries, "OOM retry", "OOM retries"),
                    count(d.empty_cache_calls, "empty_cache() call", "empty_cache() calls"),
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

    /// The best run against the recorded settings, by the one order: OOMs avoided, then
    /// stalls (OOM retries and `empty_cache()` calls), then peak reserved.
    fn best_line(&self, best: &Run, recorded_peak: u64) -> String {
        let peak = best.peak_reserved();
        let conf = best.shown();
        let recorded = self.recorded();
        if let Some(at) = recorded.and_then(Run::first_oom) {
            return format!(
                "best: {conf} avoids the OOM the recorded settings run into at {}, with {} and peak reserved {}",
                oom_at(at, best.devices.len()),
                count(best.outcome().oom_retries, "OOM retry", "OOM retries"),
                Bytes(peak)
            );
        }
        let (mine, theirs) = (
            best.outcome(),
            recorded.map(Run::outcome).unwrap_or_default(),
        );
        if recorded.is_some() && mine.stalls() < theirs.stalls() {
            return format!(
                "best: {conf}: {} and {} against {} and {} with the recorded settings, peak reserved {}",
                count(mine.oom_retries, "OOM retry", "OOM retries"),
                count(mine.empty_cache_calls, "empty_cache() call", "empty_cache() calls"),
                theirs.oom_retries,
                theirs.empty_cache_calls,
                Bytes(peak)
            );
        }
        if peak < recorded_peak && mine.stalls() <= theirs.stalls() {
            let saved = recorded_peak - peak;
            format!(
                "best: {conf} saves {} of peak reserved ({:.1}%) against the recorded settings",
                Bytes(saved),
                saved as f64 * 100.0 / recorded_peak.max(1) as f64
            )
        } else {
            "best: the recorded settings; no setting tried avoids a stall or lowers peak reserved"
                .to_string()
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

    /// The run without OOM that ranks first (the one order of `sim::sweep`); the recorded
    /// settings when none is better.
    pub fn best(&self) -> Option<&Run> {
        self.runs
            .iter()
            .filter(|r| !r.has_oom())
            .min_by_key(|r| (r.outcome().rank_key(), r.source != RunSource::Recorded))
    }
}
