//! Fragmentation over time: memory reserved from the driver but not holding live
//! allocations (reserved - active), with reserved for scale and the OOM marked.

use super::font::FAMILY;
use super::style::{self, tick, Unit};
use super::timeline::{draw_empty, x_label};
use crate::analysis::MemorySeries;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Reserved minus active over time for one device.
pub struct FragmentationPlot<'a> {
    pub title: String,
    pub series: &'a MemorySeries,
}

impl super::Figure for FragmentationPlot<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let s = self.series;
        let (Some(first), Some(last)) = (s.points.first(), s.points.last()) else {
            return draw_empty(
                area,
                &self.title,
                "No trace entries: nothing to plot over time.",
            );
        };
        area.fill(&WHITE)?;
        let top = s.points.iter().map(|p| p.reserved).max().unwrap_or(0);
        let unit = Unit::for_max(top);
        let y_max = (unit.of(top) * 1.15).max(1e-3);
        let x_min = first.x.min(0.0);
        let x_max = if last.x > first.x {
            last.x
        } else {
            first.x + 1.0
        };
        let x_range = x_max - x_min;
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FAMILY, style::TITLE_PX))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d(x_min..x_max, 0f64..y_max)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE.mix(0.0))
            .x_desc(x_label(s))
            .y_desc(format!("memory ({})", unit.name))
            .axis_desc_style((FAMILY, style::LABEL_PX))
            .label_style((FAMILY, style::TICK_PX))
            .x_label_formatter(&|v| tick(*v, x_range))
            .y_label_formatter(&|v| tick(*v, y_max))
            .draw()?;
        let unused = style::PENDING_FREE;
        chart
            .draw_series(AreaSeries::new(
                s.points
                    .iter()
                    .map(|p| (p.x, unit.of(p.reserved.saturating_sub(p.active)))),
                0.0,
                unused.mix(0.75),
            ))?
            .label("reserved - active: cached free blocks and rounding")
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], unused.filled()));
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|p| (p.x, unit.of(p.reserved))),
                style::RESERVED.stroke_width(2),
            ))?
            .label("reserved")
            .legend(|(x, y)| {
                PathElement::new([(x, y), (x + 14, y)], style::RESERVED.stroke_width(2))
            });
        style::finish_time_chart(&mut chart, s.oom, y_max)
    }
}
