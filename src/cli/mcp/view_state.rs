//! The `view_state` tool's arguments and document: what `memprof view` shows at its cursor,
//! for one device at one trace entry (the peak unless given).

use crate::analysis::find_peak;
use crate::cli::input::load_snapshot;
use crate::report::view_state::ViewStateReport;
use anyhow::{bail, Context};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ViewStateArgs {
    /// A PyTorch memory snapshot pickle or a memprof recording.
    pub file: PathBuf,
    /// The trace entry (0-based, as `analyze --json` and `diagnose --json` number them): the
    /// state just after it. Default: the peak, where `memprof view` opens.
    #[arg(long, value_name = "N")]
    pub index: Option<usize>,
    /// The device (default: the first with a trace, else the first with segments).
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
    /// How many free blocks, allocations and sites to list.
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub top: usize,
}

/// The document the tool returns.
pub fn report(args: &ViewStateArgs) -> anyhow::Result<ViewStateReport> {
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, false).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    let devices = snapshot.devices();
    let traced = |d: &&u32| !snapshot.timeline.device(**d as usize).is_empty();
    let device = match args.device {
        Some(d) if devices.contains(&d) => d,
        Some(d) => bail!("{shown}: device {d} has no segments and no trace entries"),
        None => match devices.iter().find(traced).or(devices.first()) {
            Some(d) => *d,
            None => bail!("{shown}: the snapshot has no segments and no trace entries"),
        },
    };
    let entries = snapshot.timeline.device(device as usize);
    if let Some(i) = args
        .index
        .filter(|&i| i >= entries.len() && !entries.is_empty())
    {
        bail!(
            "{shown}: entry {i} is past the end of device {device}'s trace ({} entries)",
            entries.len()
        );
    }
    let index = args.index.unwrap_or_else(|| {
        let segments: Vec<_> = snapshot.device_segments(device).collect();
        find_peak(entries, &segments).entry_index.unwrap_or(0)
    });
    Ok(ViewStateReport::new(
        shown, snapshot, device, index, args.top,
    ))
}
