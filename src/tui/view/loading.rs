//! The screen `view` shows while its file loads, from its first frame: the file's name and
//! size, how much of it is read, and each device's figures at the dump as soon as the
//! snapshot's segments are read (PyTorch writes them before the trace); the dashboard follows
//! once the file is read and its account built. `q` quits at once, `?` shows the keys.

use crate::account::Figures;
use crate::model::{count, Bytes, Snapshot};
use crate::tui::help;
use crate::tui::keys::Key;
use crate::tui::theme::Theme;
use crate::tui::{Dashboard, Flow};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Widget};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the screen looks at the load.
const TICK: Duration = Duration::from_millis(50);

/// The keys while loading, for the help overlay.
pub const KEYS: [(&str, &str); 2] = [("?", "this help"), ("q / Ctrl-C", "quit")];

/// Where the load is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading and decoding the file.
    Reading = 0,
    /// The file is read; its account is being built.
    Account = 1,
    /// The account is built; the dashboard's summaries are being made.
    Dashboard = 2,
    /// Over (loaded, or failed: the caller says which).
    Over = 3,
}

impl Stage {
    fn from_u8(n: u8) -> Stage {
        match n {
            0 => Stage::Reading,
            1 => Stage::Account,
            2 => Stage::Dashboard,
            _ => Stage::Over,
        }
    }
}

/// One device at the dump: its segments and the account's figures of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpRow {
    pub device: u32,
    pub segments: usize,
    pub figures: Figures,
}

/// The figures at the dump of each device of `dump` (a snapshot's segments), as its account
/// has them (`Figures::of_layout` of the device's segments).
pub fn dump_rows(dump: &Snapshot) -> Vec<DumpRow> {
    dump.devices()
        .into_iter()
        .map(|device| DumpRow {
            device,
            segments: dump.device_segments(device).count(),
            figures: Figures::of_layout(dump.device_segments(device)),
        })
        .collect()
}

/// What the loading thread tells the screen, shared between them.
pub struct Progress {
    /// The file's size, when it is a regular file.
    size: Option<u64>,
    /// Bytes of it read so far.
    read: Arc<AtomicU64>,
    /// Whether the dump may come before the rest (a snapshot, not a recording).
    dump_first: bool,
    stage: AtomicU8,
    dump: Mutex<Option<Vec<DumpRow>>>,
}

impl Progress {
    /// The load of a file `size` bytes long (when known) whose bytes read `read` counts;
    /// `dump_first`: a snapshot, whose segments may be read before the rest.
    pub fn new(size: Option<u64>, read: Arc<AtomicU64>, dump_first: bool) -> Progress {
        Progress {
            size,
            read,
            dump_first,
            stage: AtomicU8::new(Stage::Reading as u8),
            dump: Mutex::new(None),
        }
    }

    pub fn set_stage(&self, stage: Stage) {
        self.stage.store(stage as u8, Ordering::Release);
    }

    /// The snapshot's segments are read (`dump` holds them, without a trace).
    pub fn dump_read(&self, dump: &Snapshot) {
        let rows = dump_rows(dump);
        *self.dump.lock().unwrap_or_else(PoisonError::into_inner) = Some(rows);
    }
}

/// What the screen shows, as last looked at.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    read: u64,
    stage: Stage,
    elapsed: Duration,
    dump: Option<Vec<DumpRow>>,
}

/// The loading screen.
pub struct LoadingApp {
    name: String,
    progress: Arc<Progress>,
    theme: Theme,
    started: Instant,
    seen: Seen,
    help: bool,
}

impl LoadingApp {
    /// The screen of the file `name` whose load `progress` follows, started at `started`.
    pub fn new(name: String, progress: Arc<Progress>, theme: Theme, started: Instant) -> Self {
        let mut app = LoadingApp {
            name,
            progress,
            theme,
            started,
            seen: Seen {
                read: 0,
                stage: Stage::Reading,
                elapsed: Duration::ZERO,
                dump: None,
            },
            help: false,
        };
        app.look();
        app
    }

    /// Takes in where the load is now.
    fn look(&mut self) {
        let p = &self.progress;
        // The stage first: what it says was done is then in what is read after it.
        let stage = Stage::from_u8(p.stage.load(Ordering::Acquire));
        self.seen.stage = stage;
        self.seen.read = p.read.load(Ordering::Relaxed);
        self.seen.elapsed = self.started.elapsed();
        if self.seen.dump.is_none() {
            self.seen.dump = p
                .dump
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
        }
    }

