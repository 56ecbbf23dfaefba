//! Memory named in the user's terms: a foreach optimizer's step temporaries with the change
//! that removes them, gradients made by the autograd engine as gradients, live memory without a
//! stack with its reason and fix, and the anomalies of a trace (pending-free stalls, leak
//! suspects, lifetimes of freed blocks), on a built `torch.optim.AdamW(foreach=True)`-like run
//! and on the real snapshots in `../shared/fixtures/real/`.

use crate::util::{add_stack, module_to_stack, Scratch};
use crate::util::{analyze_json, memprof, model_snapshot, real_file, stdout, write_snapshot};
use memprof::model::{Action, StackId, StackTable, TraceEntry};
use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const TORCH: &str = "/usr/lib/python3.11/site-packages/torch";

/// Two training iterations of four 16 MiB parameters under a foreach AdamW: forward keeps two
/// 8 MiB activations and appends the loss to a list that lives on, backward frees the
/// activations and `AccumulateGrad` makes the gradients (first iteration), the step makes the
/// state (first iteration) and four 16 MiB `_multi_tensor_adamw` temporaries it frees. One
/// activation is used on a second stream and its free completes 5 ms later.
fn foreach_adamw(path: &std::path::Path) {
    let module = format!("{TORCH}/nn/modules/module.py");
    let adamw = format!("{TORCH}/optim/adamw.py");
    let optimizer = format!("{TORCH}/optim/optimizer.py");
    let mut stacks = StackTable::default();
    let to = module_to_stack(&mut stacks, &module);
    let mut stack = |frames: &[(&str, &str)]| add_stack(&mut stacks, frames);
    let forward = stack(&[
        ("/w/model.py", "forward"),
        (&module, "_call_impl"),
        ("/w/train.py", "main"),
    ]);
    let loss = stack(&[("/w/train.py", "train_step"), ("/w/train.py", "main")]);
    let grad = stack(&[
        ("??", "at::_ops::new_empty_strided::call(...)"),
        ("??", "torch::autograd::AccumulateGrad::apply(...)"),
        ("??", "torch::autograd::Engine::thread_main(...)"),
    ]);
    let state = stack(&[
        (&adamw, "_init_group"),
        (&adamw, "step"),
        (&optimizer, "wrapper"),
        ("/w/train.py", "main"),
    ]);
    let temporary = stack(&[
        (&adamw, "_multi_tensor_adamw"),
        (&adamw, "adamw"),
        (&adamw, "step"),
        (&optimizer, "wrapper"),
        ("/w/train.py", "main"),
    ]);
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(None));
    let mut all: Vec<TraceEntry> = Vec::new();
    let mut now = 0i64;
    let mut take = |a: &mut CachingAllocator, stack: Option<StackId>, wait: i64| {
        now += wait;
        for mut e in a.take_events() {
            if e.action() == Action::Alloc {
                e.stack = stack;
            }
            now += 10;
            all.push(e.with_time(Some(now)));
        }
    };
    let mut malloc = |a: &mut CachingAllocator, size: u64, s: Option<StackId>| {
        let addr = a.malloc(size, 0).expect("no limit");
        take(a, s, 0);
        addr
    };
    // Frees go through the allocator; their entries are taken at the next malloc.
    let params: Vec<u64> = (0..4).map(|_| malloc(&mut a, 16 * MIB, to)).collect();
    let mut grads_made = false;
    for iteration in 0..2 {
        let acts: Vec<u64> = (0..2).map(|_| malloc(&mut a, 8 * MIB, forward)).collect();
        malloc(&mut a, 512, loss);
        if iteration == 0 {
            a.record_stream(acts[0], 7).expect("allocated");
        }
        for &x in &acts {
            a.free(x).expect("allocated");
        }
        if !grads_made {
            for _ in &params {
                malloc(&mut a, 16 * MIB, grad);
            }
            grads_made = true;
        }
        if iteration == 0 {
            // The other stream's work ends 5 ms after the free was asked for.
            a.free_completed(acts[0]).expect("pending");
        }
        if iteration == 0 {
            for _ in 0..2 * params.len() {
                malloc(&mut a, 16 * MIB, state);
            }
        }
        let temps: Vec<u64> = (0..4)
            .map(|_| malloc(&mut a, 16 * MIB, temporary))
            .collect();
        for t in temps {
            a.free(t).expect("allocated");
        }
    }
    take(&mut a, None, 0);
    // Stretch the stall: 5 ms between the first free_requested and its free_completed.
    let requested = all
        .iter()
        .position(|e| e.action() == Action::FreeRequested)
        .expect("a free");
    let completed = requested
        + all[requested..]
            .iter()
            .position(|e| e.action() == Action::FreeCompleted && e.addr() == all[requested].addr())
            .expect("its completion");
    for e in &mut all[completed..] {
        let t = e.time_us().expect("timed");
        *e = e.with_time(Some(t + 5000));
    }
    let layout = a.layout(0);
    write_snapshot(&model_snapshot(all, layout, stacks, None), path);
}

