//! The segment map: one bar per segment, its blocks coloured by state (allocated, pending
//! free, free), so cached free memory split across segments is visible at a glance.

use super::font::FAMILY;
use super::style::{self, tick, Unit};
use super::timeline::draw_empty;
use crate::model::{BlockState, Segment};
use plotters::coord::Shift;
use plotters::prelude::*;

/// At most this many segments are drawn (the largest).
pub const MAX_ROWS: usize = 48;

/// The segments of one device, as the snapshot holds them.
pub struct SegmentsPlot<'a> {
    pub title: String,
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
        let n = rows.len() as i32;
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FAMILY, style::TITLE_PX))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..x_max, (0..n).into_segmented())?;
        let label_of = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => rows
                .get((n - 1 - i) as usize)
                .map_or_else(String::new, |s| {
                    crate::model::Bytes(s.total_size).to_string()
                }),
            _ => String::new(),
        };
        let tick_px = if n > 30 { 10 } else { style::TICK_PX };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .y_labels(rows.len())
            .x_desc(format!("offset in the segment ({})", unit.name))
            .y_desc("segment (size)")
            .axis_desc_style((FAMILY, style::LABEL_PX))
            .x_label_style((FAMILY, style::TICK_PX))
            .y_label_style((FAMILY, tick_px))
            .x_label_formatter(&|v| tick(*v, x_max))
            .y_label_formatter(&label_of)
            .draw()?;
        for (row, segment) in rows.iter().enumerate() {
            let y = n - 1 - row as i32;
            let (lo, hi) = (SegmentValue::Exact(y), SegmentValue::Exact(y + 1));
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
                Rectangle::new([(start, lo.clone()), (end, hi.clone())], style)
            };
            chart.draw_series(
                spans
                    .iter()
                    .map(|&(a, b, st)| rect(a, b, color(st).filled())),
            )?;
            // White edges separate neighbouring blocks and rows.
            chart.draw_series(
                spans
                    .iter()
                    .map(|&(a, b, _)| rect(a, b, WHITE.stroke_width(1))),
            )?;
        }
        for (label, c) in [
            ("allocated", style::ALLOCATED),
            (
                "pending free (freed, awaiting other streams)",
                style::PENDING_FREE,
            ),
            ("free (cached in the segment)", style::FREE),
        ] {
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, SegmentValue<i32>)>>())?
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
