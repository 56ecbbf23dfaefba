//! Human text for `analyze`: a short summary a person can act on.

use super::analyze_json::{AnalyzeReport, InputKind, InputReport};
use super::pressure_text;
use super::terminal_text::terminal_text;
use crate::account::{DeviceReport, Figures, FindingKind, MomentKind};
use crate::analysis::compare::{Comparison, RowRef, BALANCED_RATIO};
use crate::analysis::host_pinned::HostPinnedReport;
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

/// The text of one device of `input`, as `analyze` prints it.
pub fn device_text(input: &InputReport, d: &DeviceReport) -> String {
    let mut out = String::new();
    render_device(d, input.kind == InputKind::MemprofRecording, &mut out);
    out
}

/// The comparison of the devices of `report`, as `analyze` prints it.
pub fn comparison_text(report: &AnalyzeReport, c: &Comparison) -> String {
    let mut out = String::new();
    render_comparison(report, c, &mut out);
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

/// A figure of the account, or "not known".
pub fn figure(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "not known".to_string(), |b| Bytes(b).to_string())
}

/// Where a moment lies: its entry and its time on the input's axis.
pub fn moment_place(entry: Option<usize>, seconds: Option<f64>, entries: usize) -> String {
    match (entry, seconds) {
        (Some(i), Some(s)) => format!("at entry {i} of {entries}, {s:.3} s"),
        (Some(i), None) => format!("at entry {i} of {entries}"),
        (None, _) => "before the trace began".to_string(),
    }
}

