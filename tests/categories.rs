//! What the live memory is: `analyze` sorts what is alive at the peak, the OOM and the dump
//! into categories that sum to the live total, on every real snapshot in
//! `../shared/fixtures/real/`; training files with an Adam step show parameters and optimizer
//! state, forward-only inference files show neither gradients nor optimizer state, an OOM in
//! one function's intermediates is mostly activations, and `record_function` ranges give the
//! phase table.

use crate::util::{add_stack, analyze_json, memprof, model_snapshot, module_to_stack};
use crate::util::{real_fixtures, stdout};
use crate::util::{write_snapshot, Scratch};
use memprof::model::{Action, StackTable};
use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
use serde_json::Value;
use std::path::PathBuf;

const MIB: u64 = 1 << 20;

/// Bytes of one category in a breakdown (0 when absent).
fn bytes(list: &Value, category: &str) -> u64 {
    list.as_array()
        .into_iter()
        .flatten()
        .find(|c| c["category"] == category)
        .and_then(|c| c["bytes"].as_u64())
        .unwrap_or(0)
}

fn sum(list: &Value) -> u64 {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|c| c["bytes"].as_u64().expect("bytes"))
        .sum()
}

/// Every real snapshot, `more/` included.
fn real_files() -> Option<Vec<PathBuf>> {
    let dir = real_fixtures()?;
    let mut files = Vec::new();
    for d in [dir.clone(), dir.join("more")] {
        for e in std::fs::read_dir(&d).expect("listable").flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pickle" || x == "pkl") {
                files.push(p);
            }
        }
    }
    files.sort();
    Some(files)
}

/// The first device of one real file's analysis; `None` (skipped) when the file is absent.
fn real_device(rel: &str) -> Option<Value> {
    let path = crate::util::real_file(rel)?;
    let doc = analyze_json(&[path]);
    Some(doc["inputs"][0]["devices"][0].clone())
}

#[test]
fn categories_sum_to_the_live_total_on_every_real_snapshot() {
    let Some(files) = real_files() else { return };
    assert!(files.len() >= 20, "{} files", files.len());
    let doc = analyze_json(&files);
    let mut devices = 0;
    for input in doc["inputs"].as_array().expect("inputs") {
        let name = input["path"].as_str().unwrap_or_default();
        for d in input["devices"].as_array().expect("devices") {
            let c = &d["categories"];
            assert_eq!(
                sum(&c["at_peak"]),
                d["trace"]["peak_active_bytes"].as_u64().expect("peak"),
                "{name}: at_peak"
            );
            // The dump's blocks are counted by block size, as `allocated_bytes` counts them.
            assert_eq!(
                sum(&c["at_dump"]),
                d["allocated_bytes"].as_u64().expect("allocated"),
                "{name}: at_dump"
            );
            assert_eq!(c["at_oom"].is_null(), d["oom"].is_null(), "{name}: at_oom");
            for list in [&c["at_peak"], &c["at_dump"]] {
                for entry in list.as_array().expect("list") {
                    let category = entry["category"].as_str().expect("category");
                    assert!(
                        memprof::analysis::categories::BUILTIN.contains(&category)
                            || category.starts_with("private_pool"),
                        "{name}: {category}"
                    );
                    assert!(entry["count"].as_u64() > Some(0), "{name}: {entry}");
                }
            }
            devices += 1;
        }
    }
    assert!(devices >= 25, "{devices} devices");
}

