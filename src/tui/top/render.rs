//! Draws `top`: a header, one used/total bar per GPU, the process table (most memory first),
//! the key line and the help overlay. Pure: the same state and time draw the same buffer.

use super::state::TopState;
use crate::model::Bytes;
use crate::source::gpu::DeviceSample;
use crate::tui::help;
use crate::tui::theme::Theme;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Widget};

/// The keys of `top`, for the help overlay.
pub const KEYS: [(&str, &str); 6] = [
    ("↑ ↓ / k j", "select a process"),
    ("Home End / g G", "first / last process"),
    ("Enter", "open the selected process (the attach view)"),
    ("Esc / q", "from the attach view: back to this list"),
    ("?", "this help"),
    ("q / Ctrl-C", "quit"),
];

/// `HH:MM:SS UTC` of milliseconds since the epoch.
pub fn clock_time(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

fn or_unknown(b: Option<Bytes>) -> String {
    b.map_or("unknown".into(), |b| b.to_string())
}

/// Draws the whole screen; `source` names the sampler.
pub fn render(state: &TopState, source: &str, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let devices = state.sample.as_ref().map_or(&[][..], |s| &s.devices[..]);
    let gpu_rows = (devices.len() as u16).max(1) + 2;
    let [header, gpus, table, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(gpu_rows),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    let mut head = format!(" memprof top │ {source}");
    if let Some(s) = &state.sample {
        head.push_str(&format!(
            " │ {} │ {} GPUs, {} processes",
            clock_time(s.time_ms),
            s.devices.len(),
            s.processes.len()
        ));
    }
    Paragraph::new(Line::styled(head, theme.title())).render(header, buf);
    let block = Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(" GPUs ", theme.title()));
    let inner = block.inner(gpus);
    block.render(gpus, buf);
    if devices.is_empty() {
        let text = if state.sample.is_some() {
            "no GPUs"
        } else {
            "waiting for the first sample"
        };
        Paragraph::new(text).render(inner, buf);
    }
    for (i, d) in devices.iter().enumerate() {
        let row = Rect::new(inner.x, inner.y + i as u16, inner.width, 1);
        if row.y < inner.bottom() {
            Paragraph::new(device_line(d, theme, inner.width as usize)).render(row, buf);
        }
    }
    render_table(state, theme, table, buf);
    let hint = match (&state.message, &state.error) {
        (Some(m), _) => Line::styled(format!(" {m}"), theme.oom()),
        (None, Some(e)) => Line::styled(format!(" sampling failed: {e}"), theme.oom()),
        (None, None) => Line::styled(" ? help  q quit  ↑↓ select  Enter open", theme.muted()),
    };
    Paragraph::new(hint).render(footer, buf);
    if state.help {
        help::render("memprof top", &KEYS, theme, area, buf);
    }
}

/// `GPU 0 name  used / total  pct  util  [bar]`: fixed-width figures, the bar in the rest.
fn device_line<'a>(d: &DeviceSample, theme: &Theme, width: usize) -> Line<'a> {
    let name = d.name.clone().unwrap_or_else(|| "unknown GPU".into());
    let label = format!("GPU {} {name:<22.22} ", d.index);
    let fraction = match (d.used, d.total) {
        (Some(u), Some(t)) if t.0 > 0 => Some(u.0 as f64 / t.0 as f64),
        _ => None,
    };
    let figures = format!(
        "{:>10} / {:<10} {:>4}  util {:>4} ",
        or_unknown(d.used),
        or_unknown(d.total),
        fraction.map_or("?".into(), |f| format!("{:.0}%", f * 100.0)),
        d.utilization_gpu_percent
            .map_or("?".into(), |u| format!("{u}%"))
    );
    let bar_width = width.saturating_sub(label.chars().count() + figures.chars().count() + 2);
    let filled = fraction.map_or(0, |f| {
        ((f * bar_width as f64).round() as usize).min(bar_width)
    });
    let (used_bar, rest) = match fraction {
        Some(_) => ("█".repeat(filled), "░".repeat(bar_width - filled)),
        None => (String::new(), "?".repeat(bar_width)),
    };
    Line::from(vec![
        Span::styled(label, theme.title()),
        Span::raw(figures),
        Span::raw("["),
        Span::styled(used_bar, theme.allocated()),
        Span::styled(rest, theme.reserved()),
        Span::raw("]"),
    ])
}

fn render_table(state: &TopState, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let block = Block::default().borders(Borders::ALL).title(Span::styled(
        " Processes, most memory first ",
        theme.title(),
    ));
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height == 0 {
        return;
    }
    let head = format!(
        "{:>8} {:>4} {:>11} {:>5}  COMMAND",
        "PID", "GPU", "MEMORY", "SHIM"
    );
    let mut lines = vec![Line::styled(head, theme.title())];
    let processes = state.sample.as_ref().map_or(&[][..], |s| &s.processes[..]);
    let rows = (inner.height as usize).saturating_sub(1).max(1);
    let first = state.selected.saturating_sub(rows - 1);
    for (i, p) in processes.iter().enumerate().skip(first).take(rows) {
        let text = format!(
            "{:>8} {:>4} {:>11} {:>5}  {}",
            p.pid,
            p.device,
            or_unknown(p.used),
            match state.has_shim(p.pid) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "?",
            },
            p.command.as_deref().unwrap_or("unknown")
        );
        let style = if i == state.selected {
            theme.selected()
        } else {
            Style::new()
        };
        lines.push(Line::styled(text, style));
    }
    if processes.is_empty() && state.sample.is_some() {
        lines.push(Line::raw("no process holds GPU memory"));
    }
    Paragraph::new(lines).render(inner, buf);
}
