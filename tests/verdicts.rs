//! The sentences `analyze` and `diagnose` put in front of a user, on the real snapshots of
//! `../shared/fixtures/real/` (skipped, with a message, where that folder is absent) and on the
//! generated OOM fixtures: every figure names its moment, near misses are reported, the
//! version the file shows is named, and a file without a trace says what is known.

use crate::util::{
    fixture, memprof, model_snapshot, real_fixtures, stdout, write_snapshot, Scratch, Within,
};
use serde_json::Value;
use std::path::PathBuf;

/// A real snapshot, or `None` (with a message) where the real fixtures are absent.
fn real(rel: &str) -> Option<PathBuf> {
    crate::util::real_file(rel)
}

/// `analyze`'s text on a real snapshot, which must succeed; `None` where it is absent.
fn analyze_real(rel: &str) -> Option<String> {
    let file = real(rel)?;
    let (code, text) = run(&["analyze", &file.display().to_string()]);
    assert_eq!(code, 0, "{text}");
    Some(text)
}

fn run(args: &[&str]) -> (i32, String) {
    let out = memprof(args);
    (out.status.code().unwrap_or(-1), stdout(&out))
}

fn json(args: &[&str]) -> Value {
    let (code, text) = run(args);
    assert_eq!(code, 0, "{args:?}");
    serde_json::from_str(&text).expect("one JSON document")
}

#[test]
fn a_near_miss_is_reported_with_its_retry_and_the_capacity_it_brackets() {
    let Some(file) = real("more/HugePandaCoder__octree-nca-groupeq__inference2_peso_oct.pickle")
    else {
        return;
    };
    let file = file.display().to_string();
    let (code, text) = run(&["diagnose", &file]);
    assert_eq!(code, 0, "no OOM: a pressure verdict, exit 0");
    assert!(text.contains("no out-of-memory error found"), "{text}");
    assert!(
        text.contains(
            "near miss: the allocator hit the device limit and recovered once (each time it \
             released every cached block and synchronized the device"
        ),
        "{text}"
    );
    assert!(
        text.contains("first at entry 2063, 3.522 s into the trace: a request of 6.85 GiB"),
        "{text}"
    );
    assert!(
        text.contains(
            "device memory for the allocator: between 22.69 GiB and 25.14 GiB (at least the peak \
             of reserved memory; less than what an OOM retry shows: reserved before its releases \
             plus the segment it then got)"
        ),
        "{text}"
    );
    let doc = json(&["analyze", "--json", &file]);
    let p = &doc["inputs"][0]["devices"][0]["pressure"];
    assert_eq!(p["oom_retries"], 1);
    assert_eq!(p["empty_cache_bursts"], 0);
    assert_eq!(p["capacity_source"], "inferred");
    let (min, max) = (
        p["capacity_bytes_min"].as_u64().expect("min"),
        p["capacity_bytes_max"].as_u64().expect("max"),
    );
    assert!(min < max);
    assert_eq!(p["headroom_at_peak_bytes"].as_u64(), Some(max - min));
    let (_, text) = run(&["analyze", &file]);
    assert!(text.contains("near miss"), "analyze says it too: {text}");
}

#[test]
fn a_dump_at_the_limit_without_a_trace_gets_a_verdict() {
    let Some(file) = real("more/hlinander__equivariant-posteriors__oom_snapshot_new.pickle") else {
        return;
    };
    let (code, text) = run(&["diagnose", &file.display().to_string()]);
    assert_eq!(code, 0);
    assert!(
        text.contains(
            "at the limit of what the allocator holds: 36.60 GiB of 37.90 GiB reserved is active \
             and 1.30 GiB (3%) cached free, so if this dump came from an OOM, live memory filled \
             the device, not fragmentation"
        ),
        "{text}"
    );
    let (_, text) = run(&["analyze", &file.display().to_string()]);
    assert!(
        text.contains("no trace to judge: memory history was not recorded, so the peak"),
        "{text}"
    );
}

#[test]
fn a_one_entry_trace_does_not_invent_a_peak() {
    let Some(file) = real("more/jogregoire__How-Diffusion-Models-Work__my_snapshot.pickle") else {
        return;
    };
    let (_, text) = run(&["analyze", &file.display().to_string()]);
    assert!(
        text.contains(
            "no trace to judge: the trace holds one entry, so the peak, OOM retries and \
             empty_cache() calls are not known"
        ),
        "{text}"
    );
    assert!(
        text.contains("trace          1 entry: 1 free_completed"),
        "{text}"
    );
    assert!(!text.contains("peak requested"), "{text}");
    assert!(!text.contains("before the trace began"), "{text}");
}

