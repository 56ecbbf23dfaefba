//! The planners' picture: one stacked bar per candidate layout (parameters, gradients,
//! optimizer states, activations, headroom) against the GPU's memory, so what each layout
//! spends its memory on, and which fit, reads at a glance.

use super::font::FAMILY;
use super::style::{self, tick, Unit};
use super::timeline::draw_empty;
use crate::model::Bytes;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One candidate's bar: the layout in three short lines and its memory per GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateBar {
    /// The parallel layout, e.g. "dp8 tp1 pp1".
    pub layout: String,
    /// Sharding and micro-batch, e.g. "ZeRO-3, mb 1".
    pub setting: String,
    /// Activation recompute, e.g. "selective rc".
    pub recompute: String,
    pub params: u64,
    pub grads: u64,
    pub optimizer: u64,
    pub activations: u64,
    /// Kept free for the CUDA context and fragmentation.
    pub headroom: u64,
    pub fits: bool,
}

impl CandidateBar {
    fn parts(&self) -> [u64; 5] {
        [
            self.params,
            self.grads,
            self.optimizer,
            self.activations,
            self.headroom,
        ]
    }

    fn total(&self) -> u64 {
        self.parts().iter().fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// At most this many candidates are drawn (the first ones, best first).
pub const MAX_BARS: usize = 12;

/// The memory breakdown of a planner's candidates, per GPU.
pub struct CandidatesPlot {
    pub title: String,
    pub gpu_memory: u64,
    pub bars: Vec<CandidateBar>,
    /// Index of the recommended bar, marked above it.
    pub recommended: Option<usize>,
}

const PARTS: [(&str, RGBColor); 5] = [
    ("parameters", style::SITE_COLORS[0]),
    ("gradients", style::SITE_COLORS[1]),
    ("optimizer states", style::SITE_COLORS[2]),
    ("activations", style::SITE_COLORS[3]),
    ("headroom (CUDA context, fragmentation)", style::OTHER),
];

impl super::Figure for CandidatesPlot {
    fn draw<DB: DrawingBackend>(
        &self,
        area: &DrawingArea<DB, Shift>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        let bars = &self.bars[..self.bars.len().min(MAX_BARS)];
        if bars.is_empty() {
            return draw_empty(area, &self.title, "No candidate layouts to compare.");
        }
        area.fill(&WHITE)?;
        let top = bars
            .iter()
            .map(CandidateBar::total)
            .max()
            .unwrap_or(0)
            .max(self.gpu_memory);
        let unit = Unit::for_max(top);
        // Room above the tallest bar for its label and the legend.
        let y_max = (unit.of(top) * 1.4).max(1e-3);
        let n = bars.len() as f64;
        let mut chart = ChartBuilder::on(area)
            .caption(&self.title, (FAMILY, style::TITLE_PX))
            .margin(16)
            .x_label_area_size(80)
            .y_label_area_size(80)
            .build_cartesian_2d(0f64..n, 0f64..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE.mix(0.0))
            .x_labels(0)
            .y_desc(format!("memory per GPU ({})", unit.name))
            .axis_desc_style((FAMILY, style::LABEL_PX))
            .label_style((FAMILY, style::TICK_PX))
            .y_label_formatter(&|v| tick(*v, y_max))
            .draw()?;

        for (i, bar) in bars.iter().enumerate() {
            let (left, right) = (i as f64 + 0.15, i as f64 + 0.85);
            let mut base = 0u64;
            for (part, (_, color)) in bar.parts().iter().zip(PARTS) {
                let (lo, hi) = (unit.of(base), unit.of(base.saturating_add(*part)));
                base = base.saturating_add(*part);
                chart.draw_series([Rectangle::new([(left, lo), (right, hi)], color.filled())])?;
            }
            let edge = if bar.fits {
                BLACK.stroke_width(1)
            } else {
                style::OOM.stroke_width(3)
            };
            chart.draw_series([Rectangle::new([(left, 0.0), (right, unit.of(base))], edge)])?;
            let centre = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            let below = TextStyle::from((FAMILY, style::TICK_PX).into_font())
                .pos(Pos::new(HPos::Center, VPos::Top));
            let lines = [
                format!("#{i} {}", bar.layout),
                bar.setting.clone(),
                bar.recompute.clone(),
            ];
            for (k, line) in lines.into_iter().enumerate() {
                let y = centre.1 + 6 + 18 * k as i32;
                area.draw(&Text::new(line, (centre.0, y), below.clone()))?;
            }
            let above = chart.backend_coord(&(i as f64 + 0.5, unit.of(base)));
            let verdict = match (self.recommended == Some(i), bar.fits) {
                (true, _) => "recommended",
                (false, true) => "",
                (false, false) => "does not fit",
            };
            let color = if bar.fits { BLACK } else { style::OOM };
            let font = (FAMILY, style::TICK_PX)
                .into_font()
                .color(&color)
                .pos(Pos::new(HPos::Center, VPos::Bottom));
            let total = Bytes(base).to_string();
            area.draw(&Text::new(total, (above.0, above.1 - 4), font.clone()))?;
            area.draw(&Text::new(verdict, (above.0, above.1 - 22), font))?;
        }

        let limit = unit.of(self.gpu_memory);
        let line = style::PEAK.stroke_width(2);
        chart
            .draw_series(LineSeries::new([(0.0, limit), (n, limit)], line))?
            .label(format!("GPU memory {}", Bytes(self.gpu_memory)))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], line));
        for (label, color) in PARTS {
            chart
                .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FAMILY, style::TICK_PX))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
    }
}
