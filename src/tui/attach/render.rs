//! Draws the attach view: a header, memory over time per device (a sparkline and its
//! figures), then in shim mode the counts, the memory by library and the largest live
//! allocations, in NVML mode what
//! NVML cannot see; the key line, or that the process has ended. Pure.

use super::state::{AttachState, Mode};
use crate::model::Bytes;
use crate::report::terminal_text::terminal_text;
use crate::source::attach::figures::TorchDevice;
use crate::source::live_libraries::{top_and_other, LibraryFigures};
use crate::source::live_tally::LiveTally;
use crate::tui::help;
use crate::tui::theme::Theme;
use crate::tui::top::render::clock_time;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline, Widget, Wrap};

/// The keys of the attach view, for the help overlay.
pub const KEYS: [(&str, &str); 3] = [
    ("?", "this help"),
    (
        "Esc / q",
        "back to the process list (opened from top), else quit",
    ),
    ("Ctrl-C", "quit"),
];

/// Rows of each device's sparkline at most (fewer when many devices share the screen).
const SPARK_ROWS: u16 = 3;
/// Rows kept below the chart for the counts and at least a few allocations.
const BODY_MIN: u16 = 8;
/// Libraries listed per device (and for pinned host memory); the rest are one `other` row.
const LIBRARY_ROWS: usize = 4;
/// Rows of the library table at most (its header included).
const LIBRARY_TABLE_MAX: usize = 9;

fn or_unknown(b: Option<Bytes>) -> String {
    b.map_or("unknown".into(), |b| b.to_string())
}

