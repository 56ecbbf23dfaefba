//! The tree pane of `view`: what is live at the cursor as the caller-first tree of
//! `memprof tree` (`report::tree_at`), one row per shown node, a node's children shown when it
//! is open. Pure: the rows follow from the tree and the set of open nodes.

use super::ViewApp;
use crate::analysis::live_tree::Node;
use crate::model::Bytes;
use crate::report::terminal_text::terminal_text;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};
use std::collections::BTreeSet;

/// A node's place: the names from the root's child down to it (the root is `[]`).
pub type Path = Vec<String>;

/// One row of the pane.
pub struct Row<'a> {
    pub depth: usize,
    pub path: Path,
    pub node: &'a Node,
    pub open: bool,
}

/// The rows shown: the root, then the children of every open node, depth first.
pub fn rows<'a>(root: &'a Node, open: &BTreeSet<Path>) -> Vec<Row<'a>> {
    fn walk<'a>(
        n: &'a Node,
        path: Path,
        depth: usize,
        open: &BTreeSet<Path>,
        out: &mut Vec<Row<'a>>,
    ) {
        let is_open = open.contains(&path);
        out.push(Row {
            depth,
            path: path.clone(),
            node: n,
            open: is_open,
        });
        if is_open {
            for c in &n.children {
                let mut p = path.clone();
                p.push(c.name.clone());
                walk(c, p, depth + 1, open, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, Vec::new(), 0, open, &mut out);
    out
}

/// Draws the pane: the selected row highlighted and kept in sight.
pub fn render(app: &ViewApp, area: Rect, buf: &mut Buffer) {
    let theme = &app.theme;
    let Some((_, tree)) = app.cursor_tree.as_ref() else {
        Paragraph::new("no tree here").render(area, buf);
        return;
    };
    let root = &tree.root;
    let rows = rows(root, &app.state.tree_open);
    let height = area.height.saturating_sub(1) as usize;
    let selected = app.state.tree_selected.min(rows.len().saturating_sub(1));
    let first = (selected + 1).saturating_sub(height.max(1));
    let mut lines = vec![Line::styled(
        format!(
            "{:>10} {:>6}  {} bytes, caller first; Enter opens / closes",
            "inclusive",
            "share",
            tree.figure.word()
        ),
        theme.muted(),
    )];
    let width = area.width as usize;
    for (i, row) in rows.iter().enumerate().skip(first).take(height) {
        let n = row.node;
        let mark = match (n.children.is_empty(), row.open) {
            (true, _) => ' ',
            (false, true) => '▾',
            (false, false) => '▸',
        };
        let head = format!(
            "{:>10} {:>5.1}%  {}{mark} ",
            Bytes(n.inclusive_bytes).to_string(),
            n.share * 100.0,
            "  ".repeat(row.depth)
        );
        let room = width.saturating_sub(head.chars().count());
        let name: String = terminal_text(&n.name)
            .to_string()
            .chars()
            .take(room)
            .collect();
        let style = if i == selected {
            theme.selected()
        } else {
            ratatui::style::Style::new()
        };
        lines.push(Line::from(vec![Span::styled(
            format!("{head}{name}"),
            style,
        )]));
    }
    Paragraph::new(lines).render(area, buf);
}
