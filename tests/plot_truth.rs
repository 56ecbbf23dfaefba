//! Pictures that show what happened: a step in memory is drawn as a step (no diagonal between
//! two levels, even after a long trace is reduced), and a region of blocks narrower than a
//! pixel shows the colour of their state, not white outlines.

use crate::util::{memprof, model_snapshot, stderr, write_snapshot, Scratch};
use memprof::model::TraceEntry;
use memprof::model::{Action, Block, BlockState, PoolKind, Segment, StackTable, StreamIndex};
use std::path::Path;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn entry(action: Action, addr: u64, size: u64, t: i64) -> TraceEntry {
    TraceEntry::new(action, Some(addr), size, StreamIndex(0)).with_time(Some(t))
}

fn block(address: u64, size: u64, state: BlockState) -> Block {
    Block {
        address,
        size,
        requested_size: size,
        state,
        stack: None,
    }
}

fn segment(address: u64, blocks: Vec<Block>) -> Segment {
    Segment {
        device: 0,
        address,
        total_size: blocks.iter().map(|b| b.size).sum(),
        stream: 0,
        pool: PoolKind::Large,
        pool_id: (0, 0),
        is_expandable: false,
        stack: None,
        blocks,
    }
}

/// Reserved memory flat at 2 GiB for 100 ms (3,000 small allocations and frees come and go
/// meanwhile, more than a plot keeps), then one 5 GiB segment mapped and filled.
fn step_snapshot(path: &Path) {
    let (a, b, small) = (0x1000_0000u64, 0x4_0000_0000u64, 0x1000_0000u64 + GIB);
    let mut entries = vec![
        entry(Action::SegmentAlloc, a, 2 * GIB, 1_000_000),
        entry(Action::Alloc, a, GIB, 1_000_000),
    ];
    for i in 0..3000i64 {
        let t = 1_000_000 + 10 + i * 33;
        entries.push(entry(Action::Alloc, small, MIB, t));
        entries.push(entry(Action::FreeRequested, small, MIB, t + 5));
        entries.push(entry(Action::FreeCompleted, small, MIB, t + 10));
    }
    entries.push(entry(Action::SegmentAlloc, b, 5 * GIB, 1_100_000));
    entries.push(entry(Action::Alloc, b, 4 * GIB, 1_100_050));
    let segments = vec![
        segment(
            a,
            vec![
                block(a, GIB, BlockState::ActiveAllocated),
                block(a + GIB, GIB, BlockState::Inactive),
            ],
        ),
        segment(
            b,
            vec![
                block(b, 4 * GIB, BlockState::ActiveAllocated),
                block(b + 4 * GIB, GIB, BlockState::Inactive),
            ],
        ),
    ];
    let snapshot = model_snapshot(entries, segments, StackTable::default(), None);
    write_snapshot(&snapshot, path);
}

/// The `points` of every polyline and polygon of an SVG, each as a list of (x, y).
fn svg_paths(svg: &str) -> Vec<Vec<(f64, f64)>> {
    let mut paths = Vec::new();
    for shape in ["<polyline", "<polygon"] {
        for part in svg.split(shape).skip(1) {
            let Some(start) = part.find("points=\"") else {
                continue;
            };
            let rest = &part[start + 8..];
            let text = &rest[..rest.find('"').expect("closed attribute")];
            let points = text
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').expect("x,y");
                    (x.parse().expect("x"), y.parse().expect("y"))
                })
                .collect();
            paths.push(points);
        }
    }
    paths
}

