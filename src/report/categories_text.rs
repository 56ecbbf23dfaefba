//! Text lines for the categories of live memory and the phases of a trace, as `analyze` and
//! `view` show them.

use super::terminal_text::terminal_text;
use crate::analysis::categories::{Categories, CategoryBytes, Phase};
use crate::model::Bytes;

/// Phases listed in text (`--json` has them all).
const PHASES_SHOWN: usize = 16;

/// `name bytes (percent)` for each category, largest first.
pub fn breakdown(list: &[CategoryBytes]) -> String {
    let total = list.iter().fold(0u64, |a, c| a.wrapping_add(c.bytes));
    if list.is_empty() {
        return "nothing alive".to_string();
    }
    list.iter()
        .map(|c| {
            let share = if total == 0 {
                0.0
            } else {
                c.bytes as f64 * 100.0 / total as f64
            };
            format!(
                "{} {} ({share:.0}%)",
                terminal_text(&c.category),
                Bytes(c.bytes)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn total(list: &[CategoryBytes]) -> Bytes {
    Bytes(list.iter().fold(0u64, |a, c| a.wrapping_add(c.bytes)))
}

/// One line per moment, indented by `indent`.
pub fn moments(c: &Categories, has_peak: bool, indent: &str) -> Vec<String> {
    let mut lines = vec![format!("{indent}what the live memory is:")];
    let mut moment = |when: &str, list: &[CategoryBytes]| {
        lines.push(format!(
            "{indent}  {when:<12} {:>10}: {}",
            total(list).to_string(),
            breakdown(list)
        ));
    };
    if has_peak {
        moment("at the peak", &c.at_peak);
    }
    if let Some(oom) = &c.at_oom {
        moment("at the OOM", oom);
    }
    moment("at the dump", &c.at_dump);
    lines
}

/// The phase table: name, peak, live at entry, top categories at the peak.
pub fn phases(phases: &[Phase], indent: &str) -> Vec<String> {
    let Some(first) = phases.first() else {
        return Vec::new();
    };
    let source = if first.source == "annotation" {
        "record_function ranges"
    } else {
        "from the stacks"
    };
    let width = phases
        .iter()
        .take(PHASES_SHOWN)
        .map(|p| p.name.chars().count().min(48))
        .max()
        .unwrap_or(5)
        .max(5);
    let mut lines = vec![
        format!("{indent}phases ({source}):"),
        format!(
            "{indent}  {:<width$} {:>10} {:>10}  top categories at the phase's peak",
            "phase", "peak", "at entry"
        ),
    ];
    for p in phases.iter().take(PHASES_SHOWN) {
        let name: String = p.name.chars().take(48).collect();
        lines.push(format!(
            "{indent}  {:<width$} {:>10} {:>10}  {}",
            terminal_text(&name).to_string(),
            Bytes(p.peak_bytes).to_string(),
            Bytes(p.at_entry_bytes).to_string(),
            breakdown(&p.top_categories)
        ));
    }
    if phases.len() > PHASES_SHOWN {
        lines.push(format!(
            "{indent}  ... and {} more (--json lists them)",
            phases.len() - PHASES_SHOWN
        ));
    }
    lines
}
