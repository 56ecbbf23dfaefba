//! What the person is looking at in `view`: the visible window of entries, the cursor, the
//! device, the focused panel, the selected block and how its stack is shown, and the help
//! overlay; and how keys change it. Pure: no terminal, no replay.

use crate::tui::keys::Key;
use crate::tui::Flow;
use std::collections::BTreeSet;

/// The panels below the chart, in Tab order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panel {
    /// Figures and the segment map at the cursor.
    Cursor,
    /// The largest live blocks at the cursor and the selected one's stack.
    Blocks,
    /// Top allocation sites at the peak.
    Sites,
    /// The OOM and its diagnosis.
    Oom,
    /// What is live at the cursor as a caller-first tree (shown with `t`).
    Tree,
    /// Pending-free stalls, leak suspects and the lifetimes of freed blocks over the trace.
    Anomalies,
}

/// The fewest entries a zoomed window shows.
const MIN_WINDOW: usize = 8;
/// Columns one big step moves the cursor.
const BIG_STEP: usize = 10;

/// The browsing state for one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewState {
    /// Entries of the current device's trace.
    pub entries: usize,
    /// The visible entries, `[start, end)`.
    pub start: usize,
    pub end: usize,
    pub cursor: usize,
    /// Columns of the chart's plot area at the current terminal size.
    pub columns: usize,
    /// Rows of the terminal.
    pub rows: u16,
    /// Index into the file's devices.
    pub device: usize,
    pub devices: usize,
    pub panels: Vec<Panel>,
    /// Index of the focused panel in `panels`.
    pub focus: usize,
    /// Row selected in the largest-blocks list.
    pub selected_block: usize,
    /// Whether the selected block's stack is shown with every frame as recorded, rather than
    /// filtered.
    pub full_stack: bool,
    /// The first stack line shown; `None` opens the stack on its site's frame.
    pub stack_scroll: Option<usize>,
    pub help: bool,
    /// Entry of the peak and of the OOM on this device, for `p` and `o`.
    pub peak: Option<usize>,
    pub oom: Option<usize>,
    /// One line for the status bar after a key that could not be done.
    pub message: Option<String>,
    /// Row selected in the tree pane.
    pub tree_selected: usize,
    /// The tree's open nodes, by path (the root is `[]`); kept as the cursor moves.
    pub tree_open: BTreeSet<Vec<String>>,
}

impl ViewState {
    /// The state opening a device: whole trace visible, cursor at the peak (else the end).
    pub fn new(entries: usize, devices: usize, peak: Option<usize>, oom: Option<usize>) -> Self {
        let mut panels = vec![Panel::Cursor, Panel::Blocks, Panel::Sites];
        if entries > 0 {
            panels.push(Panel::Anomalies);
        }
        if oom.is_some() {
            panels.push(Panel::Oom);
        }
        ViewState {
            entries,
            start: 0,
            end: entries,
            cursor: peak.unwrap_or(entries.saturating_sub(1)),
            columns: 1,
            rows: 0,
            device: 0,
            devices,
            panels,
            focus: 0,
            selected_block: 0,
            full_stack: false,
            stack_scroll: None,
            help: false,
            peak,
            oom,
            message: None,
            tree_selected: 0,
            tree_open: BTreeSet::from([Vec::new()]),
        }
    }

    /// Whether the tree pane is shown.
    pub fn tree_shown(&self) -> bool {
        self.panels.contains(&Panel::Tree)
    }

    /// Whether the tree pane has the focus.
    pub fn tree_focused(&self) -> bool {
        self.panels.get(self.focus) == Some(&Panel::Tree)
    }

    /// Switches to another device's trace, keeping the focus, the terminal size and the
    /// choice of full or filtered stacks.
    pub fn switch_device(&mut self, device: usize, fresh: ViewState) {
        let (columns, rows, focus, full_stack) =
            (self.columns, self.rows, self.focus, self.full_stack);
        let tree = self.tree_shown();
        *self = ViewState {
            device,
            columns,
            rows,
            focus: focus.min(fresh.panels.len() - 1),
            full_stack,
            ..fresh
        };
        if tree {
            self.toggle_tree();
        }
    }

