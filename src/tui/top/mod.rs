//! `memprof top`: every GPU and the processes on them, from a `GpuSampler` (NVML, a replay or
//! the scripted fake) at a fixed interval; `state` holds what is shown, `render` draws it.
//! Enter opens the attach view of a process that runs the shim (its stream); for any other
//! process it offers the attach menu (`menu`): top's own samples filtered to it, or one of
//! `memprof attach`'s modes, which top leaves to run. Esc or q comes back.

pub mod menu;
pub mod render;
pub mod state;

use super::attach::{AttachApp, Feed};
use super::keys::Key;
use super::theme::Theme;
use super::{Dashboard, Flow};
use crate::source::gpu::{Clock, GpuSampler};
use crate::source::live_feed::LiveFeed;
use menu::{AttachChoice, AttachMenu, MenuFlow};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use state::TopState;
use std::rc::Rc;
use std::time::Duration;

/// Of the PIDs given, whether each runs the shim, for those it can tell (a process of another
/// user has its socket where we cannot look: it is left out, unknown).
pub type ShimLister = Box<dyn Fn(&[u32]) -> Vec<(u32, bool)>>;
/// Connects to the shim of a PID, or says why not.
pub type ShimOpener = Box<dyn Fn(u32) -> Result<LiveFeed, String>>;
/// Whether a PID still runs.
pub type Liveness = Rc<dyn Fn(u32) -> bool>;

/// The `top` dashboard: a sampler, the injected clock, and the state.
pub struct TopApp<'c> {
    sampler: Box<dyn GpuSampler>,
    clock: &'c dyn Clock,
    interval: Duration,
    pub state: TopState,
    pub theme: Theme,
    shims: Option<(ShimLister, ShimOpener)>,
    /// Tells the attach view of a process without the shim that it ended; `None`: never.
    liveness: Option<Liveness>,
    /// The attach view opened with Enter.
    pub attached: Option<AttachApp<'c>>,
    /// The attach menu of a process not under the shim.
    pub menu: Option<AttachMenu>,
    /// A `memprof attach` mode chosen in the menu, for the caller to run once top has quit.
    pub chosen: Option<(u32, AttachChoice)>,
}

impl<'c> TopApp<'c> {
    /// A dashboard that samples every `interval`; takes the first sample now.
    pub fn new(
        sampler: Box<dyn GpuSampler>,
        clock: &'c dyn Clock,
        interval: Duration,
        theme: Theme,
    ) -> TopApp<'c> {
        let mut app = TopApp {
            sampler,
            clock,
            interval,
            state: TopState::default(),
            theme,
            shims: None,
            liveness: None,
            attached: None,
            menu: None,
            chosen: None,
        };
        app.on_tick();
        app
    }

    /// Fills the SHIM column from `list` and opens shim processes' streams with `open`.
    pub fn with_shims(mut self, list: ShimLister, open: ShimOpener) -> TopApp<'c> {
        self.shims = Some((list, open));
        self.look_for_shims();
        self
    }

    /// Fills the SHIM column for the processes of the latest sample.
    fn look_for_shims(&mut self) {
        if let Some((list, _)) = &self.shims {
            let pids: Vec<u32> = self
                .state
                .sample
                .iter()
                .flat_map(|s| s.processes.iter().map(|p| p.pid))
                .collect();
            let mut known = list(&pids);
            known.sort_unstable();
            known.dedup_by_key(|k| k.0);
            self.state.shims = Some(known);
        }
    }

    /// Lets attach views without the shim say when their process has ended.
    pub fn with_liveness(mut self, alive: Liveness) -> TopApp<'c> {
        self.liveness = Some(alive);
        self
    }

    /// Opens the attach view of the selected process when it runs the shim, else its menu.
    fn open_selected(&mut self) {
        let Some(pid) = self.state.selected_process().map(|p| p.pid) else {
            return;
        };
        match self.shim_feed(pid) {
            Ok(feed) => self.open_view(pid, Feed::Shim(feed), String::new()),
            Err(why) => self.menu = Some(AttachMenu::new(pid, why)),
        }
    }

    /// The shim's stream of `pid`, or why there is none.
    fn shim_feed(&self, pid: u32) -> Result<LiveFeed, String> {
        match &self.shims {
            Some((_, open)) if self.state.has_shim(pid) == Some(true) => open(pid),
            Some(_) if self.state.has_shim(pid) == Some(false) => {
                Err(format!("PID {pid} does not run the memprof shim"))
            }
            Some(_) => Err(format!(
                "whether PID {pid} runs the shim cannot be told (not a process of this user)"
            )),
            None => Err("shim detection is off".to_owned()),
        }
    }

    /// The attach view of `pid` fed by top's own samples.
    fn watch(&mut self, pid: u32, why: String) {
        let check = self.liveness.clone();
        let alive = Box::new(move || check.as_ref().is_none_or(|alive| alive(pid)));
        let source = self.sampler.describe();
        self.open_view(pid, Feed::Outside { source, alive }, why);
    }

    /// Opens the attach view of `pid` on `feed`; `why` says why it is not the shim's.
    fn open_view(&mut self, pid: u32, feed: Feed, why: String) {
        let command = self
            .state
            .sample
            .iter()
            .flat_map(|s| &s.processes)
            .find(|p| p.pid == pid)
            .and_then(|p| p.command.clone());
        let mut view = AttachApp::new(
            pid,
            command,
            feed,
            self.clock,
            self.interval,
            self.theme,
            &why,
        );
        if let Some(sample) = &self.state.sample {
            view.take_sample(self.clock.now_ms(), sample);
        }
        self.attached = Some(view);
    }
}

