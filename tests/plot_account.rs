//! The plots draw the account: on every real snapshot the timeline's area tops out at the
//! account's peak of requested memory even at a narrow width, a spike far shorter than a pixel
//! still fills its pixel column under the peak dot, and `plot FILE` draws the device that ran
//! out of memory.

use crate::util::{memprof, real_fixtures, stderr, write_snapshot, Scratch};
use memprof::account::{InputAccount, Options};
use memprof::analysis::categories::CategoryRules;
use memprof::diagnose::Origin;
use memprof::model::{
    Action, Block, BlockState, PoolKind, Segment, Snapshot, SnapshotFormat, StackTable,
    StreamIndex, Timeline, TraceEntry,
};
use memprof::report::plot::{DevicePlot, Stacking};
use memprof::source::torch_snapshot;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// The account of `snapshot`, as `plot` builds it.
pub fn account(snapshot: &Snapshot) -> InputAccount {
    memprof::account::build(
        snapshot,
        &Options::new(5, &CategoryRules::default(), Origin::TorchSnapshot),
    )
}

/// Every real snapshot here (the real ones and `more/`).
fn real_snapshots() -> Vec<PathBuf> {
    let Some(dir) = real_fixtures() else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for folder in [dir.clone(), dir.join("more")] {
        let Ok(list) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in list.flatten() {
            let path = entry.path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if matches!(ext, "pickle" | "pkl") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_area_tops_out_at_the_accounts_peak_on_every_real_snapshot() {
    let files = real_snapshots();
    let mut checked = 0;
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let bytes = std::fs::read(path).expect("readable");
        let snapshot = torch_snapshot::read(&bytes[..])
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .snapshot;
        let account = account(&snapshot);
        for report in &account.devices {
            let device = report.analysis.device;
            let of = DevicePlot {
                snapshot: &snapshot,
                report,
                axis: account.axis,
            };
            // 40 columns: thousands of entries to each.
            let series = of.series(&Stacking::Site, 40);
            for p in &series.points {
                assert_eq!(p.by_group.iter().sum::<u64>(), p.active, "{name} {device}");
            }
            let peaks = report.account.peaks;
            let (Some(peak), Some(reserved)) = (peaks.requested.bytes, peaks.reserved.bytes) else {
                continue;
            };
            let top = series.points.iter().map(|p| p.active).max();
            assert_eq!(top, Some(peak), "{name} device {device}: area's top");
            let top = series.points.iter().map(|p| p.reserved).max();
            assert_eq!(top, Some(reserved), "{name} device {device}: reserved");
            if let Some(mark) = of.peak(&series) {
                assert!(
                    series
                        .points
                        .iter()
                        .any(|p| p.x == mark.x && p.active == mark.bytes),
                    "{name} device {device}: the peak dot sits on the area"
                );
            }
            checked += 1;
        }
    }
    assert!(
        files.is_empty() || checked > 10,
        "{checked} devices checked"
    );
}

fn entry(action: Action, addr: u64, size: u64, t: i64) -> TraceEntry {
    TraceEntry::new(action, Some(addr), size, StreamIndex(0)).with_time(Some(t))
}

fn segment(device: u32, address: u64, size: u64, used: u64) -> Segment {
    let mut blocks = vec![Block {
        address,
        size: used,
        requested_size: used,
        state: BlockState::ActiveAllocated,
        stack: None,
    }];
    if used < size {
        blocks.push(Block {
            address: address + used,
            size: size - used,
            requested_size: 0,
            state: BlockState::Inactive,
            stack: None,
        });
    }
    Segment {
        device,
        address,
        total_size: size,
        stream: 0,
        pool: PoolKind::Large,
        pool_id: (0, 0),
        is_expandable: false,
        stack: None,
        blocks,
    }
}

fn snapshot_of(entries: Vec<TraceEntry>, devices: Vec<std::ops::Range<usize>>) -> Snapshot {
    let segments = Vec::new();
    Snapshot {
        format: SnapshotFormat::Modern,
        segments,
        timeline: Timeline::new(entries, devices),
        stacks: StackTable::default(),
        settings: None,
        annotations: Vec::new(),
    }
}

/// The SVG elements (text after `<`) that start with `tag`.
fn elements<'s>(svg: &'s str, tag: &str) -> Vec<&'s str> {
    svg.split('<').filter(|e| e.starts_with(tag)).collect()
}

fn attr(element: &str, name: &str) -> f64 {
    let key = format!(" {name}=\"");
    let (_, rest) = element.split_once(&key).expect("attribute");
    rest.split('"')
        .next()
        .unwrap_or("")
        .parse()
        .expect("number")
}

fn points(element: &str) -> Vec<(f64, f64)> {
    let (_, rest) = element.split_once(" points=\"").expect("points");
    let text = rest.split('"').next().unwrap_or("");
    text.split_whitespace()
        .map(|p| {
            let (x, y) = p.split_once(',').expect("x,y");
            (x.parse().expect("x"), y.parse().expect("y"))
        })
        .collect()
}

fn plot_svg(input: &Path, out: &Path, extra: &[&str]) -> String {
    let (input, out_s) = (input.display().to_string(), out.display().to_string());
    let mut args = vec!["plot", input.as_str(), "-o", out_s.as_str()];
    args.extend_from_slice(extra);
    let run = memprof(&args);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    std::fs::read_to_string(out).expect("written")
}

