//! Generated OOM fixtures, one per diagnosis class: a small program drives the allocator model
//! (as "the real allocator", under a capacity) until it runs out of memory; its trace and final
//! segments make a snapshot, which is then diagnosed. `fixtures/README.md` describes them.

use super::*;
use crate::analysis;
use crate::analysis::oom::Cause;
use crate::analysis::version::{Release, VersionRange};
use crate::diagnose::remedies::Recorded;
use crate::model::{
    Action, AllocatorSettings, Snapshot, SnapshotFormat, StackTable, StreamIndex, Timeline,
    TraceEntry,
};
use crate::sim::replay::{self, DeviceTrace};
use crate::sim::{AllocatorConfig, CachingAllocator, Driver};

const MIB: u64 = 1 << 20;

/// Runs `program` on a model with settings `conf` that may reserve `capacity`, and returns
/// the snapshot it would dump.
fn recorded(conf: &str, capacity: u64, program: impl FnOnce(&mut CachingAllocator)) -> Snapshot {
    let config = AllocatorConfig::parse(conf).expect("valid settings");
    let settings = AllocatorSettings {
        alloc_conf: Some(conf.to_string()),
        expandable_segments: Some(config.expandable_segments),
        max_split_size: config.max_split_size,
        garbage_collection_threshold: config.garbage_collection_threshold,
        ..AllocatorSettings::default()
    };
    let mut real = CachingAllocator::new(config, Driver::new(Some(capacity)));
    program(&mut real);
    let entries = real.take_events();
    let n = entries.len();
    Snapshot {
        format: SnapshotFormat::Modern,
        segments: real.layout(0),
        timeline: Timeline::new(entries, std::iter::once(0..n).collect()),
        stacks: StackTable::default(),
        settings: Some(settings),
        annotations: Vec::new(),
    }
}

fn ok(a: &mut CachingAllocator, size: u64) -> u64 {
    a.malloc(size, 0).expect("fits")
}

fn diagnosed(snapshot: &Snapshot, total: Option<u64>) -> analysis::oom::Diagnosis {
    let (config, _) = replay::recorded_config(snapshot);
    let trace = &DeviceTrace::all(snapshot)[0];
    let prepared = replay::prepare(trace, &config, None);
    assert!(prepared.validation.first_mismatch.is_none());
    let recorded = Recorded {
        config: &config,
        conf: snapshot.alloc_conf(),
        version: VersionRange::default(),
    };
    diagnose_device(snapshot, &prepared, &recorded, total, Depth::WithRemedies)
        .expect("an oom entry")
}

/// 120 MiB of device: a 60 MiB segment left with free 20 MiB and 10 MiB blocks around a live
/// 30 MiB one, a second 60 MiB segment full; then 25 MiB is asked for.
fn fragmented(conf: &str) -> Snapshot {
    recorded(conf, 120 * MIB, |a| {
        let x = ok(a, 60 * MIB);
        a.free(x).expect("allocated");
        let p = ok(a, 20 * MIB);
        ok(a, 30 * MIB);
        a.free(p).expect("allocated");
        ok(a, 60 * MIB);
        let failed = a.malloc(25 * MIB, 0).is_err();
        assert_eq!(failed, !conf.contains("expandable_segments:True"));
    })
}

/// 100 MiB the allocator may reserve: 80 MiB live, then 30 MiB asked for.
fn exhausted() -> Snapshot {
    recorded("", 100 * MIB, |a| {
        ok(a, 40 * MIB);
        ok(a, 40 * MIB);
        assert!(a.malloc(30 * MIB, 0).is_err());
    })
}

#[test]
fn generated_fragmentation() {
    let d = diagnosed(&fragmented(""), None);
    assert_eq!(d.cause, Cause::Fragmentation, "{}", d.evidence);
    assert_eq!(d.request_bytes, 25 * MIB);
    assert_eq!(d.largest_free_block_bytes, Some(20 * MIB));
    assert_eq!(d.reserved_bytes, 120 * MIB);
    assert!(d.evidence.contains("20.00 MiB"), "{}", d.evidence);
    let confs: Vec<&str> = d
        .remedies
        .iter()
        .filter_map(|r| r.alloc_conf.as_deref())
        .collect();
    assert!(confs.contains(&"expandable_segments:True"), "{confs:?}");
    assert!(d
        .remedies
        .iter()
        .filter(|r| r.kind == analysis::oom::RemedyKind::AllocConf)
        .all(|r| r.verified && r.oom_avoided == Some(true)));
    // Cutting live memory is offered last, with the bytes it takes.
    let cut = d.remedies.last().expect("a cut");
    assert_eq!(cut.kind, analysis::oom::RemedyKind::ReduceLive);
    assert_eq!(cut.bytes, Some(5 * MIB));
    let best = &d.remedies[0];
    assert_eq!(best.oom_avoided, Some(true), "{:?}", d.remedies);
    assert!(best.new_peak_reserved_bytes.is_some_and(|p| p <= 120 * MIB));
}

