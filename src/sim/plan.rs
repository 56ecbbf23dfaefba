//! The first pass over a recorded trace: turns it into the program's requests, telling OOM
//! retries from `empty_cache()` bursts (rule 1, verified by running the model's own retry on
//! a copy), leaving a retry's releases and the completions inside it to the model (rules
//! 2-3), offering each new segment the recorded address (rule 8), serving each request from
//! the pool it used (private pools apart), and comparing every decision with the record.

use super::alloc_conf::AllocatorConfig;
use super::caching_allocator::CachingAllocator;
use super::engine::{Engine, Op, OTHER_STREAM};
use super::replay::DeviceTrace;
use super::rounding::SMALL_SIZE;
use super::validation::{compare, Validation};
use crate::model::{Action, TraceEntry};
use rustc_hash::{FxHashMap, FxHashSet};

pub(super) fn is_burst(a: Action) -> bool {
    matches!(a, Action::SegmentFree | Action::SegmentUnmap)
}

pub(super) fn is_growth(a: Action) -> bool {
    matches!(a, Action::SegmentAlloc | Action::SegmentMap)
}

/// Walks the trace, turning it into requests, applying each to the model and comparing the
/// model's entries with the recorded ones.
/// Also returns the indices of the releases it took for `empty_cache()` calls.
pub(super) fn plan_and_validate(
    trace: &DeviceTrace<'_>,
    engine: &mut Engine,
    validation: &mut Validation,
) -> (Vec<Op>, FxHashSet<usize>) {
    let mut empty_cache_bursts = FxHashSet::default();
    let entries = trace.entries;
    let private = trace.segments.iter().any(|s| s.pool_id != (0, 0));
    let n = entries.len();
    let mut ops = Vec::with_capacity(n);
    let mut group_start = 0;
    let mut detached = false;
    let mut hint: Option<(u64, Option<u64>)> = None;
    // What `reserved_by_ooms` finds, made at the first `oom` entry.
    let mut oom_reserved: Option<FxHashMap<usize, u64>> = None;
    let mut i = 0;
    // Applies an op; the model's entries for it stay in `engine.model.events()`.
    let step = |op: Op, engine: &mut Engine, ops: &mut Vec<Op>| {
        engine.model.clear_events();
        engine.apply(&op);
        ops.push(op);
    };
    while i < n {
        let e = &entries[i];
        let addr = e.addr().unwrap_or(0);
        match e.action() {
            Action::Alloc | Action::Oom => {
                let hint = match hint.take() {
                    None if e.action() == Action::Oom => oom_reserved
                        .get_or_insert_with(|| reserved_by_ooms(trace, &engine.model.config))
                        .get(&i)
                        .map(|&a| (a, None)),
                    taken => taken,
                };
                let op = Op::Malloc {
                    entry: i,
                    size: e.size,
                    stream: trace.stream(e),
                    pool: request_pool(trace, &engine.model, e, private),
                    recorded: (e.action() == Action::Alloc).then_some(addr),
                    hint,
                };
                step(op, engine, &mut ops);
                compare(
                    entries,
                    group_start,
                    i + 1,
                    engine.model.events(),
                    validation,
                );
                if std::mem::take(&mut detached) {
                    step(Op::CompleteDetached, engine, &mut ops);
                }
                i += 1;
                group_start = i;
            }
            Action::SegmentAlloc => {
                hint = Some((addr, Some(e.size)));
                i += 1;
            }
            Action::SegmentMap => {
                hint = hint.or(Some((addr, None)));
                i += 1;
            }
            Action::FreeRequested => {
                let paired = entries
                    .get(i + 1)
                    .is_some_and(|n| n.action() == Action::FreeCompleted && n.addr() == Some(addr))
                    && !completed_by_retry(engine, trace, i, private);
                let (op, used) = if paired {
                    (Op::Free { entry: i, addr }, 2)
                } else {
                    (Op::FreeRequested { entry: i, addr }, 1)
                };
                step(op, engine, &mut ops);
                compare(
                    entries,
                    group_start,
                    i + used,
                    engine.model.events(),
                    validation,
                );
                i += used;
                group_start = i;
            }
            Action::FreeCompleted | Action::SegmentFree | Action::SegmentUnmap => {
                let lone_end = (i..n)
                    .find(|&j| entries[j].action() != Action::FreeCompleted)
                    .unwrap_or(n);
                // The releases, with the completions of a synchronization between them
                // (release_available_cached_blocks releases before release_cached_blocks
                // synchronizes).
                let run_end = (lone_end..n)
                    .find(|&j| {
                        !(is_burst(entries[j].action())
                            || entries[j].action() == Action::FreeCompleted)
                    })
                    .unwrap_or(n);
                let burst_end = if (lone_end..run_end).any(|j| is_burst(entries[j].action())) {
                    run_end
                } else {
                    lone_end
                };
                let completions: Vec<(usize, u64)> = (i..burst_end)
                    .filter(|&j| entries[j].action() == Action::FreeCompleted)
                    .map(|j| (j, entries[j].addr().unwrap_or(0)))
                    .collect();
                let has_burst = burst_end != lone_end;
                let request = (burst_end..n)
                    .find(|&j| !is_growth(entries[j].action()))
                    .map(|j| (j, &entries[j]))
                    .filter(|(_, r)| matches!(r.action(), Action::Alloc | Action::Oom));
                // Rule 1: an OOM retry only if best fit fails before the burst and, with the
                // capacity known, the device had no room without it. Then the model's own
                // retry, run on a copy, must make exactly the recorded releases and growth;
                // otherwise the burst was an empty_cache() call (and completions before an
                // `oom` came first).
                let retry = request.is_some_and(|(j, r)| {
                    let candidate = r.action() == Action::Oom
                        || (has_burst
                            && engine.model.would_release(
                                r.size,
                                trace.stream(r),
                                request_pool(trace, &engine.model, r, private),
                            ));
                    candidate && retry_reproduces(&engine.model, trace, lone_end, j, private)
                });
                // An empty_cache() right before a request whose own retry releases more (a
                // private pool's blocks, which empty_cache() leaves): the burst splits where
                // the model's empty_cache() stops.
                let split = match request {
                    Some((j, _)) if has_burst && !retry && completions.is_empty() => {
                        empty_cache_then_retry(
                            &engine.model,
                            trace,
                            lone_end,
                            burst_end,
                            j,
                            private,
                        )
                    }
                    _ => None,
                };
                if let Some(s) = split {
                    empty_cache_bursts
                        .extend((lone_end..s).filter(|&k| is_burst(entries[k].action())));
                    step(Op::EmptyCache, engine, &mut ops);
                    compare(entries, group_start, s, engine.model.events(), validation);
                    i = s;
                    group_start = s;
                    continue;
                }
                if !has_burst && !retry {
                    for (j, addr) in completions {
                        step(Op::FreeCompleted { entry: j, addr }, engine, &mut ops);
                        compare(
                            entries,
                            group_start,
                            j + 1,
                            engine.model.events(),
                            validation,
                        );
                        group_start = j + 1;
                    }
                    i = lone_end;
                    continue;
                }
                for &(_, addr) in &completions {
                    step(Op::Detach { addr }, engine, &mut ops);
                }
                if retry {
                    // The model's own retry releases and completes; compare at the request.
                    detached = true;
                    i = burst_end;
                    continue;
                }
                empty_cache_bursts
                    .extend((lone_end..burst_end).filter(|&k| is_burst(entries[k].action())));
                step(Op::EmptyCache, engine, &mut ops);
                compare(
                    entries,
                    group_start,
                    burst_end,
                    engine.model.events(),
                    validation,
                );
                step(Op::CompleteDetached, engine, &mut ops);
                i = burst_end;
                group_start = i;
            }
            Action::Snapshot => i += 1,
        }
    }
    compare(entries, group_start, n, &[], validation);
    (ops, empty_cache_bursts)
}

