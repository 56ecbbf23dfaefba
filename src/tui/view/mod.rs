//! `memprof view`: browse one snapshot (or recording) on the terminal. `summary` precomputes,
//! `state` holds what is looked at, `chart` and `render` draw; `ViewApp` ties them together.
//! `loading` is the screen shown while the file loads.

pub mod chart;
pub mod loading;
pub mod render;
pub mod state;
pub mod summary;
pub mod tree;

use super::keys::Key;
use super::theme::Theme;
use super::{Dashboard, Flow};
use crate::account::{DeviceAccount, DeviceReport, Figure, MomentKind, MomentQuery, TimeAxis};
use crate::analysis::categories::{CategoryBytes, CategoryRules, Classifier};
use crate::analysis::{shown_stack, DeviceAnalysis, ShownStack};
use crate::model::Snapshot;
use crate::report::tree_at::{tree_at, TreeAt};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use state::ViewState;
use summary::{CursorState, Summary};

/// Levels and the smallest share the tree pane keeps (smaller nodes fold into their caller).
const TREE_DEPTH: usize = 64;
const TREE_MIN_SHARE: f64 = 0.01;

/// One device of the file: its summary and what `analyze` says about it.
pub struct DeviceView<'a> {
    pub summary: Summary<'a>,
    /// Sorts the allocations alive at the cursor into categories: the account's, else built
    /// when the device is first shown (a twin device's account is a copy, without one).
    pub classifier: Option<Classifier<'a>>,
    /// Top sites at the peak, the OOM and its diagnosis.
    pub analysis: DeviceAnalysis,
    /// The device's account: the figures at its moments, which the cursor shows there.
    pub account: DeviceAccount,
}

/// What was built for the dashboard beside the account (by `view`'s loader, on its two
/// cores): each, where there, in the order of the account's devices.
#[derive(Default)]
pub struct Prebuilt<'a> {
    /// The classifiers the account kept (`account::build_keeping_classifiers`, with the
    /// default rules); `None` for a device it kept none of.
    pub classifiers: Vec<Option<Classifier<'a>>>,
    /// Summaries of the devices' traces (one whose device is not the next report's is
    /// left out).
    pub summaries: Vec<Summary<'a>>,
}

/// The whole `view` dashboard over one file.
pub struct ViewApp<'a> {
    /// The file's name, for the header.
    pub name: String,
    pub snapshot: &'a Snapshot,
    pub devices: Vec<DeviceView<'a>>,
    pub state: ViewState,
    /// The state at the cursor, recomputed when the cursor or device changes.
    pub at_cursor: CursorState,
    /// The categories alive at the cursor, recomputed with `at_cursor`, and the figure they
    /// add up to.
    pub cursor_categories: (Vec<CategoryBytes>, Figure),
    /// The tree of what is live at the cursor, and the entry it is at (`None`: the dump);
    /// built while the tree pane is shown.
    pub cursor_tree: Option<(Option<usize>, TreeAt)>,
    pub theme: Theme,
}

