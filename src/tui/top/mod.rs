//! `memprof top`: every GPU and the processes on them, from a `GpuSampler` (NVML, a replay or
//! the scripted fake) at a fixed interval; `state` holds what is shown, `render` draws it.

pub mod render;
pub mod state;

use super::keys::Key;
use super::theme::Theme;
use super::{Dashboard, Flow};
use crate::source::gpu::{Clock, GpuSampler};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use state::TopState;
use std::time::Duration;

/// The `top` dashboard: a sampler, the injected clock, and the state.
pub struct TopApp<'c> {
    sampler: Box<dyn GpuSampler>,
    clock: &'c dyn Clock,
    interval: Duration,
    pub state: TopState,
    pub theme: Theme,
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
        };
        app.on_tick();
        app
    }
}

impl Dashboard for TopApp<'_> {
    fn render(&self, area: Rect, buf: &mut Buffer) {
        render::render(
            &self.state,
            &self.sampler.describe(),
            &self.theme,
            area,
            buf,
        );
    }

    fn on_key(&mut self, key: Key) -> Flow {
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
        self.state.update(sample.map_err(|e| e.to_string()));
    }
}
