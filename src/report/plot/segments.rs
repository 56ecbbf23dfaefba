//! The segment map: one bar per segment, its blocks coloured by state (allocated, pending
//! free, free), so cached free memory split across segments is visible at a glance. Bars are
//! drawn per pixel column (the state holding most of it), outlines only between blocks wide
//! enough to keep their colour, and every segment at least a few pixels wide.

use super::font::FAMILY;
use super::legend::{self, Swatch};
use super::style::{self, tick, Unit};
use super::timeline::draw_empty;
use crate::model::{BlockState, Bytes, Segment};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// At most this many segments are drawn (the largest).
pub const MAX_ROWS: usize = 32;

/// The segments of one device at one instant.
pub struct SegmentsPlot<'a> {
    pub title: String,
    /// The y axis description: which segments are drawn.
    pub rows_label: String,
    /// What the free parts of the bars are, in the legend.
    pub free_label: &'static str,
    pub segments: Vec<&'a Segment>,
}

impl SegmentsPlot<'_> {
    /// The segments drawn, largest first, and how many there are in all.
    fn rows(&self) -> Vec<&Segment> {
        let mut rows = self.segments.clone();
        rows.sort_by(|a, b| {
            b.total_size
                .cmp(&a.total_size)
                .then(a.address.cmp(&b.address))
        });
        rows.truncate(MAX_ROWS);
        rows
    }
}

fn color(state: BlockState) -> RGBColor {
    match state {
        BlockState::ActiveAllocated => style::ALLOCATED,
        BlockState::ActivePendingFree => style::PENDING_FREE,
        BlockState::Inactive => style::FREE,
    }
}

/// Blocks narrower than this many pixels get no outline (it would hide their colour).
const OUTLINE_MIN_PX: f64 = 4.0;
/// The narrowest bar a segment is drawn with, so what exists shows.
const MIN_BAR_PX: i32 = 3;

/// The state each pixel column of a bar `width` pixels wide shows: the one holding most of
/// the column's bytes. Blocks run from offset 0 in the order given.
pub fn columns(blocks: &[(u64, BlockState)], width: usize) -> Vec<BlockState> {
    let total: u64 = blocks.iter().map(|b| b.0).sum();
    if width == 0 || total == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(width);
    let (mut block, mut block_start) = (0usize, 0u64);
    for c in 0..width {
        let lo = (total as u128 * c as u128 / width as u128) as u64;
        let hi = (total as u128 * (c + 1) as u128 / width as u128) as u64;
        let mut held = [0u64; 3];
        let mut at = lo;
        while at < hi && block < blocks.len() {
            let end = block_start + blocks[block].0;
            let upto = end.min(hi);
            held[state_slot(blocks[block].1)] += upto - at;
            at = upto;
            if end <= hi {
                block_start = end;
                block += 1;
            }
        }
        let slot = (0..3).max_by_key(|&i| (held[i], 3 - i)).unwrap_or(0);
        out.push(SLOTS[slot]);
    }
    out
}

const SLOTS: [BlockState; 3] = [
    BlockState::ActiveAllocated,
    BlockState::ActivePendingFree,
    BlockState::Inactive,
];

fn state_slot(state: BlockState) -> usize {
    match state {
        BlockState::ActiveAllocated => 0,
        BlockState::ActivePendingFree => 1,
        BlockState::Inactive => 2,
    }
}