impl<'a> ViewApp<'a> {
    /// The dashboard over every analysed device; `None` when there is none. What `built`
    /// lacks for a device is built here.
    pub fn new(
        name: String,
        snapshot: &'a Snapshot,
        reports: Vec<DeviceReport>,
        built: Prebuilt<'a>,
        theme: Theme,
    ) -> Option<ViewApp<'a>> {
        let mut classifiers = built.classifiers.into_iter();
        let mut summaries = built.summaries.into_iter().peekable();
        let mut devices: Vec<DeviceView<'a>> = reports
            .into_iter()
            .map(|r| {
                let device = r.analysis.device;
                let classifier = classifiers.next().flatten();
                let summary = summaries
                    .next_if(|s| s.device == device)
                    .unwrap_or_else(|| Summary::build(snapshot, device));
                DeviceView {
                    summary,
                    classifier,
                    analysis: r.analysis,
                    account: r.account,
                }
            })
            .collect();
        // Open on the first device that ran out of memory: that is what the user came for.
        let first = devices
            .iter()
            .position(|d| d.analysis.oom.is_some())
            .unwrap_or(0);
        let mut state = fresh_state(devices.get(first)?, devices.len());
        state.device = first;
        let at_cursor = devices.get(first)?.summary.state_at(state.cursor);
        let cursor_categories = categories_at(snapshot, devices.get_mut(first)?, &at_cursor);
        Some(ViewApp {
            name,
            snapshot,
            devices,
            state,
            at_cursor,
            cursor_categories,
            cursor_tree: None,
            theme,
        })
    }

    /// The device being shown.
    pub fn device(&self) -> &DeviceView<'a> {
        &self.devices[self.state.device]
    }

    /// The selected block's stack as the blocks panel shows it (full or filtered); `None`
    /// when no block is live at the cursor or the block has no stack.
    pub fn selected_stack(&self) -> Option<ShownStack> {
        let blocks = &self.at_cursor.largest;
        let block = blocks.get(self.state.selected_block.min(blocks.len().checked_sub(1)?))?;
        Some(shown_stack(
            &self.snapshot.stacks,
            block.stack?,
            self.state.full_stack,
        ))
    }

    /// The first line of the selected block's stack that the panel shows.
    fn first_stack_line(&self) -> usize {
        self.selected_stack().map_or(0, |shown| {
            let rows = render::stack_rows(self.state.rows, self.at_cursor.largest.len());
            render::first_stack_line(&shown, rows, self.state.stack_scroll)
        })
    }

    fn refresh_cursor(&mut self) {
        if self.at_cursor.index != Some(self.state.cursor) && !self.device().summary.is_empty() {
            self.at_cursor = self.device().summary.state_at(self.state.cursor);
            self.cursor_categories = categories_at(
                self.snapshot,
                &mut self.devices[self.state.device],
                &self.at_cursor,
            );
        }
        self.refresh_tree();
    }

    /// Builds the tree at the cursor when the pane is shown and the cursor has moved (or the
    /// device changed).
    fn refresh_tree(&mut self) {
        if !self.state.tree_shown() {
            self.cursor_tree = None;
            return;
        }
        let entry = self.at_cursor.index;
        if self.cursor_tree.as_ref().is_some_and(|(e, _)| *e == entry) {
            return;
        }
        let d = self.device();
        let device = d.analysis.device;
        let entries = self.snapshot.timeline.device(device as usize);
        let query = match entry {
            Some(i) => MomentQuery::Entry(i),
            None => MomentQuery::Named(MomentKind::Dump),
        };
        let axis = TimeAxis::of(self.snapshot);
        self.cursor_tree = d.account.resolve(query, entries, axis).ok().map(|at| {
            let blocks = d.analysis.block_sizes();
            let tree = tree_at(
                self.snapshot,
                device,
                &at,
                blocks,
                TREE_DEPTH,
                TREE_MIN_SHARE,
            );
            (entry, tree)
        });
    }

    /// Opens or closes the selected node of the tree pane.
    fn toggle_tree_node(&mut self) {
        let Some((_, TreeAt { root, .. })) = &self.cursor_tree else {
            return;
        };
        let rows = tree::rows(root, &self.state.tree_open);
        let Some(row) = rows.get(self.state.tree_selected.min(rows.len().saturating_sub(1))) else {
            return;
        };
        if row.node.children.is_empty() {
            return;
        }
        let path = row.path.clone();
        if !self.state.tree_open.remove(&path) {
            self.state.tree_open.insert(path);
        }
    }
}

/// The categories of the state at the cursor: after its entry, or the dump without a trace;
/// in allocated bytes where the account knows them there, else in requested bytes.
fn categories_at<'a>(
    snapshot: &'a Snapshot,
    device: &mut DeviceView<'a>,
    at: &CursorState,
) -> (Vec<CategoryBytes>, Figure) {
    let id = device.analysis.device;
    let classifier = device
        .classifier
        .get_or_insert_with(|| Classifier::new(snapshot, id, &CategoryRules::default()));
    let Some(i) = at.index else {
        let dump = classifier.at_dump(id);
        return (dump, Figure::AllocatedBytes);
    };
    let allocated = device
        .account
        .figures_at(Some(i))
        .and_then(|f| f.allocated_bytes);
    let live = classifier.classify(Some(i));
    let names = classifier.names();
    if let (Some(a), Some(blocks)) = (allocated, device.analysis.block_sizes()) {
        if let Some(list) = live.allocated(names, blocks, a) {
            return (list, Figure::AllocatedBytes);
        }
    }
    (live.requested(names), Figure::RequestedBytes)
}

