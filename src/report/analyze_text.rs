//! Human text for `analyze`: a short summary a person can act on.

use super::analyze_json::{AnalyzeReport, InputKind, InputReport};
use super::pressure_text;
use super::terminal_text::terminal_text;
use crate::analysis::compare::{Comparison, RowRef, BALANCED_RATIO};
use crate::analysis::host_pinned::HostPinnedReport;
use crate::analysis::DeviceAnalysis;
use crate::model::{count, Bytes};
use std::fmt::Write;

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".into();
    }
    format!("{:.0}%", part as f64 * 100.0 / whole as f64)
}

/// The whole text report.
pub fn render(report: &AnalyzeReport) -> String {
    let mut out = String::new();
    if let Some(c) = &report.comparison {
        render_comparison(report, c, &mut out);
        out.push('\n');
    }
    for (i, input) in report.inputs.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render_input(input, &mut out);
    }
    out
}

/// An argument as a shell would need it: in single quotes when empty or holding blanks or quotes.
fn quoted(arg: &str) -> String {
    if !arg.is_empty() && !arg.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', "'\\''"))
}

fn render_input(input: &InputReport, out: &mut String) {
    let format = match (input.format, &input.torch_version) {
        ("segments_only", _) => "segment list (no trace)".to_string(),
        ("recording", _) => "memprof recording of driver calls".to_string(),
        (_, Some(v)) => format!("{v} snapshot"),
        (_, None) => "PyTorch snapshot".to_string(),
    };
    let _ = writeln!(
        out,
        "{}  ({}, {format}, {} device{})",
        terminal_text(&input.path),
        Bytes(input.bytes),
        input.devices.len(),
        if input.devices.len() == 1 { "" } else { "s" }
    );
    if let Some(p) = &input.process {
        let host = p
            .host
            .as_deref()
            .map(|h| format!(" on {}", terminal_text(h)))
            .unwrap_or_default();
        let command = match &p.command {
            None => String::new(),
            Some(args) => {
                let words: Vec<String> = args
                    .iter()
                    .map(|a| quoted(&terminal_text(a).to_string()))
                    .collect();
                format!(": {}", words.join(" "))
            }
        };
        let _ = writeln!(out, "  process {}{host}{command}", p.pid);
    }
    if let Some(conf) = input.alloc_conf.as_deref().filter(|c| !c.is_empty()) {
        let _ = writeln!(out, "  PYTORCH_CUDA_ALLOC_CONF={conf}");
    }
    for w in &input.warnings {
        let _ = writeln!(out, "  warning: {}", terminal_text(w));
    }
    if input.devices.is_empty() {
        let _ = writeln!(out, "  no device has a segment or a trace entry");
    }
    let mut devices = input.devices.iter().peekable();
    while let Some(d) = devices.next() {
        let Some(twin) = d.twin_of else {
            render_device(d, input.kind == InputKind::MemprofRecording, out);
            continue;
        };
        // A run of twins of one device in a row is one line.
        let mut last = d.device;
        while let Some(next) = devices.next_if(|n| n.twin_of == Some(twin)) {
            last = next.device;
        }
        let which = if last == d.device {
            format!("device {}", d.device)
        } else {
            format!("devices {} to {}", d.device, last)
        };
        let _ = writeln!(
            out,
            "{which}: the same trace and segments as device {twin}, so the same report"
        );
    }
    if let Some(host) = &input.pinned_host_allocator {
        render_host_pinned(host, out);
    }
    if let Some(ledger) = &input.ledger {
        super::ledger_text::render(ledger, out);
    }
}