    fn render_load(&self, area: Rect, buf: &mut Buffer) {
        let theme = &self.theme;
        let seen = &self.seen;
        let size = self.progress.size;
        let done = match size {
            Some(total) if total > 0 => format!(
                "{} of {} ({:.0}%)",
                Bytes(seen.read.min(total)),
                Bytes(total),
                seen.read.min(total) as f64 * 100.0 / total as f64
            ),
            _ => format!("{} so far", Bytes(seen.read)),
        };
        let what = match seen.stage {
            Stage::Reading => "reading the file",
            Stage::Account => "building the account: peaks, OOM, sites, anomalies",
            Stage::Dashboard => "preparing the dashboard: memory over time, categories",
            Stage::Over => "opening the dashboard",
        };
        let mut lines = vec![
            Line::raw(format!("{what} ({:.1} s)", seen.elapsed.as_secs_f64())),
            Line::from(vec![
                Span::raw("read     "),
                Span::styled(done, theme.title()),
            ]),
        ];
        let width = area.width.saturating_sub(2) as usize;
        if let (Some(total), true) = (size.filter(|&t| t > 0), width > 0) {
            let filled = (seen.read.min(total) as f64 / total as f64 * width as f64) as usize;
            lines.push(Line::from(vec![
                Span::styled("█".repeat(filled), theme.allocated()),
                Span::styled("░".repeat(width - filled), theme.reserved()),
            ]));
        }
        lines.push(Line::styled(
            "the timeline, blocks, sites and the OOM follow when the trace is read",
            theme.muted(),
        ));
        Paragraph::new(lines)
            .block(titled(" Loading ", theme))
            .render(area, buf);
    }

    fn render_dump(&self, area: Rect, buf: &mut Buffer) {
        let theme = &self.theme;
        let mut lines = Vec::new();
        match &self.seen.dump {
            None if self.progress.dump_first => lines.push(Line::styled(
                "shown once the snapshot's segments are read (PyTorch writes them first)",
                theme.muted(),
            )),
            None => lines.push(Line::styled(
                "a recording's segments are known once it is read whole",
                theme.muted(),
            )),
            Some(rows) if rows.is_empty() => lines.push(Line::raw("no segments")),
            Some(rows) => {
                for row in rows {
                    lines.extend(dump_lines(row, theme));
                }
            }
        }
        Paragraph::new(lines)
            .block(titled(" At the dump, from the segments ", theme))
            .render(area, buf);
    }
}

/// A bordered box titled `title`.
fn titled<'a>(title: &'a str, theme: &Theme) -> Block<'a> {
    Block::default()
        .borders(Borders::ALL)
        .title(Span::styled(title, theme.title()))
}

/// One figure's line: its name, then its value.
fn figure(name: &str, value: String, style: Style) -> Line<'static> {
    Line::from(vec![
        Span::raw(format!("  {name:<14}")),
        Span::styled(value, style),
    ])
}

/// A device's figures at the dump, a line each.
fn dump_lines(row: &DumpRow, theme: &Theme) -> Vec<Line<'static>> {
    let f = &row.figures;
    let bytes = |b: Option<u64>| b.map_or_else(|| "not known".into(), |b| Bytes(b).to_string());
    let share = f
        .cached_free_share()
        .map_or_else(String::new, |s| format!(" ({:.0}%)", s * 100.0));
    vec![
        Line::styled(
            format!(
                "device {}: {}",
                row.device,
                count(row.segments as u64, "segment", "segments")
            ),
            theme.title(),
        ),
        figure("reserved", bytes(f.reserved_bytes), theme.reserved()),
        figure("allocated", bytes(f.allocated_bytes), theme.allocated()),
        figure(
            "cached free",
            format!("{}{share}", bytes(f.cached_free_bytes)),
            Style::new(),
        ),
        figure(
            "largest free",
            bytes(f.largest_free_block_bytes),
            Style::new(),
        ),
    ]
}

impl Dashboard for LoadingApp {
    fn render(&self, area: Rect, buf: &mut Buffer) {
        let size = self
            .progress
            .size
            .map_or_else(|| "a stream".to_string(), |s| Bytes(s).to_string());
        let [header, load, dump, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(6),
            Constraint::Min(0),
            Constraint::Length(1),
        ])
        .areas(area);
        let title = format!(" {} │ {size} │ loading", self.name);
        Paragraph::new(Line::styled(title, self.theme.title())).render(header, buf);
        self.render_load(load, buf);
        self.render_dump(dump, buf);
        Paragraph::new(Line::styled(" ? help  q quit", self.theme.muted())).render(footer, buf);
        if self.help {
            help::render("memprof view", &KEYS, &self.theme, area, buf);
        }
    }

    fn on_key(&mut self, key: Key) -> Flow {
        if let Some(flow) = help::dismiss(&mut self.help, key) {
            return flow;
        }
        match key {
            Key::Char('q') | Key::Interrupt => Flow::Quit,
            Key::Char('?') => {
                self.help = true;
                Flow::Continue
            }
            _ => Flow::Continue,
        }
    }

    fn on_resize(&mut self, _width: u16, _height: u16) {}

    fn tick_every(&self) -> Option<Duration> {
        Some(TICK)
    }

    fn on_tick(&mut self) {
        self.look();
    }

    fn finished(&self) -> bool {
        self.seen.stage == Stage::Over
    }
}
