//! Bad input: exit code 2 and one line naming the file and what is wrong, never a panic.

use crate::util::{fixture, memprof, stderr};

fn assert_one_line_error(path: &str, want: &str) {
    let out = memprof(&["analyze", path]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{path}: {err}");
    assert!(out.stdout.is_empty(), "{path}: nothing on stdout");
    assert_eq!(err.lines().count(), 1, "{path}: one line: {err}");
    assert!(err.contains(path), "{path}: names the file: {err}");
    assert!(err.contains(want), "{path}: says {want:?}: {err}");
    assert!(!err.contains("panicked"), "{path}: {err}");
}

#[test]
fn invalid_fixtures() {
    let cases = [
        ("empty.pickle", "the file is empty"),
        (
            "truncated.pickle",
            "truncated pickle: the data ends inside the opcode at byte",
        ),
        ("random.bin", "byte 0"),
        ("snapshot.json", "JSON holding a snapshot's keys"),
        ("wrong_shape.pickle", "'segments' is an integer"),
        ("list_of_ints.pickle", "segments[0]: is an integer"),
        ("code_exec.pickle", "refused opcode STACK_GLOBAL"),
        ("code_exec_protocol2.pickle", "refused opcode GLOBAL"),
        // Found by the fuzzer: lengths near usize::MAX once made the reader allocate them.
        ("fuzz_huge_string_length.pickle", "truncated pickle"),
        ("fuzz_huge_bytearray_length.pickle", "truncated pickle"),
        // Found by the fuzzer: sets holding the same sets through the memo; describing them in
        // the message once took memory exponential in the nesting.
        ("fuzz_shared_sets_render.pickle", "segments[0]: is a list"),
    ];
    for (name, want) in cases {
        assert_one_line_error(
            &fixture(&format!("invalid/{name}")).display().to_string(),
            want,
        );
    }
}

#[test]
fn missing_path_and_directory() {
    assert_one_line_error("/nonexistent/snapshot.pickle", "cannot open");
    // A directory is read as the snapshots in it; one with none is an error.
    assert_one_line_error(
        &fixture("schemas").display().to_string(),
        "no snapshot or recording in this directory",
    );
}

#[test]
fn every_cut_of_a_real_pickle_fails_cleanly() {
    let bytes = std::fs::read(fixture("snapshots/v2_1_basic.pickle")).expect("fixture");
    let dir = std::env::temp_dir().join(format!("memprof-cuts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let step = (bytes.len() / 40).max(1);
    for cut in (0..bytes.len()).step_by(step) {
        let path = dir.join(format!("cut{cut}.pickle"));
        std::fs::write(&path, &bytes[..cut]).expect("write");
        let out = memprof(&["analyze", "--json", &path.display().to_string()]);
        assert_eq!(out.status.code(), Some(2), "cut at {cut}: {}", stderr(&out));
        assert_eq!(stderr(&out).lines().count(), 1, "cut at {cut}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Blocks that overlap, so that allocated (2 MiB) exceeds reserved (1 MiB): the snapshot is
/// read, and `analyze` (text and JSON) and `diagnose` say the layout cannot be.
#[test]
fn allocated_over_reserved_from_overlapping_blocks_is_warned_about() {
    use memprof::model::{Block, BlockState, PoolKind, Segment, StackTable};
    let m = 1u64 << 20;
    let block = Block {
        address: m,
        size: m,
        requested_size: m,
        state: BlockState::ActiveAllocated,
        stack: None,
    };
    let segment = Segment {
        device: 0,
        address: m,
        total_size: m,
        stream: 0,
        pool: PoolKind::Large,
        pool_id: (0, 0),
        is_expandable: false,
        stack: None,
        blocks: vec![block.clone(), block],
    };
    let dir = crate::util::Scratch::new("overlap");
    let path = dir.join("overlap.pickle");
    crate::util::write_snapshot(
        &crate::util::model_snapshot(Vec::new(), vec![segment], StackTable::default(), None),
        &path,
    );
    let want = "device 0: the segment layout cannot be: 1 block overlaps another block (first in \
                the segment at 0x100000); allocated 2.00 MiB is more than reserved 1.00 MiB";
    let shown = path.display().to_string();
    let out = memprof(&["analyze", &shown]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = crate::util::stdout(&out);
    assert!(text.contains(&format!("warning: {want}")), "{text}");
    let doc = crate::util::analyze_json(std::slice::from_ref(&path));
    assert_eq!(doc["inputs"][0]["warnings"], serde_json::json!([want]));
    let out = memprof(&["diagnose", &shown]);
    assert!(stderr(&out).contains(want), "{}", stderr(&out));
}