#[test]
fn a_setting_in_force_is_never_offered() {
    let d = diagnosed(
        &fragmented("max_split_size_mb:512,garbage_collection_threshold:0.6"),
        None,
    );
    assert_eq!(d.cause, Cause::Fragmentation);
    let confs: Vec<&str> = d
        .remedies
        .iter()
        .chain(&d.tried)
        .filter_map(|r| r.alloc_conf.as_deref())
        .collect();
    // The whole string to set: the recorded settings kept, the one change added.
    assert_eq!(
        confs,
        [
            "max_split_size_mb:512,garbage_collection_threshold:0.6,expandable_segments:True",
            "max_split_size_mb:512,garbage_collection_threshold:0.6,roundup_power2_divisions:4"
        ]
    );
    let r = &d.remedies[0];
    assert_eq!(r.env, Some("PYTORCH_CUDA_ALLOC_CONF"));
    assert_eq!(r.changed.len(), 1);
    assert_eq!(r.changed[0].key, "expandable_segments");
    assert_eq!(
        d.already_on,
        ["max_split_size_mb:512", "garbage_collection_threshold:0.6"]
    );
    // With expandable segments on, the same program does not run out of memory at all.
    let s = fragmented("expandable_segments:True");
    assert!(s
        .timeline
        .device(0)
        .iter()
        .all(|e| e.action() != Action::Oom));
}

#[test]
fn generated_exhaustion_and_outside_allocator() {
    let s = exhausted();
    let d = diagnosed(&s, None);
    assert_eq!(d.cause, Cause::Exhaustion, "{}", d.evidence);
    assert_eq!(d.device_free_bytes, Some(20 * MIB));
    assert!(d.remedies.iter().all(|r| r.oom_avoided != Some(true)));
    // Every setting replayed still fails, so they are listed as tried and the cut leads.
    assert!(!d.tried.is_empty());
    assert!(d.tried.iter().all(|r| r.oom_avoided == Some(false)));
    let plan = &d.remedies[0];
    assert_eq!(plan.kind, analysis::oom::RemedyKind::ReduceLive);
    assert!(!plan.verified && plan.action.starts_with("cut live memory"));
    assert_eq!(plan.bytes, Some(10 * MIB));
    // The same OOM on a device of 164 MiB: 64 MiB is held outside the allocator.
    let d = diagnosed(&s, Some(164 * MIB));
    assert_eq!(d.cause, Cause::OutsideAllocator, "{}", d.evidence);
    assert!(d.evidence.contains("64.00 MiB"), "{}", d.evidence);
}

#[test]
fn generated_oversized_request() {
    let s = recorded("", 100 * MIB, |a| {
        ok(a, 20 * MIB);
        assert!(a.malloc(200 * MIB, 0).is_err());
    });
    let d = diagnosed(&s, None);
    assert_eq!(d.cause, Cause::OversizedRequest, "{}", d.evidence);
    assert!(d
        .remedies
        .iter()
        .any(|r| r.action.contains("at most 100.00 MiB")));
}

/// 100 MiB: each iteration makes a 20 MiB temporary and keeps 12 MiB for good (a list that
/// accumulates tensors); the seventh cannot keep its 12 MiB. Returns the snapshot and the
/// trace index at which each iteration starts.
fn accumulating() -> (Snapshot, Vec<usize>) {
    let mut starts = Vec::new();
    let s = recorded("", 100 * MIB, |a| {
        for _ in 0..7 {
            starts.push(a.events().len());
            let t = ok(a, 20 * MIB);
            if a.malloc(12 * MIB, 0).is_err() {
                break;
            }
            a.free(t).expect("allocated");
        }
    });
    (s, starts)
}

/// The remedy that frees tensors earlier.
fn freeing(d: &analysis::oom::Diagnosis) -> &analysis::oom::Remedy {
    d.remedies
        .iter()
        .chain(&d.tried)
        .find(|r| r.kind == analysis::oom::RemedyKind::FreeEarlier)
        .expect("a remedy that frees tensors earlier")
}

