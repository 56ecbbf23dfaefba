//! The segment map: one bar per segment, its blocks coloured by state (allocated, pending
//! free, free), so cached free memory split across segments is visible at a glance.

use super::font::FAMILY;
use super::style::{self, tick, Unit};
use super::timeline::draw_empty;
use crate::model::{BlockState, Bytes, Segment};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// At most this many segments are drawn (the largest).
pub const MAX_ROWS: usize = 48;

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
        let unit = Unit::for_max(largest);
        let x_max = unit.of(largest).max(1e-3);
        let n = rows.len() as f64;
        let mut chart = ChartBuilder::on(area)
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
        let label_px = if rows.len() > 30 { 10 } else { style::TICK_PX };
        let label_font = TextStyle::from((FAMILY, label_px).into_font())
            .pos(Pos::new(HPos::Right, VPos::Center));
        for (row, segment) in rows.iter().enumerate() {
            // The largest segment on top; each row keeps a thin gap below it.
            let (lo, hi) = (n - row as f64 - 0.92, n - row as f64 - 0.08);
            let mut offset = 0u64;
            let spans: Vec<(f64, f64, BlockState)> = segment
                .blocks
                .iter()
                .map(|b| {
                    let start = unit.of(offset);
                    offset = offset.saturating_add(b.size);
                    (start, unit.of(offset), b.state)
                })
                .collect();
            let rect = |start: f64, end: f64, style: ShapeStyle| {
                Rectangle::new([(start, lo), (end, hi)], style)
            };
            chart.draw_series(
                spans
                    .iter()
                    .map(|&(a, b, st)| rect(a, b, color(st).filled())),
            )?;
            // White edges separate neighbouring blocks.
            chart.draw_series(
                spans
                    .iter()
                    .map(|&(a, b, _)| rect(a, b, WHITE.stroke_width(1))),
            )?;
            let (x, y) = chart.backend_coord(&(0.0, (lo + hi) / 2.0));
            let label = Bytes(segment.total_size).to_string();
            area.draw(&Text::new(label, (x - 8, y), label_font.clone()))?;
        }
        for (label, c) in [
            ("allocated", style::ALLOCATED),
            (
                "pending free (freed, awaiting other streams)",
                style::PENDING_FREE,
            ),
            (self.free_label, style::FREE),
        ] {
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                .label(label)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FAMILY, style::TICK_PX))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    }
}
