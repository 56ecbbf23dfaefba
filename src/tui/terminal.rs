//! The only code that touches the real terminal: raw mode and the alternate screen, the event
//! loop (one dashboard, or several in turn on one screen), and restoring the terminal on every
//! way out (return, error, panic, Ctrl-C, SIGTERM, SIGHUP).
//!
//! Ctrl-C reaches us as a key in raw mode (the terminal sends no SIGINT then) and quits like
//! `q`. A panic restores the terminal before the panic message is printed. SIGTERM and SIGHUP
//! restore it from a watcher thread, then exit with 128 + the signal number, as the default
//! action would have ended the process.

use super::keys::{self, Key};
use super::{Dashboard, Flow};
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event};
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::crossterm::{cursor, execute};
use ratatui::Terminal;
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;
use std::io::{self, IsTerminal, Stdout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// How long the loop waits for input when the dashboard wants no tick.
const IDLE_WAIT: Duration = Duration::from_secs(60);

/// Whether the terminal is in our mode now (so restoring twice does nothing).
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOKS: Once = Once::new();

/// Puts the terminal back: leaves raw mode and the alternate screen, shows the cursor.
fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        // Errors are ignored: there is nothing better to do while leaving.
        let _ = disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

/// Restores the terminal and exits on SIGTERM, SIGHUP, and SIGINT or SIGQUIT sent from outside
/// (in raw mode Ctrl-C arrives as a key), from a thread of its own.
fn watch_signals() -> io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGHUP, SIGINT, SIGQUIT])?;
    std::thread::Builder::new()
        .name("memprof-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                restore();
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

/// Restores the terminal when dropped, however the loop ends.
struct Session;

impl Session {
    fn start() -> io::Result<Session> {
        let mut hooked = Ok(());
        HOOKS.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
            hooked = watch_signals();
        });
        hooked?;
        ACTIVE.store(true, Ordering::SeqCst);
        let session = Session;
        enable_raw_mode()?;
        execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
        Ok(session)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        restore();
    }
}

/// Runs `dashboard` on the terminal until it quits. Fails when stdout is not a terminal.
pub fn run(dashboard: &mut dyn Dashboard) -> io::Result<()> {
    Screen::open()?.show(dashboard).map(|_| ())
}

/// How a dashboard left the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The user quit.
    Quit,
    /// The dashboard said it was done (`Dashboard::finished`).
    Finished,
}

/// The terminal in the dashboards' mode, for one dashboard after another (a loading screen,
/// then what it loaded) without leaving it in between; restored when dropped.
pub struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    _session: Session,
}

impl Screen {
    /// Takes over the terminal. Fails when stdout is not a terminal.
    pub fn open() -> io::Result<Screen> {
        if !io::stdout().is_terminal() {
            return Err(io::Error::other(
                "the dashboard needs a terminal; stdout is not one",
            ));
        }
        let session = Session::start()?;
        let terminal = Terminal::new(CrosstermBackend::new(io::stdout()))?;
        Ok(Screen {
            terminal,
            _session: session,
        })
    }

    /// Runs `dashboard` until the user quits or the dashboard is finished.
    pub fn show(&mut self, dashboard: &mut dyn Dashboard) -> io::Result<Ended> {
        let size = self.terminal.size()?;
        dashboard.on_resize(size.width, size.height);
        event_loop(&mut self.terminal, dashboard)
    }
}

fn event_loop(
    terminal: &mut Terminal<CrosstermBackend<Stdout>>,
    dashboard: &mut dyn Dashboard,
) -> io::Result<Ended> {
    let mut next_tick = dashboard.tick_every().map(|every| Instant::now() + every);
    loop {
        terminal.draw(|frame| dashboard.render(frame.area(), frame.buffer_mut()))?;
        if dashboard.finished() {
            return Ok(Ended::Finished);
        }
        let wait = next_tick.map_or(IDLE_WAIT, |t| t.saturating_duration_since(Instant::now()));
        if event::poll(wait)? {
            match event::read()? {
                Event::Key(key) => {
                    if let Some(key) = keys::from_event(key) {
                        if key == Key::Interrupt || dashboard.on_key(key) == Flow::Quit {
                            return Ok(Ended::Quit);
                        }
                    }
                }
                Event::Resize(width, height) => {
                    terminal.autoresize()?;
                    dashboard.on_resize(width, height);
                }
                _ => {}
            }
        }
        if let (Some(t), Some(every)) = (next_tick, dashboard.tick_every()) {
            if Instant::now() >= t {
                dashboard.on_tick();
                next_tick = Some(Instant::now() + every);
            }
        }
    }
}