#[test]
fn generated_growth() {
    // `snapshot` entries mark the start of each iteration.
    let (mut s, starts) = accumulating();
    let mut entries = s.timeline.device(0).to_vec();
    for &i in starts.iter().rev() {
        entries.insert(
            i,
            TraceEntry::new(Action::Snapshot, Some(0), 0, StreamIndex(0)),
        );
    }
    let n = entries.len();
    s.timeline = Timeline::new(entries, std::iter::once(0..n).collect());
    let d = diagnosed(&s, None);
    assert_eq!(d.cause, Cause::Growth, "{}", d.evidence);
    assert!(
        d.evidence.contains("from 0 B to 72.00 MiB"),
        "{}",
        d.evidence
    );
    // No stacks: the kept tensors and the live temporary share one site.
    assert_eq!(d.sites[1].bytes, 92 * MIB);
    let last = d.remedies.last().expect("a program remedy");
    assert!(
        last.action.starts_with("stop live memory growing"),
        "{}",
        last.action
    );
    // Freeing each kept tensor at the end of its iteration: the six kept tensors go, the
    // loop never holds more than a temporary and one kept tensor, and the OOM is gone.
    let r = freeing(&d);
    assert!(r.verified);
    assert_eq!(r.oom_avoided, Some(true), "{r:?}");
    assert_eq!(r.sites[0].bytes, 72 * MIB);
    assert!(
        r.action.starts_with("free the 6 tensors (72.00 MiB)"),
        "{}",
        r.action
    );
    assert_eq!(r.new_peak_allocated_bytes, Some(32 * MIB));
    assert_eq!(
        d.remedies[0], *r,
        "the only remedy that avoids the OOM comes first"
    );
}

#[test]
fn generated_growth_without_markers() {
    // The same program without markers: the iterations come from the repeating allocation
    // pattern (20 MiB, 12 MiB), with a boundary before each 20 MiB temporary (the first
    // follows the trace's first entry, the `segment_alloc` for it).
    let (s, _) = accumulating();
    let d = diagnosed(&s, None);
    assert_eq!(d.cause, Cause::Growth, "{}", d.evidence);
    assert!(d.evidence.contains("every 2 allocations"), "{}", d.evidence);
    assert!(
        d.evidence
            .contains("7 iterations in a row, from 0 B to 72.00 MiB"),
        "{}",
        d.evidence
    );
    let r = freeing(&d);
    assert_eq!(r.oom_avoided, Some(true), "{r:?}");
    assert_eq!(r.sites[0].bytes, 72 * MIB);
    assert_eq!(r.new_peak_allocated_bytes, Some(32 * MIB));
}

#[test]
fn generated_exhaustion_with_a_small_accumulating_list() {
    // 200 MiB: 100 MiB of weights, then iterations that each use a 40 MiB activation and
    // keep 12 MiB; the fourth asks for 70 MiB more. Live memory climbs 36 MiB over the loop,
    // less than the 46 MiB the request lacks: exhaustion, and freeing the kept tensors
    // earlier (verified) does not avoid the OOM.
    let s = recorded("", 200 * MIB, |a| {
        ok(a, 100 * MIB);
        for _ in 0..3 {
            let act = ok(a, 40 * MIB);
            ok(a, 12 * MIB);
            a.free(act).expect("allocated");
        }
        ok(a, 40 * MIB);
        assert!(a.malloc(70 * MIB, 0).is_err());
    });
    let d = diagnosed(&s, None);
    assert_eq!(d.cause, Cause::Exhaustion, "{}", d.evidence);
    let r = freeing(&d);
    assert!(r.verified);
    assert_eq!(r.oom_avoided, Some(false), "{r:?}");
    // The weights (made before the loop) and the live activation stay.
    assert_eq!(r.sites[0].bytes, 36 * MIB);
    // Without a loop nothing is freed earlier.
    let d = diagnosed(&exhausted(), None);
    assert!(
        d.remedies
            .iter()
            .chain(&d.tried)
            .all(|r| r.kind != analysis::oom::RemedyKind::FreeEarlier),
        "{:?}",
        d.remedies
    );
}

