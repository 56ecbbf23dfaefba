//! Unit tests of every allocator rule of the reference, the published cases, and property
//! tests of the model's invariants.

use super::*;
use crate::model::Action::*;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;
const S1: u64 = 0x1000;

fn model(conf: &str, capacity: Option<u64>) -> CachingAllocator {
    let config = AllocatorConfig::parse(conf).expect("valid settings");
    CachingAllocator::new(config, Driver::new(capacity))
}

fn ok(a: &mut CachingAllocator, size: u64) -> u64 {
    a.malloc(size, 0).expect("fits")
}

/// (action, size) of the entries since the last call.
fn actions(a: &mut CachingAllocator) -> Vec<(Action, u64)> {
    a.take_events()
        .iter()
        .map(|e| (e.action(), e.size))
        .collect()
}

fn checked(a: &CachingAllocator) {
    if let Err(e) = a.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

#[test]
fn published_case_default_settings() {
    let mut a = model("", None);
    let blocks: Vec<u64> = (0..8).map(|_| ok(&mut a, 16 * MIB)).collect();
    assert_eq!(a.reserved(), 128 * MIB);
    for b in blocks {
        a.free(b).expect("allocated");
    }
    for _ in 0..4 {
        ok(&mut a, 32 * MIB);
    }
    assert_eq!(a.reserved(), 256 * MIB);
    checked(&a);
}

#[test]
fn published_case_expandable_segments() {
    let mut a = model("expandable_segments:True", None);
    let blocks: Vec<u64> = (0..8).map(|_| ok(&mut a, 16 * MIB)).collect();
    let maps: Vec<(Action, u64)> = actions(&mut a)
        .into_iter()
        .filter(|(a, _)| *a == SegmentMap)
        .collect();
    assert_eq!(maps, vec![(SegmentMap, 20 * MIB); 7]);
    assert_eq!(a.reserved(), 140 * MIB);
    for b in blocks {
        a.free(b).expect("allocated");
    }
    for _ in 0..4 {
        ok(&mut a, 32 * MIB);
    }
    assert!(!actions(&mut a).iter().any(|(a, _)| *a == SegmentMap));
    assert_eq!(a.reserved(), 140 * MIB);
    checked(&a);
}

#[test]
fn segment_sizes_per_pool() {
    let mut a = model("", None);
    ok(&mut a, 1000);
    ok(&mut a, 11 * MIB + 1);
    ok(&mut a, 2 * MIB);
    let segs: Vec<u64> = actions(&mut a)
        .into_iter()
        .filter(|(a, _)| *a == SegmentAlloc)
        .map(|(_, s)| s)
        .collect();
    assert_eq!(segs, [2 * MIB, 12 * MIB, 20 * MIB]);
    // The alloc entry carries the requested size, the block the rounded one; the 12 MiB
    // segment keeps its unsplit remainder below 1 MiB.
    ok(&mut a, 1000);
    assert_eq!(actions(&mut a), [(Alloc, 1000)]);
    assert_eq!(a.stats().allocated_bytes, 1024 + 12 * MIB + 2 * MIB + 1024);
}

#[test]
fn best_fit_smallest_then_lowest_address_same_stream_only() {
    let mut a = model("", None);
    let x = ok(&mut a, 30 * MIB);
    let y = ok(&mut a, 24 * MIB);
    let z = ok(&mut a, 24 * MIB);
    for b in [x, y, z] {
        a.free(b).expect("allocated");
    }
    a.take_events();
    // 24 MiB blocks fit better than the 30 MiB one; the lower of the two wins.
    assert_eq!(ok(&mut a, 23 * MIB), y.min(z));
    // Another stream does not see these blocks.
    a.malloc(23 * MIB, S1).expect("fits");
    assert!(actions(&mut a).contains(&(SegmentAlloc, 24 * MIB)));
}

#[test]
fn large_pool_splits_only_above_one_mib() {
    let mut a = model("", None);
    let x = ok(&mut a, 12 * MIB);
    a.free(x).expect("allocated");
    // 12 MiB block, 11 MiB request: the 1 MiB remainder stays in the block.
    let y = ok(&mut a, 11 * MIB);
    assert_eq!(a.stats().allocated_bytes, 12 * MIB);
    a.free(y).expect("allocated");
    // 10 MiB - 512 request: 1 MiB + 512 remains, so it splits.
    ok(&mut a, 11 * MIB - 512);
    assert_eq!(a.stats().allocated_bytes, 11 * MIB - 512);
    checked(&a);
}

#[test]
fn small_pool_splits_at_512() {
    let mut a = model("", None);
    let x = ok(&mut a, 1000);
    let y = ok(&mut a, 512);
    assert_eq!(y, x + 1024);
    assert_eq!(a.stats().allocated_bytes, 1536);
    assert_eq!(a.reserved(), 2 * MIB);
}

#[test]
fn free_merges_neighbours() {
    let mut a = model("", None);
    let x = ok(&mut a, 4 * MIB);
    let y = ok(&mut a, 4 * MIB);
    let z = ok(&mut a, 4 * MIB);
    a.free(x).expect("allocated");
    a.free(z).expect("allocated");
    checked(&a);
    a.free(y).expect("allocated");
    checked(&a);
    assert_eq!(a.largest_free_block(), 20 * MIB);
    assert_eq!(a.layout(0).len(), 1);
    assert_eq!(a.layout(0)[0].blocks.len(), 1);
}

#[test]
fn oversize_rules_with_max_split_size() {
    let mut a = model("max_split_size_mb:40", None);
    let big = ok(&mut a, 100 * MIB);
    a.free(big).expect("allocated");
    a.take_events();
    // A small request never carves an oversize block.
    ok(&mut a, 30 * MIB);
    assert!(actions(&mut a).contains(&(SegmentAlloc, 30 * MIB)));
    // A large request may take it only within max_non_split_rounding (20 MiB).
    ok(&mut a, 70 * MIB);
    assert!(actions(&mut a).contains(&(SegmentAlloc, 70 * MIB)));
    ok(&mut a, 81 * MIB);
    assert_eq!(actions(&mut a), [(Alloc, 81 * MIB)]);
    // Oversize blocks are never split.
    assert_eq!(a.stats().allocated_bytes, 30 * MIB + 70 * MIB + 100 * MIB);
}

#[test]
fn oom_retry_order_frees_cached_then_all() {
    let mut a = model("", Some(100 * MIB));
    let x = ok(&mut a, 40 * MIB);
    let y = ok(&mut a, 2000);
    a.free(x).expect("allocated");
    a.free(y).expect("allocated");
    a.take_events();
    ok(&mut a, 70 * MIB);
    assert_eq!(
        actions(&mut a),
        [
            (SegmentFree, 40 * MIB),
            (SegmentFree, 2 * MIB),
            (SegmentAlloc, 70 * MIB),
            (Alloc, 70 * MIB),
        ]
    );
    assert_eq!(a.stats().num_alloc_retries, 1);
    let err = a.malloc(50 * MIB, 0).expect_err("does not fit");
    assert_eq!(err.alloc_size, 50 * MIB);
    let events = a.take_events();
    assert_eq!(events.last().map(|e| e.action()), Some(Oom));
    assert_eq!(events.last().and_then(|e| e.device_free()), Some(30 * MIB));
    assert_eq!(a.stats().num_ooms, 1);
    checked(&a);
}

#[test]
fn release_available_cached_blocks_frees_one_oversize_block_first() {
    let mut a = model("max_split_size_mb:20", Some(120 * MIB));
    let x = ok(&mut a, 30 * MIB);
    let y = ok(&mut a, 70 * MIB);
    let s = ok(&mut a, 2000);
    a.free(x).expect("allocated");
    a.free(y).expect("allocated");
    a.free(s).expect("allocated");
    a.take_events();
    // 40 MiB: best fit refuses the 70 MiB block (over 40 + 20 MiB) and the device is full;
    // the smallest cached block >= 40 MiB is freed alone, the small pool keeps its segment.
    ok(&mut a, 40 * MIB);
    assert_eq!(
        actions(&mut a),
        [
            (SegmentFree, 70 * MIB),
            (SegmentAlloc, 40 * MIB),
            (Alloc, 40 * MIB)
        ]
    );
    assert_eq!(a.stats().num_alloc_retries, 0);
}

#[test]
fn pending_frees_wait_for_completion_or_empty_cache() {
    let mut a = model("", None);
    let x = ok(&mut a, 4 * MIB);
    a.record_stream(x, S1).expect("allocated");
    a.free(x).expect("allocated");
    assert_eq!(
        actions(&mut a),
        [
            (SegmentAlloc, 20 * MIB),
            (Alloc, 4 * MIB),
            (FreeRequested, 4 * MIB)
        ]
    );
    assert!(a.is_pending(x));
    // Still active: a new request does not reuse it.
    let y = ok(&mut a, 4 * MIB);
    assert_ne!(x, y);
    a.free(y).expect("allocated");
    a.take_events();
    a.empty_cache();
    assert_eq!(
        actions(&mut a),
        [(FreeCompleted, 4 * MIB), (SegmentFree, 20 * MIB)]
    );
    assert_eq!(a.reserved(), 0);
    checked(&a);
}

#[test]
fn contradictory_frees_are_errors() {
    let mut a = model("", None);
    assert_eq!(a.free(0x10), Err(FreeError::NotAllocated(0x10)));
    let x = ok(&mut a, 100);
    a.free(x).expect("allocated");
    assert_eq!(a.free(x), Err(FreeError::NotAllocated(x)));
    let y = ok(&mut a, 100);
    assert_eq!(a.free_completed(y), Err(FreeError::NotPending(y)));
    a.record_stream(y, S1).expect("allocated");
    a.free(y).expect("allocated");
    assert_eq!(a.free(y), Err(FreeError::AlreadyFreed(y)));
    a.free_completed(y).expect("pending");
    checked(&a);
}

#[test]
fn empty_cache_order_large_then_small_by_stream_size_address() {
    let mut a = model("", None);
    let small = ok(&mut a, 1000);
    let l1 = ok(&mut a, 30 * MIB);
    let l2 = ok(&mut a, 20 * MIB);
    let l3 = a.malloc(12 * MIB, S1).expect("fits");
    for b in [small, l1, l2, l3] {
        a.free(b).expect("allocated");
    }
    a.take_events();
    a.empty_cache();
    assert_eq!(
        actions(&mut a),
        [
            (SegmentFree, 20 * MIB),
            (SegmentFree, 30 * MIB),
            (SegmentFree, 12 * MIB),
            (SegmentFree, 2 * MIB)
        ]
    );
}

#[test]
fn garbage_collection_needs_a_fraction_and_frees_old_blocks() {
    let mut a = model(
        "garbage_collection_threshold:0.5,per_process_memory_fraction:1.0",
        Some(100 * MIB),
    );
    let x = ok(&mut a, 30 * MIB);
    let y = ok(&mut a, 30 * MIB);
    a.free(x).expect("allocated");
    a.free(y).expect("allocated");
    a.take_events();
    // 60 MiB reserved > 50 MiB threshold: GC frees cached blocks before allocating.
    ok(&mut a, 32 * MIB);
    let got = actions(&mut a);
    assert_eq!(got.first().map(|e| e.0), Some(SegmentFree));
    assert!(got.contains(&(SegmentAlloc, 32 * MIB)));
    // Without a fraction, GC is inert.
    let mut b = model("garbage_collection_threshold:0.5", Some(100 * MIB));
    let x = ok(&mut b, 30 * MIB);
    b.free(x).expect("allocated");
    b.take_events();
    ok(&mut b, 32 * MIB);
    assert_eq!(
        actions(&mut b),
        [(SegmentAlloc, 32 * MIB), (Alloc, 32 * MIB)]
    );
}

#[test]
fn memory_fraction_limits_reservations() {
    let mut a = model("per_process_memory_fraction:0.5", Some(100 * MIB));
    ok(&mut a, 40 * MIB);
    assert!(a.malloc(20 * MIB, 0).is_err());
}

#[test]
fn expandable_segments_unmap_whole_free_pages_on_empty_cache() {
    let mut a = model("expandable_segments:True", None);
    let x = ok(&mut a, 30 * MIB);
    let y = ok(&mut a, 5 * MIB);
    assert_eq!(
        actions(&mut a),
        [(SegmentMap, 40 * MIB), (Alloc, 30 * MIB), (Alloc, 5 * MIB)]
    );
    a.free(x).expect("allocated");
    a.take_events();
    a.empty_cache();
    // [0, 30) is free: page [0, 20) unmaps; [20, 30) stays mapped next to the live block.
    assert_eq!(actions(&mut a), [(SegmentUnmap, 20 * MIB)]);
    assert_eq!(a.reserved(), 20 * MIB);
    checked(&a);
    a.free(y).expect("allocated");
    a.empty_cache();
    assert_eq!(a.reserved(), 0);
    assert!(a.layout(0).is_empty());
    checked(&a);
    // A new mapping starts a fresh segment.
    ok(&mut a, MIB);
    a.take_events();
    checked(&a);
}

#[test]
fn expandable_small_pool_pages_are_two_mib() {
    let mut a = model("expandable_segments:True", None);
    ok(&mut a, 1000);
    ok(&mut a, 3 * MIB);
    let maps: Vec<(Action, u64)> = actions(&mut a)
        .into_iter()
        .filter(|(a, _)| *a == SegmentMap)
        .collect();
    assert_eq!(maps, [(SegmentMap, 2 * MIB), (SegmentMap, 20 * MIB)]);
    // Splits use the 512-byte rule: the 3 MiB block is exactly 3 MiB.
    assert_eq!(a.stats().allocated_bytes, 1024 + 3 * MIB);
}

#[test]
fn layout_round_trips() {
    let mut a = model("", None);
    let x = ok(&mut a, 3 * MIB);
    ok(&mut a, 5 * MIB);
    ok(&mut a, 700);
    a.free(x).expect("allocated");
    let layout = a.layout(0);
    let mut b = model("", None);
    b.load_layout(&layout, &[]).expect("loads");
    checked(&b);
    assert_eq!(b.layout(0), layout);
    assert_eq!(b.reserved(), a.reserved());
    let mut e = model("expandable_segments:True", None);
    let x = ok(&mut e, 30 * MIB);
    ok(&mut e, 5 * MIB);
    e.free(x).expect("allocated");
    e.empty_cache();
    let layout = e.layout(0);
    let mut f = model("expandable_segments:True", None);
    f.load_layout(&layout, &[]).expect("loads");
    checked(&f);
    assert_eq!(f.layout(0), layout);
}

#[derive(Clone, Debug)]
enum Op {
    Malloc(u64, bool),
    Free(usize),
    FreeCrossStream(usize),
    Complete(usize),
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..40 * MIB, any::<bool>()).prop_map(|(s, t)| Op::Malloc(s, t)),
        1 => (1u64..3 * MIB, any::<bool>()).prop_map(|(s, t)| Op::Malloc(s, t)),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::FreeCrossStream),
        1 => any::<usize>().prop_map(Op::Complete),
        1 => Just(Op::EmptyCache),
    ]
}

