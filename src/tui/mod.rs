//! Terminal dashboards (`memprof view`, `memprof top`): pure state and pure rendering over the
//! model and analyses; `terminal.rs` is the only file that touches the real terminal.

pub mod attach;
pub mod help;
pub mod keys;
pub mod terminal;
pub mod theme;
pub mod top;
pub mod view;

use keys::Key;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use std::time::Duration;

/// What the event loop does after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Quit,
}

/// A dashboard the terminal loop drives: it renders into a buffer, takes keys, and may want
/// a periodic tick (a live sampler); without one the loop sleeps until a key or a resize.
pub trait Dashboard {
    /// Draws the whole screen into `buf` over `area`; pure, no I/O.
    fn render(&self, area: Rect, buf: &mut Buffer);
    /// Handles one key.
    fn on_key(&mut self, key: Key) -> Flow;
    /// The terminal changed size (also called once before the first frame).
    fn on_resize(&mut self, width: u16, height: u16);
    /// How often `on_tick` wants to run; `None`: never.
    fn tick_every(&self) -> Option<Duration> {
        None
    }
    /// Periodic work (take a sample).
    fn on_tick(&mut self) {}
    /// Whether the dashboard is done and hands the terminal back to its caller (a loading
    /// screen once the load is over), checked after each frame.
    fn finished(&self) -> bool {
        false
    }
}
