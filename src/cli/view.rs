//! `memprof view FILE`: load a snapshot or a recording (through the same loader as `analyze`),
//! analyse it, and browse it in the terminal dashboard.

use super::analyze::origin;
use super::input::load_snapshot;
use super::Outcome;
use crate::analysis::categories::CategoryRules;
use crate::tui::terminal;
use crate::tui::theme::Theme;
use crate::tui::view::ViewApp;
use anyhow::{bail, Context};
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Sites listed at the peak.
const TOP_SITES: usize = 10;

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// A PyTorch memory snapshot pickle or a memprof recording.
    pub file: PathBuf,
}

pub fn run(args: &ViewArgs) -> anyhow::Result<Outcome> {
    if !std::io::stdout().is_terminal() {
        bail!("`memprof view` is an interactive dashboard and needs a terminal; for text or JSON use `memprof analyze`");
    }
    let shown = args.file.display().to_string();
    let loaded = load_snapshot(&args.file, true).with_context(|| shown.clone())?;
    let snapshot = &loaded.parsed.snapshot;
    let rules = CategoryRules::default();
    let account = crate::account::build(
        snapshot,
        &crate::account::Options {
            top: TOP_SITES,
            only: None,
            rules: &rules,
            origin: origin(loaded.recording.as_ref()),
            capacity: None,
        },
    );
    let name = args
        .file
        .file_name()
        .map_or(shown.clone(), |n| n.to_string_lossy().into_owned());
    let theme = Theme::from_no_color(std::env::var_os("NO_COLOR").as_deref());
    let Some(mut app) = ViewApp::new(name, snapshot, account.devices, theme) else {
        bail!("{shown}: the snapshot has no segments and no trace entries: nothing to view");
    };
    terminal::run(&mut app).context("terminal")?;
    Ok(Outcome::Ok)
}
