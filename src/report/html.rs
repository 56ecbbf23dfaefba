//! `memprof report`: one self-contained HTML page (no script, no external file or font): the
//! account in the words `analyze` and `diagnose` print, then each device's plots as inline SVG
//! (the timeline twice: by site and by category), its live memory by category, the tree of
//! what is live at the OOM or the peak, and the top sites with their stacks. Every text that comes from the file is escaped.

use super::analyze_json::AnalyzeReport;
use super::terminal_text::terminal_lines;
use crate::account::TimeAxis;
use crate::analysis::categories::CategoryRules;
use crate::analysis::{site_text, DeviceAnalysis};
use crate::model::{Bytes, Snapshot};
use crate::report::plot::{self, DevicePlot, Format, Kind, PlotError, Stacking};
use crate::report::terminal_text::markup_text;
use std::fmt::Write;

/// Escapes text for HTML element content and quoted attribute values.
pub fn escape(text: &str) -> String {
    markup_text(text)
}

const SVG_NAMESPACE: &str = " xmlns=\"http://www.w3.org/2000/svg\"";

const STYLE: &str = "body{font-family:sans-serif;margin:2em auto;max-width:1300px;color:#222}\
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}\
table{border-collapse:collapse;margin:1em 0}td,th{padding:.25em .8em;text-align:left;\
border-bottom:1px solid #eee}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.oom{background:#fde8e8;border-left:5px solid #d62728;padding:.6em 1em;margin:1em 0}\
.plot svg{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0}\
details pre{background:#f6f6f6;padding:.5em;overflow-x:auto;font-size:.85em}\
code{font-size:.95em}.muted{color:#777}pre.text{white-space:pre-wrap}";

/// The page for one snapshot: `name` is the file's name. The words are the account's, as
/// `memprof analyze` and `memprof diagnose` print them (`analyze` is the report of the file,
/// `diagnosis` the text of `diagnose`), then per device its plots, the live memory by category
/// and the sites with their stacks.
pub fn report(
    snapshot: &Snapshot,
    name: &str,
    analyze: &AnalyzeReport,
    diagnosis: &str,
) -> Result<String, PlotError> {
    let mut page = String::new();
    let title = format!("memprof report: {}", escape(name));
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title><style>{STYLE}{}</style></head><body>\n<h1>{title}</h1>\n\
         <p class=\"muted\">Written by memprof {}. Sizes in binary units (1 GiB = 2<sup>30</sup> \
         bytes). The words are those of <code>memprof analyze</code> and <code>memprof \
         diagnose</code> on the same file.</p>\n",
        super::html_tree::STYLE,
        env!("CARGO_PKG_VERSION")
    );
    page.push_str("<h2>Diagnosis</h2>\n");
    text_block(&mut page, diagnosis);
    if let Some(c) = &analyze.comparison {
        page.push_str("<h2>Devices side by side</h2>\n");
        text_block(&mut page, &super::analyze_text::comparison_text(analyze, c));
    }
    let Some(input) = analyze.inputs.first() else {
        page.push_str("</body></html>\n");
        return Ok(page);
    };
    for warning in &input.warnings {
        let _ = writeln!(page, "<p class=\"muted\">warning: {}</p>", escape(warning));
    }
    if input.devices.is_empty() {
        page.push_str("<p>No device has segments or trace entries.</p>\n");
    }
    for d in &input.devices {
        let device = d.device;
        let _ = writeln!(page, "<h2>Device {device}</h2>");
        text_block(&mut page, &super::analyze_text::device_text(input, d));
        let by_category = Stacking::Category(CategoryRules::default());
        let plots = Kind::ALL.into_iter().flat_map(|kind| match kind {
            Kind::Timeline => vec![(kind, &Stacking::Site), (kind, &by_category)],
            _ => vec![(kind, &Stacking::Site)],
        });
        let of = DevicePlot {
            snapshot,
            report: d,
            axis: TimeAxis {
                origin_us: input.time_origin_us,
            },
        };
        for (kind, stacking) in plots {
            let svg = plot::plot(of, name, kind, stacking, Format::Svg)?;
            page.push_str("<div class=\"plot\">");
            // Inline SVG needs no namespace in HTML; dropping it keeps the page free of URLs.
            let svg = String::from_utf8_lossy(&svg).replacen(SVG_NAMESPACE, "", 1);
            page.push_str(&svg);
            page.push_str("</div>\n");
        }
        super::html_categories::section(&mut page, &d.analysis);
        super::html_tree::section(&mut page, snapshot, d, of.axis);
        sites(&mut page, &d.analysis);
    }
    page.push_str("</body></html>\n");
    Ok(page)
}

/// Text as the terminal shows it, escaped, in a block that keeps its lines.
fn text_block(page: &mut String, text: &str) {
    let _ = writeln!(
        page,
        "<pre class=\"text\">{}</pre>",
        escape(&terminal_lines(text))
    );
}

fn sites(page: &mut String, d: &DeviceAnalysis) {
    if d.top_sites.is_empty() {
        return;
    }
    page.push_str(
        "<h3>Alive at the peak, by allocation site</h3>\n<table><tr><th>bytes</th>\
         <th>allocations</th><th>site and stack (innermost first)</th></tr>\n",
    );
    for site in &d.top_sites {
        let lines = |frames: &[String]| -> String {
            let escaped: Vec<String> = frames.iter().map(|f| escape(f)).collect();
            escaped.join("\n")
        };
        let _ = writeln!(
            page,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td><details><summary><code>{}\
             </code></summary><pre>{}</pre><details><summary>all {} frames, as recorded\
             </summary><pre>{}</pre></details></details></td></tr>",
            Bytes(site.bytes),
            site.count,
            escape(&site_text(&site.frame, site.via.as_deref())),
            lines(&site.stack),
            site.full_stack.len(),
            lines(&site.full_stack)
        );
    }
    page.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<script>\"a\" & 'b'</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
    }
}