fn run_ops(conf: &str, capacity: Option<u64>, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut a = model(conf, capacity);
    let mut live: Vec<u64> = Vec::new();
    let mut pending: Vec<u64> = Vec::new();
    for op in ops {
        match *op {
            Op::Malloc(size, other) => {
                if let Ok(addr) = a.malloc(size, if other { S1 } else { 0 }) {
                    live.push(addr);
                }
            }
            Op::Free(i) if !live.is_empty() => {
                let addr = live.swap_remove(i % live.len());
                prop_assert!(a.free(addr).is_ok());
            }
            Op::FreeCrossStream(i) if !live.is_empty() => {
                let addr = live.swap_remove(i % live.len());
                prop_assert!(a.record_stream(addr, 0x77).is_ok());
                prop_assert!(a.free(addr).is_ok());
                pending.push(addr);
            }
            Op::Complete(i) if !pending.is_empty() => {
                let addr = pending.swap_remove(i % pending.len());
                if a.is_pending(addr) {
                    prop_assert!(a.free_completed(addr).is_ok());
                }
            }
            Op::EmptyCache => {
                a.empty_cache();
                pending.clear();
            }
            _ => {}
        }
        a.clear_events();
        if let Err(e) = a.check_invariants() {
            return Err(TestCaseError::fail(e));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn invariants_default(ops in prop::collection::vec(op(), 1..120)) {
        run_ops("", Some(400 * MIB), &ops)?;
    }

    #[test]
    fn invariants_max_split(ops in prop::collection::vec(op(), 1..120)) {
        run_ops("max_split_size_mb:24,roundup_power2_divisions:4", Some(300 * MIB), &ops)?;
    }

    #[test]
    fn invariants_expandable(ops in prop::collection::vec(op(), 1..120)) {
        run_ops("expandable_segments:True", Some(400 * MIB), &ops)?;
    }

    #[test]
    fn invariants_gc(ops in prop::collection::vec(op(), 1..120)) {
        run_ops(
            "garbage_collection_threshold:0.6,per_process_memory_fraction:0.9",
            Some(300 * MIB),
            &ops,
        )?;
    }
}
