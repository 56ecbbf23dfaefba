//! Call stacks in recordings: `kernels/workloads/two_sites.c` (built with frame pointers and
//! `-g`) allocates from named functions and from a library it loads with `dlopen`; its recording
//! carries a stack per allocation and the mappings to symbolize them, and `analyze` names those
//! functions, with file and line, as the top sites with the bytes each left alive; `gate` names
//! the site that grew and `export --to torch-snapshot` keeps the stacks.

use crate::shim_preload::{cc_with_driver, check, kernels, shim};
use crate::util::{analyze_json, memprof, repo, stderr, stdout, Scratch};
use memprof_wire::{decode_recording, Kind, Recording};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Frame pointers, debug lines, and no sibling calls: each allocating function keeps a frame.
const FLAGS: [&str; 4] = [
    "-O1",
    "-g",
    "-fno-omit-frame-pointer",
    "-fno-optimize-sibling-calls",
];

/// Builds two_sites and libplugin.so next to the fake driver in `dir`.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let src = repo().join("kernels/workloads");
    let exe = dir.join("two_sites");
    cc_with_driver(dir, &FLAGS, &src.join("two_sites.c"), &exe, &["-ldl"]);
    let plugin = dir.join("libplugin.so");
    let shared = [&FLAGS[..], &["-shared", "-fPIC"]].concat();
    cc_with_driver(dir, &shared, &src.join("plugin.c"), &plugin, &[]);
    (exe, plugin)
}

/// Runs two_sites (loading the plugin) under the shim; `stacks` false sets `MEMPROF_STACKS=0`.
fn record(name: &str, stacks: bool) -> (Scratch, PathBuf, Recording) {
    record_run(name, stacks, true)
}

/// `record`, with or without loading the plugin.
fn record_run(name: &str, stacks: bool, load_plugin: bool) -> (Scratch, PathBuf, Recording) {
    let dir = kernels(name);
    let (exe, plugin) = build(&dir);
    let out = dir.join("two_sites.memprof");
    let mut cmd = Command::new(exe);
    if load_plugin {
        cmd.arg(&plugin);
    }
    cmd.env("MEMPROF_OUT", &out).env("LD_PRELOAD", shim());
    if !stacks {
        cmd.env("MEMPROF_STACKS", "0");
    }
    check("two_sites", &cmd.output().expect("two_sites runs"));
    let recording = decode_recording(&std::fs::read(&out).expect("recorded")).expect("decodes");
    (dir, out, recording)
}

/// The line of the first line of `file` (under kernels/workloads) holding `text`, from 1.
fn line_of(file: &str, text: &str) -> usize {
    let source =
        std::fs::read_to_string(repo().join("kernels/workloads").join(file)).expect("source");
    source
        .lines()
        .position(|l| l.contains(text))
        .map(|i| i + 1)
        .expect("the text is in the source")
}

fn sites(doc: &Value) -> Vec<(String, u64, u64)> {
    doc["inputs"][0]["devices"][0]["top_sites"]
        .as_array()
        .expect("top sites")
        .iter()
        .map(|s| {
            (
                s["frame"].as_str().expect("frame").to_string(),
                s["bytes"].as_u64().expect("bytes"),
                s["count"].as_u64().expect("count"),
            )
        })
        .collect()
}