    /// Shows the tree pane first and focused, or takes it away.
    fn toggle_tree(&mut self) {
        if let Some(i) = self.panels.iter().position(|&p| p == Panel::Tree) {
            self.panels.remove(i);
        } else {
            self.panels.insert(0, Panel::Tree);
        }
        self.focus = 0;
    }

    /// Entries per chart column (at least one).
    pub fn step(&self) -> usize {
        (self.end - self.start).div_ceil(self.columns.max(1)).max(1)
    }

    /// Handles a key; the caller recomputes what depends on the cursor or device.
    pub fn on_key(&mut self, key: Key) -> Flow {
        self.message = None;
        if let Some(flow) = crate::tui::help::dismiss(&mut self.help, key) {
            return flow;
        }
        match key {
            Key::Char('q') | Key::Interrupt => return Flow::Quit,
            Key::Char('?') => self.help = true,
            Key::Left | Key::Char('h') => self.move_by(-1),
            Key::Right | Key::Char('l') => self.move_by(1),
            Key::BigLeft | Key::PageUp | Key::Char('H') => self.move_by(-(BIG_STEP as i64)),
            Key::BigRight | Key::PageDown | Key::Char('L') => self.move_by(BIG_STEP as i64),
            Key::Home | Key::Char('g') => self.move_to(0),
            Key::End | Key::Char('G') => self.move_to(self.entries.saturating_sub(1)),
            Key::Char('+') | Key::Char('=') | Key::Char('z') => self.zoom_in(),
            Key::Char('-') | Key::Char('Z') => self.zoom_out(),
            Key::Char('0') => {
                self.start = 0;
                self.end = self.entries;
            }
            Key::Char('p') => match self.peak {
                Some(p) => self.move_to(p),
                None => {
                    self.message = Some("no peak above the memory alive before the trace".into())
                }
            },
            Key::Char('o') => match self.oom {
                Some(o) => {
                    self.move_to(o);
                    if let Some(i) = self.panels.iter().position(|&p| p == Panel::Oom) {
                        self.focus = i;
                    }
                }
                None => self.message = Some("this trace has no OOM".into()),
            },
            Key::Char('t') => self.toggle_tree(),
            Key::Up | Key::Char('k') if self.tree_focused() => {
                self.tree_selected = self.tree_selected.saturating_sub(1)
            }
            Key::Down | Key::Char('j') if self.tree_focused() => self.tree_selected += 1,
            Key::Up | Key::Char('k') => {
                self.selected_block = self.selected_block.saturating_sub(1);
                self.stack_scroll = None;
            }
            Key::Down | Key::Char('j') => {
                self.selected_block += 1;
                self.stack_scroll = None;
            }
            // The caller puts a stack opened on its site at its first line before these.
            Key::Char('[') => self.stack_scroll = self.stack_scroll.map(|s| s.saturating_sub(1)),
            Key::Char(']') => self.stack_scroll = self.stack_scroll.map(|s| s + 1),
            Key::Char('f') => {
                self.full_stack = !self.full_stack;
                self.stack_scroll = None;
            }
            Key::Tab => self.focus = (self.focus + 1) % self.panels.len(),
            Key::BackTab => self.focus = (self.focus + self.panels.len() - 1) % self.panels.len(),
            Key::Char('d') if self.devices > 1 => {
                // The caller swaps in the next device's state.
            }
            Key::Char('d') => self.message = Some("this file has one device".into()),
            _ => {}
        }
        Flow::Continue
    }

    /// The device `d` asks for, if the file has more than one.
    pub fn next_device(&self) -> Option<usize> {
        (self.devices > 1).then(|| (self.device + 1) % self.devices)
    }

    fn move_by(&mut self, columns: i64) {
        let delta = self.step() as i64 * columns;
        let target = (self.cursor as i64 + delta).max(0) as usize;
        self.move_to(target);
    }

    /// Puts the cursor on `index` and pans the window to show it.
    fn move_to(&mut self, index: usize) {
        if self.entries == 0 {
            return;
        }
        let index = index.min(self.entries - 1);
        if index != self.cursor {
            self.selected_block = 0;
            self.stack_scroll = None;
        }
        self.cursor = index;
        let width = self.end - self.start;
        if index < self.start {
            self.start = index;
            self.end = index + width;
        } else if index >= self.end {
            self.end = index + 1;
            self.start = self.end - width;
        }
    }

