//! The attach menu `top` offers on Enter for a process not under the shim: watch it in the
//! dashboard (top's own samples), or leave the dashboard to attach memprof's agent to the job
//! in one of `memprof attach`'s modes (a snapshot to a file, a recorded window, the OOM
//! observer armed).

use crate::tui::keys::Key;
use crate::tui::theme::Theme;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Widget, Wrap};
use std::path::PathBuf;

/// How long a window recorded from the menu lasts (Ctrl-C ends it early).
pub const RECORD_SECONDS: u64 = 30;

/// What the user chose for a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttachChoice {
    /// The attach view, fed by top's samples.
    Watch,
    /// `memprof attach PID --snapshot FILE`.
    Snapshot(PathBuf),
    /// `memprof attach PID --record SECONDS --snapshot FILE`.
    Record { seconds: u64, file: PathBuf },
    /// `memprof attach PID --on-oom FILE`.
    OnOom(PathBuf),
}

impl AttachChoice {
    /// The `memprof attach` command line that does the same, for the menu to show.
    pub fn command(&self, pid: u32) -> String {
        match self {
            AttachChoice::Watch => format!("memprof attach {pid} (here, from top's samples)"),
            AttachChoice::Snapshot(f) => {
                format!("memprof attach {pid} --snapshot {}", f.display())
            }
            AttachChoice::Record { seconds, file } => format!(
                "memprof attach {pid} --record {seconds} --snapshot {}",
                file.display()
            ),
            AttachChoice::OnOom(f) => format!("memprof attach {pid} --on-oom {}", f.display()),
        }
    }

    fn title(&self) -> &'static str {
        match self {
            AttachChoice::Watch => "watch its memory here",
            AttachChoice::Snapshot(_) => "snapshot PyTorch's allocator to a file, then analyze it",
            AttachChoice::Record { .. } => "record a window of allocations with stacks",
            AttachChoice::OnOom(_) => "arm the OOM observer: its next OOM is diagnosed",
        }
    }
}

/// What a key did to the menu.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MenuFlow {
    Stay,
    Back,
    Chose(AttachChoice),
}

/// The menu for one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachMenu {
    pub pid: u32,
    /// Why the process is not watched through the shim.
    pub why: String,
    pub selected: usize,
}

impl AttachMenu {
    pub fn new(pid: u32, why: String) -> AttachMenu {
        AttachMenu {
            pid,
            why,
            selected: 0,
        }
    }

    /// The choices, in the menu's order; files go in the current folder.
    pub fn choices(&self) -> [AttachChoice; 4] {
        let pid = self.pid;
        [
            AttachChoice::Watch,
            AttachChoice::Snapshot(PathBuf::from(format!("memprof-attach-{pid}.pickle"))),
            AttachChoice::Record {
                seconds: RECORD_SECONDS,
                file: PathBuf::from(format!("memprof-record-{pid}.pickle")),
            },
            AttachChoice::OnOom(PathBuf::from(format!("memprof-oom-{pid}.pickle"))),
        ]
    }

    /// ↑↓ (or k j) move, Enter picks, 1 to 4 pick at once, Esc or q go back.
    pub fn on_key(&mut self, key: Key) -> MenuFlow {
        let choices = self.choices();
        match key {
            Key::Up | Key::Char('k') => self.selected = self.selected.saturating_sub(1),
            Key::Down | Key::Char('j') => self.selected = (self.selected + 1).min(3),
            Key::Enter => return MenuFlow::Chose(choices[self.selected].clone()),
            Key::Char(c @ '1'..='4') => {
                let at = c as usize - '1' as usize;
                return MenuFlow::Chose(choices[at].clone());
            }
            Key::Esc | Key::Char('q') => return MenuFlow::Back,
            _ => {}
        }
        MenuFlow::Stay
    }

    /// Draws the menu over the middle of `area`.
    pub fn render(&self, theme: &Theme, area: Rect, buf: &mut Buffer) {
        let width = area.width.min(84);
        let height = area.height.min(16);
        let x = area.x + (area.width - width) / 2;
        let y = area.y + (area.height - height) / 2;
        let popup = Rect::new(x, y, width, height);
        Clear.render(popup, buf);
        let mut lines = vec![Line::styled(self.why.clone(), theme.muted())];
        for (k, choice) in self.choices().iter().enumerate() {
            let style = if k == self.selected {
                theme.selected()
            } else {
                theme.title()
            };
            lines.push(Line::from(vec![
                Span::styled(format!("{} ", k + 1), style),
                Span::styled(choice.title(), style),
            ]));
            lines.push(Line::styled(
                format!("  {}", choice.command(self.pid)),
                theme.muted(),
            ));
        }
        lines.push(Line::raw(
            "2 to 4 leave top and attach memprof's agent to the job (Python with PyTorch).",
        ));
        lines.push(Line::raw("↑↓ select  Enter or 1-4 choose  Esc back"));
        let title = format!(" attach to PID {} ", self.pid);
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(
                Block::default()
                    .borders(Borders::ALL)
                    .title(Span::styled(title, theme.title())),
            )
            .render(popup, buf);
    }
}
