//! Human text for `analyze`: a short summary a person can act on.

use super::analyze_json::{AnalyzeReport, InputKind, InputReport};
use super::terminal_text::terminal_text;
use crate::analysis::DeviceAnalysis;
use crate::model::Bytes;
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
    if report.inputs.len() > 1 {
        render_comparison(report, &mut out);
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
    let format = match input.format {
        "history" => "PyTorch 2.0 snapshot",
        "segments_only" => "segment list (no trace)",
        "recording" => "memprof recording of driver calls",
        _ => "PyTorch 2.1+ snapshot",
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
    for d in &input.devices {
        render_device(d, input.kind == InputKind::MemprofRecording, out);
    }
}

/// One device's report; `driver_only` for a recording, whose diagnosis sees the driver's calls
/// but not the allocator's cache.
fn render_device(d: &DeviceAnalysis, driver_only: bool, out: &mut String) {
    let f = &d.layout.fragmentation;
    let _ = writeln!(out, "device {}", d.device);
    let _ = writeln!(
        out,
        "  reserved    {:>11}  in {} segments, {} blocks",
        Bytes(d.layout.reserved_bytes).to_string(),
        d.layout.segments,
        d.layout.blocks
    );
    let _ = writeln!(
        out,
        "  allocated   {:>11}  requested {}, {} lost to rounding (internal)",
        Bytes(d.layout.allocated_bytes).to_string(),
        Bytes(d.layout.requested_bytes),
        Bytes(f.internal_bytes)
    );
    if d.layout.active_bytes != d.layout.allocated_bytes {
        let _ = writeln!(
            out,
            "  pending     {:>11}  freed but waiting on other streams",
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
        "  cached free {:>11}  {} of reserved; largest free block {}",
        Bytes(f.external_bytes).to_string(),
        percent(f.external_bytes, d.layout.reserved_bytes),
        Bytes(f.largest_free_block_bytes)
    );
    render_trace(d, out);
    if !d.top_sites.is_empty() {
        let when = if d.trace.entries > 0 {
            "at the peak"
        } else {
            "now"
        };
        let _ = writeln!(out, "  alive {when}, by allocation site:");
        for s in &d.top_sites {
            let _ = writeln!(
                out,
                "    {:>11}  {:>5} {}  {}",
                Bytes(s.bytes).to_string(),
                s.count,
                if s.count == 1 { "alloc " } else { "allocs" },
                s.frame
            );
        }
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
            "  segment map: {} of {} segments are at least half free{}; the emptiest, 0x{:x} ({}), is {} free",
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
        let _ = writeln!(out, "  segment map: every segment is more than half used");
    }
    if let Some(oom) = &d.oom {
        let free = oom
            .device_free_bytes
            .map_or_else(|| "unknown".to_string(), |b| Bytes(b).to_string());
        let largest = if driver_only {
            "not visible in driver calls".to_string()
        } else {
            Bytes(f.largest_free_block_bytes).to_string()
        };
        let _ = writeln!(
            out,
            "  OUT OF MEMORY at entry {}: a request of {} failed with {} free on the device; largest cached free block {}; site {}",
            oom.entry_index,
            Bytes(oom.request_bytes),
            free,
            largest,
            oom.site
        );
        if let Some(diag) = &oom.diagnosis {
            let _ = writeln!(
                out,
                "  cause: {}. {} Remedies{}: `memprof diagnose`.",
                diag.cause.name(),
                diag.evidence,
                if driver_only { "" } else { ", replayed" }
            );
        }
    }
}

fn render_trace(d: &DeviceAnalysis, out: &mut String) {
    let t = &d.trace;
    if t.entries == 0 {
        let _ = writeln!(
            out,
            "  no trace (history recording was off); live requested bytes now {}",
            Bytes(t.peak_active_bytes)
        );
        return;
    }
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
        "  peak active {:>11}  {at} ({} alive before the first entry)",
        Bytes(t.peak_active_bytes).to_string(),
        Bytes(t.before_trace_bytes)
    );
    if let Some(site) = &t.peak_site {
        let _ = writeln!(out, "              reached by an allocation at {site}");
    }
    let counts: Vec<String> = t.actions.iter().map(|(a, n)| format!("{n} {a}")).collect();
    let _ = writeln!(
        out,
        "  trace       {} entries: {}",
        t.entries,
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

/// One row per file and device, heaviest named first.
fn render_comparison(report: &AnalyzeReport, out: &mut String) {
    let rows: Vec<(&InputReport, &DeviceAnalysis)> = report
        .inputs
        .iter()
        .flat_map(|i| i.devices.iter().map(move |d| (i, d)))
        .collect();
    let Some((heavy_input, heavy)) = rows.iter().max_by_key(|(_, d)| d.trace.peak_active_bytes)
    else {
        return;
    };
    let lightest = rows
        .iter()
        .map(|(_, d)| d.trace.peak_active_bytes)
        .min()
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "heaviest: {} device {}, peak active {} ({} above the lightest)",
        terminal_text(&heavy_input.path),
        heavy.device,
        Bytes(heavy.trace.peak_active_bytes),
        Bytes(heavy.trace.peak_active_bytes - lightest)
    );
    let width = rows
        .iter()
        .map(|(i, _)| terminal_text(&i.path).to_string().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:>3}  {:>11}  {:>11}  {:>11}  {:>11}  {:>4}",
        "file", "dev", "reserved", "allocated", "peak active", "cached free", "oom"
    );
    for (input, d) in &rows {
        let _ = writeln!(
            out,
            "{:<width$}  {:>3}  {:>11}  {:>11}  {:>11}  {:>11}  {:>4}",
            terminal_text(&input.path).to_string(),
            d.device,
            Bytes(d.layout.reserved_bytes).to_string(),
            Bytes(d.layout.allocated_bytes).to_string(),
            Bytes(d.trace.peak_active_bytes).to_string(),
            Bytes(d.layout.fragmentation.external_bytes).to_string(),
            if d.oom.is_some() { "yes" } else { "-" }
        );
    }
}
