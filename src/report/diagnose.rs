//! The `diagnose` report (docs/json/diagnose.md): the JSON document and the text a person acts on
//! (the cause in one line, the figures at the OOM, the sites, the fixes that avoid it in
//! replay, what was tried and still fails, and the allocator pressure of every device).

use super::analyze_json::SCHEMA_VERSION;
use super::analyze_text::{figure, oom_figures};
use super::pressure_text::{self, shell_value};
use crate::account::{DeviceAccount, Figures, FindingKind, MomentKind};
use crate::analysis::oom::{Diagnosis, Remedy, RemedyKind};
use crate::analysis::pressure::Pressure;
use crate::analysis::site_text;
use crate::analysis::version::{Release, VersionRange};
use crate::diagnose::remedies::PressureRemedies;
use crate::model::{count, Bytes};
use crate::report::terminal_text::terminal_text;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;
use std::fmt::Write;

/// What the final layout of a device without a trace shows.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct UntracedState {
    pub reserved_bytes: u64,
    /// Allocated blocks, pending-free ones included.
    pub active_bytes: u64,
    pub free_in_cache_bytes: u64,
    pub largest_free_block_bytes: u64,
}

/// One device's allocator pressure, with or without an OOM.
#[derive(Clone, Debug, Serialize)]
pub struct DevicePressure {
    pub device: u32,
    /// `None` for a device without a trace.
    pub pressure: Option<Pressure>,
    /// For a device without a trace: the state at the dump.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untraced: Option<UntracedState>,
    /// For a device that retried without running out of memory: the settings replayed
    /// against the retries, ranked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedies: Option<PressureRemedies>,
    /// The earlier device whose trace and segments this one's equal (its figures and diagnosis
    /// are copies): the text names it instead of repeating them.
    #[serde(skip)]
    pub twin_of: Option<u32>,
    /// The device's account: its moments with their figures, peaks, pools and findings.
    #[serde(flatten)]
    pub account: DeviceAccount,
}

/// The whole document.
#[derive(Debug, Serialize)]
pub struct DiagnoseReport {
    pub schema_version: u32,
    /// The PyTorch releases that could have written the file (`None` for a log or a
    /// recording).
    pub torch_version: Option<VersionRange>,
    /// The origin of the input's one time axis (as in `analyze --json`).
    pub time_origin_us: Option<i64>,
    pub diagnoses: Vec<Diagnosis>,
    pub devices: Vec<DevicePressure>,
    /// With `--micro-batch`: for each device that ran out of memory, what would have fit
    /// (`plan fit`'s answer at the replay's capacity, in one line).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub would_fit: Vec<WouldFit>,
}

/// One device's "what would have fit" line.
#[derive(Clone, Debug, Serialize)]
pub struct WouldFit {
    pub device: u32,
    /// "at micro-batch 3 instead of 4 this run fits with 2.10 GiB to spare".
    pub line: String,
    /// The largest micro-batch whose scaled replay fits (0: not even 1).
    pub largest_micro_batch: u64,
}

impl DiagnoseReport {
    pub fn new(
        diagnoses: Vec<Diagnosis>,
        devices: Vec<DevicePressure>,
        torch_version: Option<VersionRange>,
        time_origin_us: Option<i64>,
    ) -> DiagnoseReport {
        DiagnoseReport {
            schema_version: SCHEMA_VERSION,
            torch_version,
            time_origin_us,
            diagnoses,
            devices,
            would_fit: Vec::new(),
        }
    }

