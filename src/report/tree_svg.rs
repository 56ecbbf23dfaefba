//! The live-memory tree as a self-contained SVG icicle: the root across the top, each node's
//! children below it, widths in proportion to inclusive bytes, a tooltip on every node.

use super::terminal_text::markup_text;
use crate::analysis::live_tree::Node;
use crate::model::Bytes;
use std::fmt::Write;

const WIDTH: f64 = 1200.0;
const ROW: f64 = 18.0;
/// Roughly how wide one character of the 11px label font is.
const CHAR: f64 = 6.5;

fn depth_of(node: &Node) -> usize {
    1 + node.children.iter().map(depth_of).max().unwrap_or(0)
}

/// The SVG document of `root`, titled `title`.
pub fn svg(root: &Node, title: &str) -> String {
    let rows = depth_of(root);
    let height = ROW * (rows as f64 + 2.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<?xml version="1.0" encoding="UTF-8"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="11">
<title>{}</title>
<text x="4" y="13">{}</text>"#,
        markup_text(title),
        markup_text(title)
    );
    node(&mut out, root, 0.0, WIDTH, ROW * 1.5, root.inclusive_bytes);
    out.push_str("</svg>\n");
    out
}

fn node(out: &mut String, n: &Node, x: f64, width: f64, y: f64, total: u64) {
    if width < 0.5 {
        return;
    }
    // A warm colour, a little darker for the nodes that hold more themselves.
    let own = if n.inclusive_bytes == 0 {
        0.0
    } else {
        n.self_bytes as f64 / n.inclusive_bytes as f64
    };
    let green = (200.0 - 120.0 * own) as u8;
    let tip = format!(
        "{}: {} inclusive, {} self, {:.1}%",
        n.name,
        Bytes(n.inclusive_bytes),
        Bytes(n.self_bytes),
        n.share * 100.0
    );
    let _ = writeln!(
        out,
        r#"<g><title>{}</title><rect x="{x:.2}" y="{y:.2}" width="{:.2}" height="{:.2}" fill="rgb(240,{green},60)" stroke="white" stroke-width="0.5"/>"#,
        markup_text(&tip),
        width,
        ROW - 1.0
    );
    let fits = ((width - 4.0) / CHAR).floor() as usize;
    if fits >= 3 {
        let label: String = if n.name.chars().count() > fits {
            let mut s: String = n.name.chars().take(fits.saturating_sub(1)).collect();
            s.push('…');
            s
        } else {
            n.name.clone()
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.2}" y="{:.2}">{}</text>"#,
            x + 2.0,
            y + ROW - 5.0,
            markup_text(&label)
        );
    }
    out.push_str("</g>\n");
    let mut cx = x;
    for c in &n.children {
        let w = if total == 0 {
            0.0
        } else {
            WIDTH * c.inclusive_bytes as f64 / total as f64
        };
        node(out, c, cx, w, y + ROW, total);
        cx += w;
    }
}
