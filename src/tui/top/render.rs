//! Draws `top`: a header, one used/total bar per GPU, the process table (most memory first),
//! the key line and the help overlay. Pure: the same state and time draw the same buffer.

use super::state::TopState;
use crate::model::{count, Bytes};
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
    ("Enter", "open the selected process (or its attach menu)"),
    ("Esc / q", "from the attach view: back to this list"),
    ("?", "this help"),
    ("q / Ctrl-C", "quit"),
];

/// `HH:MM:SS UTC` of milliseconds since the epoch.
pub fn clock_time(ms: u64) -> String {
    let s = ms / 1000 % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

/// Columns `text` takes on a terminal.
fn columns(text: &str) -> usize {
    Span::raw(text).width()
}

/// `command` cut to `width` columns. Whole when it fits; otherwise the program's name (its path
/// left out as `…/`) and as many whole arguments as fit, `…` standing for the rest: the
/// arguments are what tells two Python processes apart.
pub fn fit_command(command: &str, width: usize) -> String {
    if columns(command) <= width {
        return command.to_owned();
    }
    let mut words = command.split(' ');
    let program = words.next().unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or(program);
    let mut out = if name.len() < program.len() {
        format!("…/{name}")
    } else {
        name.to_owned()
    };
    if columns(&out) > width {
        if columns(name) + 2 <= width {
            return format!("{name} …");
        }
        if columns(name) <= width {
            return name.to_owned();
        }
        // Not even the name fits: as much of it as does.
        let mut cut = String::new();
        for c in name.chars() {
            if columns(&cut) + columns(c.encode_utf8(&mut [0; 4])) + 1 > width {
                break;
            }
            cut.push(c);
        }
        if width > 0 {
            cut.push('…');
        }
        return cut;
    }
    let args: Vec<&str> = words.collect();
    for (i, arg) in args.iter().enumerate() {
        // Room for " …" unless this is the last argument.
        let rest = if i + 1 == args.len() { 0 } else { 2 };
        if columns(&out) + 1 + columns(arg) + rest > width {
            if columns(&out) + 2 <= width {
                out.push_str(" …");
            }
            return out;
        }
        out.push(' ');
        out.push_str(arg);
    }
    out
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
            " │ {} │ {}, {}",
            clock_time(s.time_ms),
            count(s.devices.len() as u64, "GPU", "GPUs"),
            count(s.processes.len() as u64, "process", "processes")
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
    // The columns before COMMAND; the command gets the rest of the row.
    let command_width = (inner.width as usize).saturating_sub(columns(&head) - "COMMAND".len());
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
            fit_command(p.command.as_deref().unwrap_or("unknown"), command_width)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_fits_is_left_whole() {
        let command = "/usr/bin/python3 train.py --lr 0.1";
        assert_eq!(fit_command(command, 34), command);
        assert_eq!(fit_command(command, 80), command);
    }

    #[test]
    fn a_long_command_keeps_the_program_name_and_the_arguments_that_fit() {
        let command =
            "/home/someone/projects/gpu-tools/memprof/target/tmp/kernels-top/peak_oom wait";
        assert_eq!(fit_command(command, 67), "…/peak_oom wait");
        let python = "/opt/conda/envs/train/bin/python3 train.py --config llama.yaml --rank 3";
        for (width, cut) in [
            (71, python),
            (70, "…/python3 train.py --config llama.yaml --rank 3"),
            (47, "…/python3 train.py --config llama.yaml --rank 3"),
            (46, "…/python3 train.py --config llama.yaml …"),
            (40, "…/python3 train.py --config llama.yaml …"),
            (39, "…/python3 train.py --config …"),
            (28, "…/python3 train.py …"),
            (19, "…/python3 …"),
            (9, "…/python3"),
            (8, "python3"),
            (5, "pyth…"),
            (1, "…"),
            (0, ""),
        ] {
            let got = fit_command(python, width);
            assert_eq!(got, cut, "width {width}");
            assert!(columns(&got) <= width, "{got:?} in {width}");
        }
    }
}
