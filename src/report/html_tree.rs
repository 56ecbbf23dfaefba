//! The report's memory tree: what is live at the OOM (else the peak, else the dump) as a
//! caller-first tree of nested `<details>` (no script), the one `report::tree_at` builds for
//! `memprof tree`; every frame name is escaped.

use super::html::escape;
use super::tree_at::{tree_at, TreeAt};
use crate::account::{DeviceReport, Figure, MomentKind, TimeAxis};
use crate::analysis::live_tree::Node;
use crate::model::{Bytes, Snapshot};
use std::fmt::Write;

/// Levels shown below the root, and the share under which a node folds into its parent (as
/// `memprof tree`'s defaults).
const DEPTH: usize = 12;
const MIN_SHARE: f64 = 0.01;
/// Levels open when the page loads.
const OPEN: usize = 2;

pub const STYLE: &str = ".tree details,.tree div.leaf{margin-left:1.2em}\
.tree>details{margin-left:0}.tree summary,.tree div.leaf{font-variant-numeric:tabular-nums;\
white-space:nowrap}.tree .b{display:inline-block;min-width:6.5em;text-align:right}\
.tree .s{display:inline-block;min-width:4em;text-align:right;color:#777}";

/// Writes the tree of `d` (device `d.device` of `snapshot`) on `axis`; nothing when the device
/// holds nothing.
pub fn section(page: &mut String, snapshot: &Snapshot, d: &DeviceReport, axis: TimeAxis) {
    let device = d.analysis.device;
    let entries = snapshot.timeline.device(device as usize);
    let Ok(at) = d.account.resolve(d.account.oom_else_peak(), entries, axis) else {
        return;
    };
    let TreeAt { figure, root } = tree_at(
        snapshot,
        device,
        &at,
        d.analysis.block_sizes(),
        DEPTH,
        MIN_SHARE,
    );
    if root.inclusive_bytes == 0 {
        return;
    }
    let when = match at.kind {
        Some(MomentKind::Oom) => "at the OOM",
        Some(MomentKind::Dump) => "at the dump",
        _ => "at the peak",
    };
    let place = match (at.entry, at.offset_us) {
        (Some(e), Some(us)) => format!(" (entry {e}, {:.3} s)", us as f64 / 1e6),
        (Some(e), None) => format!(" (entry {e})"),
        _ => String::new(),
    };
    let figure = match figure {
        Figure::AllocatedBytes => "Allocated bytes (block sizes)",
        Figure::RequestedBytes => "Requested bytes",
    };
    let _ = writeln!(
        page,
        "<h3>Live memory {when}{place}, caller first</h3>\n<p class=\"muted\">{figure} \
         through each frame (inclusive), allocated right there (self) and the share of \
         the total, as <code>memprof tree</code> shows them; frames under 1% fold into their \
         caller.</p>\n<div class=\"tree\" data-root-bytes=\"{}\">",
        root.inclusive_bytes
    );
    node(page, &root, 0);
    page.push_str("</div>\n");
}

fn node(page: &mut String, n: &Node, depth: usize) {
    let hidden = if n.hidden_children > 0 {
        format!(
            " <span class=\"muted\">(+{} below, not shown)</span>",
            n.hidden_children
        )
    } else {
        String::new()
    };
    let line = format!(
        "<span class=\"b\">{}</span> <span class=\"b muted\">self {}</span> <span class=\"s\">\
         {:.1}%</span> <code>{}</code>{hidden}",
        Bytes(n.inclusive_bytes),
        Bytes(n.self_bytes),
        n.share * 100.0,
        escape(&n.name)
    );
    if n.children.is_empty() {
        let _ = writeln!(page, "<div class=\"leaf\">{line}</div>");
        return;
    }
    let open = if depth < OPEN { " open" } else { "" };
    let _ = writeln!(page, "<details{open}><summary>{line}</summary>");
    for c in &n.children {
        node(page, c, depth + 1);
    }
    page.push_str("</details>\n");
}
