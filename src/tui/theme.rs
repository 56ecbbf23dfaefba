//! Colours and emphasis. Never a background colour (light and dark terminals both stay
//! readable); with `NO_COLOR` set, only modifiers (bold, reverse), and every mark also has its
//! own character so nothing depends on colour.

use ratatui::style::{Color, Modifier, Style};
use std::ffi::OsStr;

/// The styles the dashboards use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` holds a non-empty value (no-color.org).
    pub fn from_no_color(no_color: Option<&OsStr>) -> Theme {
        Theme {
            color: no_color.is_none_or(|v| v.is_empty()),
        }
    }

    /// The theme for tests and snapshots: colour on.
    pub fn colored() -> Theme {
        Theme { color: true }
    }

    /// No colour, modifiers only.
    pub fn plain() -> Theme {
        Theme { color: false }
    }

    fn fg(&self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }

    /// Allocated (live) memory.
    pub fn allocated(&self) -> Style {
        self.fg(Color::Blue)
    }

    /// Reserved but not allocated memory.
    pub fn reserved(&self) -> Style {
        self.fg(Color::Magenta)
    }

    /// The peak marker and peak figures.
    pub fn peak(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    /// An OOM and its figures.
    pub fn oom(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    /// The cursor column and the selected row.
    pub fn selected(&self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    /// Titles and headings.
    pub fn title(&self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }

    /// Secondary text (axis labels, hints): the terminal's own colour, no dimming, which some
    /// light themes make unreadable.
    pub fn muted(&self) -> Style {
        Style::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_means_no_colours_only_modifiers() {
        let plain = Theme::from_no_color(Some(OsStr::new("1")));
        assert_eq!(plain, Theme::plain());
        assert_eq!(plain.allocated().fg, None);
        assert_eq!(plain.peak().fg, None);
        assert!(plain.peak().add_modifier.contains(Modifier::BOLD));
        let empty = Theme::from_no_color(Some(OsStr::new("")));
        assert_eq!(empty, Theme::colored());
        assert_eq!(Theme::from_no_color(None).allocated().fg, Some(Color::Blue));
        for style in [Theme::colored().allocated(), Theme::colored().peak()] {
            assert_eq!(style.bg, None, "never a background colour");
        }
    }
}