fn device(doc: &Value) -> &Value {
    &doc["inputs"][0]["devices"][0]
}

fn bytes(list: &Value, category: &str) -> u64 {
    list.as_array()
        .into_iter()
        .flatten()
        .find(|c| c["category"] == category)
        .and_then(|c| c["bytes"].as_u64())
        .unwrap_or(0)
}

fn sentence(d: &Value, kind: &str) -> String {
    d["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["kind"] == kind)
        .and_then(|f| f["sentence"].as_str())
        .unwrap_or_else(|| panic!("no {kind} finding in {}", d["findings"]))
        .to_string()
}

#[test]
fn a_foreach_adamw_step_names_its_temporaries_and_the_fix() {
    let dir = Scratch::new("blame_foreach");
    let file = dir.join("adamw.pickle");
    foreach_adamw(&file);
    let doc = analyze_json(std::slice::from_ref(&file));
    let d = device(&doc);
    let peak = &d["categories"]["at_peak"];
    assert_eq!(bytes(peak, "optimizer_temporary"), 64 * MIB, "{peak}");
    assert_eq!(bytes(peak, "gradient"), 64 * MIB, "{peak}");
    assert_eq!(bytes(peak, "optimizer_state"), 128 * MIB, "{peak}");
    // Only the list of losses is something else.
    assert!(bytes(peak, "other") <= 1024, "{peak}");
    let said = sentence(d, "optimizer_temporaries");
    assert!(
        said.starts_with(
            "optimizer step temporaries: 64.00 MiB (requested) alive at once inside the optimizer step"
        ),
        "{said}"
    );
    assert!(
        said.contains(
            "(64.00 MiB of them at the peak), made by _multi_tensor_adamw, the foreach \
             implementation"
        ),
        "{said}"
    );
    assert!(
        said.ends_with(
            "a fused optimizer (`fused=True`) or `foreach=False` removes most of that 64.00 MiB \
             transient"
        ),
        "{said}"
    );
    let text = stdout(&memprof(&["analyze", &file.display().to_string()]));
    assert!(text.contains(&format!("  {said}\n")), "{text}");
    // The anomalies: one stall, the loss list growing each iteration, the lifetimes.
    let a = &d["anomalies"];
    assert_eq!(a["stalls"]["count"], 1, "{a}");
    assert!(
        text.contains(
            "  pending-free stalls: 1 free waited over 1.0 ms for other streams (8.00 MiB held \
             meanwhile); the longest 5.1 ms for 8.00 MiB at /w/model.py:7:forward"
        ),
        "{text}"
    );
    let first = &a["leak_suspects"]["sites"][0];
    assert_eq!(first["site"], "/w/train.py:7:train_step", "{a}");
    assert_eq!(first["iterations"], 2, "{a}");
    assert!(
        text.contains(
            "(2 optimizer steps seen): 1.00 KiB at /w/train.py:7:train_step (2 allocs, iterations \
             1 to 2, 2 of them)"
        ),
        "{text}"
    );
    let freed: u64 = a["lifetimes"]
        .as_array()
        .expect("buckets")
        .iter()
        .map(|b| b["count"].as_u64().expect("count"))
        .sum();
    // Two activations and four temporaries per iteration.
    assert_eq!(freed, 12, "{a}");
    assert!(
        text.contains("  freed blocks by lifetime (alloc to free): "),
        "{text}"
    );
}

/// The first device of a real file's analysis; `None` (skipped) when absent.
fn real(rel: &str) -> Option<Value> {
    let path = real_file(rel)?;
    Some(device(&analyze_json(&[path])).clone())
}

#[test]
fn real_optimizer_steps_name_their_temporaries_and_gradients() {
    // torch.optim.Adam with its default foreach implementation, on one 7.5 MiB tensor.
    if let Some(d) = real("JasperSolt__EoR_NN__snapshot.pickle") {
        let t = &d["categories"]["optimizer_temporaries"];
        assert_eq!(t["implementation"], "_multi_tensor_adam", "{t}");
        let said = sentence(&d, "optimizer_temporaries");
        assert!(
            said.starts_with(
                "optimizer step temporaries: 7.50 MiB (requested) alive at once inside the optimizer step"
            ),
            "{said}"
        );
        assert!(
            said.contains("made by _multi_tensor_adam, the foreach implementation"),
            "{said}"
        );
        assert!(
            said.ends_with("removes most of that 7.50 MiB transient"),
            "{said}"
        );
    }
    // A course's own AdamW, written out of place: its temporaries are its arithmetic's. Its
    // weights were made before recording began, and the autograd engine's gradients
    // (`at::_ops::new_empty_strided` under the engine) are gradients.
    for (rel, site, unrecorded) in [
        (
            "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle",
            "/home/c-kaitwang/assignment1/cs336_basics/optimizers.py:100:step",
            "12.69 GiB (requested) in 324 allocations",
        ),
        (
            "more/sidsoc12__spring2024-assignment2-systems__mem_snapshot_ctx128_fp32_train.pickle",
            "/home/ubuntu/spring2024-assignment2-systems/cs336-basics/cs336_basics/optimizer.py:71:step",
            "12.72 GiB (requested) in 295 allocations",
        ),
    ] {
        let Some(d) = real(rel) else { continue };
        let peak = &d["categories"]["at_peak"];
        assert_eq!(bytes(peak, "gradient"), bytes(peak, "parameter"), "{rel}: {peak}");
        assert!(bytes(peak, "gradient") > 12 << 30, "{rel}: {peak}");
        assert!(bytes(peak, "optimizer_temporary") > 100 * MIB, "{rel}: {peak}");
        assert!(bytes(peak, "other") < 100 * MIB, "{rel}: {peak}");
        let said = sentence(&d, "optimizer_temporaries");
        assert!(
            said.contains(&format!(
                "made by the step's own arithmetic at {site}; written in place (`mul_`, \
                 `addcdiv_`, `add_`) the step would not allocate them"
            )),
            "{rel}: {said}"
        );
        let said = sentence(&d, "unrecorded_stacks");
        assert!(
            said.starts_with(&format!("<no stack recorded>: {unrecorded} ")),
            "{rel}: {said}"
        );
        assert!(
            said.contains(
                "alive at the peak was allocated before recording began (the model was built, \
                 or moved to the GPU, before `torch.cuda.memory._record_memory_history()` was \
                 called); call it before building the model"
            ),
            "{rel}: {said}"
        );
    }
}

/// The autograd engine's gradients have no Python frame (its thread runs none), so no module:
/// their site is the node that makes a parameter's `.grad`, `AccumulateGrad`, not the
/// allocation helper it called (`at::_ops::new_empty_strided`).
#[test]
fn the_engines_gradients_are_sited_at_accumulate_grad() {
    let rel =
        "more/sidsoc12__spring2024-assignment2-systems__mem_snapshot_ctx128_fp32_train.pickle";
    let Some(d) = real(rel) else { return };
    let sites = d["top_sites"].as_array().expect("sites");
    let frames: Vec<&str> = sites.iter().filter_map(|s| s["frame"].as_str()).collect();
    assert!(
        !frames.iter().any(|f| f.contains("new_empty_strided")),
        "{frames:?}"
    );
    let grad = sites
        .iter()
        .find(|s| s["frame"] == "torch::autograd::AccumulateGrad::apply")
        .unwrap_or_else(|| panic!("{frames:?}"));
    let gradients = bytes(&d["categories"]["at_peak"], "gradient");
    let at_site = grad["bytes"].as_u64().unwrap_or(0);
    assert!(
        at_site > 12 << 30 && at_site <= gradients,
        "{at_site} of {gradients} gradient bytes"
    );
}

#[test]
fn a_helper_that_serves_many_callers_is_attributed_to_them() {
    // FlexGen's `allocate` helper makes every weight and cache tensor for its callers.
    let Some(d) = real("more/Yiyi-philosophy__LLM-inference__1.3b_snapshot_23d4f52.pickle") else {
        return;
    };
    let w = &d["categories"]["wrappers"][0];
    assert_eq!(w["caller_count"], 3, "{w}");
    let said = sentence(&d, "wrapper");
    assert!(
        said.starts_with(
            "/home/dingyiran/git_Flex/flexgen/pytorch_backend.py:195:allocate is the innermost \
             user frame of 762.08 MiB alive at the dump, made for 3 distinct callers; by caller: \
             /home/dingyiran/git_Flex/flexgen/compression.py:45:allocate (676.31 MiB), "
        ),
        "{said}"
    );
}

#[test]
fn a_private_pools_allocations_are_a_category_of_their_own() {
    let file = crate::util::fixture("snapshots/private_pool.pickle");
    let doc = analyze_json(&[file]);
    let d = device(&doc);
    let pools = d["pools"].as_array().expect("pools");
    let private: u64 = pools
        .iter()
        .filter(|p| p["id"] != serde_json::json!([0, 0]))
        .map(|p| p["allocated_bytes"].as_u64().expect("allocated"))
        .sum();
    assert!(private > 0, "{pools:?}");
    assert_eq!(bytes(&d["categories"]["at_dump"], "private_pool"), private);
}
