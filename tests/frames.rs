//! Sites and stacks on the real snapshots in `../shared/fixtures/real/` and `real/more/`, as a
//! person reads them: a top site is the user's own frame (POSIX and Windows paths), with the
//! library call that allocated; stacks leave out capture, allocator and interpreter frames;
//! the full stack is one flag (`analyze --full-stacks`) or one click (`report`) away.

use crate::util::{analyze_json, memprof, real_fixtures, stderr, stdout};
use serde_json::Value;
use std::path::PathBuf;

/// A real snapshot (`rel` under `../shared/fixtures/real/`); `None`, saying so, when absent.
fn real(rel: &str) -> Option<PathBuf> {
    crate::util::real_file(rel)
}

/// Every real snapshot there is, in name order.
fn all_real() -> Vec<PathBuf> {
    let Some(dir) = real_fixtures() else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = [dir.clone(), dir.join("more")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle" || x == "pkl"))
        .collect();
    files.sort();
    files
}

fn top_sites(doc: &Value) -> Vec<Value> {
    let devices = doc["inputs"][0]["devices"].as_array().expect("devices");
    (devices.iter())
        .flat_map(|d| d["top_sites"].as_array().expect("top_sites").clone())
        .collect()
}

/// The top site whose frame ends with `end`.
fn site<'a>(sites: &'a [Value], end: &str) -> &'a Value {
    sites
        .iter()
        .find(|s| s["frame"].as_str().is_some_and(|f| f.ends_with(end)))
        .unwrap_or_else(|| panic!("no top site ends with {end}: {sites:#?}"))
}

fn strings(v: &Value) -> Vec<&str> {
    (v.as_array().expect("a list").iter())
        .map(|x| x.as_str().expect("a string"))
        .collect()
}

/// An installed package's or PyTorch's frame, by its path alone.
fn is_library_label(label: &str) -> bool {
    let l = label.replace('\\', "/").to_ascii_lowercase();
    [
        "site-packages/",
        "dist-packages/",
        "/torch/",
        "torchinductor_",
        "/debugpy/",
    ]
    .iter()
    .any(|p| l.contains(p))
}

/// A frame of the Python standard library, by its path alone.
fn is_stdlib_label(label: &str) -> bool {
    let l = label.to_ascii_lowercase();
    l.contains("/lib/python3.") || l.contains("/lib64/python3.") || l.starts_with("<frozen")
}

fn is_python_label(label: &str) -> bool {
    let Some((file, _)) = label.split_once(".py:") else {
        return label.starts_with('<');
    };
    !file.contains('(')
}

