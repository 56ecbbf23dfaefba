//! The plots memprof draws for one device of a snapshot, by kind: what each one is computed
//! from and its title. The sites, the peak, the OOM and their times are the device's account
//! (`crate::account`); only the curves over time and the segment layouts come from the
//! snapshot itself.

use super::style::{self, Mark};
use super::{render, Format, FragmentationPlot, PlotError, SegmentsPlot, TimelinePlot};
use crate::account::{DeviceReport, MomentKind, TimeAxis};
use crate::analysis::categories::{self, CategoryRules};
use crate::analysis::{by_site, layout_at, memory_series, x_of_entry, MemorySeries};
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

/// What the timeline's areas split the requested bytes by.
#[derive(Clone, Debug)]
pub enum Stacking {
    /// The top sites at the peak, then the other sites.
    Site,
    /// The categories, under the user's `--category` rules.
    Category(CategoryRules),
}

/// What a plot of one device is drawn from: the snapshot, the device's account and the
/// input's one time axis.
#[derive(Clone, Copy)]
pub struct DevicePlot<'a> {
    pub snapshot: &'a Snapshot,
    pub report: &'a DeviceReport,
    pub axis: TimeAxis,
}

impl DevicePlot<'_> {
    fn device(&self) -> u32 {
        self.report.analysis.device
    }

    /// The device's memory over time at `columns` columns, split by the account's top sites
    /// at the peak or by category.
    pub fn series(&self, stacking: &Stacking, columns: usize) -> MemorySeries {
        let (snapshot, device) = (self.snapshot, self.device());
        let grouping = match stacking {
            Stacking::Site => {
                let sites: Vec<String> = self
                    .report
                    .analysis
                    .top_sites
                    .iter()
                    .take(STACKED_SITES)
                    .map(|s| s.frame.clone())
                    .collect();
                by_site(snapshot, &sites)
            }
            Stacking::Category(rules) => categories::grouping(snapshot, device, rules),
        };
        memory_series(snapshot, device, grouping, columns, self.axis.origin_us)
    }

    /// The account's peak of requested memory on `series`' x axis (none when the account does
    /// not know it, or it is the state before the trace).
    pub fn peak(&self, series: &MemorySeries) -> Option<Mark> {
        let peak = self.report.account.peaks.requested;
        let entry = peak.entry?;
        Some(Mark {
            entry_index: entry,
            x: x_of_entry(series.x_axis, entry, peak.offset_us)?,
            bytes: peak.bytes?,
        })
    }

    /// The account's OOMs on `series`' x axis, in trace order; `bytes` is the request that
    /// failed.
    pub fn ooms(&self, series: &MemorySeries) -> Vec<Mark> {
        let entries = self.snapshot.timeline.device(self.device() as usize);
        let ooms = self.report.account.moments.iter();
        ooms.filter(|m| m.kind == MomentKind::Oom)
            .filter_map(|m| {
                let entry = m.entry?;
                Some(Mark {
                    entry_index: entry,
                    x: x_of_entry(series.x_axis, entry, m.offset_us)?,
                    bytes: entries.get(entry)?.size,
                })
            })
            .collect()
    }
}

/// A series keeps a few points per column of the figure's width, so every extreme survives
/// downsampling however narrow the spike.
const COLUMNS: usize = super::canvas::SIZE.0 as usize;

/// A title that fits the figure's width, the file name cut if need be.
fn fit(make: impl Fn(&str) -> String, name: &str) -> String {
    // The caption spans the figure less its margins.
    style::fit_title(make, name, super::canvas::SIZE.0 - 40)
}

/// Draws one kind of plot of one device, a timeline's areas split by `stacking`; `name` (the
/// file's name) goes in the title.
pub fn plot(
    of: DevicePlot<'_>,
    name: &str,
    kind: Kind,
    stacking: &Stacking,
    format: Format,
) -> Result<Vec<u8>, PlotError> {
    let (snapshot, device) = (of.snapshot, of.device());
    match kind {
        Kind::Timeline => {
            let series = of.series(stacking, COLUMNS);
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
                    peak: of.peak(&series),
                    ooms: of.ooms(&series),
                    series: &series,
                },
                format,
            )
        }
        Kind::Fragmentation => {
            let series = of.series(&Stacking::Site, COLUMNS);
            let title = fit(
                |n| {
                    format!("Fragmentation over time (reserved - requested) - {n}, device {device}")
                },
                name,
            );
            render(
                &FragmentationPlot {
                    title,
                    ooms: of.ooms(&series),
                    series: &series,
                },
                format,
            )
        }
        Kind::Segments => {
            let peak = of.report.account.peaks.requested.entry;
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
