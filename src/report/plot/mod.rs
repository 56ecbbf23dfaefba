//! Plots (plotters, PNG and SVG): memory over time, the segment map and fragmentation over
//! time. Each figure draws on any backend; `canvas` turns a figure into file bytes.

mod canvas;
mod font;
mod fragmentation;
mod kinds;
mod segments;
mod style;
mod timeline;

pub use canvas::{render, Figure, Format, PlotError};
pub use fragmentation::FragmentationPlot;
pub use kinds::{device_series, plot, Kind};
pub use segments::SegmentsPlot;
pub use timeline::TimelinePlot;