#[test]
fn windows_snapshot_sites_are_the_users_frames_not_torchs() {
    let Some(path) = real("more/jogregoire__How-Diffusion-Models-Work__my_snapshot.pickle") else {
        return;
    };
    let doc = analyze_json(std::slice::from_ref(&path));
    let sites = top_sites(&doc);
    // Before, these were torch's own `linear.py:116:forward` and `module.py:1150:convert`.
    assert_eq!(
        sites[0]["frame"],
        r"d:\ai\dev\How-Diffusion-Models-Work\joel\unet.py:134:forward"
    );
    assert_eq!(sites[0]["via"], "torch.nn.modules.container.forward");
    assert_eq!(
        sites[1]["frame"],
        r"d:\ai\dev\How-Diffusion-Models-Work\joel\model.py:7:__init__"
    );
    assert_eq!(sites[1]["via"], "torch.nn.modules.module.to");
    let rsub = site(&sites, r"noise_scheduler.py:22:linear_schedule");
    assert_eq!(rsub["via"], "torch._tensor.__rsub__");
    let direct = site(&sites, r"noise_scheduler.py:32:denoise_add_noise");
    assert!(direct["via"].is_null(), "{direct}");
    for s in &sites {
        let frame = s["frame"].as_str().expect("frame");
        assert!(!is_library_label(frame), "{frame}");
        assert!(s.get("full_stack").is_none(), "only with --full-stacks");
    }
    // The stack goes from torch's frames to the user's, innermost first.
    let stack = strings(&sites[1]["stack"]);
    assert!(
        stack[0].ends_with(r"torch\nn\modules\module.py:1150:convert"),
        "{stack:?}"
    );
    assert_eq!(stack.iter().position(|f| *f == sites[1]["frame"]), Some(5));
    let out = memprof(&["analyze", &path.display().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(r"joel\model.py:7:__init__, via torch.nn.modules.module.to"),
        "{text}"
    );
}

#[test]
fn sites_name_the_library_call_that_allocated() {
    if let Some(path) = real("kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle") {
        let sites = top_sites(&analyze_json(&[path]));
        let einsum = site(&sites, "/cs336_basics/transformer.py:22:forward");
        assert_eq!(einsum["via"], "einops.einops.einsum");
        // `torch.zeros_like` called from the user's own optimizer: nothing in between.
        let step = site(&sites, "/cs336_basics/optimizers.py:82:step");
        assert!(step["via"].is_null(), "{step}");
        // A backward pass on the autograd thread: the node, without `??:0:`.
        site(&sites, "BmmBackward0::apply");
        assert!(sites
            .iter()
            .any(|s| s["frame"] == "torch::autograd::generated::BmmBackward0::apply"));
    }
    if let Some(path) = real("JasperSolt__EoR_NN__snapshot.pickle") {
        let sites = top_sites(&analyze_json(&[path]));
        let step = site(
            &sites,
            "/FourierNN/counterfactuals.py:127:generate_counterfactuals",
        );
        // Past the optimizer's decorators to the function that allocated.
        assert_eq!(step["via"], "torch.optim.adam.step");
    }
    if let Some(path) = real("more/HugePandaCoder__octree-nca-groupeq__my_snapshot_e67173f.pickle")
    {
        let sites = top_sites(&analyze_json(&[path]));
        let norm = site(&sites, "/Model_BasicNCA3D.py:62:update");
        assert_eq!(norm["via"], "torch.nn.modules.batchnorm.forward");
    }
}

/// Frames no filtered stack shows: PyTorch's memory viewer hides them, or they are the
/// allocator's, the dispatcher's or the interpreter's.
const NOISE: [&str; 9] = [
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "CUDACachingAllocator",
    "_PyEval_EvalFrameDefault",
    "Py_RunMain",
    "wrap_kernel_functor_unboxed_",
    "RegisterCUDA.cpp",
    "__libc_start_main",
];

#[test]
fn every_real_stack_is_filtered_and_every_site_is_the_innermost_user_frame() {
    let mut checked = 0;
    let mut dropped = 0;
    for path in all_real() {
        let name = path.display().to_string();
        let out = memprof(&["analyze", "--json", "--full-stacks", &name]);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        for s in top_sites(&doc) {
            let frame = s["frame"].as_str().expect("frame");
            if frame == "<no stack recorded>" {
                continue;
            }
            let stack = strings(&s["stack"]);
            let full = strings(&s["full_stack"]);
            for f in &stack {
                assert!(!NOISE.iter().any(|n| f.contains(n)), "{name}: {f}");
                assert!(!f.contains(":0:"), "{name}: {f}");
            }
            assert!(full.len() >= stack.len(), "{name}: {frame}");
            dropped += full.len() - stack.len();
            // The first Python frame outside libraries and the standard library is the site.
            let user = stack
                .iter()
                .find(|f| is_python_label(f) && !is_library_label(f) && !is_stdlib_label(f));
            match user {
                Some(user) => assert_eq!(frame, *user, "{name}: {stack:#?}"),
                None => assert!(
                    stack.is_empty() || stack.contains(&frame),
                    "{name}: {frame}"
                ),
            }
            if s["via"].is_string() {
                assert!(!is_library_label(frame), "{name}: {frame}");
            }
            checked += 1;
        }
    }
    if real_fixtures().is_some() {
        assert!(checked > 100, "{checked} sites checked");
        assert!(dropped > 1000, "{dropped} frames left out");
    }
}

#[test]
fn the_report_shows_the_filtered_stack_and_the_full_one_behind_a_click() {
    let Some(path) = real("silmont2000__assignment2-systems__mem_snapshot.pickle") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("memprof-frames-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let html = dir.join("report.html");
    let out = memprof(&[
        "report",
        &path.display().to_string(),
        "-o",
        &html.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).expect("the page");
    let _ = std::fs::remove_dir_all(&dir);
    let site = "trace_peak_memory.py:12:custom_scaled_dot_product_attention, via \
                einops.einops.einsum";
    // The sites table, after the account's text (which names the site too).
    let table = page
        .find("by allocation site</h3>")
        .expect("the sites table");
    let at = table
        + page[table..]
            .find(site)
            .unwrap_or_else(|| panic!("no row for {site}"));
    let row = &page[at..at + page[at..].find("</tr>").expect("the row ends")];
    let (filtered, full) = row
        .split_once("<details><summary>all ")
        .expect("the full stack behind its own summary");
    assert!(
        filtered.contains("einops/einops.py:916:einsum"),
        "{filtered}"
    );
    assert!(!filtered.contains("unwind::unwind"), "{filtered}");
    assert!(full.contains("torch::unwind::unwind()"), "{full}");
    assert!(full.contains("frames, as recorded"), "{full}");
}
