//! Allocator pressure: the moments a device's trace shows the allocator at the device's
//! limit without failing (OOM retries: every cached block released and the device
//! synchronized, then the request tried again), the `torch.cuda.empty_cache()` calls told
//! apart from them (rule 1 of the replay), the device capacity those moments bracket, and the
//! headroom left at the peak of reserved memory.

use crate::analysis::pressure::{EmptyCacheSite, Pressure, Retry};
use crate::analysis::site_of;
use crate::model::{Action, Snapshot, TraceEntry};
use crate::sim::replay::{CapacitySource, Prepared, UpperBound};

/// How many retries are listed one by one.
const RETRIES_LISTED: usize = 8;

fn is_release(a: Action) -> bool {
    matches!(a, Action::SegmentFree | Action::SegmentUnmap)
}

/// A run of releases (completions may sit between them): its start, end and bytes.
struct Burst {
    start: usize,
    end: usize,
    bytes: u64,
    segments: usize,
}

fn bursts(entries: &[TraceEntry]) -> Vec<Burst> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < entries.len() {
        if !is_release(entries[i].action()) {
            i += 1;
            continue;
        }
        let start = i;
        let (mut bytes, mut segments) = (0u64, 0usize);
        while i < entries.len()
            && (is_release(entries[i].action()) || entries[i].action() == Action::FreeCompleted)
        {
            if is_release(entries[i].action()) {
                bytes = bytes.saturating_add(entries[i].size);
                segments += 1;
            }
            i += 1;
        }
        out.push(Burst {
            start,
            end: i,
            bytes,
            segments,
        });
    }
    out
}

/// The pressure on `prepared`'s device, from its trace and the replay that told retries from
/// `empty_cache()` calls; `total` is the device's total memory when the user gave it (one
/// more upper bound of what the allocator could use).
pub fn pressure(snapshot: &Snapshot, prepared: &Prepared, total: Option<u64>) -> Pressure {
    let entries = snapshot.timeline.device(prepared.device as usize);
    // Times on the input's one axis, as the account's moments.
    let first_time = snapshot.timeline.time_origin_us();
    let mut retries = Vec::new();
    let mut oom_retries = 0;
    let mut empty_cache = 0;
    let mut sites: Vec<EmptyCacheSite> = Vec::new();
    let mut last_retry = None;
    for b in bursts(entries) {
        if prepared.empty_cache_bursts.binary_search(&b.start).is_ok() {
            empty_cache += 1;
            let site = site_of(&snapshot.stacks, entries[b.start].stack);
            match sites.iter_mut().find(|s| s.site == site) {
                Some(s) => {
                    s.bursts += 1;
                    s.released_bytes = s.released_bytes.saturating_add(b.bytes);
                }
                None => sites.push(EmptyCacheSite {
                    site,
                    bursts: 1,
                    released_bytes: b.bytes,
                }),
            }
            continue;
        }
        // A retry: the request after the new segment it got.
        let request = (b.end..entries.len()).find(|&j| {
            !matches!(
                entries[j].action(),
                Action::SegmentAlloc | Action::SegmentMap
            )
        });
        let Some(j) = request.filter(|&j| entries[j].action() == Action::Alloc) else {
            continue;
        };
        oom_retries += 1;
        last_retry = Some(j);
        if retries.len() < RETRIES_LISTED {
            let e = &entries[j];
            retries.push(Retry {
                entry_index: j,
                offset_us: e.time_us().zip(first_time).map(|(t, f)| t - f),
                request_bytes: e.size,
                released_bytes: b.bytes,
                segments_released: b.segments,
                site: site_of(&snapshot.stacks, e.stack),
            });
        }
    }
    sites.sort_by(|a, b| b.bursts.cmp(&a.bursts).then(a.site.cmp(&b.site)));
    let oom_entry_index = entries.iter().rposition(|e| e.action() == Action::Oom);
    // A retry the OOM followed before any other request was served did not recover.
    let retry_before_oom = last_retry.zip(oom_entry_index).and_then(|(j, oom)| {
        let served = entries[j + 1..oom.max(j + 1)]
            .iter()
            .any(|e| e.action() == Action::Alloc);
        (j < oom && !served).then_some(j)
    });
    let peak = prepared.recorded_peak_reserved_bytes;
    let traced = prepared
        .capacity_upper_bytes
        .zip(prepared.capacity_upper_from);
    let (min, max, capacity_max_from, source) = match prepared.capacity_source {
        CapacitySource::Given => (prepared.capacity, prepared.capacity, None, "given"),
        CapacitySource::Inferred | CapacitySource::Unlimited => {
            // Every upper bound: the trace's, and the device's total when given.
            let given = total.map(|t| (t, UpperBound::GivenTotal));
            let upper = [traced, given]
                .into_iter()
                .flatten()
                .min_by_key(|&(u, _)| u);
            match upper.filter(|&(u, _)| u >= peak) {
                Some((u, from)) => (Some(peak), Some(u), Some(from), "inferred"),
                None => (None, None, None, "unknown"),
            }
        }
    };
    Pressure {
        oom_retries,
        empty_cache_bursts: empty_cache,
        capacity_bytes_min: min,
        capacity_bytes_max: max,
        capacity_max_from,
        capacity_source: source,
        retry_before_oom,
        oom_entry_index,
        headroom_at_peak_bytes: max.map(|m| m.saturating_sub(peak)),
        peak_reserved_bytes: peak,
        retries,
        empty_cache_sites: sites,
    }
}