#[test]
fn the_oom_figures_are_those_of_the_oom_not_of_the_dump() {
    // The exception frees the 60 MiB tensor before the snapshot is dumped: at the dump a
    // whole free 60 MiB segment is cached, at the OOM the largest free block was 20 MiB.
    let s = recorded("", 120 * MIB, |a| {
        let x = ok(a, 60 * MIB);
        a.free(x).expect("allocated");
        let p = ok(a, 20 * MIB);
        ok(a, 30 * MIB);
        a.free(p).expect("allocated");
        let big = ok(a, 60 * MIB);
        assert!(a.malloc(25 * MIB, 0).is_err());
        a.free(big).expect("allocated");
    });
    let devices = classify_ooms(
        &s,
        Origin::TorchSnapshot,
        analysis::analyze_snapshot(&s, 5, None),
    );
    let d = &devices[0];
    assert_eq!(d.layout.fragmentation.largest_free_block_bytes, 60 * MIB);
    let oom = d.oom.as_ref().expect("an oom entry");
    let at = oom.at_oom.expect("replayed");
    assert_eq!(at.largest_free_block_bytes, Some(20 * MIB));
    assert_eq!(at.reserved_bytes, 120 * MIB);
    assert_eq!(at.allocated_bytes, 90 * MIB);
    assert_eq!(at.free_in_cache_bytes, 30 * MIB);
}

#[test]
fn a_setting_the_version_lacks_is_never_offered() {
    let s = fragmented("");
    let (config, _) = replay::recorded_config(&s);
    let trace = &DeviceTrace::all(&s)[0];
    let prepared = replay::prepare(trace, &config, None);
    let at = |min: (u32, u32), max: Option<(u32, u32)>| {
        let recorded = Recorded {
            config: &config,
            conf: "",
            version: VersionRange {
                min: Some(Release(min.0, min.1)),
                max: max.map(|(a, b)| Release(a, b)),
            },
        };
        diagnose_device(&s, &prepared, &recorded, None, Depth::WithRemedies).expect("an oom entry")
    };
    let confs = |d: &analysis::oom::Diagnosis| -> Vec<String> {
        d.remedies
            .iter()
            .chain(&d.tried)
            .filter_map(|r| r.alloc_conf.clone())
            .collect()
    };
    // PyTorch 2.0 has no expandable segments.
    let d = at((2, 0), Some((2, 0)));
    assert!(
        confs(&d).iter().all(|c| !c.contains("expandable")),
        "{:?}",
        confs(&d)
    );
    // Before 2.9 the memory fraction is a call, not a key of the settings string.
    let gc = |d: &analysis::oom::Diagnosis| {
        d.remedies
            .iter()
            .chain(&d.tried)
            .find(|r| {
                r.alloc_conf
                    .as_deref()
                    .is_some_and(|c| c.contains("garbage_collection_threshold"))
            })
            .cloned()
            .expect("a garbage-collection remedy")
    };
    let old = gc(&at((2, 5), Some((2, 7))));
    assert_eq!(
        old.alloc_conf.as_deref(),
        Some("garbage_collection_threshold:0.8")
    );
    assert!(old
        .code
        .as_deref()
        .is_some_and(|c| c.starts_with("torch.cuda.set_per_process_memory_fraction(1.0)")));
    let new = gc(&at((2, 10), None));
    assert_eq!(
        new.alloc_conf.as_deref(),
        Some("garbage_collection_threshold:0.8,per_process_memory_fraction:1.0")
    );
    assert_eq!(new.code, None);
}

/// 100 MiB the allocator may reserve: two 40 MiB tensors, one freed; a 50 MiB request then
/// needs an OOM retry (the cached 40 MiB segment released), and the very next request, 30 MiB,
/// fails. The `oom` entry records the 10 MiB the device had free.
fn retried_then_failed() -> Snapshot {
    recorded("", 100 * MIB, |a| {
        let x = ok(a, 40 * MIB);
        ok(a, 40 * MIB);
        a.free(x).expect("allocated");
        ok(a, 50 * MIB);
        assert!(a.malloc(30 * MIB, 0).is_err());
    })
}

