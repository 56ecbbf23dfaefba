//! The memory-over-time chart: one column per run of entries, the requested bytes of live
//! allocations as a bar (eighth-block resolution; solid up to the column's lowest value, `▓`
//! between its lowest and highest), reserved as shading above it, the cursor column marked,
//! peak and OOM marked on the axis. Reads only the summary's buckets: at most `MAX_BUCKETS` per
//! frame.

use super::state::ViewState;
use super::summary::{Bucket, Summary};
use crate::model::Bytes;
use crate::tui::theme::Theme;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;

/// Width of the y-axis labels ("123.45 MiB" and a space).
const AXIS: u16 = 11;
/// Borders around the chart.
const BORDERS: u16 = 2;
const EIGHTHS: [&str; 8] = ["▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];

/// Columns of the plot for a terminal `width` wide (what the cursor steps by).
pub fn plot_columns(width: u16) -> usize {
    width.saturating_sub(AXIS + BORDERS).max(1) as usize
}

/// Where an entry is, in words: seconds from the first entry when the trace has times, else
/// its index.
pub fn position(summary: &Summary, index: usize) -> String {
    match summary.offset_us(index) {
        Some(us) => format!("+{:.3} s", us as f64 / 1e6),
        None => format!("#{index}"),
    }
}

/// The entries `[from, to)` column `c` of `columns` covers in the window.
fn column_span(state: &ViewState, c: usize, columns: usize) -> (usize, usize) {
    let width = state.end - state.start;
    let from = state.start + c * width / columns;
    let to = (state.start + (c + 1) * width / columns).max(from + 1);
    (from, to)
}

fn put(buf: &mut Buffer, x: u16, y: u16, symbol: &str, style: Style) {
    if let Some(cell) = buf.cell_mut((x, y)) {
        cell.set_symbol(symbol).set_style(style);
    }
}

fn put_text(buf: &mut Buffer, x: u16, y: u16, text: &str, max_x: u16, style: Style) {
    for (i, ch) in text.chars().enumerate() {
        let at = x + i as u16;
        if at >= max_x {
            break;
        }
        put(buf, at, y, ch.encode_utf8(&mut [0u8; 4]), style);
    }
}

/// Draws the chart inside `area` (the chart block's inner area).
pub fn render(summary: &Summary, state: &ViewState, theme: &Theme, area: Rect, buf: &mut Buffer) {
    let rows = area.height.saturating_sub(1);
    if rows == 0 || area.width <= AXIS {
        return;
    }
    let plot_x = area.x + AXIS;
    let columns = (area.width - AXIS) as usize;
    if summary.is_empty() {
        put_text(
            buf,
            plot_x,
            area.y,
            "no trace in this file: the panels show its final layout",
            area.right(),
            theme.muted(),
        );
        return;
    }
    let spans: Vec<(usize, usize, Bucket)> = (0..columns)
        .filter_map(|c| {
            let (from, to) = column_span(state, c, columns);
            Some((from, to, summary.span(from, to)?))
        })
        .collect();
    let top = spans
        .iter()
        .map(|(_, _, b)| b.reserved.max(b.high))
        .max()
        .unwrap_or(0)
        .max(1);
    let bottom_row = area.y + rows - 1;
    let eighths_total = rows as u64 * 8;
    let mark = |from: usize, to: usize, at: Option<usize>| at.is_some_and(|i| from <= i && i < to);
    let mut cursor_drawn = false;
    for (c, &(from, to, bucket)) in spans.iter().enumerate() {
        let x = plot_x + c as u16;
        let filled = (bucket.high as u128 * eighths_total as u128).div_ceil(top as u128) as u64;
        let shaded = (bucket.reserved as u128 * rows as u128).div_ceil(top as u128) as u64;
        let solid = (bucket.low as u128 * rows as u128 / top as u128) as u64;
        let is_cursor = !cursor_drawn && mark(from, to, Some(state.cursor));
        cursor_drawn |= is_cursor;
        for row in 0..rows as u64 {
            let y = bottom_row - row as u16;
            let (symbol, style) = if row < solid {
                (EIGHTHS[7], theme.allocated())
            } else if filled >= (row + 1) * 8 {
                ("▓", theme.allocated())
            } else if filled > row * 8 {
                (EIGHTHS[(filled - row * 8 - 1) as usize], theme.allocated())
            } else if row < shaded {
                ("░", theme.reserved())
            } else if is_cursor {
                ("│", theme.title())
            } else {
                continue;
            };
            let style = if is_cursor && symbol != "│" {
                style.patch(theme.selected())
            } else {
                style
            };
            put(buf, x, y, symbol, style);
        }
    }
    let axis_style = theme.muted();
    let label = |bytes: u64| {
        format!(
            "{:>width$}",
            Bytes(bytes).to_string(),
            width = AXIS as usize - 1
        )
    };
    put_text(buf, area.x, area.y, &label(top), plot_x, axis_style);
    if rows >= 3 {
        put_text(
            buf,
            area.x,
            area.y + rows / 2,
            &label(top / 2),
            plot_x,
            axis_style,
        );
    }
    put_text(buf, area.x, bottom_row, &label(0), plot_x, axis_style);
    let axis_y = bottom_row + 1;
    let right = area.right();
    put_text(
        buf,
        plot_x,
        axis_y,
        &position(summary, state.start),
        right,
        axis_style,
    );
    let end_label = position(summary, state.end.saturating_sub(1));
    let end_x = right
        .saturating_sub(end_label.chars().count() as u16)
        .max(plot_x);
    put_text(buf, end_x, axis_y, &end_label, right, axis_style);
    // The cursor first: on the peak or the OOM, their mark shows (the column is reversed).
    let marks = [
        (Some(state.cursor), "^", theme.title()),
        (state.peak, "▲", theme.peak()),
        (state.oom, "✕", theme.oom()),
    ];
    for (at, symbol, style) in marks {
        if let Some(c) = spans.iter().position(|&(f, t, _)| mark(f, t, at)) {
            put(buf, plot_x + c as u16, axis_y, symbol, style);
        }
    }
}
