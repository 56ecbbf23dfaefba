//! Text lines for the categories of live memory and the phases of a trace, as `analyze` and
//! `view` show them.

use super::terminal_text::terminal_text;
use crate::account::Figure;
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

/// One line per moment, indented by `indent`: the trace's moments in allocated bytes where the
/// account knows them (else requested bytes), the dump in allocated bytes.
pub fn moments(c: &Categories, has_peak: bool, indent: &str) -> Vec<String> {
    let mut shown: Vec<(&str, &[CategoryBytes], Figure)> = Vec::new();
    if has_peak {
        let (list, figure) = c.peak_shown();
        shown.push(("at the peak", list, figure));
    }
    if let Some((list, figure)) = c.oom_shown() {
        shown.push(("at the OOM", list, figure));
    }
    let requested: Vec<&str> = shown
        .iter()
        .filter(|s| s.2 == Figure::RequestedBytes)
        .map(|s| s.0.trim_start_matches("at "))
        .collect();
    let unit = if requested.is_empty() {
        "in allocated bytes".to_string()
    } else if requested.len() == shown.len() {
        "the trace's moments in requested bytes, the dump in allocated bytes".to_string()
    } else {
        format!(
            "in allocated bytes, {} in requested bytes",
            requested.join(" and ")
        )
    };
    shown.push(("at the dump", &c.at_dump, Figure::AllocatedBytes));
    let mut lines = vec![format!("{indent}what the live memory is ({unit}):")];
    for (when, list, figure) in shown {
        lines.push(format!(
            "{indent}  {when:<12} {:>10} {:<9}: {}",
            total(list).to_string(),
            figure.word(),
            breakdown(list)
        ));
    }
    lines
}

/// The phase table, one row per phase name: how often it ran, its highest peak, what was live
/// when that run began, and the top categories at that peak. `trace_peak` is the device's peak
/// of active memory (bytes, entry index): the row whose run holds it is marked, and a peak that
/// no annotated range holds is said so.
pub fn phases(phases: &[Phase], trace_peak: Option<(u64, usize)>, indent: &str) -> Vec<String> {
    let Some(first) = phases.first() else {
        return Vec::new();
    };
    let annotated = first.source == "annotation";
    let source = if annotated {
        "record_function ranges"
    } else {
        "from the stacks"
    };
    let holds_peak = |p: &Phase| {
        trace_peak.is_some_and(|(_, entry)| p.start_entry <= entry && entry < p.end_entry)
    };
    // Rows in the order each phase first ran; each keeps its highest run (its name says which
    // iteration, for phases found from the stacks).
    let mut rows: Vec<(&Phase, usize, bool)> = Vec::new();
    for p in phases {
        match rows
            .iter_mut()
            .find(|(r, _, _)| kind_of(&r.name) == kind_of(&p.name))
        {
            Some((best, runs, peak)) => {
                *runs += 1;
                *peak |= holds_peak(p);
                if p.peak_bytes > best.peak_bytes {
                    *best = p;
                }
            }
            None => rows.push((p, 1, holds_peak(p))),
        }
    }
    let width = rows
        .iter()
        .take(PHASES_SHOWN)
        .map(|(p, _, _)| p.name.chars().count().min(48))
        .max()
        .unwrap_or(5)
        .max(5);
    let mut lines = vec![
        format!("{indent}phases ({source}; a phase that ran several times shows its highest run):"),
        format!(
            "{indent}  {:<width$} {:>5} {:>10} {:>10}  top categories at the phase's peak",
            "phase", "runs", "peak", "at start"
        ),
    ];
    for (p, runs, peak) in rows.iter().take(PHASES_SHOWN) {
        let name: String = p.name.chars().take(48).collect();
        lines.push(format!(
            "{indent}  {:<width$} {runs:>5} {:>10} {:>10}  {}{}",
            terminal_text(&name).to_string(),
            Bytes(p.peak_bytes).to_string(),
            Bytes(p.at_entry_bytes).to_string(),
            breakdown(&p.top_categories),
            if *peak { "  <- the trace's peak" } else { "" }
        ));
    }
    if rows.len() > PHASES_SHOWN {
        lines.push(format!(
            "{indent}  ... and {} more (--json lists every run)",
            rows.len() - PHASES_SHOWN
        ));
    }
    if let Some((bytes, entry)) = trace_peak {
        if annotated && !phases.iter().any(holds_peak) {
            lines.push(format!(
                "{indent}  the trace's peak ({}, entry {entry}) is outside every range",
                Bytes(bytes)
            ));
        }
    }
    lines
}

/// A phase's name without the iteration a run from the stacks names (`backward (iteration 3)`).
fn kind_of(name: &str) -> &str {
    match name.rsplit_once(" (iteration ") {
        Some((kind, rest)) if rest.ends_with(')') => kind,
        _ => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, start: usize, end: usize, peak: u64) -> Phase {
        Phase {
            name: name.to_string(),
            source: "stacks",
            start_entry: start,
            end_entry: end,
            at_entry_bytes: 0,
            peak_bytes: peak,
            peak_entry_index: Some(start),
            top_categories: Vec::new(),
        }
    }

    #[test]
    fn runs_of_one_phase_make_one_row_with_the_highest_run_and_the_peak_marked() {
        let runs = [
            run("forward (iteration 1)", 0, 10, 5 << 20),
            run("backward (iteration 1)", 10, 20, 7 << 20),
            run("forward (iteration 2)", 20, 30, 6 << 20),
            run("backward (iteration 2)", 30, 40, 9 << 20),
        ];
        let lines = phases(&runs, Some((9 << 20, 35)), "");
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(lines[2].contains("forward (iteration 2)") && lines[2].contains("    2 "));
        assert!(lines[3].contains("backward (iteration 2)"), "{lines:#?}");
        assert!(lines[3].ends_with("<- the trace's peak"), "{lines:#?}");
        assert!(!lines[2].contains("<-"));
    }

    #[test]
    fn a_peak_outside_every_annotated_range_is_said() {
        let mut step = run("Optimizer.step#AdamW.step", 0, 10, 1 << 20);
        step.source = "annotation";
        let lines = phases(&[step], Some((4 << 20, 50)), "");
        assert_eq!(
            lines.last().map(String::as_str),
            Some("  the trace's peak (4.00 MiB, entry 50) is outside every range")
        );
    }
}