#[test]
fn an_adam_step_shows_parameters_gradients_and_optimizer_state() {
    // Two AdamW runs (torch.optim.AdamW, and a course's own AdamW under the step wrapper) and a
    // hand-written Adam that replaces its parameters in the step.
    for rel in [
        "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle",
        "more/sidsoc12__spring2024-assignment2-systems__mem_snapshot_ctx128_fp32_train.pickle",
        "more/NiuHuangxiaozi__assignment2-systems__forward_and_backward_memory_snapshot_200_mixed_precision.pickle",
    ] {
        let Some(d) = real_device(rel) else { continue };
        let peak = &d["categories"]["at_peak"];
        let total = sum(peak);
        let state = bytes(peak, "optimizer_state");
        let parameters = bytes(peak, "parameter");
        assert!(state > 0 && parameters > 0, "{rel}: {peak}");
        assert!(bytes(peak, "gradient") > 0, "{rel}: {peak}");
        // Adam keeps two states per parameter.
        assert_eq!(state, 2 * parameters, "{rel}: {peak}");
        if rel.contains("Niu") {
            // Its step replaces the parameters (`p.data = ...`): the new ones are parameters.
            let dump = &d["categories"]["at_dump"];
            // One gradient per parameter; the dump counts block sizes, which round each
            // differently (a parameter may sit in a split block).
            let count = |c: &str| {
                dump.as_array()
                    .into_iter()
                    .flatten()
                    .find(|x| x["category"] == c)
                    .and_then(|x| x["count"].as_u64())
            };
            assert_eq!(count("parameter"), count("gradient"), "{dump}");
            let (p, g) = (bytes(dump, "parameter"), bytes(dump, "gradient"));
            assert!(p.abs_diff(g) * 50 < p, "{dump}");
            // Two states per parameter, in block sizes at the dump.
            assert_eq!(
                count("optimizer_state").map(|n| n / 2),
                count("parameter"),
                "{dump}"
            );
            assert!(bytes(dump, "optimizer_state").abs_diff(2 * p) * 20 < p, "{dump}");
        } else {
            assert!(state + 2 * parameters > total / 10 * 9, "{rel}: {peak}");
        }
    }
}

#[test]
fn forward_only_inference_has_no_gradient_or_optimizer_state() {
    // An NCA model's inference, FlexGen's OPT-1.3B inference (no trace: blocks only) and a
    // BERT validation run: their stacks hold forward calls only.
    for rel in [
        "more/HugePandaCoder__octree-nca-groupeq__inference2_peso_oct.pickle",
        "more/Yiyi-philosophy__LLM-inference__1.3b_snapshot_6a8eab0.pickle",
        "more/Maphsge4__select_n__snapshot_1f2f548.pickle",
    ] {
        let Some(d) = real_device(rel) else { continue };
        let c = &d["categories"];
        for list in [&c["at_peak"], &c["at_dump"]] {
            for category in ["gradient", "optimizer_state", "autograd"] {
                assert_eq!(bytes(list, category), 0, "{rel}: {category} in {list}");
            }
        }
    }
    // The inference run's peak is its forward's activations.
    if let Some(d) =
        real_device("more/HugePandaCoder__octree-nca-groupeq__inference2_peso_oct.pickle")
    {
        assert!(bytes(&d["categories"]["at_peak"], "activation") > 7000 * MIB);
    }
}

#[test]
fn a_peak_in_backward_is_its_temporaries_and_the_saved_activations() {
    // silmont2000: one function (custom_softmax) whose intermediates are saved for backward;
    // the peak is in its backward, where the autograd engine's temporaries join them.
    let Some(d) = real_device("silmont2000__assignment2-systems__mem_snapshot.pickle") else {
        return;
    };
    let peak = &d["categories"]["at_peak"];
    assert!(bytes(peak, "autograd") >= 2560 * MIB, "{peak}");
    assert!(bytes(peak, "autograd") * 10 > sum(peak) * 8, "{peak}");
    assert!(bytes(peak, "activation") >= 512 * MIB, "{peak}");
    assert_eq!(bytes(peak, "optimizer_state"), 0);
}

