//! Draws the `view` screen from the app's state: header, chart, the visible panels (cursor
//! state and segment map, largest blocks and the selected one's stack, opened on its site,
//! top sites at the peak, the anomalies, the OOM, the tree at the cursor), the key line, and
//! the help overlay. Pure: the same state draws the same buffer.

use super::chart;
use super::state::Panel;
use super::summary::CursorState;
use super::ViewApp;
use crate::analysis::{site_of, site_text, ShownStack};
use crate::model::{count, Bytes};
use crate::tui::help;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Widget, Wrap};

/// Width that earns one more panel side by side.
const PANEL_WIDTH: u16 = 64;

/// The keys of `view`, for the help overlay.
pub const KEYS: [(&str, &str); 17] = [
    ("← → / h l", "move the cursor one column"),
    ("Shift+← → / PgUp PgDn", "move ten columns"),
    ("Home End / g G", "first / last entry"),
    ("+ / z", "zoom in around the cursor"),
    ("- / Z", "zoom out"),
    ("0", "show the whole trace"),
    ("p", "jump to the peak"),
    ("o", "jump to the OOM"),
    ("↑ ↓ / k j", "select a block (its stack is shown)"),
    ("[ ]", "scroll the stack up / down"),
    ("f", "full stack / filtered stack"),
    ("t", "show / hide the tree of what is live"),
    ("Enter", "open / close a frame of the tree"),
    ("Tab / Shift+Tab", "next / previous panel"),
    ("d", "next device"),
    ("?", "this help"),
    ("q / Ctrl-C", "quit"),
];

/// Rows the chart takes on a terminal `height` rows high.
fn chart_height(height: u16) -> u16 {
    (height.saturating_sub(2) * 2 / 5).max(7)
}

/// Rows of the block list and of the stack lines in a blocks panel `inner` rows high inside,
/// with `blocks` live blocks (a line between them says whose stack it is).
fn blocks_rows(inner: usize, blocks: usize) -> (usize, usize) {
    let list = (inner / 2).max(1).min(blocks);
    (list, inner.saturating_sub(list + 1))
}

/// Stack lines the blocks panel shows on a terminal `height` rows high.
pub fn stack_rows(height: u16, blocks: usize) -> usize {
    let panels = height.saturating_sub(2 + chart_height(height));
    blocks_rows(panels.saturating_sub(2) as usize, blocks).1
}

/// The first of `rows` stack lines shown: `scroll`, else one above the site's frame (the call
/// it made), and never past the last screenful.
pub fn first_stack_line(shown: &ShownStack, rows: usize, scroll: Option<usize>) -> usize {
    let last = shown.frames.len().saturating_sub(rows);
    scroll
        .unwrap_or_else(|| shown.site.map_or(0, |s| s.saturating_sub(1)))
        .min(last)
}

