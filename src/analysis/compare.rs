//! Devices and ranks side by side: the peak of each, the outlier (the highest peak against
//! the median) and the allocation sites that make the difference between the outlier and the
//! median device at their peaks.

use super::device::DeviceAnalysis;
use serde::Serialize;

/// How many sites explain the difference.
const DIFFERENCES: usize = 5;

/// Below this ratio of the highest peak to the median the devices are balanced.
pub const BALANCED_RATIO: f64 = 1.1;

/// One device of one input. A peak the input cannot tell (no trace) is `None`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PeakRow {
    pub input: String,
    pub device: u32,
    pub peak_active_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
}

/// Which row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RowRef {
    pub input: String,
    pub device: u32,
}

/// A site that holds more on the outlier than on the median device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteDifference {
    pub site: String,
    pub bytes_outlier: u64,
    pub bytes_median: u64,
}

/// The comparison of two or more devices (names fixed by the JSON reference). The outlier,
/// the median and the spread are over the devices whose peak is known; they are `None` when
/// fewer than two are.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Every device that holds memory, in input and device order.
    pub peaks: Vec<PeakRow>,
    /// The device with the highest peak of requested memory.
    pub outlier: Option<RowRef>,
    /// The device at the median peak (the lower of the two middle ones for an even count).
    pub median: Option<RowRef>,
    pub median_peak_bytes: Option<u64>,
    /// Highest peak over the median peak; 1.0 when they are equal.
    pub spread_ratio: Option<f64>,
    /// Sites holding more on the outlier than on the median device at their peaks, largest
    /// difference first.
    pub differences: Vec<SiteDifference>,
}

/// One device offered for comparison: its input's name, its analysis and its peaks as the
/// account tells them.
pub struct Candidate<'a> {
    pub input: &'a str,
    pub analysis: &'a DeviceAnalysis,
    pub peak_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
}

/// Compares `rows`; `None` for fewer than two.
pub fn compare(rows: &[Candidate<'_>]) -> Option<Comparison> {
    if rows.len() < 2 {
        return None;
    }
    let peaks: Vec<PeakRow> = rows
        .iter()
        .map(|c| PeakRow {
            input: c.input.to_string(),
            device: c.analysis.device,
            peak_active_bytes: c.peak_bytes,
            peak_reserved_bytes: c.peak_reserved_bytes,
        })
        .collect();
    let mut order: Vec<(u64, usize)> = peaks
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((p.peak_active_bytes?, i)))
        .collect();
    if order.len() < 2 {
        return Some(Comparison {
            peaks,
            outlier: None,
            median: None,
            median_peak_bytes: None,
            spread_ratio: None,
            differences: Vec::new(),
        });
    }
    order.sort_unstable();
    let (top_peak, top) = *order.last()?;
    let (median_peak, mid) = order[(order.len() - 1) / 2];
    let (outlier, median) = (rows[top].analysis, rows[mid].analysis);
    let spread_ratio = if median_peak == 0 {
        if top_peak == 0 {
            1.0
        } else {
            f64::INFINITY
        }
    } else {
        top_peak as f64 / median_peak as f64
    };
    let on_median = |site: &str| {
        median
            .comparison_sites
            .iter()
            .find(|s| s.frame == site)
            .map_or(0, |s| s.bytes)
    };
    let mut differences: Vec<SiteDifference> = outlier
        .comparison_sites
        .iter()
        .map(|s| SiteDifference {
            site: s.frame.clone(),
            bytes_outlier: s.bytes,
            bytes_median: on_median(&s.frame),
        })
        .filter(|d| d.bytes_outlier > d.bytes_median)
        .collect();
    differences.sort_by(|a, b| {
        (b.bytes_outlier - b.bytes_median)
            .cmp(&(a.bytes_outlier - a.bytes_median))
            .then_with(|| a.site.cmp(&b.site))
    });
    differences.truncate(DIFFERENCES);
    let row = |i: usize| RowRef {
        input: peaks[i].input.clone(),
        device: peaks[i].device,
    };
    Some(Comparison {
        outlier: Some(row(top)),
        median: Some(row(mid)),
        median_peak_bytes: Some(median_peak),
        spread_ratio: Some(spread_ratio),
        differences,
        peaks,
    })
}