#[test]
fn a_step_in_memory_is_drawn_as_a_step() {
    let dir = Scratch::new("plot-steps");
    let input = dir.join("step.pickle");
    step_snapshot(&input);
    for kind in ["timeline", "fragmentation"] {
        let svg_path = dir.join(format!("{kind}.svg"));
        let out = memprof(&[
            "plot",
            &input.display().to_string(),
            "--kind",
            kind,
            "-o",
            &svg_path.display().to_string(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let svg = std::fs::read_to_string(&svg_path).expect("written");
        let paths = svg_paths(&svg);
        assert!(paths.len() >= 2, "{kind}: the curves are there");
        for path in &paths {
            for pair in path.windows(2) {
                let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
                assert!(
                    x0 == x1 || y0 == y1,
                    "{kind}: a diagonal from ({x0}, {y0}) to ({x1}, {y1})"
                );
            }
        }
        // The reserved line (the longest drop in y of one vertical: 2 GiB to 7 GiB) jumps
        // straight up at 100 ms, where the segment was mapped.
        let tallest = paths
            .iter()
            .flat_map(|p| p.windows(2))
            .filter(|w| w[0].0 == w[1].0)
            .map(|w| (w[0].1 - w[1].1).abs())
            .fold(0.0, f64::max);
        assert!(
            tallest > 150.0,
            "{kind}: the jump is one vertical ({tallest} px)"
        );
    }
    assert!(
        std::fs::read_to_string(dir.join("timeline.svg"))
            .expect("written")
            .contains("one origin for all devices"),
        "the time axis says where time starts"
    );
}

/// The RGB pixels of a PNG, row by row.
fn png_pixels(bytes: &[u8]) -> (usize, Vec<[u8; 3]>) {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!(info.color_type.samples(), 3, "RGB");
    let pixels = buf[..info.buffer_size()]
        .chunks(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width as usize, pixels)
}

#[test]
fn a_region_of_tiny_allocated_blocks_shows_as_allocated() {
    const ALLOCATED: [u8; 3] = [31, 119, 180];
    let dir = Scratch::new("plot-tiny-blocks");
    let input = dir.join("tiny.pickle");
    // 150 allocated blocks of 64 KiB (under a pixel each), then 90 MiB free; and a segment of
    // 64 KiB, far under a pixel at this scale.
    let base = 0x2000_0000u64;
    let mut blocks: Vec<Block> = (0..150)
        .map(|i| block(base + i * 64 * 1024, 64 * 1024, BlockState::ActiveAllocated))
        .collect();
    blocks.push(block(
        base + 150 * 64 * 1024,
        90 * MIB,
        BlockState::Inactive,
    ));
    let small = 0x8000_0000u64;
    let segments = vec![
        segment(base, blocks),
        segment(
            small,
            vec![block(small, 64 * 1024, BlockState::ActiveAllocated)],
        ),
    ];
    let snapshot = model_snapshot(Vec::new(), segments, StackTable::default(), None);
    write_snapshot(&snapshot, &input);
    let png = dir.join("segments.png");
    let out = memprof(&[
        "plot",
        &input.display().to_string(),
        "--kind",
        "segments",
        "-o",
        &png.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (width, pixels) = png_pixels(&std::fs::read(&png).expect("written"));
    let mut region_rows = 0;
    let mut small_rows = 0;
    for row in pixels.chunks(width) {
        let blue: Vec<usize> = (0..width).filter(|&x| row[x] == ALLOCATED).collect();
        match blue.len() {
            // The legend's swatch is 14 pixels wide; the small segment's bar at least 3.
            3..=6 => small_rows += 1,
            n if n > 50 => {
                let (first, last) = (blue[0], blue[n - 1]);
                assert_eq!(
                    n,
                    last - first + 1,
                    "the allocated region is one run of the allocated colour"
                );
                // 150 x 64 KiB of 99.4 MiB: about a tenth of the plot's 1,100 or so pixels.
                assert!(n > 80, "the region is {n} pixels wide");
                region_rows += 1;
            }
            _ => {}
        }
    }
    assert!(
        region_rows > 5,
        "the region's bar is drawn ({region_rows} rows)"
    );
    assert!(
        small_rows > 5,
        "the 64 KiB segment shows ({small_rows} rows)"
    );
}
