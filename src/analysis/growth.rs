//! Growth before an OOM: live memory sampled at the same point of successive iterations,
//! where the trace marks iterations (`snapshot` entries, or the most frequent
//! `record_function` annotation), and the sites whose live memory grew. Without such markers
//! nothing is claimed.

use super::oom::OomSite;
use super::sites::top_sites;
use crate::model::{Action, Replay, Snapshot};
use rustc_hash::FxHashMap;

/// Iterations in a row that must each end higher than the one before.
const MIN_ITERATIONS: usize = 3;
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

/// Entry indices before `oom_index` that mark the same point of each iteration.
fn marks(snapshot: &Snapshot, device: u32, oom_index: usize) -> Option<(String, Vec<usize>)> {
    let entries = &snapshot.timeline.device(device as usize)[..oom_index];
    let snaps: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].action == Action::Snapshot)
        .collect();
    if snaps.len() >= MIN_ITERATIONS {
        return Some(("`snapshot` trace entries".to_string(), snaps));
    }
    let mut groups: FxHashMap<(String, String), Vec<i64>> = FxHashMap::default();
    for a in &snapshot.annotations {
        if a.device.is_some_and(|d| d != device) {
            continue;
        }
        if let (Some(t), Some(name)) = (a.time_us, &a.name) {
            let key = (a.stage.clone().unwrap_or_default(), name.clone());
            groups.entry(key).or_default().push(t);
        }
    }
    let ((stage, name), mut times) = groups
        .into_iter()
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(&a.0)))?;
    times.sort_unstable();
    let mut out: Vec<usize> = times
        .iter()
        .filter_map(|&t| {
            entries
                .iter()
                .position(|e| e.time_us().is_some_and(|u| u >= t))
        })
        .collect();
    out.dedup();
    Some((format!("the {stage} of `{name}` annotations"), out))
}

/// The growth before the `oom` entry at `oom_index`, when the trace marks iterations and live
/// memory at the marks rose in each of the last `MIN_ITERATIONS` or more.
pub fn find_growth(snapshot: &Snapshot, device: u32, oom_index: usize) -> Option<Growth> {
    let (marker, marks) = marks(snapshot, device, oom_index)?;
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
