//! `memprof view FILE`: load a snapshot or a recording (through the same loader as `analyze`),
//! analyse it, and browse it in the terminal dashboard. The terminal shows the loading screen
//! from the start: the file is read and its account built on a thread of its own, and the
//! dashboard replaces the loading screen when they are done.

use super::analyze::origin;
use super::input::{load_opened_early, open, Loaded, Opened};
use super::Outcome;
use crate::analysis::categories::CategoryRules;
use crate::tui::terminal::{Ended, Screen};
use crate::tui::theme::Theme;
use crate::tui::view::loading::{LoadingApp, Progress, Stage};
use crate::tui::view::summary::Summary;
use crate::tui::view::{Prebuilt, ViewApp};
use anyhow::{bail, Context};
use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Sites listed at the peak.
const TOP_SITES: usize = 10;

#[derive(Debug, Args)]
pub struct ViewArgs {
    /// A PyTorch memory snapshot pickle or a memprof recording.
    pub file: PathBuf,
}

pub fn run(args: &ViewArgs) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    if !std::io::stdout().is_terminal() {
        bail!("`memprof view` is an interactive dashboard and needs a terminal; for text or JSON use `memprof analyze`");
    }
    let shown = args.file.display().to_string();
    // What its first bytes refuse is refused before the terminal is taken over.
    let opened = open(&args.file, false)
        .and_then(|opened| opened.check().map(|()| opened))
        .with_context(|| shown.clone())?;
    let (size, read) = opened.progress();
    let progress = Arc::new(Progress::new(size, read, !opened.is_recording()));
    let name = args
        .file
        .file_name()
        .map_or(shown.clone(), |n| n.to_string_lossy().into_owned());
    let theme = Theme::from_no_color(std::env::var_os("NO_COLOR").as_deref());
    let loader = {
        let (progress, name) = (Arc::clone(&progress), name.clone());
        std::thread::Builder::new()
            .name("memprof-load".into())
            .spawn(move || load(opened, name, theme, &progress))
            .context("cannot start the loading thread")?
    };
    let mut screen = Screen::open().context("terminal")?;
    let mut loading = LoadingApp::new(name, progress, theme, started);
    if screen.show(&mut loading).context("terminal")? == Ended::Quit {
        // The load is left to the end of the process, which is now.
        return Ok(Outcome::Ok);
    }
    // An error leaves `screen`, which restores the terminal, before `main` prints it.
    let mut app = loader
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        .with_context(|| shown.clone())?;
    screen.show(&mut app).context("terminal")?;
    Ok(Outcome::Ok)
}

/// Marks the load over when dropped, however it ends (error or panic included), so the
/// loading screen never waits for a thread that is gone.
struct Over<'a>(&'a Progress);

impl Drop for Over<'_> {
    fn drop(&mut self) {
        self.0.set_stage(Stage::Over);
    }
}

/// Reads the file, builds its account and the dashboard over them, telling `progress` how far
/// it is. The file's model is kept to the end of the process, which the dashboard is the last
/// thing of (freeing it there would only make quitting slower), so the dashboard that borrows
/// it can be built here, off the thread that keeps the loading screen answering keys.
fn load(
    opened: Opened,
    name: String,
    theme: Theme,
    progress: &Progress,
) -> anyhow::Result<ViewApp<'static>> {
    let _over = Over(progress);
    let mut dump = |dump: crate::model::Snapshot| progress.dump_read(&dump);
    let (loaded, _) = load_opened_early(opened, (), Some(&mut dump))?;
    let loaded: &'static Loaded = Box::leak(Box::new(loaded));
    progress.set_stage(Stage::Account);
    let snapshot = &loaded.parsed.snapshot;
    let rules = CategoryRules::default();
    // The timelines need only the snapshot: another thread summarises them while this one
    // builds the account, whose second thread is idle most of that time.
    let (account, built) = std::thread::scope(|scope| {
        let summaries = scope.spawn(|| {
            snapshot
                .devices()
                .into_iter()
                .map(|device| Summary::build(snapshot, device))
                .collect()
        });
        let (account, classifiers) = crate::account::build_keeping_classifiers(
            snapshot,
            &crate::account::Options::new(TOP_SITES, &rules, origin(loaded.recording.as_ref())),
        );
        let summaries = summaries
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let built = Prebuilt {
            classifiers,
            summaries,
        };
        (account, built)
    });
    progress.set_stage(Stage::Dashboard);
    ViewApp::new(name, snapshot, account.devices, built, theme)
        .context("the snapshot has no segments and no trace entries: nothing to view")
}
