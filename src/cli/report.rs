//! `memprof report FILE -o report.html`: the self-contained HTML report of a snapshot.

use super::input::load_snapshot;
use super::Outcome;
use crate::report::html;
use anyhow::{bail, Context};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// PyTorch memory snapshot pickle or memprof recording.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The HTML file to write.
    #[arg(short = 'o', long = "output", value_name = "OUT.html", required = true)]
    pub output: PathBuf,
    /// How many allocation sites to list per device.
    #[arg(long, value_name = "K", default_value_t = 10)]
    pub top: usize,
    /// Only this device.
    #[arg(long, value_name = "N")]
    pub device: Option<u32>,
}

pub fn run(args: &ReportArgs) -> anyhow::Result<Outcome> {
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, true).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    if let Some(d) = args.device {
        if !snapshot.devices().contains(&d) {
            bail!("{shown}: device {d} has no segments and no trace entries");
        }
    }
    let name = args.file.file_name().unwrap_or(args.file.as_os_str());
    // The account, as `analyze` and `diagnose` build it and in their words.
    let analyze = super::analyze::report(&super::AnalyzeArgs {
        files: vec![args.file.clone()],
        json: true,
        top: args.top,
        full_stacks: true,
        device: args.device,
        plot: None,
        categories: Vec::new(),
        at: None,
    })?;
    let diagnosis = super::diagnose::from_loaded(&args.file, &loaded, None)?;
    let page = html::report(
        snapshot,
        &name.to_string_lossy(),
        &analyze,
        &diagnosis.text(&shown),
    )?;
    std::fs::write(&args.output, page)
        .with_context(|| format!("{}: cannot write", args.output.display()))?;
    super::wrote(&args.output)?;
    Ok(Outcome::Ok)
}
