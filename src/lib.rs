//! memprof: a GPU memory profiler and OOM diagnosis tool for PyTorch / CUDA programs.
//!
//! Data flows one way:
//!
//! ```text
//!  source/  ──►  model/  ──►  analysis/, sim/  ──►  report/, tui/  ──►  cli/
//!  (bytes -> model)  (events, layout,  (pure computations;  (JSON, text;  (one file per
//!                     replayed state)   sim/ = allocator     dashboards)   subcommand)
//!                                       model and replay)
//! ```
//!
//! `diagnose/` sits beside `analysis/` and `sim/` and combines them: an OOM's cause from the
//! analysis, its remedies replayed through the simulator.
//!
//! `account/` sits above them and below every renderer: per input, one account (the moments on
//! one time axis, the figures at each in `memory_stats()`'s words, both peaks, the pools, the
//! findings) is built once, from one replay of each trace and the allocator replay beside it.
//! `report/`, `tui/` and `cli/` print what it holds; a renderer chooses what to show, never
//! what is true, and a figure two outputs could disagree on belongs in the account
//! (docs/json/account.md says what each word means).
//!
//! `agent/` runs `memprof agent`: a thread samples the GPUs (`source/gpu`) into a cache of
//! rendered metrics (`report/prometheus`) that its HTTP server answers scrapes from.

pub mod account;
pub mod agent;
pub mod analysis;
pub mod cli;
pub mod diagnose;
pub mod model;
pub mod plan;
pub mod report;
pub mod sim;
pub mod source;
pub mod tui;
