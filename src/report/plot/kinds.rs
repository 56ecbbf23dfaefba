//! The plots memprof draws for one device of a snapshot, by kind: what each one is computed
//! from and its title.

use super::style;
use super::{render, Format, FragmentationPlot, PlotError, SegmentsPlot, TimelinePlot};
use crate::analysis::categories::{self, CategoryRules};
use crate::analysis::{analyze_device, by_site, layout_at, memory_series, MemorySeries};
use crate::model::Snapshot;

/// Which picture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Active memory stacked by site (or category), reserved, the peak and the OOM, over the
    /// trace.
    Timeline,
    /// The segment map at the peak (at the end when the trace has no peak), blocks coloured
    /// by state.
    Segments,
    /// Reserved minus active over the trace.
    Fragmentation,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Timeline, Kind::Segments, Kind::Fragmentation];
}

/// Sites active memory is split by in the timeline; the rest is "other".
const STACKED_SITES: usize = 5;

/// What the timeline's areas split active memory by.
#[derive(Clone, Debug)]
pub enum Stacking {
    /// The top sites at the peak, then the other sites.
    Site,
    /// The categories, under the user's `--category` rules.
    Category(CategoryRules),
}

/// Most points a series keeps, so big traces stay fast and files small.
const MAX_POINTS: usize = 2000;

/// One device's memory over time, split by its top sites at the peak or by category.
pub fn device_series(snapshot: &Snapshot, device: u32, stacking: &Stacking) -> MemorySeries {
    let grouping = match stacking {
        Stacking::Site => {
            let analysis = analyze_device(snapshot, device, STACKED_SITES);
            let sites: Vec<String> = analysis.top_sites.into_iter().map(|s| s.frame).collect();
            by_site(snapshot, &sites)
        }
        Stacking::Category(rules) => categories::grouping(snapshot, device, rules),
    };
    memory_series(snapshot, device, grouping, MAX_POINTS)
}

/// A title that fits the figure's width, the file name cut if need be.
fn fit(make: impl Fn(&str) -> String, name: &str) -> String {
    // The caption spans the figure less its margins.
    style::fit_title(make, name, super::canvas::SIZE.0 - 40)
}

/// Draws one kind of plot of one device, a timeline's areas split by `stacking`; `name` (the
/// file's name) goes in the title.
pub fn plot(
    snapshot: &Snapshot,
    name: &str,
    device: u32,
    kind: Kind,
    stacking: &Stacking,
    format: Format,
) -> Result<Vec<u8>, PlotError> {
    match kind {
        Kind::Timeline => {
            let series = device_series(snapshot, device, stacking);
            let by = match stacking {
                Stacking::Site => "",
                Stacking::Category(_) => " by category",
            };
            let title = fit(
                |n| format!("Memory over time{by} - {n}, device {device}"),
                name,
            );
            render(
                &TimelinePlot {
                    title,
                    series: &series,
                },
                format,
            )
        }
        Kind::Fragmentation => {
            let series = device_series(snapshot, device, &Stacking::Site);
            let title = fit(
                |n| format!("Fragmentation over time (reserved - active) - {n}, device {device}"),
                name,
            );
            render(
                &FragmentationPlot {
                    title,
                    series: &series,
                },
                format,
            )
        }
        Kind::Segments => {
            let peak = analyze_device(snapshot, device, 0).trace.peak_entry_index;
            let (when, free_label, segments) = match peak {
                Some(i) => (
                    format!("at the peak (entry {i}, rebuilt from the trace)"),
                    "free, or rounding of the allocations",
                    layout_at(snapshot, device, i),
                ),
                None => (
                    "at the end of the trace".to_string(),
                    "free (cached in the segment)",
                    snapshot.device_segments(device).cloned().collect(),
                ),
            };
            let shown = segments.len().min(super::segments::MAX_ROWS);
            let count = match segments.len() {
                1 => "1 segment".to_string(),
                all if shown < all => format!("{shown} largest of {all} segments"),
                all => format!("{all} segments"),
            };
            let title = fit(|n| format!("Segments {when} - {n}, device {device}"), name);
            let plot = SegmentsPlot {
                title,
                rows_label: format!("segment size ({count})"),
                free_label,
                segments: segments.iter().collect(),
            };
            render(&plot, format)
        }
    }
}
