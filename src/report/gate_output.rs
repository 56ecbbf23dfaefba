//! What the gate prints and writes: the text verdict, a Markdown summary for pull-request
//! comments, and JUnit XML for CI test reports.

use super::gate::{Check, Growth, Metric};
use super::site_identity::SiteChanges;
use super::terminal_text::{code_fence, code_span, markdown_text, markup_text, terminal_text};
use crate::analysis::is_user_label;
use crate::model::{count, Bytes};
use std::fmt::Write;

/// Stack frames shown under a growing site: the user's own, innermost first.
const FRAMES_SHOWN: usize = 6;

fn user_frames(stack: &[String]) -> impl Iterator<Item = &String> + '_ {
    stack.iter().filter(|f| is_user_label(f)).take(FRAMES_SHOWN)
}

fn change(check: &Check) -> String {
    match (check.baseline, check.increase()) {
        (Some(base), Some(inc)) => format!(
            "{} -> {} ({:+.1}%)",
            Bytes(base),
            Bytes(check.measured),
            inc * 100.0
        ),
        (Some(base), None) => format!("{} -> {}", Bytes(base), Bytes(check.measured)),
        (None, _) => Bytes(check.measured).to_string(),
    }
}

/// What a site did: how it grew against the baseline, or without one what it holds.
fn site_change(check: &Check, g: &Growth) -> String {
    match check.baseline {
        Some(_) => format!(
            "grew by {} ({} -> {})",
            Bytes(g.after - g.before),
            Bytes(g.before),
            Bytes(g.after)
        ),
        None => format!("holds {}", Bytes(g.after)),
    }
}

fn subject(check: &Check) -> String {
    format!(
        "rank {} ({}) device {}",
        check.rank,
        terminal_text(&check.input),
        check.device
    )
}

/// The verdict for a terminal or a CI log.
pub fn text(checks: &[Check]) -> String {
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let mut out = String::new();
    let verdict = if failed == 0 { "PASS" } else { "FAIL" };
    let _ = writeln!(
        out,
        "memprof gate: {verdict} ({failed} of {} failed)",
        count(checks.len() as u64, "check", "checks")
    );
    for c in checks {
        let status = if c.passed() { "ok  " } else { "FAIL" };
        let _ = writeln!(
            out,
            "  {status} {}: {} {}",
            subject(c),
            c.label(),
            change(c)
        );
        for why in &c.failures {
            let _ = writeln!(out, "       {}", terminal_text(why));
        }
        if !c.passed() && !c.grew.is_empty() {
            let title = match (c.baseline, c.metric) {
                (Some(_), Metric::LeftAlive) => "sites that left more alive:",
                (None, Metric::LeftAlive) => "sites that left most alive:",
                (Some(_), _) if !c.peak_known => "sites that grew most at the dump:",
                (None, _) if !c.peak_known => "largest sites at the dump:",
                (Some(_), _) => "sites that grew most at the peak:",
                (None, _) => "largest sites at the peak:",
            };
            let _ = writeln!(out, "       {title}");
            for g in &c.grew {
                let frame = terminal_text(&g.frame);
                let _ = match c.baseline {
                    Some(_) => writeln!(
                        out,
                        "         +{:>11}  {frame}  ({} -> {})",
                        Bytes(g.after - g.before).to_string(),
                        Bytes(g.before),
                        Bytes(g.after)
                    ),
                    // Nothing to grow from: the site's bytes alone.
                    None => writeln!(out, "          {:>11}  {frame}", Bytes(g.after).to_string()),
                };
                for frame in user_frames(&g.stack) {
                    let _ = writeln!(out, "                      {}", terminal_text(frame));
                }
            }
            if let Some(changes) = &c.changes {
                out.push_str(&other_changes(changes));
            }
        }
    }
    out
}

/// Below the grown sites: what shrank and disappeared, and everything else, so that the rows
/// add up to the total change.
fn other_changes(c: &SiteChanges) -> String {
    let mut out = String::new();
    for (title, list) in [("shrank:", &c.shrank), ("disappeared:", &c.disappeared)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(out, "       {title}");
        for d in list {
            let _ = writeln!(
                out,
                "         {:>12}  {}  ({} -> {})",
                signed_bytes(d.delta()),
                terminal_text(&d.site),
                Bytes(d.before_bytes),
                Bytes(d.after_bytes)
            );
        }
    }
    let _ = writeln!(
        out,
        "       everything else: {} (total change {})",
        signed_bytes(c.everything_else_bytes),
        signed_bytes(c.total_change_bytes)
    );
    out
}

/// `+1.00 GiB`, `-512 B`, `+0 B`.
pub fn signed_bytes(delta: i128) -> String {
    let magnitude = u64::try_from(delta.unsigned_abs()).unwrap_or(u64::MAX);
    let sign = if delta < 0 { '-' } else { '+' };
    format!("{sign}{}", Bytes(magnitude))
}

/// Text for a table cell or a line: non-printing characters escaped (a newline too, which
/// would end the row), and `|`, which would end the cell.
fn markdown_cell(text: &str) -> String {
    markdown_text(text)
}