/// Draws the whole screen.
pub fn render(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let chart_height = chart_height(area.height);
    let [header, chart_area, panels, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(chart_height),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(app, header, buf);
    let theme = &app.theme;
    let chart_block = Block::default()
        .borders(Borders::ALL)
        .title(Line::from(vec![
            Span::styled(" Memory over time ", theme.title()),
            Span::styled("█▓ requested ", theme.allocated()),
            Span::styled("░ reserved ", theme.reserved()),
            Span::styled("▲ peak ", theme.peak()),
            Span::styled("✕ OOM ", theme.oom()),
        ]));
    let inner = chart_block.inner(chart_area);
    chart_block.render(chart_area, buf);
    chart::render(&app.device().summary, &app.state, theme, inner, buf);
    render_panels(app, panels, buf);
    let hint = match &app.state.message {
        Some(m) => Line::styled(format!(" {m}"), theme.oom()),
        None => Line::styled(
            " ? help  q quit  ←→ move  +- zoom  p peak  o OOM  Tab panel  d device",
            theme.muted(),
        ),
    };
    Paragraph::new(hint).render(footer, buf);
    if app.state.help {
        help::render("memprof view", &KEYS, theme, area, buf);
    }
}

fn render_header(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let state = &app.state;
    let summary = &app.device().summary;
    let device = if state.devices > 1 {
        format!(
            "device {} ({} of {})",
            summary.device,
            state.device + 1,
            state.devices
        )
    } else {
        format!("device {}", summary.device)
    };
    let mut parts = vec![
        app.name.clone(),
        device,
        count(summary.len() as u64, "entry", "entries"),
    ];
    if !summary.is_empty() {
        parts.push(format!("cursor {}", chart::position(summary, state.cursor)));
        parts.push(format!("zoom {:.1}×", state.zoom()));
        if summary.bucket_size() > 1 {
            parts.push(format!("{} entries/bucket", summary.bucket_size()));
        }
    }
    let text = format!(" {}", parts.join(" │ "));
    Paragraph::new(Line::styled(text, app.theme.title())).render(area, buf);
}

/// Draws the focused panel and as many following ones as fit side by side.
fn render_panels(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let state = &app.state;
    let count = ((area.width / PANEL_WIDTH).max(1) as usize).min(state.panels.len());
    let areas = Layout::horizontal(vec![Constraint::Fill(1); count]).split(area);
    for (i, &rect) in areas.iter().enumerate() {
        let panel = state.panels[(state.focus + i) % state.panels.len()];
        let title = match panel {
            Panel::Cursor => " At the cursor ",
            Panel::Blocks => " Largest blocks at the cursor ",
            Panel::Sites => " Top sites at the peak ",
            Panel::Oom => " Out of memory ",
            Panel::Tree => " Live at the cursor, caller first ",
            Panel::Anomalies => " Anomalies over the trace ",
        };
        let title_style = if i == 0 {
            app.theme.title().patch(app.theme.selected())
        } else {
            app.theme.title()
        };
        let block = Block::default()
            .borders(Borders::ALL)
            .title(Span::styled(title, title_style));
        let inner = block.inner(rect);
        block.render(rect, buf);
        match panel {
            Panel::Cursor => render_cursor(app, inner, buf),
            Panel::Blocks => render_blocks(app, inner, buf),
            Panel::Sites => render_sites(app, inner, buf),
            Panel::Oom => render_oom(app, inner, buf),
            Panel::Tree => super::tree::render(app, inner, buf),
            Panel::Anomalies => render_anomalies(app, inner, buf),
        }
    }
}

/// A stack frame's label cut to `width` characters: a compiled function's keeps its start
/// (the name before the argument list), others their end (where the file and line are).
fn fit_frame(label: &str, width: usize) -> String {
    if !label.contains('(') || label.chars().count() <= width || width == 0 {
        return keep_end(label, width);
    }
    let head: String = label.chars().take(width - 1).collect();
    format!("{head}…")
}

/// A site and the library call it made on one line of `width` characters: whole if it fits,
/// else with the file's directory left out; `None` when that does not fit either.
fn fit_site(frame: &str, via: Option<&str>, width: usize) -> Option<String> {
    let whole = site_text(frame, via);
    if whole.chars().count() <= width || via.is_none() {
        return Some(keep_end(&whole, width));
    }
    let file = frame.rsplit(['/', '\\']).next().unwrap_or(frame);
    let short = site_text(file, via);
    (short.chars().count() <= width).then_some(short)
}

/// `text` cut to `width` characters, keeping its end (where a site's file and line are).
fn keep_end(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let tail: String = text.chars().skip(n - width + 1).collect();
    format!("…{tail}")
}

fn figure<'a>(name: &'a str, value: String, style: Style) -> Line<'a> {
    Line::from(vec![
        Span::raw(format!("{name:<14}")),
        Span::styled(value, style),
    ])
}