/// The pool the request at `e` used: its `pool_id` where the trace records one (PyTorch after
/// 2.11). Else, where private pools are about, the pool of the segment its recorded address
/// lies in, since a request is never served from another pool's segment: a mapped segment of
/// the model, else the snapshot's segment there (a segment made for this request), else the
/// model's reserved range there; and the default pool when nothing holds it (or for an `oom`).
/// `private`: the snapshot has private-pool segments.
pub(super) fn request_pool(
    trace: &DeviceTrace<'_>,
    model: &CachingAllocator,
    e: &TraceEntry,
    private: bool,
) -> (i64, i64) {
    if let Some(p) = trace.pool(e) {
        return p;
    }
    let Some(addr) = e.addr() else {
        return (0, 0);
    };
    if !model.has_private_pools() && !private {
        return (0, 0);
    }
    let mapped = model.pool_id_at(addr, true);
    mapped
        .or_else(|| trace.segment_pool_at(addr))
        .or_else(|| model.pool_id_at(addr, false))
        .unwrap_or((0, 0))
}

/// With expandable segments, a request that fails may have reserved a new address range that
/// it could not map; the range stays reserved, and the record shows it only when the first map
/// into it comes, at its base. That is the first later `segment_map` of the request's stream
/// and pool (small requests map 2 MiB pages, large ones whole large pages; a private pool's
/// maps are its own): offered as the address of the range the failing request reserves. Where
/// the map falls in a range already reserved, the driver refuses the offer. Found for every
/// `oom` entry (by index) in one backward pass.
fn reserved_by_ooms(trace: &DeviceTrace<'_>, config: &AllocatorConfig) -> FxHashMap<usize, u64> {
    let mut found = FxHashMap::default();
    if !config.expandable_segments {
        return found;
    }
    // The address of the next `segment_map` of each (stream, large pages, pool).
    let mut next_map: FxHashMap<(u64, bool, (i64, i64)), Option<u64>> = FxHashMap::default();
    for (i, e) in trace.entries.iter().enumerate().rev() {
        match e.action() {
            Action::SegmentMap => {
                let large = e.size.is_multiple_of(config.large_segment_size);
                next_map.insert((trace.stream(e), large, trace.map_pool(e)), e.addr());
            }
            Action::Oom => {
                let large = e.size > SMALL_SIZE;
                let pool = trace.pool(e).unwrap_or((0, 0));
                if let Some(&Some(addr)) = next_map.get(&(trace.stream(e), large, pool)) {
                    found.insert(i, addr);
                }
            }
            _ => {}
        }
    }
    found
}