/// A model moved to the GPU (`Module.to`), then one attention function's intermediates
/// allocated in forward until the device (`capacity`) is full.
pub(crate) fn oom_in_attention(path: &std::path::Path, capacity: u64) {
    let torch = "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py";
    let mut stacks = StackTable::default();
    let to = module_to_stack(&mut stacks, torch);
    let mut stack = |frames: &[(&str, &str)]| add_stack(&mut stacks, frames);
    let attention = stack(&[
        ("/w/model.py", "attention"),
        ("/w/model.py", "forward"),
        (torch, "_call_impl"),
        ("/w/train.py", "main"),
    ]);
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(Some(capacity)));
    for _ in 0..4 {
        a.malloc(16 * MIB, 0).expect("fits");
    }
    let mut entries = a.take_events();
    let parameters = entries.len();
    while a.malloc(30 * MIB, 0).is_ok() {}
    entries.extend(a.take_events());
    let mut all = Vec::new();
    let layout = a.layout(0);
    for (i, mut e) in entries.into_iter().enumerate() {
        if matches!(e.action(), Action::Alloc | Action::Oom) {
            e.stack = if i < parameters { to } else { attention };
        }
        all.push(e);
    }
    write_snapshot(&model_snapshot(all, layout, stacks, None), path);
}