#[test]
fn the_header_names_the_pytorch_versions_the_file_shows() {
    let cases = [
        (
            "more/Yiyi-philosophy__LLM-inference__1.3b_snapshot_6a8eab0.pickle",
            "PyTorch 2.0 snapshot",
            ("2.0", "2.0"),
        ),
        (
            "kkaitlyn111__cs336-a2-systems__memory_ctx128_fullstep.pickle",
            "PyTorch 2.5 to 2.7 snapshot",
            ("2.5", "2.7"),
        ),
        (
            "JasperSolt__EoR_NN__snapshot.pickle",
            "PyTorch 2.2 snapshot",
            ("2.2", "2.2"),
        ),
        (
            "more/CognitoBlocks__BlockZero__cuda_snapshot.pickle",
            "PyTorch 2.9 snapshot",
            ("2.9", "2.9"),
        ),
    ];
    for (rel, header, (min, max)) in cases {
        let Some(file) = real(rel) else { continue };
        let file = file.display().to_string();
        let (_, text) = run(&["analyze", &file]);
        let first = text.lines().next().unwrap_or_default();
        assert!(first.contains(header), "{rel}: {first}");
        let doc = json(&["analyze", "--json", &file]);
        let v = &doc["inputs"][0]["torch_version"];
        assert_eq!(
            (v["min"].as_str(), v["max"].as_str()),
            (Some(min), Some(max)),
            "{rel}"
        );
    }
}