#[test]
fn analyze_names_the_functions_that_allocated_as_top_sites() {
    let (_dir, path, recording) = record("stacks", true);
    assert_eq!(recording.version, memprof_wire::VERSION);
    assert_eq!(recording.dropped, Some(0));
    let allocs: Vec<_> = (recording.records.iter())
        .filter(|r| r.kind == Kind::Alloc)
        .collect();
    assert_eq!(allocs.len(), 7);
    assert!(allocs
        .iter()
        .all(|r| recording.stacks.contains_key(&r.stack)));
    // Three allocations from one call site share one stack.
    assert_eq!(allocs[0].stack, allocs[2].stack);
    assert_ne!(allocs[0].stack, allocs[3].stack);
    // The plugin was loaded after the first stack was written: its mapping came later.
    let paths: Vec<String> = (recording.mappings.iter())
        .map(|m| String::from_utf8_lossy(&m.path).into_owned())
        .collect();
    assert!(
        paths.iter().any(|p| p.ends_with("/libplugin.so")),
        "{paths:?}"
    );
    assert!(paths.iter().any(|p| p.ends_with("/two_sites")), "{paths:?}");

    let doc = analyze_json(std::slice::from_ref(&path));
    let site = |file: &str, call: &str, function: &str| {
        let line = line_of(file, call);
        format!("kernels/workloads/{file}:{line}:{function}")
    };
    let found = sites(&doc);
    let expected = [
        (
            site("two_sites.c", "\"load_weights\")", "load_weights"),
            900_000,
            3,
        ),
        (
            site("two_sites.c", "\"make_workspace\")", "make_workspace"),
            200_000,
            2,
        ),
        (
            site("plugin.c", "cuMemAlloc_v2(p, 70000)", "plugin_buffer"),
            70_000,
            1,
        ),
    ];
    assert_eq!(found.len(), expected.len(), "{found:?}");
    for ((frame, bytes, count), (want, want_bytes, want_count)) in found.iter().zip(&expected) {
        assert!(frame.ends_with(want.as_str()), "{frame} is not {want}");
        assert_eq!((bytes, count), (want_bytes, want_count), "{frame}");
    }
    // The stack of a site goes out to main; the process start-up frames below it (the C
    // library's) are left out of it and kept in the full stack.
    let out = memprof(&[
        "analyze",
        "--json",
        "--full-stacks",
        &path.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let frames = |key: &str| -> Vec<String> {
        let list = &doc["inputs"][0]["devices"][0]["top_sites"][0][key];
        (list.as_array().expect("a stack").iter())
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect()
    };
    let (stack, full) = (frames("stack"), frames("full_stack"));
    assert_eq!(stack.len(), 2, "{stack:?}");
    assert!(stack[0].ends_with(":load_weights"), "{stack:?}");
    assert!(stack[1].ends_with(":main"), "{stack:?}");
    assert_eq!(full[..2], stack[..], "{full:?}");
    assert!(
        full[2..]
            .iter()
            .all(|f| f.starts_with("libc.so") || f.ends_with("_start")),
        "{full:?}"
    );
}

#[test]
fn memprof_stacks_0_records_no_stacks() {
    let (_dir, path, recording) = record("nostacks", false);
    assert_eq!(recording.records.len(), 8, "7 allocations and 1 free");
    assert!(recording.records.iter().all(|r| r.stack == 0));
    assert!(recording.stacks.is_empty());
    let doc = analyze_json(std::slice::from_ref(&path));
    let found = sites(&doc);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0], ("<no stack recorded>".to_string(), 1_170_000, 6));
}

#[test]
fn gate_names_the_site_that_grew_and_exports_keep_the_stacks() {
    let (_base_dir, base, _) = record_run("stacks-base", true, false);
    let (_current_dir, current, _) = record("stacks-current", true);
    let dir = current.parent().expect("a directory");
    let baseline = dir.join("baseline.json").display().to_string();
    let out = memprof(&[
        "gate",
        &base.display().to_string(),
        "--write-baseline",
        &baseline,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let current_arg = current.display().to_string();
    let out = memprof(&[
        "gate",
        &current_arg,
        "--baseline",
        &baseline,
        "--limit",
        "1100000",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    let grown = format!(
        "kernels/workloads/plugin.c:{}:plugin_buffer  (0 B -> 68.36 KiB)",
        line_of("plugin.c", "cuMemAlloc_v2(p, 70000)")
    );
    assert!(text.contains(&grown), "{text}");

    let pickle = dir.join("two_sites.pickle");
    let pickle_arg = pickle.display().to_string();
    let out = memprof(&[
        "export",
        &current_arg,
        "--to",
        "torch-snapshot",
        "-o",
        &pickle_arg,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let from_recording = sites(&analyze_json(std::slice::from_ref(&current)));
    let from_export = sites(&analyze_json(&[pickle]));
    assert_eq!(from_export, from_recording);
}