    fn zoom_in(&mut self) {
        let width = self.end - self.start;
        let target = (width / 2).max(MIN_WINDOW.min(self.entries));
        self.set_width_around_cursor(target);
    }

    fn zoom_out(&mut self) {
        let width = self.end - self.start;
        self.set_width_around_cursor(width.saturating_mul(2).min(self.entries));
    }

    fn set_width_around_cursor(&mut self, width: usize) {
        let half = width / 2;
        let start = self.cursor.saturating_sub(half).min(self.entries - width);
        self.start = start;
        self.end = start + width;
    }

    /// How many times the window is narrower than the trace.
    pub fn zoom(&self) -> f64 {
        self.entries as f64 / (self.end - self.start).max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ViewState {
        let mut s = ViewState::new(1000, 1, Some(600), None);
        s.columns = 100;
        s
    }

    #[test]
    fn cursor_moves_by_columns_and_stays_in_the_trace() {
        let mut s = state();
        assert_eq!(s.cursor, 600);
        s.on_key(Key::Right);
        assert_eq!(s.cursor, 610);
        s.on_key(Key::BigLeft);
        assert_eq!(s.cursor, 510);
        s.on_key(Key::End);
        s.on_key(Key::Right);
        assert_eq!(s.cursor, 999);
        s.on_key(Key::Home);
        s.on_key(Key::Left);
        assert_eq!(s.cursor, 0);
    }

    #[test]
    fn zoom_keeps_the_cursor_visible_and_pans_with_it() {
        let mut s = state();
        s.on_key(Key::Char('+'));
        assert_eq!((s.start, s.end), (350, 850));
        assert_eq!(s.step(), 5);
        for _ in 0..5 {
            s.on_key(Key::Char('z'));
        }
        assert_eq!(s.end - s.start, 15);
        assert!(s.start <= s.cursor && s.cursor < s.end);
        s.on_key(Key::End);
        assert_eq!((s.start, s.end), (985, 1000));
        s.on_key(Key::Char('0'));
        assert_eq!((s.start, s.end), (0, 1000));
        for _ in 0..20 {
            s.on_key(Key::Char('z'));
        }
        assert_eq!(s.end - s.start, MIN_WINDOW);
        s.on_key(Key::Char('-'));
        assert_eq!(s.end - s.start, 2 * MIN_WINDOW);
    }

    #[test]
    fn help_swallows_the_next_key_and_q_quits() {
        let mut s = state();
        assert_eq!(s.on_key(Key::Char('?')), Flow::Continue);
        assert!(s.help);
        s.on_key(Key::Right);
        assert!(!s.help);
        assert_eq!(s.cursor, 600, "the key that closes help does nothing else");
        assert_eq!(s.on_key(Key::Char('q')), Flow::Quit);
        assert_eq!(s.on_key(Key::Interrupt), Flow::Quit);
    }

    #[test]
    fn oom_key_jumps_and_focuses_the_oom_panel_or_says_there_is_none() {
        let mut s = state();
        s.on_key(Key::Char('o'));
        assert_eq!(s.message.as_deref(), Some("this trace has no OOM"));
        let mut s = ViewState::new(50, 1, None, Some(49));
        s.columns = 10;
        assert_eq!(s.panels.last(), Some(&Panel::Oom));
        s.on_key(Key::Home);
        s.on_key(Key::Char('o'));
        assert_eq!(s.cursor, 49);
        assert_eq!(s.panels[s.focus], Panel::Oom);
        s.on_key(Key::Tab);
        assert_eq!(s.focus, 0);
    }

    #[test]
    fn an_empty_trace_never_moves() {
        let mut s = ViewState::new(0, 1, None, None);
        for key in [
            Key::Right,
            Key::End,
            Key::Char('z'),
            Key::Char('-'),
            Key::Char('p'),
        ] {
            s.on_key(key);
        }
        assert_eq!((s.start, s.end, s.cursor), (0, 0, 0));
    }
}