#[test]
fn an_oom_in_one_functions_intermediates_is_mostly_activation() {
    let dir = Scratch::new("categories_oom");
    let file = dir.join("oom.pickle");
    oom_in_attention(&file, 512 * MIB);
    let doc = analyze_json(std::slice::from_ref(&file));
    let d = &doc["inputs"][0]["devices"][0];
    assert!(!d["oom"].is_null(), "{d}");
    let at_oom = &d["categories"]["at_oom"];
    let total = sum(at_oom);
    assert_eq!(bytes(at_oom, "parameter"), 64 * MIB, "{at_oom}");
    assert!(bytes(at_oom, "activation") * 4 > total * 3, "{at_oom}");
    assert_eq!(bytes(at_oom, "activation") + 64 * MIB, total);
    let text = stdout(&memprof(&["analyze", &file.display().to_string()]));
    assert!(text.contains("    at the OOM "), "{text}");
    // A rule of the user's own comes first.
    let out = memprof(&[
        "analyze",
        "--json",
        "--category",
        "attention=model\\.py:7:attention",
        &file.display().to_string(),
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let at_oom = &doc["inputs"][0]["devices"][0]["categories"]["at_oom"];
    assert_eq!(bytes(at_oom, "activation"), 0, "{at_oom}");
    assert_eq!(bytes(at_oom, "attention") + 64 * MIB, total, "{at_oom}");
    let bad = memprof(&["analyze", "--category", "x=(", &file.display().to_string()]);
    assert_eq!(bad.status.code(), Some(2));
    // The report draws a stacked bar per moment.
    let page = dir.join("report.html");
    let out = memprof(&[
        "report",
        &file.display().to_string(),
        "-o",
        &page.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let html = std::fs::read_to_string(&page).expect("written");
    let section = html
        .split("<h3>What the live memory is</h3>")
        .nth(1)
        .expect("the categories section");
    for moment in ["at the peak", "at the OOM", "at the dump"] {
        assert!(
            section.contains(&format!("<tr><th>{moment}</th>")),
            "{moment}"
        );
    }
    assert!(section.contains("title=\"activation: "), "{section}");
}

#[test]
fn record_function_ranges_give_the_phase_table() {
    let Some(d) = real_device("kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle")
    else {
        return;
    };
    let phases = d["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "Optimizer.zero_grad#AdamW.zero_grad",
            "Optimizer.step#AdamW.step"
        ]
    );
    let step = &phases[1];
    assert_eq!(step["source"], "annotation");
    // The step is where the run peaks: Adam's state is made beside the gradients.
    assert_eq!(step["peak_bytes"], d["trace"]["peak_active_bytes"]);
    assert_eq!(step["top_categories"][0]["category"], "optimizer_state");
    assert!(step["at_entry_bytes"].as_u64() < step["peak_bytes"].as_u64());
    // Without annotations, the stacks' forward, backward and optimizer runs.
    let Some(d) = real_device("JasperSolt__EoR_NN__snapshot.pickle") else {
        return;
    };
    let phases = d["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases
        .iter()
        .take(3)
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "forward (iteration 1)",
            "backward (iteration 1)",
            "optimizer step (iteration 1)"
        ]
    );
    assert!(phases.iter().all(|p| p["source"] == "stacks"));
}

#[test]
fn diff_shows_the_categories_that_grew() {
    let dir = Scratch::new("categories_diff");
    let (before, after) = (dir.join("before.pickle"), dir.join("after.pickle"));
    oom_in_attention(&before, 512 * MIB);
    oom_in_attention(&after, 1024 * MIB);
    let (b, a) = (before.display().to_string(), after.display().to_string());
    let out = memprof(&["diff", "--json", &b, &a]);
    assert_eq!(out.status.code(), Some(1), "the peak grew");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let categories = &doc["devices"][0]["categories"];
    assert_eq!(categories[0]["category"], "activation", "{categories}");
    assert!(categories[0]["after_bytes"].as_u64() > categories[0]["before_bytes"].as_u64());
    assert_eq!(categories[1]["category"], "parameter", "{categories}");
    assert_eq!(categories[1]["after_bytes"], categories[1]["before_bytes"]);
    let text = stdout(&memprof(&["diff", &b, &a]));
    assert!(
        text.contains("  by category at the peak: activation +"),
        "{text}"
    );
    // An analyze JSON document carries its categories into the diff as well.
    let json = dir.join("after.json");
    std::fs::write(&json, memprof(&["analyze", "--json", &a]).stdout).expect("writable");
    let out = memprof(&["diff", "--json", &b, &json.display().to_string()]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc["devices"][0]["categories"], *categories);
}

/// An optimizer step that replaces tensors (`p.data = ...`) instead of updating them in place:
/// the new ones are what the old ones were, whether the old ones were made in the trace or
/// were alive before it.
#[test]
fn tensors_a_step_replaces_keep_the_category_of_the_ones_they_replace() {
    let dir = Scratch::new("categories_replaced");
    let file = dir.join("replaced.pickle");
    let torch = "/usr/lib/python3.11/site-packages/torch";
    let module = format!("{torch}/nn/modules/module.py");
    let adam = format!("{torch}/optim/adam.py");
    let mut stacks = StackTable::default();
    let to = module_to_stack(&mut stacks, &module);
    let mut stack = |frames: &[(&str, &str)]| add_stack(&mut stacks, frames);
    let cache = stack(&[("/w/model.py", "forward"), ("/w/train.py", "main")]);
    let step = stack(&[(&adam, "step"), ("/w/train.py", "main")]);
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(None));
    // Alive before the trace: a parameter and, of the same size, a cache made in forward.
    let old = a.malloc(16 * MIB, 0).expect("fits");
    a.malloc(16 * MIB, 0).expect("fits");
    let cached = a.take_events();
    // In the trace: a second parameter, then a step that makes a new tensor for each
    // parameter and frees the old one.
    let second = a.malloc(16 * MIB, 0).expect("fits");
    a.malloc(16 * MIB, 0).expect("fits");
    a.free(old).expect("alive");
    a.malloc(16 * MIB, 0).expect("fits");
    a.free(second).expect("alive");
    let mut entries = a.take_events();
    let mut allocs = 0;
    for e in &mut entries {
        e.stack = match e.action() {
            Action::Alloc => {
                allocs += 1;
                if allocs == 1 {
                    to
                } else {
                    step
                }
            }
            // PyTorch's free entries carry the stack of the allocation they free.
            Action::FreeRequested | Action::FreeCompleted => to,
            _ => None,
        };
    }
    let mut layout = a.layout(0);
    let cached_at = cached
        .iter()
        .filter(|e| e.action() == Action::Alloc)
        .filter_map(|e| e.addr())
        .find(|&addr| addr != old)
        .expect("the cache");
    for block in layout.iter_mut().flat_map(|s| &mut s.blocks) {
        block.stack = if block.address == cached_at {
            cache
        } else {
            step
        };
    }
    write_snapshot(&model_snapshot(entries, layout, stacks, None), &file);
    let doc = analyze_json(std::slice::from_ref(&file));
    let at_dump = &doc["inputs"][0]["devices"][0]["categories"]["at_dump"];
    assert_eq!(bytes(at_dump, "parameter"), 32 * MIB, "{at_dump}");
    assert_eq!(bytes(at_dump, "optimizer_state"), 0, "{at_dump}");
    assert_eq!(sum(at_dump), 48 * MIB, "{at_dump}");
}