    /// The text report; `source` names the input.
    pub fn text(&self, source: &str) -> String {
        let mut out = String::new();
        if self.diagnoses.is_empty() {
            let _ = writeln!(out, "{source}: no out-of-memory error found");
        }
        // Looked up by device, so that many devices stay linear (the first of each device).
        let mut by_device: FxHashMap<u32, &DevicePressure> = FxHashMap::default();
        for p in &self.devices {
            by_device.entry(p.device).or_insert(p);
        }
        let diagnosed: FxHashSet<u32> = self.diagnoses.iter().map(|d| d.device).collect();
        let twin_of = |device: u32| by_device.get(&device).and_then(|p| p.twin_of);
        let mut twins = TwinRuns::default();
        for d in &self.diagnoses {
            if let Some(twin) = twin_of(d.device) {
                twins.add(&mut out, d.device, twin);
                continue;
            }
            twins.end(&mut out);
            let device = by_device.get(&d.device);
            let pressure = device.and_then(|p| p.pressure.as_ref());
            let figures = device
                .zip(d.entry_index)
                .and_then(|(p, i)| p.account.moment_at(MomentKind::Oom, i))
                .map(|m| m.figures);
            write_one(&mut out, d, figures, pressure.map_or(0, |p| p.oom_retries));
            for w in self.would_fit.iter().filter(|w| w.device == d.device) {
                let _ = writeln!(out, "  what would have fit: {}", w.line);
            }
            let imbalance = device
                .into_iter()
                .flat_map(|p| &p.account.findings)
                .filter(|f| f.kind == FindingKind::Imbalance);
            for f in imbalance {
                let _ = writeln!(out, "  {}", f.sentence);
            }
            let old_name = d
                .remedies
                .iter()
                .any(|r| r.env == Some("PYTORCH_CUDA_ALLOC_CONF"));
            let may_warn = self.torch_version.is_some_and(|v| !v.before(Release(2, 8)));
            if old_name && may_warn {
                let _ = writeln!(
                    out,
                    "  (PyTorch 2.8 and later warn that PYTORCH_CUDA_ALLOC_CONF is deprecated; it \
                     still works, while its new name PYTORCH_ALLOC_CONF is ignored for CUDA by \
                     some releases: pytorch/pytorch#183387)"
                );
            }
            if let Some(p) = pressure {
                for line in pressure_text::lines(p, true) {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
        twins.end(&mut out);
        for p in &self.devices {
            if diagnosed.contains(&p.device) {
                continue;
            }
            if let Some(twin) = p.twin_of {
                twins.add(&mut out, p.device, twin);
                continue;
            }
            twins.end(&mut out);
            write_device(&mut out, p);
        }
        twins.end(&mut out);
        out
    }
}

/// Devices in a row that are twins of one device, said in one line.
#[derive(Default)]
struct TwinRuns {
    /// (first device, last device, their twin)
    run: Option<(u32, u32, u32)>,
}

impl TwinRuns {
    fn add(&mut self, out: &mut String, device: u32, twin: u32) {
        match &mut self.run {
            Some((_, last, of)) if *of == twin && device == *last + 1 => *last = device,
            _ => {
                self.end(out);
                self.run = Some((device, device, twin));
            }
        }
    }

    fn end(&mut self, out: &mut String) {
        let Some((first, last, twin)) = self.run.take() else {
            return;
        };
        let which = if first == last {
            format!("device {first}")
        } else {
            format!("devices {first} to {last}")
        };
        let _ = writeln!(
            out,
            "{which}: the same trace and segments as device {twin}, so the same as above"
        );
    }
}

fn write_device(out: &mut String, p: &DevicePressure) {
    let quiet = p
        .pressure
        .as_ref()
        .is_none_or(|x| x.oom_retries == 0 && x.empty_cache_bursts == 0);
    match &p.pressure {
        Some(pressure) if !quiet => {
            let _ = writeln!(out, "device {}: allocator pressure", p.device);
            for line in pressure_text::lines(pressure, false) {
                let _ = writeln!(out, "  {line}");
            }
            if let Some(r) = &p.remedies {
                for line in pressure_text::remedy_lines(r) {
                    let _ = writeln!(out, "  {line}");
                }
            }
        }
        Some(pressure) => {
            let _ = writeln!(out, "device {}: no allocator pressure", p.device);
            for line in pressure_text::lines(pressure, false) {
                let _ = writeln!(out, "  {line}");
            }
        }
        None => {
            let dump = p.account.dump();
            let _ = writeln!(
                out,
                "device {}: at the dump {} reserved, {} active ({} allocated), {} cached free \
                 (largest free block {})",
                p.device,
                figure(dump.reserved_bytes),
                figure(dump.active_bytes),
                figure(dump.allocated_bytes),
                figure(dump.cached_free_bytes),
                figure(dump.largest_free_block_bytes)
            );
        }
    }
    for f in &p.account.findings {
        if matches!(
            f.kind,
            FindingKind::NoTrace
                | FindingKind::AtLimit
                | FindingKind::IfThisWasAnOom
                | FindingKind::PrivatePool
        ) {
            let _ = writeln!(out, "  {}", f.sentence);
        }
    }
}

/// One diagnosis with the account's `figures` at its OOM; `retries` the device's OOM retries
/// (they bracket the capacity too).
fn write_one(out: &mut String, d: &Diagnosis, figures: Option<Figures>, retries: usize) {
    let at = d
        .entry_index
        .map(|i| format!(" at entry {i}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "device {}: OUT OF MEMORY{at}: a request of {} failed ({})",
        d.device,
        Bytes(d.request_bytes),
        d.cause.name()
    );
    let avoids = d.remedies.iter().any(|r| r.oom_avoided == Some(true));
    if !avoids && !d.tried.is_empty() {
        let cut = d
            .remedies
            .iter()
            .find(|r| r.bytes.is_some())
            .and_then(|r| r.bytes)
            .map(|b| {
                format!(
                    ": cut live memory at the failing request by at least {}",
                    Bytes(b)
                )
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  No allocator setting avoids this OOM in replay ({} tried, below){cut}.",
            d.tried.len()
        );
    }
    let _ = writeln!(out, "  {}", d.evidence);
    let mut figures = match figures {
        Some(f) => format!("  at the OOM: {}", oom_figures(&f, false)),
        // A log or a recording: the figures its message or driver calls give.
        None => {
            let a = &d.at_oom;
            let mut line = format!(
                "  at the OOM: reserved {}, allocated {}, free in the cache {}",
                Bytes(a.reserved_bytes),
                Bytes(a.allocated_bytes),
                Bytes(a.free_in_cache_bytes)
            );
            if let Some(l) = a.largest_free_block_bytes {
                let _ = write!(line, " (largest free block {})", Bytes(l));
            }
            line
        }
    };
    let a = &d.at_oom;
    if let Some(f) = a.device_free_bytes {
        let _ = write!(figures, ", free on the device {}", Bytes(f));
    }
    if let Some(t) = d.total_bytes {
        let _ = write!(figures, ", device total {}", Bytes(t));
    }
    let _ = writeln!(out, "{figures}");
    if let Some((first, rest)) = d.sites.split_first() {
        let _ = writeln!(
            out,
            "  failing request: {}",
            terminal_text(&site_text(&first.frame, first.via.as_deref()))
        );
        if !rest.is_empty() {
            let _ = writeln!(out, "  live at the OOM, by site:");
            for s in rest {
                let _ = writeln!(
                    out,
                    "    {:>12}  {}",
                    Bytes(s.bytes).to_string(),
                    terminal_text(&site_text(&s.frame, s.via.as_deref()))
                );
            }
        }
    }
    let capacity = d
        .replay_capacity_bytes
        .map(|c| {
            format!(
                " (replayed over the recorded trace with {} for the allocator, {})",
                Bytes(c),
                pressure_text::capacity_source(
                    d.replay_capacity_source.unwrap_or("inferred"),
                    retries,
                    d.entry_index.is_some()
                )
            )
        })
        .unwrap_or_default();
    if d.remedies.is_empty() {
        let _ = writeln!(out, "  fixes: none the evidence supports");
    } else {
        let _ = writeln!(out, "  fixes, best first{capacity}:");
        for (k, r) in d.remedies.iter().enumerate() {
            write_remedy(out, k + 1, r);
        }
    }
    if !d.tried.is_empty() {
        let _ = writeln!(out, "  tried in replay, still out of memory:");
        for r in &d.tried {
            let _ = writeln!(out, "    - {}", tried_line(r));
        }
    } else if d.replay_capacity_bytes.is_none() && d.entry_index.is_some() {
        let _ = writeln!(
            out,
            "  no setting was replayed: the device capacity is not known from the trace \
             (give --capacity, the device's total memory)"
        );
    }
    if !d.already_on.is_empty() {
        let _ = writeln!(
            out,
            "  already on in the recorded settings: {}",
            d.already_on.join(", ")
        );
    }
}

fn outcome(r: &Remedy) -> String {
    let mut text = match r.oom_avoided {
        Some(true) => "no OOM in replay".to_string(),
        Some(false) => "still out of memory in replay".to_string(),
        None => "not replayable".to_string(),
    };
    if let Some(n) = r.new_oom_retries {
        let _ = write!(text, "; {}", count(n, "OOM retry", "OOM retries"));
    }
    if let Some(p) = r.new_peak_reserved_bytes {
        let _ = write!(text, "; peak reserved {}", Bytes(p));
    }
    if let Some(p) = r.new_peak_allocated_bytes {
        let _ = write!(text, ", peak allocated {}", Bytes(p));
    }
    text
}

fn changed(r: &Remedy) -> String {
    let parts: Vec<String> = r
        .changed
        .iter()
        .map(|c| match &c.recorded {
            None => format!("adds {}:{}", c.key, c.new),
            Some(old) => format!("{} {} -> {}", c.key, old, c.new),
        })
        .collect();
    let whole = r.alloc_conf.as_deref().unwrap_or("");
    let kept = whole.split(',').count() > r.changed.len();
    if kept {
        format!("{} to the recorded settings", parts.join(", "))
    } else {
        parts.join(", ")
    }
}

fn write_remedy(out: &mut String, k: usize, r: &Remedy) {
    match r.kind {
        RemedyKind::AllocConf => {
            let _ = writeln!(
                out,
                "    {k}. {}={}",
                r.env.unwrap_or("PYTORCH_CUDA_ALLOC_CONF"),
                shell_value(r.alloc_conf.as_deref().unwrap_or(""))
            );
            if let Some(code) = &r.code {
                let _ = writeln!(out, "       and in the program: {code}");
            }
            let _ = writeln!(out, "       {} ({})", outcome(r), changed(r));
        }
        _ => {
            let verified = if r.verified {
                format!(" ({})", outcome(r))
            } else {
                String::new()
            };
            let _ = writeln!(out, "    {k}. {}{verified}", r.action);
            let label = if r.kind == RemedyKind::FreeEarlier {
                "frees"
            } else {
                "holds"
            };
            for s in &r.sites {
                let _ = writeln!(
                    out,
                    "         {label} {:>12}  {}",
                    Bytes(s.bytes).to_string(),
                    terminal_text(&site_text(&s.frame, s.via.as_deref()))
                );
            }
        }
    }
}

fn tried_line(r: &Remedy) -> String {
    let what = match (r.kind, &r.alloc_conf) {
        (RemedyKind::AllocConf, Some(conf)) => {
            let env = r.env.unwrap_or("PYTORCH_CUDA_ALLOC_CONF");
            let code = r
                .code
                .as_deref()
                .and_then(|c| c.split("  #").next())
                .map(|c| format!(" with {c}"))
                .unwrap_or_default();
            format!("{env}={}{code}", shell_value(conf))
        }
        _ => r.action.clone(),
    };
    format!("{what}: {}", outcome(r))
}