impl Dashboard for TopApp<'_> {
    fn render(&self, area: Rect, buf: &mut Buffer) {
        if let Some(view) = &self.attached {
            return view.render(area, buf);
        }
        render::render(
            &self.state,
            &self.sampler.describe(),
            &self.theme,
            area,
            buf,
        );
        if let Some(menu) = &self.menu {
            menu.render(&self.theme, area, buf);
        }
    }

    fn on_key(&mut self, key: Key) -> Flow {
        if let Some(view) = &mut self.attached {
            if matches!(key, Key::Esc | Key::Char('q')) && !view.state.help {
                self.attached = None;
                return Flow::Continue;
            }
            return view.on_key(key);
        }
        if let Some(menu) = &mut self.menu {
            if key == Key::Interrupt {
                return Flow::Quit;
            }
            let pid = menu.pid;
            match menu.on_key(key) {
                MenuFlow::Stay => {}
                MenuFlow::Back => self.menu = None,
                MenuFlow::Chose(AttachChoice::Watch) => {
                    let why = self.menu.take().map(|m| m.why).unwrap_or_default();
                    self.watch(pid, why);
                }
                MenuFlow::Chose(mode) => {
                    self.menu = None;
                    self.chosen = Some((pid, mode));
                    return Flow::Quit;
                }
            }
            return Flow::Continue;
        }
        if key == Key::Enter && !self.state.help {
            self.open_selected();
            return Flow::Continue;
        }
        self.state.on_key(key)
    }

    fn on_resize(&mut self, _width: u16, _height: u16) {}

    fn tick_every(&self) -> Option<Duration> {
        Some(self.interval)
    }

    /// Takes a sample, stamped with the injected clock when the sampler left no time.
    fn on_tick(&mut self) {
        let sample = self.sampler.sample().map(|mut s| {
            if s.time_ms == 0 {
                s.time_ms = self.clock.now_ms();
            }
            s
        });
        let sample = sample.map_err(|e| e.to_string());
        if let Some(view) = &mut self.attached {
            view.on_tick();
            if let Ok(sample) = &sample {
                view.take_sample(self.clock.now_ms(), sample);
            }
        }
        self.state.update(sample);
        self.look_for_shims();
    }
}
