//! Fragmentation over time: memory reserved from the driver but not holding live
//! allocations (reserved - active), with reserved for scale and the account's OOMs marked; both
//! are step functions (the area fills each pixel column to its highest), and the legend sits
//! below the plot.

use super::legend::{self, Swatch};
use super::style::{self, column_tops, steps, Mark};
use super::timeline::time_axes;
use crate::analysis::MemorySeries;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Reserved minus active over time for one device.
pub struct FragmentationPlot<'a> {
    pub title: String,
    pub series: &'a MemorySeries,
    /// The account's OOMs.
    pub ooms: Vec<Mark>,
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
                "reserved - requested: cached free blocks and rounding".to_string(),
                Swatch::Fill(unused),
            ),
            ("reserved".to_string(), Swatch::Line(style::RESERVED, 2)),
        ];
        entries.extend(style::oom_entry(&self.ooms));
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
        let unused_at = |i: usize| s.points[i].reserved.saturating_sub(s.points[i].active);
        let xs: Vec<f64> = s.points.iter().map(|p| p.x).collect();
        let tops = column_tops(&xs, unused_at, axes.columns);
        chart.draw_series(AreaSeries::new(
            steps(tops.iter().map(|&(x, i)| (x, unit.of(unused_at(i))))),
            0.0,
            unused.mix(0.75),
        ))?;
        chart.draw_series(LineSeries::new(
            steps(s.points.iter().map(|p| (p.x, unit.of(p.reserved)))),
            style::RESERVED.stroke_width(2),
        ))?;
        style::mark_ooms(&mut chart, &self.ooms, y_max)?;
        legend::draw(&strip, &entries)
    }
}
