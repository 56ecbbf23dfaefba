//! Growth before an OOM: live memory sampled at the boundaries of successive iterations
//! (`iterations`: recorded markers, else the trace's repeating allocation pattern), and the
//! sites whose live memory grew. Without iterations nothing is claimed.

use super::iterations::{find_iterations, MIN_ITERATIONS};
use super::oom::OomSite;
use super::sites::top_sites;
use crate::model::{Replay, Snapshot};
use rustc_hash::FxHashMap;
/// How many growing sites are named.
const SITES: usize = 5;

/// Live memory climbing over successive iterations before the OOM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    /// What marks the iterations.
    pub marker: String,
    /// Samples in the climbing run.
    pub iterations: usize,
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// Sites whose live memory grew from the run's start to the OOM, with the growth.
    pub sites: Vec<OomSite>,
}

impl Growth {
    pub fn rise_bytes(&self) -> u64 {
        self.to_bytes.saturating_sub(self.from_bytes)
    }
}

/// The growth before the `oom` entry at `oom_index`, when the trace shows iterations and live
/// memory at their boundaries rose in each of the last `MIN_ITERATIONS` or more.
pub fn find_growth(snapshot: &Snapshot, device: u32, oom_index: usize) -> Option<Growth> {
    let it = find_iterations(snapshot, device, oom_index)?;
    let (marker, marks) = (it.marker, it.boundaries);
    let entries = snapshot.timeline.device(device as usize);
    let segments = || snapshot.device_segments(device);
    let mut replay = Replay::new(entries, segments());
    let samples: Vec<u64> = marks
        .iter()
        .map(|&m| {
            replay.run_through(m);
            replay.live().total()
        })
        .collect();
    let last = samples.len().checked_sub(1)?;
    let start = (0..last)
        .rev()
        .take_while(|&i| samples[i] < samples[i + 1])
        .last()?;
    let iterations = last - start + 1;
    if iterations < MIN_ITERATIONS {
        return None;
    }
    let mut at_start = Replay::new(entries, segments());
    at_start.run_through(marks[start]);
    replay.run_through(oom_index);
    let before: FxHashMap<String, u64> = top_sites(&snapshot.stacks, at_start.live(), usize::MAX)
        .into_iter()
        .map(|s| (s.frame, s.bytes))
        .collect();
    let mut sites: Vec<OomSite> = top_sites(&snapshot.stacks, replay.live(), usize::MAX)
        .into_iter()
        .filter_map(|s| {
            let grew = s
                .bytes
                .saturating_sub(before.get(&s.frame).copied().unwrap_or(0));
            (grew > 0).then_some(OomSite {
                frame: s.frame,
                via: s.via,
                bytes: grew,
            })
        })
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.frame.cmp(&b.frame)));
    sites.truncate(SITES);
    Some(Growth {
        marker,
        iterations,
        from_bytes: samples[start],
        to_bytes: samples[last],
        sites,
    })
}
