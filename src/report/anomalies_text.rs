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

/// The iterations a site's live allocations came from; of a trace with `steps` optimizer
/// steps, iteration `steps + 1` is what ran after the last of them (at an OOM dump, the
/// iteration that failed).
fn iterations(s: &LeakSite, steps: u32) -> String {
    if s.first_iteration == s.last_iteration {
        let after = if steps > 0 && s.first_iteration > steps {
            ", after the last step"
        } else {
            ""
        };
        format!("iteration {}{after}", s.first_iteration)
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
                    iterations(s, l.steps)
                )
            })
            .collect();
        let steps = format!(
            "{} optimizer {} seen",
            l.steps,
            if l.steps == 1 { "step" } else { "steps" }
        );
        // Sites that made live allocations in several iterations come first: when the first
        // did not, none did, and what is alive is what single iterations made: what the run
        // kept (its weights, its optimizer's state), or what the iteration after the last step
        // holds; only steps can tell either from growth.
        let growing = l.sites.first().is_some_and(|s| s.iterations > 1);
        out.push(if l.steps > 0 && !growing {
            format!(
                "{indent}leak suspects: none: nothing alive at the trace's end was made in more \
                 than one iteration ({steps}); each made in one iteration: {} (requested) in {}: {}",
                Bytes(l.bytes),
                count(l.count as u64, "allocation", "allocations"),
                sites.join("; ")
            )
        } else {
            format!(
                "{indent}leak suspects: {} (requested) in {} made in the trace is alive at its \
                 end ({steps}): {}",
                Bytes(l.bytes),
                count(l.count as u64, "allocation", "allocations"),
                sites.join("; ")
            )
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::anomalies::LeakSuspects;

    fn site(name: &str, first: u32, last: u32, iterations: u32) -> LeakSite {
        LeakSite {
            site: name.to_string(),
            bytes: 1 << 20,
            count: 2,
            first_iteration: first,
            last_iteration: last,
            iterations,
        }
    }

    /// The leak-suspect line of anomalies with these steps and sites (growing sites first, as
    /// `account::anomalies` sorts them).
    fn leak_line(steps: u32, sites: Vec<LeakSite>) -> String {
        let a = Anomalies {
            leak_suspects: LeakSuspects {
                count: 2 * sites.len(),
                bytes: (1 << 20) * sites.len() as u64,
                steps,
                sites,
            },
            ..Anomalies::default()
        };
        let lines = lines(&a, 10, "");
        lines
            .into_iter()
            .find(|l| l.starts_with("leak suspects"))
            .expect("a leak-suspect line")
    }

    #[test]
    fn a_site_alive_from_several_iterations_is_a_suspect() {
        let line = leak_line(
            3,
            vec![site("grow.py:5", 1, 3, 2), site("adam.py:74", 1, 1, 1)],
        );
        assert!(
            line.starts_with(
                "leak suspects: 2.00 MiB (requested) in 4 allocations made in the trace is alive \
                 at its end (3 optimizer steps seen): 1.00 MiB at grow.py:5 (2 allocs, \
                 iterations 1 to 3, 2 of them)"
            ),
            "{line}"
        );
    }

    /// What single iterations made is no suspect; at an OOM dump, what the failing iteration
    /// holds is in flight, not kept, and the line says it was made after the last step.
    #[test]
    fn what_single_iterations_made_is_no_suspect_and_says_if_after_the_last_step() {
        let kept = leak_line(1, vec![site("adam.py:74", 1, 1, 1)]);
        assert_eq!(
            kept,
            "leak suspects: none: nothing alive at the trace's end was made in more than one \
             iteration (1 optimizer step seen); each made in one iteration: 1.00 MiB \
             (requested) in 2 allocations: 1.00 MiB at adam.py:74 (2 allocs, iteration 1)"
        );
        let in_flight = leak_line(
            4,
            vec![site("model.py:24", 5, 5, 1), site("adam.py:74", 1, 1, 1)],
        );
        assert!(
            in_flight.ends_with(
                "(4 optimizer steps seen); each made in one iteration: 2.00 MiB (requested) in 4 \
                 allocations: 1.00 MiB at model.py:24 (2 allocs, iteration 5, after the last \
                 step); 1.00 MiB at adam.py:74 (2 allocs, iteration 1)"
            ),
            "{in_flight}"
        );
    }

    #[test]
    fn without_a_step_growth_cannot_be_told_and_all_are_suspects() {
        let line = leak_line(0, vec![site("serve.py:9", 1, 1, 1)]);
        assert!(
            line.starts_with("leak suspects: 1.00 MiB (requested) in 2 allocations made"),
            "{line}"
        );
        assert!(line.contains("(0 optimizer steps seen)"), "{line}");
    }
}
