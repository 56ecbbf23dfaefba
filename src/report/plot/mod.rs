//! Plots (plotters, PNG and SVG): memory over time, the segment map, fragmentation over time
//! and the planners' memory per candidate. Each figure draws on any backend; `canvas` turns a
//! figure into file bytes.

mod candidates;
mod canvas;
mod font;
mod fragmentation;
mod kinds;
mod legend;
mod segments;
mod style;
mod timeline;

pub use candidates::{CandidateBar, CandidatesPlot};
pub use canvas::{render, Figure, Format, PlotError};
pub use fragmentation::FragmentationPlot;
pub use kinds::{plot, DevicePlot, Kind, Stacking};
pub use segments::SegmentsPlot;
pub use style::Mark;
pub use timeline::TimelinePlot;
