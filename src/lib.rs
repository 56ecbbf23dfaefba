//! memprof: a GPU memory profiler and OOM diagnosis tool for PyTorch / CUDA programs.
//!
//! Data flows one way:
//!
//! ```text
//!  source/  ──►  model/  ──►  analysis/  ──►  report/  ──►  cli/
//!  (bytes -> model)  (events, layout,  (pure computations)  (JSON, text)  (one file per
//!                     replayed state)                                      subcommand)
//! ```

pub mod analysis;
pub mod cli;
pub mod model;
pub mod report;
pub mod sim;
pub mod source;
