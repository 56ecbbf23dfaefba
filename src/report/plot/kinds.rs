//! The plots memprof draws for one device of a snapshot, by kind: what each one is computed
//! from and its title.

use super::style;
use super::{render, Format, FragmentationPlot, PlotError, SegmentsPlot, TimelinePlot};
use crate::analysis::{analyze_device, layout_at, memory_series, MemorySeries};
use crate::model::Snapshot;

/// Which picture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Active memory stacked by site, reserved, the peak and the OOM, over the trace.
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

/// Most points a series keeps, so big traces stay fast and files small.
const MAX_POINTS: usize = 2000;

/// One device's memory over time, split by its top sites at the peak.
pub fn device_series(snapshot: &Snapshot, device: u32) -> MemorySeries {
    let analysis = analyze_device(snapshot, device, STACKED_SITES);
    let sites: Vec<String> = analysis.top_sites.into_iter().map(|s| s.frame).collect();
    memory_series(snapshot, device, &sites, MAX_POINTS)
}

/// A title that fits the figure's width, the file name cut if need be.
fn fit(make: impl Fn(&str) -> String, name: &str) -> String {
    // The caption spans the figure less its margins.
    style::fit_title(make, name, super::canvas::SIZE.0 - 40)
}

/// Draws one kind of plot of one device; `name` (the file's name) goes in the title.
pub fn plot(
    snapshot: &Snapshot,
    name: &str,
    device: u32,
    kind: Kind,
    format: Format,
) -> Result<Vec<u8>, PlotError> {
    match kind {
        Kind::Timeline => {
            let series = device_series(snapshot, device);
            let title = fit(|n| format!("Memory over time - {n}, device {device}"), name);
            render(
                &TimelinePlot {
                    title,
                    series: &series,
                },
                format,
            )
        }
        Kind::Fragmentation => {
            let series = device_series(snapshot, device);
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