fn render_cursor(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let c = &app.at_cursor;
    let theme = &app.theme;
    let summary = &app.device().summary;
    let mut lines = vec![match c.index {
        Some(i) => Line::raw(format!(
            "entry {i} of {} ({})",
            summary.len(),
            chart::position(summary, i)
        )),
        None => Line::raw("final layout (no trace)"),
    }];
    // Requested and reserved bytes come from the trace at every entry; the other figures
    // need the allocator's block sizes, which the account holds at its moments (the peaks,
    // each OOM, the dump) and which the cursor shows when it sits on one.
    let figures = app
        .device()
        .account
        .figures_with_trace(c.index, c.allocated, c.reserved);
    let percent = |part: u64| {
        if c.reserved == 0 {
            String::new()
        } else {
            format!(" ({:.0}%)", part as f64 * 100.0 / c.reserved as f64)
        }
    };
    let at_moment = |value: Option<u64>, with_share: bool| match value {
        Some(b) if with_share => format!("{}{}", Bytes(b), percent(b)),
        Some(b) => Bytes(b).to_string(),
        None => "not known here (p: the peak, o: the OOM)".to_string(),
    };
    lines.push(figure(
        "requested",
        Bytes(figures.requested_bytes.unwrap_or(c.allocated)).to_string(),
        theme.allocated(),
    ));
    lines.push(figure(
        "reserved",
        Bytes(figures.reserved_bytes.unwrap_or(c.reserved)).to_string(),
        theme.reserved(),
    ));
    lines.push(figure(
        "allocated",
        at_moment(figures.allocated_bytes, false),
        Style::new(),
    ));
    lines.push(figure(
        "cached free",
        at_moment(figures.cached_free_bytes, true),
        Style::new(),
    ));
    lines.push(figure(
        "largest free",
        at_moment(figures.largest_free_block_bytes, false),
        Style::new(),
    ));
    lines.push(figure(
        "largest gap",
        match c.largest_free {
            Some(b) => format!(
                "{} in {} between live allocations",
                Bytes(b),
                count(c.free_runs as u64, "run", "runs")
            ),
            None => "unknown (no segments)".into(),
        },
        Style::new(),
    ));
    lines.push(Line::raw(format!(
        "{} in {}",
        count(c.live_count as u64, "live allocation", "live allocations"),
        count(c.segment_count as u64, "segment", "segments")
    )));
    let (categories, added_up) = &app.cursor_categories;
    let breakdown = crate::report::categories_text::breakdown(categories);
    lines.push(figure(
        "what it is",
        if categories.is_empty() {
            breakdown
        } else {
            format!("{}: {breakdown}", added_up.word())
        },
        Style::new(),
    ));
    let text_rows = lines.len() as u16;
    if area.height > text_rows + 1 {
        lines.push(Line::from(vec![
            Span::styled("Segment map ", theme.title()),
            Span::styled("█▓▒░ used ", theme.allocated()),
            Span::styled("· free", theme.reserved()),
        ]));
    }
    Paragraph::new(lines).render(area, buf);
    let map_top = text_rows + 1;
    if area.height > map_top {
        let map = Rect::new(area.x, area.y + map_top, area.width, area.height - map_top);
        render_map(c, app, map, buf);
    }
}

/// The segments end to end in address order, each cell shaded by how much of it is in use.
fn render_map(c: &CursorState, app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let cells = area.width as usize * area.height as usize;
    if cells == 0 || c.occupancy.is_empty() {
        return;
    }
    let n = c.occupancy.len();
    let shown = cells.min(n);
    for i in 0..shown {
        // Display cell i covers occupancy cells [from, to): each once, none left out.
        let chunk = &c.occupancy[i * n / shown..(i + 1) * n / shown];
        let capacity = c.cell_bytes * chunk.len() as u64;
        let used: u64 = chunk.iter().sum();
        let fraction = used as f64 / capacity.max(1) as f64;
        let (symbol, style) = match fraction {
            f if f <= 0.0 => ("·", app.theme.reserved()),
            f if f < 0.25 => ("░", app.theme.allocated()),
            f if f < 0.5 => ("▒", app.theme.allocated()),
            f if f < 0.999 => ("▓", app.theme.allocated()),
            _ => ("█", app.theme.allocated()),
        };
        let x = area.x + (i % area.width as usize) as u16;
        let y = area.y + (i / area.width as usize) as u16;
        if let Some(cell) = buf.cell_mut((x, y)) {
            cell.set_symbol(symbol).set_style(style);
        }
    }
}