/// Where the releases of `entries[from..to]` stop being the model's `empty_cache()` (a proper
/// prefix) and become the retry of the request at `entries[request]`, when they do.
fn empty_cache_then_retry(
    model: &CachingAllocator,
    trace: &DeviceTrace<'_>,
    from: usize,
    to: usize,
    request: usize,
    private: bool,
) -> Option<usize> {
    let mut copy = model.clone();
    copy.clear_events();
    copy.set_recording(true);
    copy.empty_cache();
    let view = |e: &TraceEntry| (e.action(), e.addr(), e.size);
    let released: Vec<_> = copy
        .events()
        .iter()
        .filter(|e| is_burst(e.action()))
        .map(view)
        .collect();
    let recorded: Vec<usize> = (from..to)
        .filter(|&k| is_burst(trace.entries[k].action()))
        .collect();
    let &s = recorded.get(released.len())?;
    let prefix = released
        .iter()
        .zip(&recorded)
        .all(|(r, &k)| *r == view(&trace.entries[k]));
    (!released.is_empty() && prefix && retry_reproduces(&copy, trace, s, request, private))
        .then_some(s)
}

/// Whether the free_requested / free_completed pair at `entries[i]` is a cross-stream free
/// whose completion came from the OOM retry right after it (rule 3's exception): the retry
/// the record shows (releases then growth and `alloc`, or an `oom`) is reproduced with the
/// block pending during the search, and not with it freed first.
pub(super) fn completed_by_retry(
    engine: &Engine,
    trace: &DeviceTrace<'_>,
    i: usize,
    private: bool,
) -> bool {
    let entries = trace.entries;
    let n = entries.len();
    let burst = i + 2;
    let burst_end = (burst..n)
        .find(|&j| !(is_burst(entries[j].action()) || entries[j].action() == Action::FreeCompleted))
        .unwrap_or(n);
    let released = (burst..burst_end).any(|j| is_burst(entries[j].action()));
    let Some(request) = (burst_end..n)
        .find(|&j| !is_growth(entries[j].action()))
        .filter(|&j| match entries[j].action() {
            Action::Oom => true,
            Action::Alloc => released,
            _ => false,
        })
    else {
        return false;
    };
    let Some(&addr) = entries[i].addr().and_then(|a| engine.addresses.get(&a)) else {
        return false;
    };
    let mut freed = engine.model.clone();
    let mut pending = engine.model.clone();
    if freed.free(addr).is_err()
        || pending.record_stream(addr, OTHER_STREAM).is_err()
        || pending.free(addr).is_err()
    {
        return false;
    }
    !retry_reproduces(&freed, trace, burst, request, private)
        && retry_reproduces(&pending, trace, burst, request, private)
}

/// Whether the model's malloc for the request at `entries[request]`, run on a copy of its
/// state, makes exactly the recorded releases and growth of `entries[from..=request]`.
/// `private` as for `request_pool`.
pub(super) fn retry_reproduces(
    model: &CachingAllocator,
    trace: &DeviceTrace<'_>,
    from: usize,
    request: usize,
    private: bool,
) -> bool {
    let entries = &trace.entries[from..=request];
    let r = &trace.entries[request];
    let mut copy = model.clone();
    copy.clear_events();
    copy.set_recording(true);
    let hint = entries
        .iter()
        .find(|e| is_growth(e.action()))
        .and_then(|e| {
            Some((
                e.addr()?,
                (e.action() == Action::SegmentAlloc).then_some(e.size),
            ))
        });
    copy.set_address_hint(hint);
    let pool = request_pool(trace, model, r, private);
    let _ = copy.malloc_in(r.size, trace.stream(r), pool);
    let decision = |e: &&TraceEntry| {
        is_burst(e.action())
            || is_growth(e.action())
            || matches!(e.action(), Action::Alloc | Action::Oom)
    };
    let view = |e: &TraceEntry| (e.action(), e.addr(), e.size);
    entries
        .iter()
        .filter(decision)
        .map(view)
        .eq(copy.events().iter().filter(decision).map(view))
}
