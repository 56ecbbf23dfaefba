//! Plots and the HTML report through the binary: every plot kind in PNG and SVG (format, size,
//! not blank, titled), the timeline stacked by category, `analyze --plot`, bad extensions, and
//! a self-contained, escaped report.

use crate::util::{fixture, memprof, stderr, stdout, Scratch};
use memprof::analysis::categories::CategoryRules;
use memprof::report::plot::{DevicePlot, Stacking};
use memprof::source::torch_snapshot;
use serde_json::json;
use serde_json::Value;
use std::collections::HashSet;
use std::path::Path;

/// A fresh scratch folder for one test, removed when it ends.
fn scratch(name: &str) -> Scratch {
    Scratch::new(&format!("plots-{name}"))
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// Decodes a PNG and returns its size and how many distinct colours it has.
fn png_stats(bytes: &[u8]) -> (u32, u32, usize) {
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "PNG magic");
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    let px = info.color_type.samples();
    let colors: HashSet<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    (info.width, info.height, colors.len())
}

fn plot(file: &str, kind: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let input = path_str(&fixture(&format!("snapshots/{file}.pickle")));
    let out_s = path_str(out);
    let mut args = vec!["plot", input.as_str(), "--kind", kind, "-o", out_s.as_str()];
    args.extend_from_slice(extra);
    memprof(&args)
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).expect("the PNG was written");
    let (w, h, colors) = png_stats(&bytes);
    assert_eq!((w, h), (1280, 720), "{}", path.display());
    assert!(colors > 16, "{}: only {colors} colours", path.display());
}

fn assert_svg(path: &Path, title: &str) -> String {
    let text = std::fs::read_to_string(path).expect("the SVG was written");
    assert!(text.starts_with("<svg"), "{}: SVG root", path.display());
    assert!(text.trim_end().ends_with("</svg>"), "{}", path.display());
    assert!(text.contains(title), "{}: title {title:?}", path.display());
    text
}