/// Draws the whole screen.
pub fn render(state: &AttachState, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let devices = state.series.len().max(1) as u16;
    // Header, footer and the body's minimum first; the chart's borders; then rows per device.
    let per_device = area.height.saturating_sub(2 + BODY_MIN + 2) / devices;
    let spark_rows = per_device.saturating_sub(1).clamp(1, SPARK_ROWS);
    let chart_rows = devices * (spark_rows + 1) + 2;
    let [header, chart, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(chart_rows),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    let source = match &state.mode {
        Mode::Shim => "shim stream (driver level)".to_owned(),
        Mode::Nvml { source, .. } | Mode::Torch { source } => source.clone(),
    };
    let mut head = format!(" memprof attach {} │ {source}", state.pid);
    if let Some(ms) = state.now_ms {
        head.push_str(&format!(" │ {}", clock_time(ms)));
    }
    head.push_str(&format!(
        " │ {}",
        state.command.as_deref().unwrap_or("unknown command")
    ));
    Paragraph::new(Line::styled(head, theme.title())).render(header, buf);
    render_chart(state, theme, spark_rows, chart, buf);
    match &state.mode {
        Mode::Shim => render_shim_body(state, theme, body, buf),
        Mode::Nvml { why, .. } => render_nvml_body(why, theme, body, buf),
        Mode::Torch { .. } => render_torch_body(&state.torch, theme, body, buf),
    }
    let hint = if state.gone {
        Line::styled(
            format!(
                " process {} has ended; its last state stays on screen  q / Esc quit (back, from top)",
                state.pid
            ),
            theme.oom(),
        )
    } else if let Some(e) = &state.error {
        Line::styled(format!(" {e}"), theme.oom())
    } else {
        Line::styled(" ? help  q / Esc quit (back, from top)", theme.muted())
    };
    Paragraph::new(hint).render(footer, buf);
    if state.help {
        help::render("memprof attach", &KEYS, theme, area, buf);
    }
}

fn render_chart(state: &AttachState, theme: &Theme, spark_rows: u16, area: Rect, buf: &mut Buffer) {
    let title = match state.mode {
        Mode::Shim => " Memory held through the driver, over time ",
        Mode::Nvml { .. } => " Memory NVML charges to the process, over time ",
        Mode::Torch { .. } => " PyTorch reserved, over time ",
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(title, theme.title()));
    let inner = block.inner(area);
    block.render(area, buf);
    if state.series.is_empty() {
        let text = match state.mode {
            Mode::Shim => "no device memory held yet",
            Mode::Nvml { .. } => "NVML lists no memory of this process yet",
            Mode::Torch { .. } => "PyTorch has reserved no device memory yet",
        };
        Paragraph::new(text).render(inner, buf);
        return;
    }
    let mut y = inner.y;
    for (&device, points) in &state.series {
        if y + 1 + spark_rows > inner.bottom() {
            break;
        }
        let peak = points.iter().filter_map(|p| p.1).max();
        let mut figures = format!(
            "GPU {device}  now {}  peak {}",
            or_unknown(state.latest(device)),
            or_unknown(peak)
        );
        if let Mode::Shim = state.mode {
            if let Some(d) = state.tally.devices.get(&device) {
                figures = format!(
                    "GPU {device}  held {}  peak {}",
                    d.held,
                    d.peak.max(peak.unwrap_or_default())
                );
                if let (Some(total), Some(free)) = (d.total, d.free) {
                    figures.push_str(&format!(
                        "  device: {} of {} used (all processes)",
                        Bytes(total.0.saturating_sub(free.0)),
                        total
                    ));
                }
            }
        }
        Paragraph::new(Line::styled(figures, theme.title()))
            .render(Rect::new(inner.x, y, inner.width, 1), buf);
        let width = inner.width as usize;
        let data: Vec<u64> = points[points.len().saturating_sub(width)..]
            .iter()
            .map(|p| p.1.map_or(0, |b| b.0))
            .collect();
        Sparkline::default()
            .data(&data)
            .max(peak.map_or(1, |b| b.0.max(1)))
            .style(theme.allocated())
            .render(Rect::new(inner.x, y + 1, inner.width, spark_rows), buf);
        y += 1 + spark_rows;
    }
}

/// The rows of the library table: per device then for pinned host memory, (where, name,
/// figures), the libraries holding most and `other` for the rest.
fn library_rows(t: &LiveTally) -> Vec<(String, String, LibraryFigures)> {
    let libs = &t.libraries;
    let mut rows = Vec::new();
    for device in libs.devices() {
        for (name, f) in top_and_other(libs.on_device(device), LIBRARY_ROWS) {
            rows.push((format!("GPU {device}"), name, f));
        }
    }
    for (name, f) in top_and_other(libs.pinned(), LIBRARY_ROWS) {
        rows.push(("pinned".to_owned(), name, f));
    }
    rows
}

fn render_libraries(t: &LiveTally, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let block = Block::default().borders(Borders::ALL).title(Span::styled(
        " Held by library (first frame outside CUDA) ",
        theme.title(),
    ));
    let inner = block.inner(area);
    block.render(area, buf);
    let mut lines = vec![Line::styled(
        format!("{:<7} {:>12} {:>12}  LIBRARY", "WHERE", "HELD", "PEAK"),
        theme.title(),
    )];
    for (place, name, f) in library_rows(t) {
        // A library's name comes from the process's file names: never shown raw.
        lines.push(Line::raw(format!(
            "{place:<7} {:>12} {:>12}  {}",
            f.held.to_string(),
            f.peak.to_string(),
            terminal_text(&name)
        )));
    }
    lines.truncate(inner.height as usize);
    Paragraph::new(lines).render(inner, buf);
}

fn render_shim_body(state: &AttachState, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let t = &state.tally;
    // The table takes what the counts and a few allocations leave, none when too little.
    let library_lines = (library_rows(t).len() + 1).min(LIBRARY_TABLE_MAX) as u16;
    let room = area.height.saturating_sub(4 + 4);
    let libraries_height = match (library_lines + 2).min(room) {
        height if library_lines > 1 && height >= 4 => height,
        _ => 0,
    };
    let [counts, libraries, largest] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Length(libraries_height),
        Constraint::Min(0),
    ])
    .areas(area);
    if libraries_height > 0 {
        render_libraries(t, theme, libraries, buf);
    }
    let rate = state.rate.map_or("?".into(), |r| format!("{r:.1}"));
    let dropped = t
        .dropped
        .map_or("? (known at exit)".into(), |d| d.to_string());
    let lines = vec![
        Line::raw(format!(
            "allocations {}  frees {}  alive {}  OOM {}  failed calls {}",
            t.allocations,
            t.frees,
            t.alive(),
            t.ooms,
            t.failed
        )),
        Line::raw(format!(
            "events/s {rate}  records {}  dropped by the shim {dropped}  not sent (slow reader) {}",
            t.records, t.lost
        )),
    ];
    Paragraph::new(lines)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(Span::styled(" Since attaching ", theme.title())),
        )
        .render(counts, buf);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(" Largest live allocations ", theme.title()));
    let inner = block.inner(largest);
    block.render(largest, buf);
    let rows = (inner.height as usize).saturating_sub(1);
    let mut lines = vec![Line::styled(
        format!("{:>18} {:>4} {:>12}  KIND", "ADDRESS", "GPU", "SIZE"),
        theme.title(),
    )];
    let alive = t.largest(rows);
    for a in &alive {
        lines.push(Line::raw(format!(
            "{:>#18x} {:>4} {:>12}  {}",
            a.address,
            a.device,
            a.size.to_string(),
            if a.mapped { "cuMemMap" } else { "cuMemAlloc" }
        )));
    }
    if alive.is_empty() {
        lines.push(Line::styled("none alive", theme.muted()));
    }
    lines.truncate(inner.height as usize);
    Paragraph::new(lines).render(inner, buf);
}

