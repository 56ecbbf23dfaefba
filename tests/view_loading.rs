//! `view`'s loading screen: the dump read before the trace (`torch_snapshot::read_early`) on
//! the fixtures and the real snapshots, with the figures the account gives at the dump; and
//! the screen itself drawn into ratatui's `TestBackend`.

use crate::util::{fixture, real_fixtures, screen};
use memprof::account::Options;
use memprof::analysis::categories::CategoryRules;
use memprof::diagnose::Origin;
use memprof::model::Snapshot;
use memprof::source::torch_snapshot;
use memprof::tui::keys::Key;
use memprof::tui::theme::Theme;
use memprof::tui::view::loading::{dump_rows, LoadingApp, Progress, Stage};
use memprof::tui::{Dashboard, Flow};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Every committed snapshot fixture, and the real snapshots where they are.
fn snapshots() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut add = |dir: &Path| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("a fixture folder")
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "pickle" || e == "pkl"))
            .collect();
        found.sort();
        files.extend(found);
    };
    add(&fixture("snapshots"));
    if let Some(real) = real_fixtures() {
        add(&real);
        add(&real.join("more"));
    }
    files
}

/// Whether the file names its segments before its trace, as PyTorch writes it.
fn segments_first(bytes: &[u8]) -> bool {
    let at = |key: &[u8]| bytes.windows(key.len()).position(|w| w == key);
    matches!((at(b"segments"), at(b"device_traces")), (Some(s), Some(t)) if s < t)
}

#[test]
fn the_dump_read_before_the_trace_has_the_accounts_figures_at_the_dump() {
    let mut early_seen = 0;
    for path in snapshots() {
        let bytes = std::fs::read(&path).expect("readable");
        let mut early: Vec<Snapshot> = Vec::new();
        let parsed = torch_snapshot::read_early(bytes.as_slice(), &mut |dump| early.push(dump))
            .expect("parses");
        let snapshot = parsed.snapshot;
        let name = path.display();
        assert!(early.len() <= 1, "{name}: the dump is handed on once");
        let entries = |s: &Snapshot| {
            (0..s.timeline.device_count())
                .map(|d| s.timeline.device(d).len())
                .sum::<usize>()
        };
        if segments_first(&bytes) && entries(&snapshot) > 0 {
            assert_eq!(
                early.len(),
                1,
                "{name}: segments before a trace are read early"
            );
        }
        let Some(dump) = early.first() else {
            continue;
        };
        early_seen += 1;
        assert_eq!(entries(dump), 0, "{name}: the early dump has no trace");
        assert_eq!(dump.segments.len(), snapshot.segments.len(), "{name}");
        // The figures the loading screen shows are those the account gives at the dump.
        let rules = CategoryRules::default();
        let account =
            memprof::account::build(&snapshot, &Options::new(10, &rules, Origin::TorchSnapshot));
        let rows = dump_rows(dump);
        for row in &rows {
            let device = account
                .devices
                .iter()
                .find(|d| d.analysis.device == row.device)
                .unwrap_or_else(|| panic!("{name}: device {} has an account", row.device));
            assert_eq!(
                row.figures,
                device.account.dump(),
                "{name}: device {}",
                row.device
            );
        }
        assert_eq!(rows, dump_rows(&snapshot), "{name}");
    }
    assert!(early_seen >= 10, "the committed fixtures are read early");
}

/// The loading screen drawn at `width` x `height`, as text.
fn draw(app: &LoadingApp, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|f| app.render(f.area(), f.buffer_mut()))
        .expect("draws");
    screen(&terminal)
}

#[test]
fn the_loading_screen_shows_the_read_bytes_then_the_dump_and_hands_over_when_over() {
    let read = Arc::new(AtomicU64::new(0));
    let progress = Arc::new(Progress::new(Some(4 << 20), Arc::clone(&read), true));
    let mut app = LoadingApp::new(
        "big.pickle".into(),
        Arc::clone(&progress),
        Theme::plain(),
        Instant::now(),
    );
    let screen = draw(&app, 90, 24);
    assert!(
        screen.contains("big.pickle │ 4.00 MiB │ loading"),
        "{screen}"
    );
    assert!(screen.contains("0 B of 4.00 MiB (0%)"), "{screen}");
    assert!(
        screen.contains("once the snapshot's segments are read"),
        "{screen}"
    );
    assert!(!app.finished());

    let file = std::fs::read(fixture("snapshots/demo_oom.pickle")).expect("fixture");
    let mut dump = None;
    torch_snapshot::read_early(file.as_slice(), &mut |d| dump = Some(d)).expect("parses");
    let dump = dump.expect("demo_oom's segments come first");
    read.store(1 << 20, Ordering::Relaxed);
    progress.dump_read(&dump);
    app.on_tick();
    let screen = draw(&app, 90, 24);
    assert!(screen.contains("1.00 MiB of 4.00 MiB (25%)"), "{screen}");
    let row = dump_rows(&dump)[0];
    let reserved = memprof::model::Bytes(row.figures.reserved_bytes.expect("known")).to_string();
    assert!(
        screen.contains(&format!("device {}: ", row.device)),
        "{screen}"
    );
    assert!(
        screen.contains(&format!("reserved      {reserved}")),
        "{screen}"
    );
    assert!(screen.contains("largest free"), "{screen}");

    assert_eq!(app.on_key(Key::Char('?')), Flow::Continue);
    assert!(draw(&app, 90, 24).contains("memprof view: keys"));
    assert_eq!(
        app.on_key(Key::Char('x')),
        Flow::Continue,
        "closes the help"
    );
    assert!(!draw(&app, 90, 24).contains("memprof view: keys"));
    assert_eq!(app.on_key(Key::Right), Flow::Continue);
    assert_eq!(app.on_key(Key::Char('q')), Flow::Quit);

    progress.set_stage(Stage::Account);
    app.on_tick();
    assert!(draw(&app, 90, 24).contains("building the account"));
    progress.set_stage(Stage::Dashboard);
    app.on_tick();
    assert!(draw(&app, 90, 24).contains("preparing the dashboard"));
    assert!(!app.finished());
    progress.set_stage(Stage::Over);
    app.on_tick();
    assert!(
        app.finished(),
        "hands the screen over once the load is over"
    );
    // A recording's segments come with the rest of it.
    let recording = Arc::new(Progress::new(None, Arc::clone(&read), false));
    let app = LoadingApp::new(
        "run.memprof".into(),
        recording,
        Theme::plain(),
        Instant::now(),
    );
    let screen = draw(&app, 90, 24);
    assert!(
        screen.contains("run.memprof │ a stream │ loading"),
        "{screen}"
    );
    assert!(screen.contains("1.00 MiB so far"), "{screen}");
    assert!(screen.contains("a recording's segments are known once it is read whole"));
    // Tiny terminals draw without a panic.
    for (w, h) in [(1, 1), (10, 3), (30, 8)] {
        draw(&app, w, h);
    }
}
