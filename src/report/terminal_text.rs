//! Text from an input file made safe to print on a terminal or in Markdown: control and other
//! non-printing characters become visible escapes (`\n`, `\x1b`, `\u{202e}`), so that a frame
//! name, host name, command line or path cannot retitle the window, clear the screen, move the
//! cursor, reorder what follows or start a line of its own. Markdown code spans also get a fence
//! longer than any run of backticks in the text.

use std::fmt::{self, Display, Write};

/// `text`, displayed with every non-printing character escaped (see [`needs_escape`]).
#[derive(Clone, Copy, Debug)]
pub struct TerminalText<'a>(pub &'a str);

/// Wraps `text` for display on a terminal.
pub fn terminal_text(text: &str) -> TerminalText<'_> {
    TerminalText(text)
}

/// Whether `c` must not reach a terminal as it is: C0 controls, DEL and C1 controls (ESC and
/// CSI start terminal sequences), and the invisible format characters that change how a line
/// reads: zero-width ones, bidirectional overrides and isolates, line and paragraph separators,
/// the byte-order mark. The list is written here rather than taken from a Unicode-category crate
/// for these two dozen code points.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{061c}'
                | '\u{feff}'
                | '\u{fffe}'
                | '\u{ffff}'
        )
}

/// `text` for XML, SVG and HTML (element content and quoted attribute values): non-printing
/// characters escaped as on a terminal (which also keeps out every character XML 1.0 forbids:
/// controls, U+FFFE and U+FFFF), then the markup characters as entities.
pub fn markup_text(text: &str) -> String {
    let visible = terminal_text(text).to_string();
    let mut out = String::with_capacity(visible.len());
    for c in visible.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` for Markdown prose and table cells: non-printing characters escaped, HTML's markup
/// characters as entities (so no tag from the file reaches the rendered page), and the Markdown
/// punctuation that could start a link, a code span, emphasis or a cell behind a backslash
/// (underscores stay: inside a name they emphasize nothing).
pub fn markdown_text(text: &str) -> String {
    let visible = terminal_text(text).to_string();
    let mut out = String::with_capacity(visible.len());
    for c in visible.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\\' | '`' | '*' | '[' | ']' | '|' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Writes `c` as a visible escape: `\t`, `\n`, `\r`, `\xNN` for other controls below U+0100,
/// `\u{NNNN}` above.
fn write_escape(out: &mut impl Write, c: char) -> fmt::Result {
    match c {
        '\t' => out.write_str("\\t"),
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        c if (c as u32) < 0x100 => write!(out, "\\x{:02x}", c as u32),
        c => write!(out, "\\u{{{:x}}}", c as u32),
    }
}

impl Display for TerminalText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some((at, c)) = rest.char_indices().find(|&(_, c)| needs_escape(c)) {
            f.write_str(&rest[..at])?;
            write_escape(f, c)?;
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// A whole report for a terminal, with every non-printing character but its line breaks
/// escaped: the last guard behind the escaping of each field from the file (a field that missed
/// it can send no terminal sequence, though a newline in it still starts a line).
pub fn terminal_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = write!(out, "{}", terminal_text(line));
    }
    out
}

/// `text` as a Markdown code span: non-printing characters escaped, and fenced with one backtick
/// more than its longest run of them (with a space inside the fence when the text starts or ends
/// with a backtick), so that no backtick in it ends the span.
pub fn code_span(text: &str) -> String {
    let safe = terminal_text(text).to_string();
    let fence = "`".repeat(longest_backtick_run(&safe) + 1);
    let pad = if safe.starts_with('`') || safe.ends_with('`') || safe.is_empty() {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{safe}{pad}{fence}")
}

/// The longest run of backticks in `text`.
fn longest_backtick_run(text: &str) -> usize {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    longest
}

/// The fence of a Markdown code block holding `lines`: three backticks, or one more than the
/// longest run of them in the lines, so that no line closes the block.
pub fn code_fence<'a>(lines: impl IntoIterator<Item = &'a str>) -> String {
    let longest = lines
        .into_iter()
        .map(longest_backtick_run)
        .max()
        .unwrap_or(0);
    "`".repeat((longest + 1).max(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_invisible_format_characters_are_escaped() {
        let hostile = "a\x1b]0;owned\x07b\x1b[2J\r\nc\td\u{7f}\u{9b}31m\u{202e}e\u{2028}f";
        let shown = terminal_text(hostile).to_string();
        assert_eq!(
            shown,
            "a\\x1b]0;owned\\x07b\\x1b[2J\\r\\nc\\td\\x7f\\x9b31m\\u{202e}e\\u{2028}f"
        );
        assert!(!shown.chars().any(needs_escape));
        // Printable text, accents and CJK included, is left alone.
        for plain in ["forward (model.py:42)", "café ジョブ", "C:\\path\\x1b", ""] {
            assert_eq!(terminal_text(plain).to_string(), plain);
        }
    }

    #[test]
    fn a_whole_report_keeps_its_line_breaks_only() {
        assert_eq!(
            terminal_lines("one \x1b[31mred\x1b[0m\ntwo\r\n\nthree\u{9b}"),
            "one \\x1b[31mred\\x1b[0m\ntwo\\r\n\nthree\\x9b"
        );
    }

    #[test]
    fn code_spans_are_fenced_past_every_backtick_run() {
        assert_eq!(code_span("python train.py"), "`python train.py`");
        assert_eq!(code_span("a`b"), "``a`b``");
        assert_eq!(code_span("x ``` y"), "````x ``` y````");
        assert_eq!(code_span("`start"), "`` `start ``");
        assert_eq!(code_span("end`"), "`` end` ``");
        assert_eq!(code_span(""), "`  `");
        assert_eq!(code_span("a\nb\x1b"), "`a\\nb\\x1b`");
        assert_eq!(code_fence(["a", "b"]), "```");
        assert_eq!(code_fence(["a ```` b", "c"]), "`````");
    }
}
