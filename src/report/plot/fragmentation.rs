//! Fragmentation over time: memory reserved from the driver but not holding live
//! allocations (reserved - active), with reserved for scale and the OOM marked.

use super::style;
use super::timeline::time_axes;
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
        let top = s.points.iter().map(|p| p.reserved).max().unwrap_or(0);
        let Some(axes) = time_axes(area, &self.title, s, top)? else {
            return Ok(());
        };
        let (mut chart, unit, y_max) = (axes.chart, axes.unit, axes.y_max);
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
