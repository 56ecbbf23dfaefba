//! The report's "what the live memory is" section: one stacked bar per moment (peak, OOM,
//! dump) of the categories alive then (the phase table is in the account's text above it). Plain HTML and CSS, no script;
//! every name from the file or the command line is escaped.

use super::html::escape;
use crate::account::Figure;
use crate::analysis::categories::CategoryBytes;
use crate::analysis::DeviceAnalysis;
use crate::model::Bytes;
use std::fmt::Write;

/// A colour per built-in category, and for the user's own in turn.
fn colour(category: &str, user: &mut Vec<String>) -> &'static str {
    const USER: [&str; 6] = [
        "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78",
    ];
    match category {
        "parameter" => "#1f77b4",
        "gradient" => "#ff7f0e",
        "optimizer_state" => "#2ca02c",
        "activation" => "#d62728",
        "autograd" => "#9467bd",
        "workspace" => "#7f7f7f",
        "other" => "#c7c7c7",
        _ => {
            let i = user.iter().position(|u| u == category).unwrap_or_else(|| {
                user.push(category.to_string());
                user.len() - 1
            });
            USER[i % USER.len()]
        }
    }
}

fn bar(
    page: &mut String,
    when: &str,
    (list, figure): (&[CategoryBytes], Figure),
    user: &mut Vec<String>,
) {
    let total = list.iter().fold(0u64, |a, c| a.wrapping_add(c.bytes));
    let _ = write!(
        page,
        "<tr><th>{when}</th><td class=\"n\">{} {}</td><td style=\"width:60%\">\
         <div style=\"display:flex;height:1.4em;border:1px solid #ccc\">",
        Bytes(total),
        figure.word()
    );
    for c in list.iter().filter(|c| c.bytes > 0) {
        let share = c.bytes as f64 * 100.0 / total.max(1) as f64;
        let _ = write!(
            page,
            "<span title=\"{}: {} in {} allocations ({share:.1}%)\" \
             style=\"width:{share:.3}%;background:{}\"></span>",
            escape(&c.category),
            Bytes(c.bytes),
            c.count,
            colour(&c.category, user)
        );
    }
    page.push_str("</div></td><td>");
    let parts: Vec<String> = list
        .iter()
        .map(|c| {
            format!(
                "<span style=\"color:{}\">&#9632;</span> {} {}",
                colour(&c.category, user),
                escape(&c.category),
                Bytes(c.bytes)
            )
        })
        .collect();
    page.push_str(&parts.join(", "));
    page.push_str("</td></tr>\n");
}

pub fn section(page: &mut String, d: &DeviceAnalysis) {
    let Some(c) = &d.categories else { return };
    page.push_str(
        "<h3>What the live memory is</h3>\n<p class=\"muted\">Each allocation's category comes \
         from its call stack and its lifetime in the trace; one whose stack and lifetime do not \
         say is <code>other</code>. Each total is in allocated bytes (block sizes, as \
         <code>torch.cuda.memory_allocated()</code> counts them) where the allocator replay \
         knows them, else in the requested bytes the trace records; it says which.</p>\n\
         <table>\n",
    );
    let mut user = Vec::new();
    if d.trace.peak_entry_index.is_some() {
        bar(page, "at the peak", c.peak_shown(), &mut user);
    }
    if let Some(oom) = c.oom_shown() {
        bar(page, "at the OOM", oom, &mut user);
    }
    bar(
        page,
        "at the dump",
        (&c.at_dump, Figure::AllocatedBytes),
        &mut user,
    );
    page.push_str("</table>\n");
}
