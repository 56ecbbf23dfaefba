//! Text lines for the anomalies of a trace (pending-free stalls, leak suspects, lifetimes of
//! freed blocks), as `analyze` prints them: three lines at most.

use super::terminal_text::terminal_text;
use crate::account::anomalies::{Anomalies, LeakSite, STALL_US};
use crate::model::{count, Bytes};

/// Leak-suspect sites named in text (`--json` has more).
const SITES_SHOWN: usize = 3;

/// `1.2 ms`, `350 us`, `4.0 s`.
fn duration(us: i64) -> String {
    match us {
        ..1_000 => format!("{us} us"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.1} s", us as f64 / 1e6),
    }
}

fn iterations(s: &LeakSite) -> String {
    if s.first_iteration == s.last_iteration {
        format!("iteration {}", s.first_iteration)
    } else {
        format!(
            "iterations {} to {}, {} of them",
            s.first_iteration, s.last_iteration, s.iterations
        )
    }
}

/// The lines, indented by `indent`; none for a device without a trace.
pub fn lines(a: &Anomalies, entries: usize, indent: &str) -> Vec<String> {
    if entries == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let s = &a.stalls;
    out.push(match s.longest.first() {
        None => format!(
            "{indent}pending-free stalls: no free waited on another stream over {}",
            duration(STALL_US)
        ),
        Some(l) => format!(
            "{indent}pending-free stalls: {} waited over {} for other streams ({} held meanwhile); \
             the longest {} for {} at {} (stream 0x{:x}, entry {})",
            count(s.count as u64, "free", "frees"),
            duration(STALL_US),
            Bytes(s.bytes),
            duration(l.wait_us),
            Bytes(l.bytes),
            terminal_text(&l.site),
            l.stream,
            l.entry
        ),
    });
    let l = &a.leak_suspects;
    if l.count == 0 {
        out.push(format!(
            "{indent}leak suspects: nothing made in the trace is alive at its end"
        ));
    } else {
        let sites: Vec<String> = l
            .sites
            .iter()
            .take(SITES_SHOWN)
            .map(|s| {
                format!(
                    "{} at {} ({}, {})",
                    Bytes(s.bytes),
                    terminal_text(&s.site),
                    count(s.count as u64, "alloc", "allocs"),
                    iterations(s)
                )
            })
            .collect();
        out.push(format!(
            "{indent}leak suspects: {} (requested) in {} made in the trace is alive at its end \
             ({} optimizer {} seen): {}",
            Bytes(l.bytes),
            count(l.count as u64, "allocation", "allocations"),
            l.steps,
            if l.steps == 1 { "step" } else { "steps" },
            sites.join("; ")
        ));
    }
    if !a.lifetimes.is_empty() {
        let mut lower = None;
        let buckets: Vec<String> = a
            .lifetimes
            .iter()
            .filter_map(|b| {
                let label = match (lower, b.below_us) {
                    (None, Some(hi)) => format!("<{}", duration(hi)),
                    (Some(lo), Some(hi)) => format!("{}-{}", duration(lo), duration(hi)),
                    (Some(lo), None) => format!(">={}", duration(lo)),
                    (None, None) => "all".to_string(),
                };
                lower = b.below_us;
                (b.count > 0).then(|| format!("{label} {}", b.count))
            })
            .collect();
        out.push(format!(
            "{indent}freed blocks by lifetime (alloc to free): {}",
            buckets.join(", ")
        ));
    }
    out
}