#[test]
fn the_oom_figures_are_those_of_the_oom_and_peak_reserved_sits_beside_peak_active() {
    let file = fixture("snapshots/demo_oom.pickle").display().to_string();
    let (_, text) = run(&["analyze", &file]);
    for line in [
        "  at the dump:",
        "    peak allocated  20.66 GiB  at entry 942 of 1649, 0.030 s",
        "    peak requested  20.65 GiB  at entry 942 of 1649, 0.030 s",
        "    peak reserved   22.32 GiB  at entry 941 of 1649, 0.030 s (torch.cuda.max_memory_reserved())",
        "    at the OOM: reserved 19.27 GiB, allocated 14.09 GiB, requested 14.09 GiB, active 14.09 GiB, cached free 5.18 GiB (largest free block 2.40 GiB)",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let doc = json(&["analyze", "--json", &file]);
    let at = &doc["inputs"][0]["devices"][0]["oom"]["at_oom"];
    assert_eq!(at["largest_free_block_bytes"], 2573991936u64);
    assert_eq!(
        at["reserved_bytes"],
        doc["inputs"][0]["devices"][0]["oom"]["diagnosis"]["reserved_bytes"]
    );
}

#[test]
fn every_real_snapshot_gets_a_verdict_without_error() {
    let Some(dir) = real_fixtures() else {
        return;
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for sub in [dir.clone(), dir.join("more")] {
        for e in std::fs::read_dir(&sub).expect("readable").flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "pickle" || x == "pkl") {
                files.push(p);
            }
        }
    }
    assert!(files.len() >= 28, "{} files", files.len());
    for f in files {
        let f = f.display().to_string();
        let doc = json(&["diagnose", "--json", &f]);
        for d in doc["devices"].as_array().expect("devices") {
            let no_trace = d["findings"]
                .as_array()
                .is_some_and(|f| f.iter().any(|f| f["kind"] == "no_trace"));
            assert!(d["pressure"].is_object() || no_trace, "{f}: {d}");
        }
        // A remedy is a complete setting that keeps what the file recorded.
        let recorded = json(&["analyze", "--json", &f])["inputs"][0]["alloc_conf"].clone();
        for diag in doc["diagnoses"].as_array().expect("diagnoses") {
            for r in diag["remedies"].as_array().into_iter().flatten() {
                if let (Some(conf), Some(rec)) = (r["alloc_conf"].as_str(), recorded.as_str()) {
                    for item in rec.split(',').filter(|i| !i.is_empty()) {
                        let key = item.split(':').next().unwrap_or_default();
                        assert!(conf.contains(key), "{f}: {conf} drops {item}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_file_whose_blocks_carry_stacks_had_history_on() {
    let Some(file) = real("more/ZijianDu__Attention__memory_9e91cf3.pickle") else {
        return;
    };
    let (_, text) = run(&["analyze", &file.display().to_string()]);
    assert!(
        text.contains(
            "no trace to judge: memory history was recorded (the blocks carry stacks) but the \
             trace was not kept, as with `enabled=\"state\"`, so the peak"
        ),
        "{text}"
    );
    assert!(!text.contains("was not recorded"), "{text}");
}

#[test]
fn pending_free_is_named_apart_from_allocated() {
    let (_, text) = run(&[
        "analyze",
        &fixture("snapshots/pending_free.pickle")
            .display()
            .to_string(),
    ]);
    assert!(
        text.contains("    allocated       22.14 MiB  requested 22.14 MiB"),
        "{text}"
    );
    assert!(
        text.contains(
            "    pending free    10.31 MiB  freed by the program, waiting on other streams (active 32.45 MiB)"
        ),
        "{text}"
    );
    let doc = json(&[
        "analyze",
        "--json",
        &fixture("snapshots/pending_free.pickle")
            .display()
            .to_string(),
    ]);
    let d = &doc["inputs"][0]["devices"][0];
    let pending = d["active_bytes"].as_u64().expect("active")
        - d["allocated_bytes"].as_u64().expect("allocated");
    assert_eq!(pending, 10814976, "{d}");
}

/// The fragmentation OOM of `fixtures/README.md` ("the OOM's own moment"), with the 60 MiB
/// tensor freed after the failed request, written as a snapshot pickle into a temporary
/// directory: at the dump a free 60 MiB segment is cached, at the OOM the largest free block
/// was 20 MiB.
fn freed_after_the_oom() -> Within {
    use memprof::model::StackTable;
    use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};
    const MIB: u64 = 1 << 20;
    let mut a = CachingAllocator::new(AllocatorConfig::default(), Driver::new(Some(120 * MIB)));
    let x = a.malloc(60 * MIB, 0).expect("fits");
    a.free(x).expect("allocated");
    let p = a.malloc(20 * MIB, 0).expect("fits");
    a.malloc(30 * MIB, 0).expect("fits");
    a.free(p).expect("allocated");
    let big = a.malloc(60 * MIB, 0).expect("fits");
    assert!(a.malloc(25 * MIB, 0).is_err());
    a.free(big).expect("allocated");
    let snapshot = model_snapshot(a.take_events(), a.layout(0), StackTable::default(), None);
    let dir = Scratch::new("verdicts");
    let path = dir.join("freed_after_the_oom.pickle");
    write_snapshot(&snapshot, &path);
    Within::new(dir, path)
}

#[test]
fn figures_next_to_the_oom_are_of_the_oom_even_when_the_dump_differs() {
    let file = freed_after_the_oom();
    let shown = file.display().to_string();
    let (_, text) = run(&["analyze", &shown]);
    assert!(
        text.contains(
            "    cached free     90.00 MiB  75% of reserved; largest free block 60.00 MiB"
        ),
        "the dump's state: {text}"
    );
    assert!(
        text.contains("    at the OOM: reserved 120.00 MiB, allocated 90.00 MiB, ")
            && text.contains("cached free 30.00 MiB (largest free block 20.00 MiB)"),
        "{text}"
    );
    let (_, text) = run(&["diagnose", &shown]);
    assert!(
        text.contains("cached free 30.00 MiB (largest free block 20.00 MiB)"),
        "{text}"
    );
    let html = file.with_extension("html");
    let (code, _) = run(&["report", &shown, "-o", &html.display().to_string()]);
    assert_eq!(code, 0);
    let page = std::fs::read_to_string(&html).expect("the report");
    assert!(
        page.contains("at the OOM: reserved 120.00 MiB, allocated 90.00 MiB, ")
            && page.contains("cached free 30.00 MiB (largest free block 20.00 MiB)"),
        "{page}"
    );
}

/// Leak suspects are sites whose live allocations come from several iterations. AdamW's
/// state, made in the only optimizer step a trace shows and kept (what the categories call
/// optimizer state), is not one: the line says each was made in one iteration.
#[test]
fn leak_suspects_are_sites_alive_from_several_iterations() {
    let cases = [
        (
            "more/sidsoc12__spring2024-assignment2-systems__mem_snapshot_ctx128_fp32_train.pickle",
            [
                "at the dump   38.28 GiB allocated: optimizer_state 25.38 GiB",
                "leak suspects: none: nothing alive at the trace's end was made in more than one \
                 iteration (1 optimizer step seen); each made in one iteration: 25.43 GiB \
                 (requested) in 585 allocations: 12.69 GiB at",
            ],
        ),
        (
            "more/NiuHuangxiaozi__assignment2-systems__forward_and_backward_memory_snapshot_200_mixed_precision.pickle",
            [
                "leak suspects: 400.73 MiB (requested) in 162 allocations made in the trace is \
                 alive at its end (3 optimizer steps seen): 46.27 MiB at",
                "(2 allocs, iterations 1 to 3, 2 of them)",
            ],
        ),
    ];
    for (file, lines) in cases {
        let Some(text) = analyze_real(file) else {
            continue;
        };
        for line in lines {
            assert!(text.contains(line), "{file}: {line}\n{text}");
        }
    }
}