/// The opening state for a device: whole trace, cursor at the peak.
fn fresh_state(device: &DeviceView, devices: usize) -> ViewState {
    ViewState::new(
        device.summary.len(),
        devices,
        device.analysis.trace.peak_entry_index,
        device.analysis.oom.as_ref().map(|o| o.entry_index),
    )
}

impl Dashboard for ViewApp<'_> {
    fn render(&self, area: Rect, buf: &mut Buffer) {
        render::render(self, area, buf);
    }

    fn on_key(&mut self, key: Key) -> Flow {
        let had_help = self.state.help;
        // `o` on a device without an OOM goes to the next device that has one.
        if !had_help && key == Key::Char('o') && self.state.oom.is_none() {
            let n = self.devices.len();
            let other = (1..n)
                .map(|k| (self.state.device + k) % n)
                .find(|&d| self.devices[d].analysis.oom.is_some());
            if let Some(next) = other {
                let fresh = fresh_state(&self.devices[next], n);
                self.state.switch_device(next, fresh);
            }
        }
        if !had_help && matches!(key, Key::Char('[' | ']')) && self.state.stack_scroll.is_none() {
            // Scrolling starts from where the stack opened.
            self.state.stack_scroll = Some(self.first_stack_line());
        }
        if !had_help && key == Key::Enter && self.state.tree_focused() {
            self.toggle_tree_node();
        }
        let flow = self.state.on_key(key);
        if !had_help && key == Key::Char('d') {
            if let Some(next) = self.state.next_device() {
                let fresh = fresh_state(&self.devices[next], self.devices.len());
                self.state.switch_device(next, fresh);
                self.at_cursor = self.devices[next].summary.state_at(self.state.cursor);
                self.cursor_categories =
                    categories_at(self.snapshot, &mut self.devices[next], &self.at_cursor);
                self.cursor_tree = None;
            }
        }
        self.refresh_cursor();
        let rows = self.cursor_tree.as_ref().map_or(1, |(_, at)| {
            tree::rows(&at.root, &self.state.tree_open).len()
        });
        self.state.tree_selected = self.state.tree_selected.min(rows.saturating_sub(1));
        let blocks = self.at_cursor.largest.len();
        self.state.selected_block = self.state.selected_block.min(blocks.saturating_sub(1));
        if self.state.stack_scroll.is_some() {
            // Not past the last screenful.
            self.state.stack_scroll = Some(self.first_stack_line());
        }
        flow
    }

    fn on_resize(&mut self, width: u16, height: u16) {
        self.state.columns = chart::plot_columns(width);
        self.state.rows = height;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{build_keeping_classifiers, Options};
    use crate::analysis::same_devices::tests::{copy_device_zero, demo_oom_on_devices};
    use crate::diagnose::Origin;

    /// `demo_oom.pickle`'s device as devices 0 and 1: one trace, the same segments and
    /// annotations (twins, whose account is one device's, copied).
    fn twins() -> Snapshot {
        let mut s = demo_oom_on_devices(|n| vec![0..n, 0..n]);
        copy_device_zero(&mut s, 1);
        s
    }

    #[test]
    fn a_twin_device_gets_its_classifier_when_first_shown_and_the_same_categories() {
        let s = twins();
        let rules = CategoryRules::default();
        let options = Options::new(10, &rules, Origin::TorchSnapshot);
        let (account, classifiers) = build_keeping_classifiers(&s, &options);
        let built = Prebuilt {
            classifiers,
            summaries: Vec::new(),
        };
        let mut app = ViewApp::new("twins".into(), &s, account.devices, built, Theme::plain())
            .expect("two devices");
        assert_eq!(app.devices.len(), 2);
        assert!(app.devices[0].classifier.is_some(), "the account's");
        assert!(
            app.devices[1].classifier.is_none(),
            "not built before it is shown"
        );
        let first = app.cursor_categories.clone();
        assert!(!first.0.is_empty());
        app.on_key(Key::Char('d'));
        assert_eq!(app.state.device, 1);
        assert!(app.devices[1].classifier.is_some());
        assert_eq!(app.cursor_categories, first);
    }
}