/// A Markdown summary for a pull-request comment.
pub fn markdown(checks: &[Check]) -> String {
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### memprof gate: {}\n",
        if failed == 0 { "passed" } else { "failed" }
    );
    let _ = writeln!(
        out,
        "| rank | input | device | metric | baseline | current | change | result |"
    );
    let _ = writeln!(out, "|---:|---|---:|---|---:|---:|---:|---|");
    for c in checks {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            c.rank,
            markdown_cell(&c.input),
            c.device,
            c.label(),
            c.baseline
                .map_or_else(|| "-".to_string(), |b| Bytes(b).to_string()),
            Bytes(c.measured),
            c.increase()
                .map_or_else(|| "-".to_string(), |i| format!("{:+.1}%", i * 100.0)),
            if c.passed() { "pass" } else { "**fail**" }
        );
    }
    for c in checks.iter().filter(|c| !c.passed()) {
        let _ = writeln!(out, "\n**{}**", markdown_cell(&subject(c)));
        for why in &c.failures {
            let _ = writeln!(out, "- {}", markdown_cell(why));
        }
        for g in &c.grew {
            let _ = writeln!(out, "- {} {}", code_span(&g.frame), site_change(c, g));
            // The stack folds away in a pull-request comment; a fenced block keeps it verbatim.
            let frames: Vec<String> = user_frames(&g.stack)
                .map(|f| terminal_text(f).to_string())
                .collect();
            if !frames.is_empty() {
                let fence = code_fence(frames.iter().map(String::as_str));
                let _ = writeln!(out, "  <details><summary>stack</summary>\n\n  {fence}");
                for frame in &frames {
                    let _ = writeln!(out, "  {frame}");
                }
                let _ = writeln!(out, "  {fence}\n  </details>");
            }
        }
    }
    out
}

fn xml_escape(text: &str) -> String {
    markup_text(text)
}

/// JUnit XML: one test case per rank and device. Hand-written: a dozen lines of XML do not
/// need an XML crate.
pub fn junit(checks: &[Check]) -> String {
    let failed = checks.iter().filter(|c| !c.passed()).count();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"memprof gate\" tests=\"{}\" failures=\"{failed}\" errors=\"0\">",
        checks.len()
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"memprof gate\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" skipped=\"0\">",
        checks.len()
    );
    for c in checks {
        let name = xml_escape(&format!("{} {}", subject(c), c.metric.key()));
        let _ = write!(
            out,
            "    <testcase classname=\"memprof.gate\" name=\"{name}\""
        );
        if c.passed() {
            let _ = writeln!(out, "/>");
            continue;
        }
        let _ = writeln!(out, ">");
        let message = xml_escape(&c.failures.join("; "));
        let mut details = String::new();
        for g in &c.grew {
            let _ = writeln!(details, "{} {}", g.frame, site_change(c, g));
            for frame in user_frames(&g.stack) {
                let _ = writeln!(details, "    {frame}");
            }
        }
        let _ = writeln!(
            out,
            "      <failure message=\"{message}\" type=\"memory_regression\">{}</failure>",
            xml_escape(&details)
        );
        let _ = writeln!(out, "    </testcase>");
    }
    let _ = writeln!(out, "  </testsuite>\n</testsuites>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing() -> Check {
        Check {
            rank: 0,
            input: "a<b>.pickle".into(),
            device: 1,
            metric: Metric::PeakActive,
            measured: 3 << 30,
            baseline: Some(2 << 30),
            failures: vec![
                "peak requested grew from 2.00 GiB to 3.00 GiB (+50.0%), more than the allowed +5.0%"
                    .into(),
            ],
            grew: vec![Growth {
                frame: "/w/model.py:42:forward".into(),
                before: 1 << 30,
                after: 2 << 30,
                stack: vec!["??:0:malloc".into(), "/w/model.py:42:forward".into()],
            }],
            changes: None,
            peak_known: true,
        }
    }

    #[test]
    fn text_names_the_failure_and_the_growing_site_with_its_stack() {
        let text = text(&[failing()]);
        assert!(text.starts_with("memprof gate: FAIL (1 of 1 check failed)"));
        assert!(text.contains("+50.0%"));
        assert!(
            text.contains("+   1.00 GiB  /w/model.py:42:forward  (1.00 GiB -> 2.00 GiB)"),
            "{text}"
        );
        assert!(
            !text.contains("malloc"),
            "native frames are left out: {text}"
        );
    }

    #[test]
    fn junit_escapes_and_counts() {
        let xml = junit(&[failing()]);
        assert!(xml.contains("tests=\"1\" failures=\"1\""));
        assert!(xml.contains("name=\"rank 0 (a&lt;b&gt;.pickle) device 1 peak_active\""));
        assert!(xml.contains("<failure message=\"peak requested grew"));
        assert_eq!(
            xml.matches("<testcase").count(),
            xml.matches("</testcase>").count()
        );
    }

    /// Without a baseline a site did not grow from 0 B: it holds its bytes.
    #[test]
    fn without_a_baseline_a_site_holds_its_bytes() {
        let mut check = failing();
        check.baseline = None;
        check.grew[0].before = 0;
        let site = "/w/model.py:42:forward";
        assert!(text(std::slice::from_ref(&check))
            .contains(&format!("             2.00 GiB  {site}\n")));
        assert!(markdown(std::slice::from_ref(&check))
            .contains(&format!("- `{site}` holds 2.00 GiB\n")));
        let xml = junit(&[check]);
        assert!(xml.contains(&format!("{site} holds 2.00 GiB")), "{xml}");
        assert!(
            !xml.contains("0 B -&gt;") && !xml.contains("0 B ->"),
            "{xml}"
        );
    }

    #[test]
    fn markdown_table_has_one_row_per_check() {
        let md = markdown(&[failing()]);
        assert!(md.starts_with("### memprof gate: failed"));
        assert!(
            md.contains(
                "| 0 | a&lt;b&gt;.pickle | 1 | peak requested | 2.00 GiB | 3.00 GiB | +50.0% | **fail** |"
            ),
            "{md}"
        );
    }
}