#[test]
fn a_spike_shorter_than_a_pixel_fills_its_column_under_the_peak_dot() {
    let dir = Scratch::new("plot-spike");
    let input = dir.join("spike.pickle");
    // 10 seconds at 100 MiB, with five spikes of 400 MiB that last 83 µs each (a hundredth
    // of a pixel), the first one at 1.3 s the peak.
    let (a, b) = (0x1000_0000u64, 0x4000_0000u64);
    let t0 = 1_700_000_000_000_000i64;
    let mut entries = vec![
        entry(Action::SegmentAlloc, a, 128 * MIB, t0),
        entry(Action::Alloc, a, 100 * MIB, t0),
        entry(Action::SegmentAlloc, b, 512 * MIB, t0 + 1_000),
    ];
    let spikes = [1_300_000i64, 2_700_000, 4_100_000, 6_600_000, 8_450_000];
    for at in spikes {
        entries.push(entry(Action::Alloc, b, 400 * MIB, t0 + at));
        entries.push(entry(Action::FreeRequested, b, 400 * MIB, t0 + at + 83));
        entries.push(entry(Action::FreeCompleted, b, 400 * MIB, t0 + at + 83));
    }
    // Small allocations come and go between them, more than the plot has pixels.
    for i in 0..5000i64 {
        let t = t0 + 1_000 + i * 2_000;
        let small = a + 100 * MIB;
        entries.push(entry(Action::Alloc, small, MIB, t));
        entries.push(entry(Action::FreeCompleted, small, MIB, t + 1));
    }
    entries.sort_by_key(|e| e.time_us());
    let n = entries.len();
    let mut snapshot = snapshot_of(entries, std::iter::once(0..n).collect());
    snapshot.segments = vec![
        segment(0, a, 128 * MIB, 100 * MIB),
        segment(0, b, 512 * MIB, 0),
    ];
    write_snapshot(&snapshot, &input);
    let svg = plot_svg(&input, &dir.join("t.svg"), &[]);
    let legend: Vec<&str> = svg.lines().filter(|l| l.contains("peak")).collect();
    assert!(
        svg.contains("peak requested 500.00 MiB (entry 1303)"),
        "the legend's peak: {legend:?}"
    );
    let dot = elements(&svg, "circle")
        .into_iter()
        .find(|e| e.contains("#960000"))
        .expect("the peak dot");
    let (cx, cy) = (attr(dot, "cx"), attr(dot, "cy"));
    // The first area drawn is the whole stack: it reaches the dot's height five times, each
    // time at least a pixel wide, the first time under the dot.
    let area = points(elements(&svg, "polygon opacity=\"0.85\"")[0]);
    let top = area.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    assert!(
        (top - cy).abs() <= 1.0,
        "the area tops at {top}, the dot at {cy}"
    );
    let mut runs: Vec<(f64, f64)> = Vec::new();
    for pair in area.windows(2) {
        if pair[0].1 == top && pair[1].1 == top {
            // A spike across a column's edge fills both columns: one run.
            match runs.last_mut() {
                Some(run) if run.1 == pair[0].0 => run.1 = pair[1].0,
                _ => runs.push((pair[0].0, pair[1].0)),
            }
        }
    }
    assert_eq!(runs.len(), spikes.len(), "one top per spike: {runs:?}");
    for (left, right) in &runs {
        assert!(right - left >= 1.0, "each top is a pixel wide: {runs:?}");
    }
    let (left, right) = runs[0];
    assert!(
        left <= cx && cx <= right + 1.0,
        "under the dot: {runs:?}, {cx}"
    );
}

#[test]
fn plot_draws_the_device_that_ran_out_of_memory() {
    let dir = Scratch::new("plot-oom-device");
    let input = dir.join("two.pickle");
    let t0 = 1_700_000_000_000_000i64;
    let (a, b) = (0x1000_0000u64, 0x8000_0000u64);
    let mut oom = TraceEntry::oom(300 * MIB, Some(10 * MIB), StreamIndex(0));
    oom = oom.with_time(Some(t0 + 3_000));
    let entries = vec![
        // Device 0: fine.
        entry(Action::SegmentAlloc, a, 64 * MIB, t0),
        entry(Action::Alloc, a, 50 * MIB, t0 + 10),
        // Device 1: a request it cannot serve.
        entry(Action::SegmentAlloc, b, 256 * MIB, t0 + 1_000),
        entry(Action::Alloc, b, 200 * MIB, t0 + 2_000),
        oom,
    ];
    let mut snapshot = snapshot_of(entries, vec![0..2, 2..5]);
    snapshot.segments = vec![
        segment(0, a, 64 * MIB, 50 * MIB),
        segment(1, b, 256 * MIB, 200 * MIB),
    ];
    write_snapshot(&snapshot, &input);
    let svg = plot_svg(&input, &dir.join("default.svg"), &[]);
    assert!(
        svg.contains("two.pickle, device 1"),
        "the title names device 1"
    );
    assert!(
        svg.contains("OOM: a request of 300.00 MiB failed"),
        "the OOM's mark"
    );
    // The OOM's line is where the account puts it: 3 ms on the input's axis.
    let account = account(&snapshot);
    let moment = account.devices[1]
        .account
        .moment(memprof::account::MomentKind::Oom)
        .expect("the account's OOM");
    assert_eq!(moment.seconds(), Some(0.003));
    let segments = plot_svg(&input, &dir.join("s.svg"), &["--kind", "segments"]);
    assert!(segments.contains("device 1"), "every kind defaults to it");
    let other = plot_svg(&input, &dir.join("zero.svg"), &["--device", "0"]);
    assert!(
        other.contains("two.pickle, device 0"),
        "--device still picks"
    );
    assert!(!other.contains("OOM:"), "device 0 had no OOM");
    let analyze_png = dir.join("a.svg");
    let run = memprof(&[
        "analyze",
        &input.display().to_string(),
        "--plot",
        &analyze_png.display().to_string(),
    ]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let plotted = std::fs::read_to_string(&analyze_png).expect("written");
    assert!(plotted.contains("device 1"), "analyze --plot too");
}
