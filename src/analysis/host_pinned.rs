//! The pinned host memory of PyTorch's caching host allocator in a snapshot: what it held at the
//! dump (reserved in its segments, allocated to tensors) and, from its trace, the most it held
//! and when. The trace is a ring buffer whose oldest entries may be gone, so the figures over it
//! are worked back from the dump: before an entry, the state at the dump less every change after.

use crate::model::{Action, HostAllocator};
use serde::Serialize;

/// `analyze`'s figures of PyTorch's host allocator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostPinnedReport {
    /// Host segments at the dump (each one pinned range, one block).
    pub segments: u64,
    /// Pinned bytes the allocator held at the dump (`total_size` of its segments).
    pub reserved_bytes: u64,
    /// Of those, bytes handed out to tensors at the dump.
    pub allocated_bytes: u64,
    /// Entries of `host_traces`.
    pub trace_entries: u64,
    /// The most the allocator held pinned over its trace (`segment_alloc` / `segment_free`);
    /// `None` without a trace.
    pub peak_reserved_bytes: Option<u64>,
    /// `time_us` of the entry that reached it (the first time); `None` without a trace, when
    /// the peak was already held before the trace's first entry, or without times.
    pub peak_reserved_time_us: Option<i64>,
    /// The most it had handed out over its trace (`alloc` / `free_requested`).
    pub peak_allocated_bytes: Option<u64>,
    pub peak_allocated_time_us: Option<i64>,
}

/// The most of one figure over the trace, and the time of the entry that first reached it.
fn peak(host: &HostAllocator, at_dump: u64, delta: impl Fn(Action) -> i128) -> (u64, Option<i64>) {
    let change = |e: &crate::model::TraceEntry| delta(e.action()) * i128::from(e.size);
    let total: i128 = host.trace.iter().map(change).sum();
    let mut now = i128::from(at_dump) - total;
    let (mut most, mut when) = (now, None);
    for e in &host.trace {
        now += change(e);
        if now > most {
            most = now;
            when = e.time_us();
        }
    }
    (u64::try_from(most.max(0)).unwrap_or(u64::MAX), when)
}

/// The figures of `host`.
pub fn host_pinned(host: &HostAllocator) -> HostPinnedReport {
    let sum = |bytes: fn(&crate::model::HostSegment) -> u64| {
        (host.segments.iter()).fold(0u64, |total, s| total.saturating_add(bytes(s)))
    };
    let (reserved, allocated) = (sum(|s| s.size), sum(|s| s.allocated));
    let traced = !host.trace.is_empty();
    let (peak_reserved, reserved_at) = peak(host, reserved, |a| match a {
        Action::SegmentAlloc | Action::SegmentMap => 1,
        Action::SegmentFree | Action::SegmentUnmap => -1,
        _ => 0,
    });
    let (peak_allocated, allocated_at) = peak(host, allocated, |a| match a {
        Action::Alloc => 1,
        Action::FreeRequested => -1,
        _ => 0,
    });
    HostPinnedReport {
        segments: host.segments.len() as u64,
        reserved_bytes: reserved,
        allocated_bytes: allocated,
        trace_entries: host.trace.len() as u64,
        peak_reserved_bytes: traced.then_some(peak_reserved),
        peak_reserved_time_us: reserved_at,
        peak_allocated_bytes: traced.then_some(peak_allocated),
        peak_allocated_time_us: allocated_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HostSegment, StreamIndex, TraceEntry};

    fn entry(action: Action, addr: u64, size: u64, t: i64) -> TraceEntry {
        TraceEntry::new(action, Some(addr), size, StreamIndex(0)).with_time(Some(t))
    }

    #[test]
    fn the_peak_is_worked_back_from_the_dump() {
        // The trace lost its oldest entries: a 4 KiB segment was already held when it begins.
        let host = HostAllocator {
            segments: vec![
                HostSegment {
                    address: 0x1000,
                    size: 4096,
                    allocated: 4096,
                    pool_id: (0, 0),
                },
                HostSegment {
                    address: 0x9000,
                    size: 8192,
                    allocated: 0,
                    pool_id: (0, 0),
                },
            ],
            trace: vec![
                entry(Action::SegmentAlloc, 0x9000, 8192, 10),
                entry(Action::Alloc, 0x9000, 8192, 11),
                entry(Action::SegmentAlloc, 0x20000, 65536, 12),
                entry(Action::Alloc, 0x20000, 65536, 13),
                entry(Action::FreeRequested, 0x20000, 65536, 14),
                entry(Action::FreeCompleted, 0x20000, 65536, 15),
                entry(Action::SegmentFree, 0x20000, 65536, 16),
                entry(Action::FreeRequested, 0x9000, 8192, 17),
            ],
        };
        let r = host_pinned(&host);
        assert_eq!(
            (r.segments, r.reserved_bytes, r.allocated_bytes),
            (2, 12288, 4096)
        );
        assert_eq!(r.trace_entries, 8);
        assert_eq!(r.peak_reserved_bytes, Some(4096 + 8192 + 65536));
        assert_eq!(r.peak_reserved_time_us, Some(12));
        assert_eq!(r.peak_allocated_bytes, Some(4096 + 8192 + 65536));
        assert_eq!(r.peak_allocated_time_us, Some(13));

        let untraced = host_pinned(&HostAllocator {
            trace: Vec::new(),
            ..host
        });
        assert_eq!(untraced.peak_reserved_bytes, None);
        assert_eq!(untraced.peak_reserved_time_us, None);
    }
}