/// One device's report; `driver_only` for a recording, whose diagnosis sees the driver's calls
/// but not the allocator's cache. Every figure is the account's and names its moment: the dump
/// (the final layout), a peak over the trace, or the OOM.
fn render_device(r: &DeviceReport, driver_only: bool, out: &mut String) {
    let d = &r.analysis;
    let a = &r.account;
    let dump = a.dump();
    let _ = writeln!(out, "device {}", d.device);
    let _ = writeln!(out, "  at the dump:");
    let _ = writeln!(
        out,
        "    reserved      {:>11}  in {}, {}",
        figure(dump.reserved_bytes),
        count(d.layout.segments as u64, "segment", "segments"),
        count(d.layout.blocks as u64, "block", "blocks")
    );
    let (allocated, requested) = (dump.allocated_bytes, dump.requested_bytes);
    let _ = writeln!(
        out,
        "    allocated     {:>11}  requested {}, {} lost to rounding (internal)",
        figure(allocated),
        figure(requested),
        figure(allocated.zip(requested).map(|(a, r)| a.saturating_sub(r)))
    );
    if let (Some(active), Some(allocated)) = (dump.active_bytes, allocated) {
        if active != allocated {
            let _ = writeln!(
                out,
                "    pending free  {:>11}  freed by the program, waiting on other streams (active {})",
                Bytes(active.saturating_sub(allocated)).to_string(),
                Bytes(active)
            );
        }
    }
    let share = dump
        .cached_free_share()
        .map(|s| format!("{:.0}% of reserved", s * 100.0))
        .unwrap_or_else(|| "0% of reserved".to_string());
    let _ = writeln!(
        out,
        "    cached free   {:>11}  {share}; largest free block {}",
        figure(dump.cached_free_bytes),
        figure(dump.largest_free_block_bytes)
    );
    if a.pools.len() > 1 {
        for p in &a.pools {
            let owner = p
                .owner
                .as_deref()
                .map(|o| format!(", {o}"))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "    {:<13} {:>11}  reserved, {} allocated, {} cached free{owner}",
                if p.is_default() {
                    "default pool".to_string()
                } else {
                    format!("pool ({},{})", p.id.0, p.id.1)
                },
                Bytes(p.reserved_bytes).to_string(),
                Bytes(p.allocated_bytes),
                Bytes(p.cached_free_bytes)
            );
        }
    }
    for f in a
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::PrivatePool)
    {
        let _ = writeln!(out, "    {}", f.sentence);
    }
    render_trace(r, out);
    for f in &a.findings {
        if matches!(
            f.kind,
            FindingKind::NoTrace | FindingKind::AtLimit | FindingKind::IfThisWasAnOom
        ) {
            let _ = writeln!(out, "  {}", f.sentence);
        }
    }
    if !d.top_sites.is_empty() {
        let when = if d.trace.peak_entry_index.is_some() {
            "at the peak of requested memory"
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
    for f in &a.findings {
        if matches!(
            f.kind,
            FindingKind::OptimizerTemporaries
                | FindingKind::UnrecordedStacks
                | FindingKind::Wrapper
        ) {
            let _ = writeln!(out, "  {}", terminal_text(&f.sentence));
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
        let moment = a.moment_at(MomentKind::Oom, oom.entry_index);
        let when = moment
            .and_then(|m| m.seconds())
            .map(|s| format!(", {s:.3} s"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  OUT OF MEMORY at entry {}{when}: a request of {} failed with {} free on the device; site {}",
            oom.entry_index,
            Bytes(oom.request_bytes),
            free,
            oom.site
        );
        if let Some(m) = moment {
            let _ = writeln!(
                out,
                "    at the OOM: {}",
                oom_figures(&m.figures, driver_only)
            );
        }
        for f in a
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Imbalance)
        {
            let _ = writeln!(out, "    {}", f.sentence);
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
    for line in super::anomalies_text::lines(&a.anomalies, d.trace.entries, "  ") {
        let _ = writeln!(out, "{line}");
    }
    let judged = a.peaks.requested.bytes.is_some();
    if let Some(p) = d.pressure.as_ref().filter(|_| judged) {
        let quiet = p.oom_retries == 0 && p.empty_cache_bursts == 0;
        if !(quiet && d.oom.is_some()) {
            for line in pressure_text::lines(p, d.oom.is_some()) {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
}

/// The account's figures at an OOM, in one line; `driver_only` for a recording, whose calls
/// do not show the allocator's free blocks.
pub fn oom_figures(f: &Figures, driver_only: bool) -> String {
    let largest = if driver_only {
        "not visible in driver calls".to_string()
    } else {
        figure(f.largest_free_block_bytes)
    };
    format!(
        "reserved {}, allocated {}, requested {}, active {}, cached free {} (largest free block {largest})",
        figure(f.reserved_bytes),
        figure(f.allocated_bytes),
        figure(f.requested_bytes),
        figure(f.active_bytes),
        figure(f.cached_free_bytes),
    )
}

fn render_trace(r: &DeviceReport, out: &mut String) {
    let t = &r.analysis.trace;
    let peaks = &r.account.peaks;
    if t.entries == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "  over the trace (seconds from the input's first trace entry):"
    );
    if peaks.requested.bytes.is_some() {
        let place = |p: &crate::account::PeakOf| {
            moment_place(p.entry, p.offset_us.map(|us| us as f64 / 1e6), t.entries)
        };
        let _ = writeln!(
            out,
            "    peak allocated {:>10}  {}",
            figure(peaks.allocated.bytes),
            match peaks.allocated.bytes {
                Some(_) => format!(
                    "{} (torch.cuda.max_memory_allocated(): block sizes)",
                    place(&peaks.allocated)
                ),
                None if t.entries > crate::diagnose::classify::QUIET_REPLAY_MAX_ENTRIES
                    && r.replayed.is_none() =>
                {
                    "(block sizes: `memprof simulate` replays the allocator, which `analyze` skips \
                     on a trace this long that never hit the limit)"
                        .to_string()
                }
                None => "(block sizes need an allocator replay that reproduces the record, and \
                         this one did not)"
                    .to_string(),
            }
        );
        let site = t
            .peak_site
            .as_deref()
            .map(|s| format!("; reached by an allocation at {s}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "    peak requested {:>10}  {} ({} alive before the first entry){site}",
            figure(peaks.requested.bytes),
            place(&peaks.requested),
            Bytes(t.before_trace_bytes)
        );
        let _ = writeln!(
            out,
            "    peak reserved  {:>10}  {} (torch.cuda.max_memory_reserved())",
            figure(peaks.reserved.bytes),
            place(&peaks.reserved)
        );
    }
    let counts: Vec<String> = t.actions.iter().map(|(a, n)| format!("{n} {a}")).collect();
    let _ = writeln!(
        out,
        "    trace          {} {}: {}",
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

/// One line naming the outlier and why (or that peaks are not known), then one row per file
/// and device that holds memory, each figure as the device's account gives it.
fn render_comparison(report: &AnalyzeReport, c: &Comparison, out: &mut String) {
    let name = |r: &RowRef| {
        if report.inputs.len() > 1 {
            format!("{} device {}", r.input, r.device)
        } else {
            format!("device {}", r.device)
        }
    };
    match (&c.outlier, &c.median, c.median_peak_bytes, c.spread_ratio) {
        (Some(outlier), Some(median), Some(median_peak), Some(spread)) => {
            render_verdict(c, &name, outlier, median, median_peak, spread, out)
        }
        _ => {
            let _ = writeln!(
                out,
                "no comparison of peaks: fewer than two devices have a trace that tells their peak"
            );
        }
    }
    let shown: Vec<(&str, u32)> = c
        .peaks
        .iter()
        .map(|p| (p.input.as_str(), p.device))
        .collect();
    let rows: Vec<(&InputReport, &DeviceReport)> = report
        .inputs
        .iter()
        .flat_map(|i| i.devices.iter().map(move |d| (i, d)))
        .filter(|(i, d)| shown.contains(&(i.path.as_str(), d.device)))
        .filter(|(_, d)| d.twin_of.is_none())
        .collect();
    let twins = report
        .inputs
        .iter()
        .flat_map(|i| i.devices.iter().map(move |d| (i, d)))
        .filter(|(i, d)| shown.contains(&(i.path.as_str(), d.device)))
        .filter(|(_, d)| d.twin_of.is_some())
        .count();
    let width = rows
        .iter()
        .map(|(i, _)| terminal_text(&i.path).to_string().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        out,
        "{:<width$}  {:>3}  {:>14}  {:>13}  {:>16}  {:>4}",
        "file", "dev", "peak requested", "peak reserved", "reserved at dump", "oom"
    );
    for (input, d) in &rows {
        let a = &d.account;
        let _ = writeln!(
            out,
            "{:<width$}  {:>3}  {:>14}  {:>13}  {:>16}  {:>4}",
            terminal_text(&input.path).to_string(),
            d.device,
            figure(a.peaks.requested.bytes),
            figure(a.peaks.reserved.bytes),
            figure(a.dump().reserved_bytes),
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

/// The comparison's verdict: balanced, no high outlier, or the outlier and why.
fn render_verdict(
    c: &Comparison,
    name: &dyn Fn(&RowRef) -> String,
    outlier: &RowRef,
    median: &RowRef,
    median_peak: u64,
    spread: f64,
    out: &mut String,
) {
    let known = || {
        c.peaks
            .iter()
            .filter_map(|p| Some((p, p.peak_active_bytes?)))
    };
    let top = known()
        .find(|(p, _)| p.input == outlier.input && p.device == outlier.device)
        .map_or(0, |(_, b)| b);
    if spread < BALANCED_RATIO {
        let within = (BALANCED_RATIO - 1.0) * 100.0;
        let low = known()
            .min_by_key(|&(_, b)| b)
            .filter(|&(_, b)| (b as f64) * BALANCED_RATIO < median_peak as f64);
        match low {
            None => {
                let _ = writeln!(
                    out,
                    "balanced: every peak of requested memory is within {within:.0}% of the median ({})",
                    Bytes(median_peak)
                );
            }
            Some((l, bytes)) => {
                let _ = writeln!(
                    out,
                    "no high outlier: the highest peak of requested memory is within {within:.0}% \
                     of the median ({}); the lowest is {}, {}",
                    Bytes(median_peak),
                    name(&RowRef {
                        input: l.input.clone(),
                        device: l.device
                    }),
                    Bytes(bytes)
                );
            }
        }
        return;
    }
    let ratio = if spread.is_finite() {
        format!("{spread:.1}x the median")
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
        "outlier: {}, peak requested {}, {ratio} ({}, {}){because}",
        name(outlier),
        Bytes(top),
        name(median),
        Bytes(median_peak)
    );
}