#[test]
fn every_kind_in_png_and_svg() {
    let dir = scratch("kinds");
    let kinds = [
        (
            "timeline",
            "Memory over time - demo_oom.pickle, device 0",
            "<polyline",
        ),
        (
            "segments",
            "Segments at the peak (entry 942, rebuilt from the trace)",
            "<rect",
        ),
        ("fragmentation", "Fragmentation over time", "<polygon"),
    ];
    for (kind, title, shape) in kinds {
        let png = dir.join(format!("{kind}.png"));
        let out = plot("demo_oom", kind, &png, &[]);
        assert_eq!(out.status.code(), Some(0), "{kind}: {}", stderr(&out));
        assert_png(&png);
        let svg = dir.join(format!("{kind}.svg"));
        let out = plot("demo_oom", kind, &svg, &[]);
        assert_eq!(out.status.code(), Some(0), "{kind}: {}", stderr(&out));
        let text = assert_svg(&svg, title);
        assert!(text.contains(shape), "{kind}: has {shape}");
    }
    let svg = assert_svg(&dir.join("timeline.svg"), "peak requested 20.65 GiB");
    assert!(svg.contains("OOM: a request of 4.03 GiB failed"));
    assert!(svg.contains("memory (GiB)"));
    assert!(svg.contains("seconds from the first trace entry"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn other_fixtures_devices_and_traces_without_times() {
    let dir = scratch("others");
    let untimed = dir.join("untimed.svg");
    let out = plot("v2_1_basic", "timeline", &untimed, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_svg(&untimed, "trace entries replayed (the trace has no times");
    let dev2 = dir.join("dev2.png");
    let out = plot("multi_device", "segments", &dev2, &["--device", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_png(&dev2);
    let no_trace = dir.join("none.svg");
    let out = plot("segments_only", "fragmentation", &no_trace, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_svg(&no_trace, "No trace entries: nothing to plot over time.");
    let missing = plot(
        "multi_device",
        "timeline",
        &dir.join("x.png"),
        &["--device", "1"],
    );
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(stderr(&missing).lines().count(), 1, "{}", stderr(&missing));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn analyze_writes_the_timeline_and_still_reports() {
    let dir = scratch("analyze");
    let png = dir.join("t.png");
    let input = path_str(&fixture("snapshots/demo_oom.pickle"));
    let out = memprof(&["analyze", &input, "--plot", &path_str(&png)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("peak requested"));
    assert_png(&png);
    std::fs::remove_dir_all(&dir).ok();
}

/// `plan train --plot`: one stacked bar per listed candidate against the GPU's memory.
#[test]
fn planner_candidates_as_stacked_bars() {
    let dir = scratch("plan");
    let plan = |out: &Path, extra: &[&str]| {
        let out = path_str(out);
        let mut args = vec![
            "plan",
            "train",
            "--model",
            "llama-3-8b",
            "--gpus",
            "8",
            "--seq-len",
            "4096",
            "--micro-batch",
            "1",
            "--plot",
            out.as_str(),
        ];
        args.extend_from_slice(extra);
        memprof(&args)
    };
    let png = dir.join("plan.png");
    let out = plan(&png, &["--gpu-memory", "80GiB", "--top", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Recommended:"),
        "the text report still prints"
    );
    assert_png(&png);

    let svg = dir.join("plan.svg");
    let out = plan(&svg, &["--gpu-memory", "80GiB", "--top", "4"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = assert_svg(
        &svg,
        "Memory per GPU by candidate layout - llama-3-8b, 8 GPUs",
    );
    // Five parts per bar (the last bar may also be the widest) plus its outline.
    assert!(text.matches("<rect").count() >= 4 * 6, "bars drawn");
    for label in [
        "GPU memory 80.00 GiB",
        "optimizer states",
        "#0 dp8 tp1 pp1",
        "recommended",
        "#3 ",
    ] {
        assert!(text.contains(label), "{label:?} in the SVG");
    }
    assert!(
        !text.contains("#4 "),
        "only the listed candidates are drawn"
    );

    // On a GPU too small for any layout, the bars say so.
    let small = dir.join("small.svg");
    let out = plan(&small, &["--gpu-memory", "16GiB", "--top", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = assert_svg(&small, "Memory per GPU by candidate layout");
    assert!(text.contains("does not fit"));
    assert!(text.contains("GPU memory 16.00 GiB"));
}

#[test]
fn bad_plot_extension_is_one_line_exit_2() {
    let dir = scratch("badext");
    let input = path_str(&fixture("snapshots/demo_oom.pickle"));
    let jpg = path_str(&dir.join("t.jpg"));
    for args in [
        vec!["analyze", input.as_str(), "--plot", jpg.as_str()],
        vec!["plot", input.as_str(), "-o", jpg.as_str()],
    ] {
        let out = memprof(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("must end in .png or .svg"), "{err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert!(!dir.join("t.jpg").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn report_is_self_contained_with_summary_plots_sites_and_oom() {
    let dir = scratch("report");
    let html = dir.join("report.html");
    let input = path_str(&fixture("snapshots/demo_oom.pickle"));
    let out = memprof(&["report", &input, "-o", &path_str(&html)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).expect("report written");
    for want in [
        "<!DOCTYPE html>",
        "19.27 GiB  in 55 segments, 182 blocks",
        "peak requested  20.65 GiB  at entry 942",
        "OUT OF MEMORY at entry 1648, 0.074 s: a request of 4.03 GiB",
        "fixes, best first",
        "/home/user/train.py:99:train_step",
        "Memory over time - demo_oom.pickle",
        "Segments at the peak (entry 942, rebuilt from the trace)",
        "Fragmentation over time",
        "Memory over time by category - demo_oom.pickle",
        "optimizer_state",
    ] {
        assert!(page.contains(want), "report has {want:?}");
    }
    assert_eq!(
        page.matches("<svg").count(),
        4,
        "four inline plots (two timelines)"
    );
    let lower = page.to_ascii_lowercase();
    for banned in ["<script", "http:", "https:", "<link", "@import", "src="] {
        assert!(!lower.contains(banned), "report has no {banned:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A one-device snapshot whose stack frame names are HTML.
fn hostile_snapshot() -> Vec<u8> {
    let frames = json!([{"filename": "/x/<script>alert(1)</script>.py", "line": 1,
                          "name": "f\"&'<b>"}]);
    let snap = json!({
        "segments": [{"device": 0, "address": 4096, "total_size": 2097152,
            "allocated_size": 1048576, "active_size": 1048576, "requested_size": 1048576,
            "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
            "is_expandable": false, "frames": [],
            "blocks": [
                {"address": 4096, "size": 1048576, "requested_size": 1048576,
                 "state": "active_allocated", "frames": frames},
                {"address": 1052672, "size": 1048576, "requested_size": 1048576,
                 "state": "inactive", "frames": []}]}],
        "device_traces": [[
            {"action": "segment_alloc", "addr": 4096, "size": 2097152, "stream": 0,
             "time_us": 1000, "frames": []},
            {"action": "alloc", "addr": 4096, "size": 1048576, "stream": 0,
             "time_us": 1001, "frames": frames}]]
    });
    serde_pickle::to_vec(&snap, serde_pickle::SerOptions::new()).expect("pickle")
}

#[test]
fn report_and_plots_escape_names_from_the_file() {
    let dir = scratch("escape");
    let pickle = dir.join("hostile.pickle");
    std::fs::write(&pickle, hostile_snapshot()).expect("write pickle");
    let html = dir.join("r.html");
    let out = memprof(&["report", &path_str(&pickle), "-o", &path_str(&html)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(!page.contains("<script"), "frame names are escaped");
    assert!(!page.contains("<b>"));
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;.py"));
    let svg = dir.join("t.svg");
    let out = memprof(&["plot", &path_str(&pickle), "-o", &path_str(&svg)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(!text.contains("<script") && !text.contains("<b>"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The layout rebuilt at the peak holds exactly the peak's live bytes, and no more reserved
/// bytes than the peak of reserved, on every fixture with a peak.
#[test]
fn layout_at_the_peak_holds_the_peak() {
    use memprof::analysis::{analyze_device, layout_at};
    use memprof::model::BlockState;
    for name in [
        "demo_oom",
        "expandable",
        "multi_device",
        "oom",
        "pending_free",
        "v2_1_basic",
    ] {
        let file = std::fs::File::open(fixture(&format!("snapshots/{name}.pickle"))).expect("open");
        let snap = memprof::source::torch_snapshot::read(file)
            .expect("parse")
            .snapshot;
        for device in snap.devices() {
            let trace = analyze_device(&snap, device, 0).trace;
            let Some(peak) = trace.peak_entry_index else {
                continue;
            };
            let layout = layout_at(&snap, device, peak);
            let active: u64 = layout
                .iter()
                .flat_map(|s| &s.blocks)
                .filter(|b| b.state != BlockState::Inactive)
                .map(|b| b.size)
                .sum();
            assert_eq!(active, trace.peak_active_bytes, "{name} device {device}");
            let reserved: u64 = layout.iter().map(|s| s.total_size).sum();
            assert!(
                reserved <= trace.peak_reserved_bytes,
                "{name} device {device}"
            );
        }
    }
}

#[test]
fn report_has_a_section_per_device_and_plot_takes_one_file() {
    let dir = scratch("multi");
    let html = dir.join("r.html");
    let input = path_str(&fixture("snapshots/multi_device.pickle"));
    let out = memprof(&["report", &input, "-o", &path_str(&html)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).expect("report written");
    assert!(page.contains("<h2>Device 0</h2>") && page.contains("<h2>Device 2</h2>"));
    assert_eq!(page.matches("<svg").count(), 8, "four plots per device");
    let png = path_str(&dir.join("t.png"));
    let out = memprof(&["analyze", &input, &input, "--plot", &png]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    std::fs::remove_dir_all(&dir).ok();
}

/// The fixed colour of each built-in category in the plots.
const CATEGORY_FILLS: [(&str, &str); 7] = [
    ("parameter", "#1F77B4"),
    ("gradient", "#FF7F0E"),
    ("optimizer_state", "#2CA02C"),
    ("activation", "#9467BD"),
    ("autograd", "#8C564B"),
    ("workspace", "#BCBD22"),
    ("other", "#AFAFAF"),
];

/// `analyze --json FILE [ARGS]`: the first device's breakdown at the peak, as (category, bytes).
fn analyze_at_peak(input: &Path, extra: &[&str]) -> Vec<(String, u64)> {
    let input = path_str(input);
    let mut args = vec!["analyze", "--json", input.as_str()];
    args.extend_from_slice(extra);
    let out = memprof(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let at_peak = &doc["inputs"][0]["devices"][0]["categories"]["at_peak"];
    at_peak
        .as_array()
        .expect("at_peak")
        .iter()
        .map(|c| {
            let name = c["category"].as_str().expect("name").to_string();
            (name, c["bytes"].as_u64().expect("bytes"))
        })
        .collect()
}

/// The points of an SVG element's `points="x,y x,y"` attribute.
fn svg_points(element: &str) -> Vec<(i64, i64)> {
    let Some((_, rest)) = element.split_once("points=\"") else {
        return Vec::new();
    };
    let list = rest.split('"').next().unwrap_or("");
    list.split_whitespace()
        .filter_map(|p| {
            let (x, y) = p.split_once(',')?;
            Some((x.parse().ok()?, y.parse().ok()?))
        })
        .collect()
}

/// An integer attribute of an SVG element.
fn svg_attr(element: &str, name: &str) -> i64 {
    let key = format!(" {name}=\"");
    let (_, rest) = element.split_once(&key).expect("attribute");
    rest.split('"')
        .next()
        .unwrap_or("")
        .parse()
        .expect("integer")
}

/// The timeline of `input` stacked by category: each category alive at the peak has its own
/// area in the SVG, the stack of areas tops out at the peak dot, the PNG renders, and the
/// series behind it splits the peak exactly as `analyze` does (`extra` are `--category`
/// rules for both).
fn stacked_by_category(input: &Path, name: &str, extra: &[&str]) -> Vec<(String, u64)> {
    let dir = scratch(&format!("by-category-{name}"));
    let mut args = vec!["--stack-by", "category"];
    for rule in extra {
        args.extend(["--category", rule]);
    }
    let analyze_args: Vec<&str> = extra.iter().flat_map(|r| ["--category", r]).collect();
    let at_peak = analyze_at_peak(input, &analyze_args);
    let peak: u64 = at_peak.iter().map(|c| c.1).sum();
    for ext in ["png", "svg"] {
        let out_path = dir.join(format!("t.{ext}"));
        let (input_s, out_s) = (path_str(input), path_str(&out_path));
        let mut full = vec!["plot", input_s.as_str(), "-o", out_s.as_str()];
        full.extend_from_slice(&args);
        let out = memprof(&full);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
    }
    assert_png(&dir.join("t.png"));
    let svg = assert_svg(&dir.join("t.svg"), "Memory over time by category - ");
    assert!(svg.contains("the areas split it by category"), "{name}");
    let areas: Vec<&str> = svg
        .split('<')
        .filter(|e| e.starts_with("polygon opacity=\"0.85\""))
        .collect();
    for (category, bytes) in &at_peak {
        assert!(
            svg.contains(&format!("\n{category}\n</text>")),
            "{name}: {category} in the legend"
        );
        if let Some((_, fill)) = CATEGORY_FILLS.iter().find(|(c, _)| c == category) {
            let drawn = areas
                .iter()
                .any(|a| a.contains(&format!("fill=\"{fill}\"")));
            assert!(drawn, "{name}: {category} ({bytes} B) has its area");
        }
    }
    // The first area drawn is the sum of every category: at the peak's x it reaches the dot.
    let dot = svg
        .split('<')
        .find(|e| e.starts_with("circle") && e.contains("#960000"))
        .expect("the peak dot");
    let (cx, cy) = (svg_attr(dot, "cx"), svg_attr(dot, "cy"));
    let top = svg_points(areas[0])
        .into_iter()
        .filter(|&(x, _)| x == cx)
        .map(|(_, y)| y)
        .min()
        .expect("the stack has points at the peak's x");
    assert!(
        (top - cy).abs() <= 1,
        "{name}: stack tops at y {top}, peak at {cy}"
    );
    // The series behind the plot: at the peak its areas are the analyze breakdown.
    let bytes = std::fs::read(input).expect("readable");
    let snapshot = torch_snapshot::read(&bytes[..])
        .expect("a snapshot")
        .snapshot;
    let rules: Vec<String> = extra.iter().map(|r| r.to_string()).collect();
    let rules = CategoryRules::parse(&rules).expect("rules");
    let account = crate::plot_account::account(&snapshot);
    let of = DevicePlot {
        snapshot: &snapshot,
        report: &account.devices[0],
        axis: account.axis,
    };
    let series = of.series(&Stacking::Category(rules), 1280);
    let mark = of.peak(&series).expect("a peak");
    assert_eq!(mark.bytes, peak, "{name}: the breakdown sums to the peak");
    let point = series
        .points
        .iter()
        .find(|p| p.x == mark.x && p.active == mark.bytes)
        .expect("the peak is a point");
    assert_eq!(point.by_group.iter().sum::<u64>(), peak, "{name}");
    for (k, label) in series.groups.iter().enumerate() {
        let want = at_peak.iter().find(|c| c.0 == *label).map_or(0, |c| c.1);
        assert_eq!(point.by_group[k], want, "{name}: {label} at the peak");
    }
    std::fs::remove_dir_all(&dir).ok();
    at_peak
}

fn bytes_of(at: &[(String, u64)], category: &str) -> u64 {
    at.iter().find(|c| c.0 == category).map_or(0, |c| c.1)
}

#[test]
fn timeline_stacked_by_category_on_demo_oom() {
    let input = fixture("snapshots/demo_oom.pickle");
    let at = stacked_by_category(&input, "demo_oom", &[]);
    assert!(bytes_of(&at, "activation") > bytes_of(&at, "parameter"));
    let head = stacked_by_category(&input, "demo_oom-rule", &["head=model\\.py:140"]);
    assert!(bytes_of(&head, "head") > 0, "{head:?}");
    let total = |at: &[(String, u64)]| at.iter().map(|c| c.1).sum::<u64>();
    assert_eq!(
        total(&head),
        total(&at),
        "a rule moves bytes, never adds them"
    );
}

#[test]
fn timeline_stacked_by_category_on_a_real_adamw_step() {
    let rel = "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle";
    let Some(path) = crate::util::real_file(rel) else {
        return;
    };
    let at = stacked_by_category(&path, "adamw", &[]);
    for category in ["parameter", "gradient", "optimizer_state"] {
        assert!(bytes_of(&at, category) > 0, "{category} at the peak");
    }
}

#[test]
fn stack_by_only_where_it_means_something() {
    let dir = scratch("stack-by-bad");
    let out_path = dir.join("t.png");
    let cases: [&[&str]; 3] = [
        &["--kind", "segments", "--stack-by", "category"],
        &["--category", "x=y"],
        &["--stack-by", "category", "--category", "x=("],
    ];
    for extra in cases {
        let input = path_str(&fixture("snapshots/demo_oom.pickle"));
        let out_s = path_str(&out_path);
        let mut args = vec!["plot", input.as_str(), "-o", out_s.as_str()];
        args.extend_from_slice(extra);
        let out = memprof(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
        assert!(!out_path.exists(), "{extra:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
