//! `memprof report`: one self-contained HTML page (no script, no external file or font) with
//! each device's summary, its plots as inline SVG (the timeline twice: by site and by category), the top sites with their stacks and the OOM.
//! Every text that comes from the file is escaped.

use crate::analysis::categories::CategoryRules;
use crate::analysis::{site_text, DeviceAnalysis};
use crate::model::{count, Bytes, Snapshot};
use crate::report::plot::{self, Format, Kind, PlotError, Stacking};
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
code{font-size:.95em}.muted{color:#777}";

/// The page for one snapshot: `name` is the file's name, `top` the sites listed per device,
/// `only` one device.
pub fn report(
    snapshot: &Snapshot,
    name: &str,
    analyses: &[DeviceAnalysis],
    warnings: &[String],
) -> Result<String, PlotError> {
    let mut page = String::new();
    let title = format!("memprof report: {}", escape(name));
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>\n\
         <p class=\"muted\">Written by memprof {}. Sizes in binary units (1 GiB = 2<sup>30</sup> \
         bytes). Active memory is the requested size of live allocations; reserved is what the \
         allocator holds from the driver.</p>\n",
        env!("CARGO_PKG_VERSION")
    );
    for warning in warnings {
        let _ = writeln!(page, "<p class=\"muted\">warning: {}</p>", escape(warning));
    }
    if analyses.is_empty() {
        page.push_str("<p>No device has segments or trace entries.</p>\n");
    }
    for analysis in analyses {
        let device = analysis.device;
        let _ = writeln!(page, "<h2>Device {device}</h2>");
        summary(&mut page, analysis);
        oom(&mut page, analysis);
        let by_category = Stacking::Category(CategoryRules::default());
        let plots = Kind::ALL.into_iter().flat_map(|kind| match kind {
            Kind::Timeline => vec![(kind, &Stacking::Site), (kind, &by_category)],
            _ => vec![(kind, &Stacking::Site)],
        });
        for (kind, stacking) in plots {
            let svg = plot::plot(snapshot, name, device, kind, stacking, Format::Svg)?;
            page.push_str("<div class=\"plot\">");
            // Inline SVG needs no namespace in HTML; dropping it keeps the page free of URLs.
            let svg = String::from_utf8_lossy(&svg).replacen(SVG_NAMESPACE, "", 1);
            page.push_str(&svg);
            page.push_str("</div>\n");
        }
        sites(&mut page, analysis);
        super::html_categories::section(&mut page, analysis);
    }
    page.push_str("</body></html>\n");
    Ok(page)
}

fn row(page: &mut String, label: &str, value: String) {
    let _ = writeln!(
        page,
        "<tr><th>{label}</th><td class=\"n\">{}</td></tr>",
        escape(&value)
    );
}

fn summary(page: &mut String, d: &DeviceAnalysis) {
    let l = &d.layout;
    let t = &d.trace;
    page.push_str(
        "<table><caption class=\"muted\">The layout at the snapshot (the end of the trace), \
         then the trace's peaks</caption>\n",
    );
    row(
        page,
        "reserved",
        format!(
            "{} in {}, {}",
            Bytes(l.reserved_bytes),
            count(l.segments as u64, "segment", "segments"),
            count(l.blocks as u64, "block", "blocks")
        ),
    );
    row(page, "allocated", Bytes(l.allocated_bytes).to_string());
    row(
        page,
        "active (allocated + pending free)",
        Bytes(l.active_bytes).to_string(),
    );
    row(page, "requested", Bytes(l.requested_bytes).to_string());
    let f = &l.fragmentation;
    row(
        page,
        "lost to rounding (internal)",
        Bytes(f.internal_bytes).to_string(),
    );
    row(
        page,
        "cached free (external)",
        Bytes(f.external_bytes).to_string(),
    );
    row(
        page,
        "largest free block",
        Bytes(f.largest_free_block_bytes).to_string(),
    );
    row(page, "trace entries", t.entries.to_string());
    let at = match (t.peak_entry_index, t.peak_offset_us) {
        (Some(i), Some(us)) => format!(" at entry {i}, {:.3} s into the trace", us as f64 / 1e6),
        (Some(i), None) => format!(" at entry {i}"),
        (None, _) => String::new(),
    };
    row(
        page,
        "peak active",
        format!("{}{at}", Bytes(t.peak_active_bytes)),
    );
    if let Some(site) = &t.peak_site {
        row(page, "peak reached by", site.clone());
    }
    row(
        page,
        "peak reserved",
        Bytes(t.peak_reserved_bytes).to_string(),
    );
    row(
        page,
        "alive before the trace",
        Bytes(t.before_trace_bytes).to_string(),
    );
    if t.inconsistencies > 0 {
        let first = t.first_inconsistency.clone().unwrap_or_default();
        row(
            page,
            "inconsistent entries",
            format!("{} (first: {first})", t.inconsistencies),
        );
    }
    page.push_str("</table>\n");
}

fn oom(page: &mut String, d: &DeviceAnalysis) {
    let Some(oom) = &d.oom else { return };
    let free = oom.device_free_bytes.map_or_else(
        || "an unrecorded amount".to_string(),
        |b| Bytes(b).to_string(),
    );
    // The state at the OOM (replayed), never the dump's: tensors freed by the exception
    // before the dump would make the cache look free.
    let state = match &oom.at_oom {
        Some(a) => {
            let largest = a
                .largest_free_block_bytes
                .map_or_else(|| "not known".to_string(), |l| Bytes(l).to_string());
            format!(
                " At the OOM the allocator held {} reserved, {} of it allocated, {} free in \
                 its cache; the largest free block was {largest}.",
                Bytes(a.reserved_bytes),
                Bytes(a.allocated_bytes),
                Bytes(a.free_in_cache_bytes)
            )
        }
        None => " The state at the OOM could not be replayed.".to_string(),
    };
    let cause = oom
        .diagnosis
        .as_ref()
        .map(|g| format!(" Cause: {}. {}", g.cause.name(), g.evidence))
        .unwrap_or_default();
    let _ = writeln!(
        page,
        "<div class=\"oom\"><strong>Out of memory</strong> at entry {}: a request of {} failed \
         with {} free on the device.{}{}<br>Site: <code>{}</code></div>",
        oom.entry_index,
        Bytes(oom.request_bytes),
        escape(&free),
        escape(&state),
        escape(&cause),
        escape(&oom.site)
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