#[test]
fn the_capacity_bracket_uses_the_free_memory_the_oom_entry_reports() {
    let s = retried_then_failed();
    let (config, _) = replay::recorded_config(&s);
    let trace = &DeviceTrace::all(&s)[0];
    let prepared = replay::prepare(trace, &config, None);
    assert!(prepared.validation.first_mismatch.is_none());
    let p = pressure(&s, &prepared, None);
    // Not 90 to 120 MiB (reserved at the OOM plus the 30 MiB it could not get): the device
    // reported 10 MiB free then.
    assert_eq!(
        (p.capacity_bytes_min, p.capacity_bytes_max),
        (Some(90 * MIB), Some(100 * MIB))
    );
    let lines = crate::report::pressure_text::lines(&p, true);
    assert!(
        lines.contains(
            &"device memory for the allocator: between 90.00 MiB and 100.00 MiB (at least the \
              peak of reserved memory; at most what the `oom` entry shows: reserved then plus \
              the memory the device reported free); at the peak of reserved memory (90.00 MiB) \
              at most 10.00 MiB was left"
                .to_string()
        ),
        "{lines:#?}"
    );
    // The retry came one entry before the OOM: it postponed the OOM, it did not recover.
    assert_eq!(p.oom_retries, 1);
    assert!(lines.iter().all(|l| !l.contains("recovered")), "{lines:#?}");
    assert!(
        lines.contains(
            &"the allocator hit the device limit at entry 8, one entry before the OOM: it \
              released every cached block, synchronized the device and got that request, but \
              no other request was served before the OOM, so it did not recover"
                .to_string()
        ),
        "{lines:#?}"
    );
    // A device total given bounds it too, where it is lower.
    let p = pressure(&s, &prepared, Some(95 * MIB));
    assert_eq!(p.capacity_bytes_max, Some(95 * MIB));
    let lines = crate::report::pressure_text::lines(&p, true);
    assert!(
        lines.iter().any(|l| l.starts_with(
            "device memory for the allocator: between 90.00 MiB and 95.00 MiB (at least the \
             peak of reserved memory; at most the device total given with --capacity)"
        )),
        "{lines:#?}"
    );
}

/// 100 MiB the allocator may reserve: 40 MiB kept for good, then temporaries that each ask
/// for 2 MiB more than the last (none fits the cached one), so the allocator retries.
fn retrying() -> Snapshot {
    recorded("", 100 * MIB, |a| {
        ok(a, 40 * MIB);
        for k in 0..12 {
            let t = ok(a, (24 + 2 * k) * MIB);
            a.free(t).expect("allocated");
        }
        assert!(a.stats().num_alloc_retries > 0);
    })
}

/// Retries without an OOM are a finding, and the settings replayed against them are ranked
/// by the stalls they leave (no OOM to avoid), each with its retry count.
#[test]
fn settings_are_ranked_against_the_retries_of_a_run_that_never_ran_out() {
    let s = retrying();
    let (config, _) = replay::recorded_config(&s);
    let trace = &DeviceTrace::all(&s)[0];
    let prepared = replay::prepare(trace, &config, None);
    assert!(prepared.validation.first_mismatch.is_none());
    assert_eq!(prepared.recorded_run.oom, None);
    let recorded = Recorded {
        config: &config,
        conf: "",
        version: VersionRange {
            min: Some(Release(2, 1)),
            max: Some(Release(2, 1)),
        },
    };
    let p = pressure(&s, &prepared, None);
    assert_eq!(p.oom_retries, 9);
    // The replay at the inferred capacity retries as often as the record.
    assert_eq!(prepared.recorded_run.oom_retries, 9);
    let r = crate::diagnose::remedies::pressure_remedies(&prepared, &recorded)
        .expect("settings replayed against the retries");
    let lines = crate::report::pressure_text::remedy_lines(&r);
    assert_eq!(
        lines[..6],
        [
            "settings replayed against the OOM retries, with 98.00 MiB for the allocator (the \
             peak of reserved memory, where the OOM retries show the device's limit was); the \
             recorded settings give 9 OOM retries, 0 empty_cache() calls:",
            "  1. PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4",
            "     3 OOM retries, 0 empty_cache() calls; peak reserved 92.00 MiB",
            "  2. PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.8",
            "     and in the program: torch.cuda.set_per_process_memory_fraction(1.0)  # before \
             the first allocation; the threshold does nothing without a fraction",
            "     5 OOM retries, 0 empty_cache() calls; peak reserved 98.00 MiB",
        ]
    );
    // PyTorch 2.1 has no per_process_memory_fraction key: never offered as one.
    assert!(r
        .settings
        .iter()
        .all(|s| !s.alloc_conf.as_deref().unwrap_or("").contains("fraction")));
    // Ranked by the one order: no OOM first, then fewer stalls, then the lower peak.
    let keys: Vec<_> = r.settings.iter().map(remedies::rank).collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "{keys:?}");
}