fn render_blocks(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let c = &app.at_cursor;
    let stacks = &app.snapshot.stacks;
    if c.largest.is_empty() {
        Paragraph::new("no live allocations at the cursor").render(area, buf);
        return;
    }
    let width = area.width as usize;
    let selected = app.state.selected_block.min(c.largest.len() - 1);
    let (list_rows, stack_rows) = blocks_rows(area.height as usize, c.largest.len());
    let first = selected.saturating_sub(list_rows - 1);
    let mut lines: Vec<Line> = c.largest[first..first + list_rows]
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let text = format!("{:>10}  ", Bytes(b.size).to_string());
            let site = keep_end(&site_of(stacks, b.stack), width.saturating_sub(12));
            let style = if first + i == selected {
                app.theme.selected()
            } else {
                Style::new()
            };
            Line::styled(format!("{text}{site}"), style)
        })
        .collect();
    let chosen = c.largest[selected];
    let whose = format!("{} block at 0x{:x}", Bytes(chosen.size), chosen.address);
    let Some(shown) = app.selected_stack() else {
        lines.push(Line::styled(
            format!("{whose}: no stack recorded"),
            app.theme.title(),
        ));
        Paragraph::new(lines).render(area, buf);
        return;
    };
    let n = shown.frames.len();
    let top = first_stack_line(&shown, stack_rows, app.state.stack_scroll);
    let what = if app.state.full_stack {
        "full stack"
    } else {
        "filtered stack"
    };
    let span = match n {
        0 => "only capture and interpreter frames, f shows them".to_string(),
        1 => format!("{what}, 1 frame"),
        _ if n <= stack_rows => format!("{what}, {n} frames"),
        _ => format!("{what}, {}-{} of {n}", top + 1, (top + stack_rows).min(n)),
    };
    lines.push(Line::styled(format!("{whose}: {span}"), app.theme.title()));
    for (i, label) in shown.frames.iter().enumerate().skip(top).take(stack_rows) {
        let text = fit_frame(label, width.saturating_sub(2));
        lines.push(if shown.site == Some(i) {
            Line::styled(format!("▶ {text}"), app.theme.title())
        } else {
            Line::raw(format!("  {text}"))
        });
    }
    Paragraph::new(lines).render(area, buf);
}

fn render_sites(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let device = app.device();
    let trace = &device.analysis.trace;
    let theme = &app.theme;
    let mut lines = vec![Line::from(vec![
        Span::raw("peak "),
        Span::styled(Bytes(trace.peak_active_bytes).to_string(), theme.peak()),
        Span::raw(match trace.peak_entry_index {
            Some(i) => format!(" at {}", chart::position(&device.summary, i)),
            None => " (the memory alive before the trace)".into(),
        }),
    ])];
    let width = area.width as usize;
    if device.analysis.top_sites.is_empty() {
        lines.push(Line::raw("no live allocations at the peak"));
    }
    for site in &device.analysis.top_sites {
        let head = format!("{:>10} {:>5}× ", Bytes(site.bytes).to_string(), site.count);
        let indent = head.chars().count();
        let room = width.saturating_sub(indent);
        match fit_site(&site.frame, site.via.as_deref(), room) {
            Some(text) => lines.push(Line::raw(format!("{head}{text}"))),
            // The library call on a line of its own.
            None => {
                lines.push(Line::raw(format!("{head}{}", keep_end(&site.frame, room))));
                let via = format!("via {}", site.via.as_deref().unwrap_or_default());
                let via = keep_end(&via, room);
                lines.push(Line::styled(format!("{:indent$}{via}", ""), theme.muted()));
            }
        }
    }
    Paragraph::new(lines).render(area, buf);
}

fn render_oom(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let device = app.device();
    let theme = &app.theme;
    let Some(oom) = &device.analysis.oom else {
        Paragraph::new("no OOM in this trace").render(area, buf);
        return;
    };
    let mut lines = vec![
        Line::from(vec![
            Span::raw("request "),
            Span::styled(Bytes(oom.request_bytes).to_string(), theme.oom()),
            Span::raw(format!(
                " failed at {}",
                chart::position(&device.summary, oom.entry_index)
            )),
        ]),
        figure(
            "device free",
            oom.device_free_bytes
                .map_or("unknown".into(), |b| Bytes(b).to_string()),
            Style::new(),
        ),
        Line::raw(format!("site {}", oom.site)),
    ];
    match &oom.diagnosis {
        Some(d) => {
            lines.push(figure(
                "cause",
                d.cause.name().replace('_', " "),
                theme.oom(),
            ));
            lines.push(Line::raw(d.evidence.clone()));
        }
        None => lines.push(Line::raw(
            "no diagnosis (the allocator backend is not modelled)",
        )),
    }
    Paragraph::new(lines)
        .wrap(Wrap { trim: true })
        .render(area, buf);
}

/// The account's anomaly lines, as `analyze` prints them.
fn render_anomalies(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let device = app.device();
    let lines: Vec<Line> = crate::report::anomalies_text::lines(
        &device.account.anomalies,
        device.analysis.trace.entries,
        "",
    )
    .into_iter()
    .map(|l| Line::raw(crate::report::terminal_text::terminal_text(&l).to_string()))
    .collect();
    Paragraph::new(lines)
        .wrap(Wrap { trim: true })
        .render(area, buf);
}
