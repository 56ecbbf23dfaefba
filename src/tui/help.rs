//! The help overlay every dashboard shows on `?`: a centred box listing its keys.

use super::keys::Key;
use super::theme::Theme;
use super::Flow;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Widget};

/// While the help is open, any key closes it and only `q` or Ctrl-C also quit; returns `None`
/// when the help was not open and the key is the dashboard's to handle.
pub fn dismiss(open: &mut bool, key: Key) -> Option<Flow> {
    if !std::mem::replace(open, false) {
        return None;
    }
    Some(match key {
        Key::Char('q') | Key::Interrupt => Flow::Quit,
        _ => Flow::Continue,
    })
}

/// Draws the key list over the middle of `area`.
pub fn render(title: &str, keys: &[(&str, &str)], theme: &Theme, area: Rect, buf: &mut Buffer) {
    let key_width = keys
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    let text_width = keys
        .iter()
        .map(|(k, a)| key_width.max(k.chars().count()) + 2 + a.chars().count())
        .max()
        .unwrap_or(0);
    let width = (text_width as u16 + 4).min(area.width);
    let height = (keys.len() as u16 + 4).min(area.height);
    let x = area.x + (area.width - width) / 2;
    let y = area.y + (area.height - height) / 2;
    let popup = Rect::new(x, y, width, height);
    Clear.render(popup, buf);
    let mut lines: Vec<Line> = keys
        .iter()
        .map(|(k, a)| {
            Line::from(vec![
                Span::styled(format!("{k:<key_width$}"), theme.title()),
                Span::raw(format!("  {a}")),
            ])
        })
        .collect();
    lines.push(Line::raw("any key closes this help"));
    Paragraph::new(lines)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(Span::styled(format!(" {title}: keys "), theme.title())),
        )
        .render(popup, buf);
}
