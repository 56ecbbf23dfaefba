//! `memprof attach PID`: the live view of one process, fed by the shim's event stream (read on
//! a thread of its own, `LiveFeed`), by memprof's agent in a PyTorch job (`TorchFeed`, on a
//! thread of its own too) or by NVML samples; `state` holds what is shown, `render`
//! draws it. `top` opens the same view on Enter.

pub mod render;
pub mod state;

use super::keys::Key;
use super::theme::Theme;
use super::{Dashboard, Flow};
use crate::source::attach::feed::TorchFeed;
use crate::source::gpu::{Clock, GpuSampler, Sample};
use crate::source::live_feed::{FeedState, LiveFeed};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use state::{AttachState, Mode};
use std::time::Duration;

/// Items taken from the stream per tick at most, so a flood cannot stall the screen.
const DRAIN_PER_TICK: usize = 1 << 20;

/// Where the view's figures come from.
pub enum Feed {
    Shim(LiveFeed),
    /// PyTorch's own figures from the agent in the job.
    Torch(TorchFeed),
    /// NVML (or a scripted sampler) and a check of whether the process still runs.
    Nvml {
        sampler: Box<dyn GpuSampler>,
        alive: Box<dyn Fn() -> bool>,
    },
    /// Samples handed in by the caller (`top`'s own) from the sampler `source` names, and a
    /// check of whether the process still runs.
    Outside {
        source: String,
        alive: Box<dyn Fn() -> bool>,
    },
}

/// The attach dashboard: a feed, the injected clock and the state.
pub struct AttachApp<'c> {
    feed: Feed,
    clock: &'c dyn Clock,
    interval: Duration,
    pub state: AttachState,
    pub theme: Theme,
}

impl<'c> AttachApp<'c> {
    /// A view of `pid` that updates every `interval`; takes the first tick now.
    pub fn new(
        pid: u32,
        command: Option<String>,
        feed: Feed,
        clock: &'c dyn Clock,
        interval: Duration,
        theme: Theme,
        nvml_why: &str,
    ) -> AttachApp<'c> {
        let mode = match &feed {
            Feed::Shim(_) => Mode::Shim,
            Feed::Torch(feed) => Mode::Torch {
                source: feed.describe.clone(),
            },
            Feed::Nvml { sampler, .. } => Mode::Nvml {
                source: sampler.describe(),
                why: nvml_why.to_owned(),
            },
            Feed::Outside { source, .. } => Mode::Nvml {
                source: source.clone(),
                why: nvml_why.to_owned(),
            },
        };
        let mut app = AttachApp {
            feed,
            clock,
            interval,
            state: AttachState::new(pid, command, mode),
            theme,
        };
        app.on_tick();
        app
    }

    /// Takes a sample the caller took, when the feed is `Outside`.
    pub fn take_sample(&mut self, now_ms: u64, sample: &Sample) {
        if let Feed::Outside { alive, .. } = &self.feed {
            if self.state.gone {
                return;
            }
            if !alive() {
                self.state.gone = true;
                return;
            }
            self.state.tick_nvml(now_ms, Ok(sample.clone()));
        }
    }
}

impl Dashboard for AttachApp<'_> {
    fn render(&self, area: Rect, buf: &mut Buffer) {
        render::render(&self.state, &self.theme, area, buf);
    }

    fn on_key(&mut self, key: Key) -> Flow {
        self.state.on_key(key)
    }

    fn on_resize(&mut self, _width: u16, _height: u16) {}

    fn tick_every(&self) -> Option<Duration> {
        Some(self.interval)
    }

    /// Takes what the stream has sent (or one NVML sample) and adds a point to the series.
    fn on_tick(&mut self) {
        let now = self.clock.now_ms();
        match &mut self.feed {
            Feed::Shim(feed) => {
                let state = &mut self.state;
                let was_gone = state.gone;
                if feed.drain(DRAIN_PER_TICK, |item| state.apply(item)) == FeedState::Closed {
                    state.gone = true;
                }
                // The tick that learns of the end still records the final state.
                if !was_gone {
                    state.tick_shim(now);
                }
            }
            Feed::Nvml { sampler, alive } => {
                if self.state.gone {
                    return;
                }
                if !alive() {
                    self.state.gone = true;
                    return;
                }
                let sample = sampler.sample().map_err(|e| e.to_string());
                self.state.tick_nvml(now, sample);
            }
            Feed::Torch(feed) => {
                if self.state.gone {
                    return;
                }
                match feed.latest() {
                    Some(Ok(devices)) => self.state.tick_torch(now, devices),
                    Some(Err(e)) => {
                        self.state.error = Some(e);
                        self.state.gone = true;
                    }
                    None => {}
                }
            }
            Feed::Outside { .. } => {}
        }
    }
}