fn render_nvml_body(why: &str, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let lines = vec![
        Line::styled(format!("{why}: sampling NVML instead"), theme.oom()),
        Line::raw(
            "NVML mode sees only the device memory the driver charges to the process (PyTorch's \
reserved segments plus the CUDA context), per GPU. Allocations, frees, OOM events, tensors, \
stacks and allocator caching are not visible. Start the process with `memprof run` (or \
LD_PRELOAD the shim) to see every allocation.",
        ),
    ];
    Paragraph::new(lines)
        .wrap(Wrap { trim: true })
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(Span::styled(" What NVML cannot see ", theme.title())),
        )
        .render(area, buf);
}

/// Torch mode: PyTorch's figures per device, and what sits outside PyTorch where NVML says.
fn render_torch_body(devices: &[TorchDevice], theme: &Theme, area: Rect, buf: &mut Buffer) {
    let mut lines = Vec::new();
    for d in devices {
        lines.push(Line::styled(
            format!(
                "GPU {}  allocated {} (peak {})  reserved {} (peak {})  active {}",
                d.device,
                or_unknown(d.allocated),
                or_unknown(d.allocated_peak),
                or_unknown(d.reserved),
                or_unknown(d.reserved_peak),
                or_unknown(d.active)
            ),
            theme.title(),
        ));
        let count = |n: Option<u64>| n.map_or("unknown".to_owned(), |n| n.to_string());
        let outside = match (d.nvml_used, d.outside_pytorch()) {
            (Some(used), Some(outside)) => {
                format!("  NVML {used}: outside PyTorch {outside} (CUDA context, NCCL, cuBLAS)")
            }
            _ => "  NVML: not available".to_owned(),
        };
        lines.push(Line::raw(format!(
            "  inactive split {}  alloc retries {}  OOMs {}{outside}",
            or_unknown(d.inactive_split),
            count(d.num_alloc_retries),
            count(d.num_ooms)
        )));
    }
    lines.push(Line::styled(
        "PyTorch's own figures (torch.cuda.memory_stats) from memprof's agent in the job; quitting detaches and leaves the job as it was. \
         For a snapshot: memprof attach PID --snapshot FILE, --record SECS or --on-oom FILE.",
        theme.muted(),
    ));
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .render(area, buf);
}
