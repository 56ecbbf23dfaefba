//! The legend of a chart, drawn in its own strip below the plot so it never covers the data:
//! entries laid out in as many columns as the widest label allows.

use super::font::FAMILY;
use super::style;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// How an entry's mark looks.
#[derive(Clone, Copy, Debug)]
pub enum Swatch {
    /// A filled square (an area or a block state).
    Fill(RGBColor),
    /// A horizontal line of this width.
    Line(RGBColor, u32),
    /// A vertical line (a marked instant).
    Mark(RGBColor),
    /// A filled dot (a marked point).
    Dot(RGBColor),
}

/// Height of one legend row, in pixels.
const ROW_PX: u32 = 20;
/// Room between columns and around the strip.
const PAD_PX: u32 = 16;

/// The entries' column count and the strip's height for an area `width` pixels wide.
pub fn layout(entries: &[(String, Swatch)], width: u32) -> (usize, u32) {
    let font = FontDesc::from((FAMILY, style::TICK_PX));
    let widest = entries
        .iter()
        .map(|(label, _)| font.box_size(label).map_or(300, |(w, _)| w))
        .max()
        .unwrap_or(0);
    let column = widest + 20 + PAD_PX;
    let usable = width.saturating_sub(2 * PAD_PX + 60);
    let columns = ((usable / column.max(1)) as usize).clamp(1, entries.len().max(1));
    let rows = entries.len().div_ceil(columns) as u32;
    (columns, rows * ROW_PX + PAD_PX)
}

/// Splits `area` into the plot above and the legend strip below.
pub fn split<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Swatch)],
) -> (DrawingArea<DB, Shift>, DrawingArea<DB, Shift>) {
    let (w, h) = area.dim_in_pixel();
    let (_, strip) = layout(entries, w);
    area.split_vertically(h.saturating_sub(strip))
}

/// Draws the entries in the strip, column by column, left to right.
pub fn draw<DB: DrawingBackend>(
    strip: &DrawingArea<DB, Shift>,
    entries: &[(String, Swatch)],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, _) = strip.dim_in_pixel();
    let (columns, _) = layout(entries, w);
    let rows = entries.len().div_ceil(columns);
    let column_px = (w.saturating_sub(2 * PAD_PX + 60) / columns as u32) as i32;
    let font = TextStyle::from((FAMILY, style::TICK_PX).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, (label, swatch)) in entries.iter().enumerate() {
        let (col, row) = ((i / rows) as i32, (i % rows) as i32);
        let x = 60 + PAD_PX as i32 + col * column_px;
        let y = (ROW_PX / 2) as i32 + row * ROW_PX as i32;
        match *swatch {
            Swatch::Fill(c) => {
                strip.draw(&Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()))?
            }
            Swatch::Line(c, width) => strip.draw(&PathElement::new(
                [(x, y), (x + 14, y)],
                c.stroke_width(width),
            ))?,
            Swatch::Mark(c) => strip.draw(&PathElement::new(
                [(x + 7, y - 7), (x + 7, y + 7)],
                c.stroke_width(2),
            ))?,
            Swatch::Dot(c) => strip.draw(&Circle::new((x + 7, y), 5, c.filled()))?,
        }
        strip.draw(&Text::new(label.clone(), (x + 20, y), font.clone()))?;
    }
    Ok(())
}