impl super::Figure for SegmentsPlot<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let rows = self.rows();
        let Some(largest) = rows.first().map(|s| s.total_size) else {
            return draw_empty(area, &self.title, "No segments on this device.");
        };
        area.fill(&WHITE)?;
        let entries = [
            ("allocated", style::ALLOCATED),
            (
                "pending free (freed, awaiting other streams)",
                style::PENDING_FREE,
            ),
            (self.free_label, style::FREE),
        ]
        .map(|(label, c)| (label.to_string(), Swatch::Fill(c)));
        let (plot_area, strip) = legend::split(area, &entries);
        let unit = Unit::for_max(largest);
        let x_max = unit.of(largest).max(1e-3);
        let n = rows.len() as f64;
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(&self.title, (FAMILY, style::TITLE_PX))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..x_max, 0f64..n)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .y_labels(0)
            .x_desc(format!("offset in the segment ({})", unit.name))
            .y_desc(&self.rows_label)
            .axis_desc_style((FAMILY, style::LABEL_PX))
            .label_style((FAMILY, style::TICK_PX))
            .x_label_formatter(&|v| tick(*v, x_max))
            .draw()?;
        let label_font = TextStyle::from((FAMILY, style::TICK_PX).into_font())
            .pos(Pos::new(HPos::Right, VPos::Center));
        // Bars are drawn in pixels: each column shows the state holding most of it.
        let left = chart.backend_coord(&(0.0, 0.0)).0;
        let full_px = f64::from(chart.backend_coord(&(x_max, 0.0)).0 - left);
        for (row, segment) in rows.iter().enumerate() {
            // The largest segment on top; each row keeps a thin gap below it.
            let (lo, hi) = (n - row as f64 - 0.92, n - row as f64 - 0.08);
            let top = chart.backend_coord(&(0.0, hi)).1;
            let bottom = chart.backend_coord(&(0.0, lo)).1.max(top + 1);
            let px_per_byte = full_px / largest as f64;
            let width = ((segment.total_size as f64 * px_per_byte).round() as i32).max(MIN_BAR_PX);
            let blocks: Vec<(u64, BlockState)> =
                segment.blocks.iter().map(|b| (b.size, b.state)).collect();
            let cols = columns(&blocks, width as usize);
            let mut start = 0usize;
            while start < cols.len() {
                let state = cols[start];
                let end = (start..cols.len())
                    .find(|&c| cols[c] != state)
                    .unwrap_or(cols.len());
                let (x0, x1) = (left + start as i32, left + end as i32);
                area.draw(&Rectangle::new(
                    [(x0, top), (x1, bottom)],
                    color(state).filled(),
                ))?;
                start = end;
            }
            // A white edge between two blocks, only where both are wide enough to keep their
            // colour beside it.
            let mut offset = 0u64;
            for pair in segment.blocks.windows(2) {
                offset += pair[0].size;
                let wide = |size: u64| size as f64 * px_per_byte >= OUTLINE_MIN_PX;
                if wide(pair[0].size) && wide(pair[1].size) {
                    let x = left + (offset as f64 * px_per_byte).round() as i32;
                    area.draw(&PathElement::new(
                        [(x, top), (x, bottom)],
                        WHITE.stroke_width(1),
                    ))?;
                }
            }
            let label = Bytes(segment.total_size).to_string();
            area.draw(&Text::new(
                label,
                (left - 8, (top + bottom) / 2),
                label_font.clone(),
            ))?;
        }
        legend::draw(&strip, &entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use BlockState::{ActiveAllocated as A, ActivePendingFree as P, Inactive as F};

    #[test]
    fn a_column_shows_the_state_that_holds_most_of_it() {
        // 150 tiny allocated blocks then a large free one, on 10 columns of 30 bytes each.
        let mut blocks = vec![(1u64, A); 150];
        blocks.push((150, F));
        let cols = columns(&blocks, 10);
        assert_eq!(cols, [A, A, A, A, A, F, F, F, F, F]);
        // Sub-column blocks: 2 of pending free, 1 allocated per column -> pending free.
        let mixed: Vec<(u64, BlockState)> = (0..30)
            .map(|i| (1, if i % 3 == 0 { A } else { P }))
            .collect();
        assert_eq!(columns(&mixed, 10), vec![P; 10]);
        assert_eq!(columns(&[], 10), Vec::<BlockState>::new());
        assert_eq!(columns(&[(5, A)], 3), [A, A, A]);
    }
}
