//! What a trace left alive: the allocations made during the trace that are still alive at its
//! end, in bytes and by site. With the history turned on at a test's start, that is what the
//! test leaked (`memprof gate --metric left-alive`).

use super::sites::{top_sites, Site};
use crate::model::{replay_device, LiveSet, Snapshot};

/// Bytes (requested sizes) of a device's allocations made during the trace and alive at its
/// end, and the `top` sites holding most of them.
pub fn left_alive(snapshot: &Snapshot, device: u32, top: usize) -> (u64, Vec<Site>) {
    let mut replay = replay_device(snapshot, device);
    while replay.step().is_some() {}
    let made: LiveSet = replay
        .live()
        .iter()
        .filter(|(_, live)| live.born().is_some())
        .map(|(addr, live)| (addr, *live))
        .collect();
    (made.total(), top_sites(&snapshot.stacks, &made, top))
}
