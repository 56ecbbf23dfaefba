//! What the figures share: colours, fonts sizes, the size unit of an axis, short site labels,
//! and the OOM mark and legend of the charts over time.

use super::font::FAMILY;
use crate::analysis::Mark;
use crate::model::Bytes;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::RGBColor;

/// Colours of the allocation sites in stacked plots; "other" is `OTHER`.
pub const SITE_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];
pub const OTHER: RGBColor = RGBColor(175, 175, 175);
pub const RESERVED: RGBColor = RGBColor(20, 20, 20);
pub const PEAK: RGBColor = RGBColor(150, 0, 0);
pub const OOM: RGBColor = RGBColor(214, 39, 40);
pub const ALLOCATED: RGBColor = RGBColor(31, 119, 180);
pub const PENDING_FREE: RGBColor = RGBColor(255, 127, 14);
pub const FREE: RGBColor = RGBColor(222, 222, 222);

pub const TITLE_PX: u32 = 26;
pub const LABEL_PX: u32 = 17;
pub const TICK_PX: u32 = 14;

/// A binary size unit for an axis: GiB, or MiB when everything is under 1 GiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unit {
    pub name: &'static str,
    bytes: f64,
}

impl Unit {
    /// The unit for an axis whose largest value is `max` bytes.
    pub fn for_max(max: u64) -> Unit {
        if max >= 1 << 30 {
            Unit {
                name: "GiB",
                bytes: (1u64 << 30) as f64,
            }
        } else {
            Unit {
                name: "MiB",
                bytes: (1u64 << 20) as f64,
            }
        }
    }

    pub fn of(self, bytes: u64) -> f64 {
        bytes as f64 / self.bytes
    }
}

/// A tick label with as few decimals as the axis range needs.
pub fn tick(value: f64, range: f64) -> String {
    let decimals = match range {
        r if r >= 20.0 => 0,
        r if r >= 2.0 => 1,
        r if r >= 0.2 => 2,
        _ => 3,
    };
    format!("{value:.decimals$}")
}

/// `file:line:function` with the file's directories dropped, cut to fit a legend.
pub fn short_site(label: &str) -> String {
    const MAX: usize = 60;
    let mut parts = label.rsplitn(3, ':');
    let (function, line, file) = (parts.next(), parts.next(), parts.next());
    let short = match (file, line, function) {
        (Some(file), Some(line), Some(function)) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{base}:{line}:{function}")
        }
        _ => label.to_string(),
    };
    if short.chars().count() > MAX {
        let cut: String = short.chars().take(MAX - 1).collect();
        format!("{cut}…")
    } else {
        short
    }
}

/// Marks the OOM on a chart over time (a vertical line with its legend entry) and draws the
/// legend box: the last step of the timeline and fragmentation plots.
pub fn finish_time_chart<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    oom: Option<Mark>,
    y_max: f64,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    if let Some(oom) = oom {
        let line = OOM.stroke_width(2);
        chart
            .draw_series(LineSeries::new([(oom.x, 0.0), (oom.x, y_max)], line))?
            .label(format!("OOM: a request of {} failed", Bytes(oom.bytes)))
            .legend(move |(x, y)| PathElement::new([(x + 7, y - 7), (x + 7, y + 7)], line));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, TICK_PX))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_lose_their_directories() {
        assert_eq!(short_site("/home/u/train.py:99:step"), "train.py:99:step");
        assert_eq!(short_site("<no stack recorded>"), "<no stack recorded>");
        let long = format!("a.py:1:{}", "f".repeat(100));
        assert_eq!(short_site(&long).chars().count(), 60);
    }

    #[test]
    fn units_follow_the_largest_value() {
        assert_eq!(Unit::for_max(3 << 30).name, "GiB");
        assert_eq!(Unit::for_max(3 << 20).name, "MiB");
        assert_eq!(Unit::for_max(3 << 30).of(3 << 29), 1.5);
        assert_eq!(tick(1.26, 5.0), "1.3");
        assert_eq!(tick(12.0, 40.0), "12");
    }
}
