//! The `view` dashboard drawn into ratatui's `TestBackend` from real snapshot fixtures, at
//! several terminal sizes, after scripted keys; compared with insta snapshots
//! (`tests/snapshots/`). Styles are checked cell by cell where text cannot show them.

use crate::util::fixture;
use insta::assert_snapshot;
use memprof::analysis::{analyze_snapshot, DeviceAnalysis};
use memprof::diagnose::{diagnose_device, Depth};
use memprof::model::Snapshot;
use memprof::sim::replay::{self, DeviceTrace};
use memprof::source::torch_snapshot;
use memprof::tui::keys::Key;
use memprof::tui::theme::Theme;
use memprof::tui::view::ViewApp;
use memprof::tui::Dashboard;
use ratatui::backend::TestBackend;
use ratatui::style::{Color, Modifier};
use ratatui::Terminal;

fn load(name: &str) -> Snapshot {
    let file = std::fs::File::open(fixture(&format!("snapshots/{name}.pickle"))).expect("fixture");
    torch_snapshot::read(file).expect("parses").snapshot
}

/// What `memprof view` analyses: every device, with the OOM diagnosed (as `analyze` does).
fn analyses(snapshot: &Snapshot) -> Vec<DeviceAnalysis> {
    let mut devices = analyze_snapshot(snapshot, 10, None);
    let (recorded, _) = replay::recorded_config(snapshot);
    for trace in DeviceTrace::all(snapshot) {
        if let Some(oom) = devices
            .iter_mut()
            .find(|d| d.device == trace.device)
            .and_then(|d| d.oom.as_mut())
        {
            let prepared = replay::prepare(&trace, &recorded, None);
            oom.diagnosis = diagnose_device(snapshot, &prepared, &recorded, None, Depth::Classify);
        }
    }
    devices
}

/// Draws `app` on a `width` x `height` terminal after `keys`.
fn draw(app: &mut ViewApp, width: u16, height: u16, keys: &[Key]) -> Terminal<TestBackend> {
    app.on_resize(width, height);
    for &key in keys {
        app.on_key(key);
    }
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|f| app.render(f.area(), f.buffer_mut()))
        .expect("draws");
    terminal
}

fn app<'a>(name: &str, snapshot: &'a Snapshot, theme: Theme) -> ViewApp<'a> {
    ViewApp::new(
        format!("{name}.pickle"),
        snapshot,
        analyses(snapshot),
        theme,
    )
    .expect("the fixture has a device")
}

#[test]
fn view_demo_oom_at_several_sizes() {
    let snap = load("demo_oom");
    for (w, h) in [(80, 24), (120, 40), (200, 50)] {
        let mut a = app("demo_oom", &snap, Theme::colored());
        let t = draw(&mut a, w, h, &[]);
        assert_snapshot!(format!("view_demo_oom_{w}x{h}"), t.backend());
    }
}

#[test]
fn view_demo_oom_after_keys() {
    let snap = load("demo_oom");
    let cases: [(&str, &[Key]); 4] = [
        ("oom_panel", &[Key::Char('o')]),
        (
            "zoomed_blocks",
            &[
                Key::Char('z'),
                Key::Char('z'),
                Key::Char('z'),
                Key::Tab,
                Key::Down,
            ],
        ),
        ("help", &[Key::Char('?')]),
        ("start_of_trace", &[Key::Home, Key::Char('d')]),
    ];
    for (name, keys) in cases {
        let mut a = app("demo_oom", &snap, Theme::colored());
        let t = draw(&mut a, 80, 24, keys);
        assert_snapshot!(format!("view_demo_oom_{name}"), t.backend());
    }
}

#[test]
fn view_other_fixtures() {
    for name in ["segments_only", "multi_device", "expandable"] {
        let snap = load(name);
        let mut a = app(name, &snap, Theme::colored());
        let t = draw(&mut a, 100, 30, &[Key::Char('d')]);
        assert_snapshot!(format!("view_{name}"), t.backend());
    }
}

#[test]
fn view_survives_tiny_terminals() {
    let snap = load("demo_oom");
    for (w, h) in [(1, 1), (10, 3), (30, 8), (79, 23)] {
        let mut a = app("demo_oom", &snap, Theme::colored());
        draw(&mut a, w, h, &[Key::Char('?')]);
        draw(&mut a, w, h, &[Key::Right, Key::Char('z'), Key::Tab]);
    }
}

#[test]
fn no_color_draws_without_colours_and_colour_never_sets_a_background() {
    let snap = load("demo_oom");
    let mut plain = app("demo_oom", &snap, Theme::plain());
    let t = draw(&mut plain, 120, 40, &[]);
    let cells = &t.backend().buffer().content;
    assert!(cells
        .iter()
        .all(|c| c.fg == Color::Reset && c.bg == Color::Reset));
    assert!(cells
        .iter()
        .any(|c| c.modifier.contains(Modifier::REVERSED)));
    let mut colored = app("demo_oom", &snap, Theme::colored());
    let t = draw(&mut colored, 120, 40, &[]);
    let cells = &t.backend().buffer().content;
    assert!(cells.iter().all(|c| c.bg == Color::Reset));
    assert!(cells.iter().any(|c| c.fg == Color::Blue));
}

#[test]
fn the_cursor_column_moves_with_the_keys() {
    let snap = load("demo_oom");
    let mut a = app("demo_oom", &snap, Theme::plain());
    let reversed_columns = |t: &Terminal<TestBackend>| -> Vec<u16> {
        let buf = t.backend().buffer();
        let mut xs: Vec<u16> = (2..9)
            .flat_map(|y| (0..buf.area.width).map(move |x| (x, y)))
            .filter(|&(x, y)| buf[(x, y)].modifier.contains(Modifier::REVERSED))
            .map(|(x, _)| x)
            .collect();
        xs.dedup();
        xs
    };
    let before = reversed_columns(&draw(&mut a, 100, 30, &[]));
    let after = reversed_columns(&draw(&mut a, 100, 30, &[Key::Left, Key::Left]));
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0] + 2, before[0]);
}
