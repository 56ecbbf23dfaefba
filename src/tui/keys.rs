//! Keys the dashboards understand, decoupled from the terminal library so state can be driven
//! by tests with plain values.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// One key press, as the dashboards see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Left,
    Right,
    Up,
    Down,
    /// Shift+Left / PageUp-like: a large step left.
    BigLeft,
    BigRight,
    PageUp,
    PageDown,
    Home,
    End,
    Tab,
    BackTab,
    Enter,
    Esc,
    /// Ctrl-C: quit from anywhere.
    Interrupt,
}

/// Maps a terminal key event to a `Key`; `None` for releases and keys the dashboards ignore.
pub fn from_event(event: KeyEvent) -> Option<Key> {
    if event.kind == KeyEventKind::Release {
        return None;
    }
    let shift = event.modifiers.contains(KeyModifiers::SHIFT);
    let key = match event.code {
        KeyCode::Char('c') if event.modifiers.contains(KeyModifiers::CONTROL) => Key::Interrupt,
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Left if shift => Key::BigLeft,
        KeyCode::Right if shift => Key::BigRight,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Tab => Key::Tab,
        KeyCode::BackTab => Key::BackTab,
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        _ => return None,
    };
    Some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_c_interrupts_and_releases_are_ignored() {
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(from_event(ctrl_c), Some(Key::Interrupt));
        let c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::NONE);
        assert_eq!(from_event(c), Some(Key::Char('c')));
        let shift_left = KeyEvent::new(KeyCode::Left, KeyModifiers::SHIFT);
        assert_eq!(from_event(shift_left), Some(Key::BigLeft));
        let mut release = KeyEvent::new(KeyCode::Left, KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        assert_eq!(from_event(release), None);
        assert_eq!(
            from_event(KeyEvent::new(KeyCode::F(5), KeyModifiers::NONE)),
            None
        );
    }
}