/// PyTorch's host allocator: what it held pinned at the dump, and its peaks over its trace.
fn render_host_pinned(h: &HostPinnedReport, out: &mut String) {
    let _ = writeln!(
        out,
        "  pinned host memory of PyTorch's host allocator: {} reserved in {} {}, {} allocated at the dump",
        Bytes(h.reserved_bytes),
        h.segments,
        if h.segments == 1 { "segment" } else { "segments" },
        Bytes(h.allocated_bytes)
    );
    let when = |t: Option<i64>| match t {
        Some(t) => format!("at time_us {t}"),
        None => "before the trace began or untimed".to_string(),
    };
    if let (Some(reserved), Some(allocated)) = (h.peak_reserved_bytes, h.peak_allocated_bytes) {
        let _ = writeln!(
            out,
            "    over its trace ({} {}): peak reserved {} {}, peak allocated {} {}",
            h.trace_entries,
            if h.trace_entries == 1 {
                "entry"
            } else {
                "entries"
            },
            Bytes(reserved),
            when(h.peak_reserved_time_us),
            Bytes(allocated),
            when(h.peak_allocated_time_us)
        );
    }
}

/// One device's report; `driver_only` for a recording, whose diagnosis sees the driver's calls
/// but not the allocator's cache. Every figure names its moment: the dump (the final layout),
/// the peak over the trace, or the OOM.
fn render_device(d: &DeviceAnalysis, driver_only: bool, out: &mut String) {
    let f = &d.layout.fragmentation;
    let _ = writeln!(out, "device {}", d.device);
    let _ = writeln!(out, "  at the dump:");
    let _ = writeln!(
        out,
        "    reserved      {:>11}  in {}, {}",
        Bytes(d.layout.reserved_bytes).to_string(),
        count(d.layout.segments as u64, "segment", "segments"),
        count(d.layout.blocks as u64, "block", "blocks")
    );
    let _ = writeln!(
        out,
        "    allocated     {:>11}  requested {}, {} lost to rounding (internal)",
        Bytes(d.layout.allocated_bytes).to_string(),
        Bytes(d.layout.requested_bytes),
        Bytes(f.internal_bytes)
    );
    if d.layout.active_bytes != d.layout.allocated_bytes {
        let _ = writeln!(
            out,
            "    pending free  {:>11}  freed by the program, waiting on other streams (not in allocated)",
            Bytes(
                d.layout
                    .active_bytes
                    .saturating_sub(d.layout.allocated_bytes)
            )
            .to_string()
        );
    }
    let _ = writeln!(
        out,
        "    cached free   {:>11}  {} of reserved; largest free block {}",
        Bytes(f.external_bytes).to_string(),
        percent(f.external_bytes, d.layout.reserved_bytes),
        Bytes(f.largest_free_block_bytes)
    );
    render_trace(d, out);
    if !d.top_sites.is_empty() {
        let when = if d.trace.peak_entry_index.is_some() {
            "at the peak of active memory"
        } else {
            "at the dump"
        };
        let _ = writeln!(out, "  alive {when}, by allocation site:");
        for s in &d.top_sites {
            let _ = writeln!(
                out,
                "    {:>11}  {:>5} {}  {}",
                Bytes(s.bytes).to_string(),
                s.count,
                if s.count == 1 { "alloc " } else { "allocs" },
                crate::analysis::site_text(&s.frame, s.via.as_deref())
            );
        }
    }
    if let Some(c) = &d.categories {
        let has_peak = d.trace.peak_entry_index.is_some();
        for line in super::categories_text::moments(c, has_peak, "  ") {
            let _ = writeln!(out, "{line}");
        }
    }
    let trace_peak = d
        .trace
        .peak_entry_index
        .map(|entry| (d.trace.peak_active_bytes, entry));
    let phases = d.phases.as_deref().unwrap_or_default();
    for line in super::categories_text::phases(phases, trace_peak, "  ") {
        let _ = writeln!(out, "{line}");
    }
    if d.mostly_free_segment_count > 0 {
        let free = d
            .mostly_free_segments
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.free_bytes));
        let shown = d.mostly_free_segments.len();
        let biggest = &d.mostly_free_segments[0];
        let _ = writeln!(
            out,
            "  segment map at the dump: {} of {} segments are at least half free{}; the emptiest, 0x{:x} ({}), is {} free",
            d.mostly_free_segment_count,
            d.layout.segments,
            if shown == d.mostly_free_segment_count {
                format!(" ({} free in them)", Bytes(free))
            } else {
                format!(" ({} free in the {shown} emptiest)", Bytes(free))
            },
            biggest.address,
            Bytes(biggest.total_bytes),
            percent(biggest.free_bytes, biggest.total_bytes)
        );
    } else if d.layout.segments > 0 {
        let _ = writeln!(
            out,
            "  segment map at the dump: every segment is more than half used"
        );
    }
    if let Some(oom) = &d.oom {
        let free = oom
            .device_free_bytes
            .map_or_else(|| "unknown".to_string(), |b| Bytes(b).to_string());
        let _ = writeln!(
            out,
            "  OUT OF MEMORY at entry {}: a request of {} failed with {} free on the device; site {}",
            oom.entry_index,
            Bytes(oom.request_bytes),
            free,
            oom.site
        );
        if let Some(a) = &oom.at_oom {
            let largest = match (driver_only, a.largest_free_block_bytes) {
                (true, _) | (false, None) => "not visible in driver calls".to_string(),
                (false, Some(l)) => Bytes(l).to_string(),
            };
            let _ = writeln!(
                out,
                "    at the OOM: reserved {}, allocated {}, free in the cache {} (largest free block {})",
                Bytes(a.reserved_bytes),
                Bytes(a.allocated_bytes),
                Bytes(a.free_in_cache_bytes),
                largest
            );
        }
        if let Some(diag) = &oom.diagnosis {
            let _ = writeln!(
                out,
                "    cause: {}. {} Fixes{}: `memprof diagnose`.",
                diag.cause.name(),
                diag.evidence,
                if driver_only { "" } else { ", replayed" }
            );
        }
    }
    if let Some(p) = &d.pressure {
        let quiet = p.oom_retries == 0 && p.empty_cache_bursts == 0;
        if !(quiet && d.oom.is_some()) {
            for line in pressure_text::lines(p, d.oom.is_some()) {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
}

fn render_trace(d: &DeviceAnalysis, out: &mut String) {
    let t = &d.trace;
    if t.entries == 0 {
        let why = if d.blocks_have_stacks {
            "memory history was recorded (the blocks carry stacks) but the trace was not kept, \
             as with `enabled=\"state\"`"
        } else {
            "memory history was not recorded"
        };
        let _ = writeln!(
            out,
            "  no trace: {why}; the peak is not known; active at the dump {} (requested sizes of the live blocks)",
            Bytes(t.peak_active_bytes)
        );
        return;
    }
    let _ = writeln!(out, "  over the trace:");
    if t.entries == 1 && t.peak_entry_index.is_none() {
        let _ = writeln!(
            out,
            "    peak active   {:>11}  (the trace holds one entry; {} was alive before it)",
            "not known",
            Bytes(t.before_trace_bytes)
        );
    } else {
        let at = match (t.peak_entry_index, t.peak_offset_us) {
            (Some(i), Some(us)) => format!(
                "at entry {i} of {}, {:.3} s into the trace",
                t.entries,
                us as f64 / 1e6
            ),
            (Some(i), None) => format!("at entry {i} of {}", t.entries),
            (None, _) => "before the trace began".to_string(),
        };
        let _ = writeln!(
            out,
            "    peak active   {:>11}  {at} ({} alive before the first entry)",
            Bytes(t.peak_active_bytes).to_string(),
            Bytes(t.before_trace_bytes)
        );
    }
    // Under the active peak it belongs to, not under the reserved peak.
    if let Some(site) = &t.peak_site {
        let _ = writeln!(
            out,
            "                               the active peak reached by an allocation at {site}"
        );
    }
    if t.entries != 1 || t.peak_entry_index.is_some() {
        let _ = writeln!(
            out,
            "    peak reserved {:>11}  (torch.cuda.max_memory_reserved() over the trace)",
            Bytes(t.peak_reserved_bytes).to_string()
        );
    }
    let counts: Vec<String> = t.actions.iter().map(|(a, n)| format!("{n} {a}")).collect();
    let _ = writeln!(
        out,
        "    trace         {} {}: {}",
        t.entries,
        if t.entries == 1 { "entry" } else { "entries" },
        counts.join(", ")
    );
    if let Some(first) = &t.first_inconsistency {
        let _ = writeln!(
            out,
            "  warning: {} trace entries contradict the state (first: {})",
            t.inconsistencies,
            terminal_text(first)
        );
    }
}

/// One line naming the outlier and why, then one row per file and device.
fn render_comparison(report: &AnalyzeReport, c: &Comparison, out: &mut String) {
    let name = |r: &RowRef| {
        if report.inputs.len() > 1 {
            format!("{} device {}", r.input, r.device)
        } else {
            format!("device {}", r.device)
        }
    };
    let top = c
        .peaks
        .iter()
        .find(|p| p.input == c.outlier.input && p.device == c.outlier.device)
        .map_or(0, |p| p.peak_active_bytes);
    let low = c.peaks.iter().min_by_key(|p| p.peak_active_bytes);
    if c.spread_ratio < BALANCED_RATIO {
        let within = (BALANCED_RATIO - 1.0) * 100.0;
        match low
            .filter(|l| (l.peak_active_bytes as f64) * BALANCED_RATIO < c.median_peak_bytes as f64)
        {
            None => {
                let _ = writeln!(
                    out,
                    "balanced: every peak of active memory is within {within:.0}% of the median ({})",
                    Bytes(c.median_peak_bytes)
                );
            }
            Some(l) => {
                let _ = writeln!(
                    out,
                    "no high outlier: the highest peak of active memory is within {within:.0}% of \
                     the median ({}); the lowest is {}, {}",
                    Bytes(c.median_peak_bytes),
                    name(&RowRef {
                        input: l.input.clone(),
                        device: l.device
                    }),
                    Bytes(l.peak_active_bytes)
                );
            }
        }
    } else {
        let ratio = if c.spread_ratio.is_finite() {
            format!("{:.1}x the median", c.spread_ratio)
        } else {
            "the median is 0 B".to_string()
        };
        let why: Vec<String> = c
            .differences
            .iter()
            .take(3)
            .map(|d| {
                format!(
                    "{} (+{}: {} against {})",
                    d.site,
                    Bytes(d.bytes_outlier - d.bytes_median),
                    Bytes(d.bytes_outlier),
                    Bytes(d.bytes_median)
                )
            })
            .collect();
        let because = if why.is_empty() {
            String::new()
        } else {
            format!("; at their peaks it holds more at {}", why.join(", "))
        };
        let _ = writeln!(
            out,
            "outlier: {}, peak active {}, {ratio} ({}, {}){because}",
            name(&c.outlier),
            Bytes(top),
            name(&c.median),
            Bytes(c.median_peak_bytes)
        );
    }
    let rows: Vec<(&InputReport, &DeviceAnalysis)> = report
        .inputs
        .iter()
        .flat_map(|i| i.devices.iter().map(move |d| (i, d)))
        .filter(|(_, d)| d.twin_of.is_none())
        .collect();
    let twins = report
        .inputs
        .iter()
        .flat_map(|i| &i.devices)
        .filter(|d| d.twin_of.is_some())
        .count();
    let width = rows
        .iter()
        .map(|(i, _)| terminal_text(&i.path).to_string().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:>3}  {:>11}  {:>13}  {:>16}  {:>4}",
        "file", "dev", "peak active", "peak reserved", "reserved at dump", "oom"
    );
    for (input, d) in &rows {
        let _ = writeln!(
            out,
            "{:<width$}  {:>3}  {:>11}  {:>13}  {:>16}  {:>4}",
            terminal_text(&input.path).to_string(),
            d.device,
            Bytes(d.trace.peak_active_bytes).to_string(),
            Bytes(d.trace.peak_reserved_bytes).to_string(),
            Bytes(d.layout.reserved_bytes).to_string(),
            if d.oom.is_some() { "yes" } else { "-" }
        );
    }
    if twins > 0 {
        let _ = writeln!(
            out,
            "and {} with the same trace and segments as a device listed (named below)",
            count(twins as u64, "device", "devices")
        );
    }
}
