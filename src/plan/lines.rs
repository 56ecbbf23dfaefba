//! Reading the line-oriented inputs of the planners (length lists, JSONL workloads): each
//! non-blank line with its 1-based number, one buffer reused for the whole file.

use std::io::{self, BufRead};

/// Calls `each(line_number, trimmed_text)` for every non-blank line, stopping at its first
/// error.
pub fn for_each_line<E: From<io::Error>>(
    mut reader: impl BufRead,
    mut each: impl FnMut(u64, &str) -> Result<(), E>,
) -> Result<(), E> {
    let mut line = String::new();
    let mut number = 0u64;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        number += 1;
        let text = line.trim();
        if !text.is_empty() {
            each(number, text)?;
        }
    }
}
