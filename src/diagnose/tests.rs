//! Generated OOM fixtures, one per diagnosis class: a small program drives the allocator model
//! (as "the real allocator", under a capacity) until it runs out of memory; its trace and final
//! segments make a snapshot, which is then diagnosed. `fixtures/README.md` describes them.

use super::*;
use crate::analysis;
use crate::analysis::oom::Cause;
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
    let (recorded, _) = replay::recorded_config(snapshot);
    let trace = &DeviceTrace::all(snapshot)[0];
    let prepared = replay::prepare(trace, &recorded, None);
    assert!(prepared.validation.first_mismatch.is_none());
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
    let actions: Vec<&str> = d.remedies.iter().map(|r| r.action.as_str()).collect();
    assert!(actions.contains(&"expandable_segments:True"), "{actions:?}");
    assert!(d.remedies.iter().all(|r| r.verified));
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
    let actions: Vec<&str> = d.remedies.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["expandable_segments:True"]);
    // With expandable segments on, the same program does not run out of memory at all.
    let s = fragmented("expandable_segments:True");
    assert!(s.timeline.device(0).iter().all(|e| e.action != Action::Oom));
}

#[test]
fn generated_exhaustion_and_outside_allocator() {
    let s = exhausted();
    let d = diagnosed(&s, None);
    assert_eq!(d.cause, Cause::Exhaustion, "{}", d.evidence);
    assert_eq!(d.device_free_bytes, Some(20 * MIB));
    assert!(d.remedies.iter().all(|r| r.oom_avoided != Some(true)));
    let plan = d.remedies.last().expect("a plan");
    assert!(!plan.verified && plan.action.starts_with("plan: "));
    assert!(plan.action.contains("10.00 MiB"), "{}", plan.action);
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

#[test]
fn generated_growth() {
    // Each iteration: a 20 MiB temporary, 12 MiB kept for good; a `snapshot` entry marks the
    // start of each iteration. The seventh iteration cannot keep its 12 MiB.
    let mut starts = Vec::new();
    let mut s = recorded("", 100 * MIB, |a| {
        for _ in 0..7 {
            starts.push(a.events().len());
            let t = ok(a, 20 * MIB);
            if a.malloc(12 * MIB, 0).is_err() {
                break;
            }
            a.free(t).expect("allocated");
        }
    });
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
    // Without the markers the same trace is exhaustion: nothing is claimed about iterations.
    let d = diagnosed(
        &recorded("", 100 * MIB, |a| {
            for _ in 0..7 {
                let t = ok(a, 20 * MIB);
                if a.malloc(12 * MIB, 0).is_err() {
                    break;
                }
                a.free(t).expect("allocated");
            }
        }),
        None,
    );
    assert_eq!(d.cause, Cause::Exhaustion);
}
