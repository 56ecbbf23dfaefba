//! The one integration-test binary: runs the real `memprof` binary on committed fixtures and on
//! the real snapshots in `../shared/fixtures/real/`.

mod analyze_fixtures;
mod bad_input;
mod commands;
mod diagnose;
mod export;
mod gate;
mod live;
mod plan;
mod plots;
mod real_snapshots;
mod recording;
mod shim_preload;
mod simulate;
mod util;
