//! Fragmentation over time: memory reserved from the driver but not holding live
//! allocations (reserved - active), with reserved for scale and the OOM marked; both are step
//! functions, and the legend sits below the plot.

use super::legend::{self, Swatch};
use super::style::{self, steps};
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
        let unused = style::PENDING_FREE;
        let mut entries = vec![
            (
                "reserved - active: cached free blocks and rounding".to_string(),
                Swatch::Fill(unused),
            ),
            ("reserved".to_string(), Swatch::Line(style::RESERVED, 2)),
        ];
        entries.extend(style::oom_entry(s.oom));
        area.fill(&WHITE)?;
        let (plot_area, strip) = if s.points.is_empty() {
            (area.clone(), area.clone())
        } else {
            legend::split(area, &entries)
        };
        let Some(axes) = time_axes(&plot_area, &self.title, s, top)? else {
            return Ok(());
        };
        let (mut chart, unit, y_max) = (axes.chart, axes.unit, axes.y_max);
        chart.draw_series(AreaSeries::new(
            steps(
                s.points
                    .iter()
                    .map(|p| (p.x, unit.of(p.reserved.saturating_sub(p.active)))),
            ),
            0.0,
            unused.mix(0.75),
        ))?;
        chart.draw_series(LineSeries::new(
            steps(s.points.iter().map(|p| (p.x, unit.of(p.reserved)))),
            style::RESERVED.stroke_width(2),
        ))?;
        style::mark_oom(&mut chart, s.oom, y_max)?;
        legend::draw(&strip, &entries)
    }
}
