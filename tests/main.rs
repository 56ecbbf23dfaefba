//! The one integration-test binary: runs the real `memprof` binary on committed fixtures and on
//! the real snapshots in `../shared/fixtures/real/`.

mod agent;
mod analyze_fixtures;
mod attach;
mod attach_shim;
mod bad_input;
mod commands;
mod compare;
mod diagnose;
mod doc_examples;
mod export;
mod frames;
mod gate;
mod gpu;
mod json_reference;
mod ledger;
mod live;
mod mcp;
mod nvml_fake;
mod plan;
mod plot_truth;
mod plots;
mod probe;
mod real_snapshots;
mod recording;
mod shim_local;
mod shim_preload;
mod simulate;
mod stacks;
mod terminal_text;
mod torch_run;
mod trace_events;
mod tui;
mod util;
mod verdicts;
mod view_tmux;
