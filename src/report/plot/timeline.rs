//! Memory over time: active memory stacked by allocation site or by category, reserved memory
//! as a line, the account's peak and OOMs marked. The areas fill, in each pixel column, the
//! highest memory held in it, so no spike is lost however short. Every curve is a step function (memory changes in steps), and the
//! legend sits below the plot.

use super::font::FAMILY;
use super::legend::{self, Swatch};
use super::style::{self, column_tops, short_site, steps, tick, Columns, Mark, Unit};
use crate::analysis::{MemorySeries, StackBy, XAxis};
use crate::model::Bytes;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Memory over time for one device.
pub struct TimelinePlot<'a> {
    pub title: String,
    pub series: &'a MemorySeries,
    /// The account's peak of requested memory.
    pub peak: Option<Mark>,
    /// The account's OOMs.
    pub ooms: Vec<Mark>,
}

/// The axes of a chart over time, drawn: x over the series' own span, y from 0 to `top` bytes
/// with 15% headroom, in the unit that suits `top`.
pub struct TimeAxes<'a, DB: DrawingBackend> {
    pub chart: ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    pub unit: Unit,
    pub y_max: f64,
    /// How the x span falls into the plot's pixel columns.
    pub columns: Columns,
}

/// Clears the area and draws the axes of a chart over time; for an empty series, draws the
/// title and a line saying there is nothing to plot, and returns `None`.
pub fn time_axes<'a, DB: DrawingBackend + 'a>(
    area: &'a DrawingArea<DB, Shift>,
    title: &str,
    s: &MemorySeries,
    top: u64,
) -> Result<Option<TimeAxes<'a, DB>>, DrawingAreaErrorKind<DB::ErrorType>> {
    if s.points.is_empty() {
        draw_empty(area, title, "No trace entries: nothing to plot over time.")?;
        return Ok(None);
    }
    area.fill(&WHITE)?;
    let first = s.points.first().map_or(0.0, |p| p.x);
    let last = s.points.last().map_or(0.0, |p| p.x);
    let unit = Unit::for_max(top);
    let y_max = (unit.of(top) * 1.15).max(1e-3);
    // The device's own span, on the time scale all devices share.
    let x_min = first;
    let x_max = if last > first { last } else { first + 1.0 };
    let x_range = x_max - x_min;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FAMILY, style::TITLE_PX))
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
    let left = chart.backend_coord(&(x_min, 0.0)).0;
    let right = chart.backend_coord(&(x_max, 0.0)).0;
    let columns = Columns {
        lo: x_min,
        hi: x_max,
        pixels: right - left,
    };
    Ok(Some(TimeAxes {
        chart,
        unit,
        y_max,
        columns,
    }))
}

/// The x axis label of a series.
pub fn x_label(series: &MemorySeries) -> &'static str {
    match series.x_axis {
        XAxis::Seconds => {
            "seconds from the first trace entry of any device (one origin for all devices)"
        }
        XAxis::EntriesReplayed => {
            "trace entries replayed (the trace has no times; 0 is before the first entry)"
        }
    }
}

/// Draws a title and a line saying why there is nothing else.
pub fn draw_empty<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    why: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    area.fill(&WHITE)?;
    let (w, h) = area.dim_in_pixel();
    let title_style = (FAMILY, style::TITLE_PX).into_font();
    area.draw(&Text::new(title.to_string(), (20, 20), title_style))?;
    let body = (FAMILY, style::LABEL_PX).into_font();
    area.draw(&Text::new(
        why.to_string(),
        (w as i32 / 8, h as i32 / 2),
        body,
    ))
}

impl super::Figure for TimelinePlot<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let s = self.series;
        let top = s
            .points
            .iter()
            .map(|p| p.reserved.max(p.active))
            .max()
            .unwrap_or(0)
            .max(self.ooms.iter().map(|o| o.bytes).max().unwrap_or(0))
            .max(self.peak.map_or(0, |p| p.bytes));
        let n = s.groups.len();
        let colors: Vec<RGBColor> = match s.stack_by {
            StackBy::Site => (0..n)
                .map(|k| match k + 1 == n {
                    true => style::OTHER,
                    false => style::SITE_COLORS[k % style::SITE_COLORS.len()],
                })
                .collect(),
            StackBy::Category => style::category_colors(&s.groups),
        };
        // The legend reads top-down as the bands stack bottom-up: the first group is lowest.
        // Every site is listed; a category only when it holds memory somewhere.
        let shown =
            |k: usize| s.stack_by == StackBy::Site || s.points.iter().any(|p| p.by_group[k] > 0);
        let mut entries: Vec<(String, Swatch)> = (0..n)
            .filter(|&k| shown(k))
            .map(|k| {
                let label = match s.stack_by {
                    StackBy::Site => short_site(&s.groups[k]),
                    StackBy::Category => s.groups[k].clone(),
                };
                (label, Swatch::Fill(colors[k]))
            })
            .collect();
        let by = match s.stack_by {
            StackBy::Site => "site",
            StackBy::Category => "category",
        };
        entries.push((
            format!("requested (sizes of live allocations; the areas split it by {by})"),
            Swatch::Line(style::ACTIVE, 1),
        ));
        entries.push((
            "reserved (segments from the driver)".to_string(),
            Swatch::Line(style::RESERVED, 2),
        ));
        if let Some(peak) = self.peak {
            entries.push((
                format!(
                    "peak requested {} (entry {})",
                    Bytes(peak.bytes),
                    peak.entry_index
                ),
                Swatch::Dot(style::PEAK),
            ));
        }
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
        // Each pixel column shows the state of its highest active memory.
        let xs: Vec<f64> = s.points.iter().map(|p| p.x).collect();
        let tops = column_tops(&xs, |i| s.points[i].active, axes.columns);
        // Stacked areas: draw the sum of groups 0..=k for k from the last down, so each band
        // between two sums shows its own colour.
        for k in (0..n).rev() {
            let points = tops.iter().map(|&(x, i)| {
                let sum: u64 = s.points[i].by_group[..=k]
                    .iter()
                    .fold(0u64, |a, b| a.saturating_add(*b));
                (x, unit.of(sum))
            });
            chart.draw_series(AreaSeries::new(steps(points), 0.0, colors[k].mix(0.85)))?;
        }
        chart.draw_series(LineSeries::new(
            steps(s.points.iter().map(|p| (p.x, unit.of(p.active)))),
            style::ACTIVE.stroke_width(1),
        ))?;
        chart.draw_series(LineSeries::new(
            steps(s.points.iter().map(|p| (p.x, unit.of(p.reserved)))),
            style::RESERVED.stroke_width(2),
        ))?;
        if let Some(peak) = self.peak {
            let at = (peak.x, unit.of(peak.bytes));
            chart.draw_series([Circle::new(at, 6, style::PEAK.filled())])?;
        }
        style::mark_ooms(&mut chart, &self.ooms, y_max)?;
        legend::draw(&strip, &entries)
    }
}
