//! What every device held at the moment one of them ran out of memory: the requested and
//! reserved bytes of each other device just before the OOM's time (on the input's one axis),
//! and the imbalance that shows, as a finding of the device that failed.

use super::findings::{Finding, FindingKind};
use super::{DeviceReport, MomentKind, TimeAxis};
use crate::model::{Bytes, ReplayStarts};
use std::fmt::Write;

/// What one device held at a moment.
struct Held {
    device: u32,
    requested: u64,
    reserved: u64,
}

/// Adds to each device whose OOM has a time the state of every other traced device then.
pub fn add_imbalance(starts: &ReplayStarts<'_>, axis: TimeAxis, devices: &mut [DeviceReport]) {
    if devices.len() < 2 {
        return;
    }
    let ooms: Vec<(usize, i64)> = devices
        .iter()
        .enumerate()
        .filter_map(|(i, d)| {
            let m = last_oom(d)?;
            Some((i, m.offset_us?))
        })
        .collect();
    for (i, at) in ooms {
        let failed = &devices[i];
        let Some(own) = last_oom(failed) else {
            continue;
        };
        let mut held: Vec<Held> = vec![Held {
            device: failed.device,
            requested: own.figures.requested_bytes.unwrap_or(0),
            reserved: own.figures.reserved_bytes.unwrap_or(0),
        }];
        for (j, other) in devices.iter().enumerate() {
            if j == i {
                continue;
            }
            held.extend(held_at(starts, axis, other.device, at));
        }
        if held.len() < 2 {
            continue;
        }
        let sentence = words(failed.device, at, &mut held);
        devices[i].account.findings.push(Finding {
            kind: FindingKind::Imbalance,
            moment: Some(MomentKind::Oom),
            sentence,
        });
    }
}

/// The device's last OOM (the one that ended its run).
fn last_oom(d: &DeviceReport) -> Option<&super::Moment> {
    d.account
        .moments
        .iter()
        .rev()
        .find(|m| m.kind == MomentKind::Oom)
}

/// `device`'s requested and reserved bytes after its last entry at or before `at` (µs on the
/// axis); `None` for a device whose trace has no time.
fn held_at(starts: &ReplayStarts<'_>, axis: TimeAxis, device: u32, at: i64) -> Option<Held> {
    let entries = starts.snapshot().timeline.device(device as usize);
    let origin = axis.origin_us?;
    entries.iter().find_map(|e| e.time_us())?;
    let mut replay = starts.replay(device);
    let last = entries
        .iter()
        .rposition(|e| e.time_us().is_some_and(|t| t - origin <= at));
    if let Some(last) = last {
        replay.run_through(last);
    }
    Some(Held {
        device,
        requested: replay.live().total(),
        reserved: replay.reserved(),
    })
}

/// "at the OOM (T s), every device held: ...", with the failed device against the median.
fn words(failed: u32, at: i64, held: &mut [Held]) -> String {
    held.sort_by_key(|h| h.device);
    let mut out = format!(
        "at the OOM ({:.3} s) every device held (requested / reserved):",
        at as f64 / 1e6
    );
    for h in held.iter() {
        let _ = write!(
            out,
            " device {} {} / {};",
            h.device,
            Bytes(h.requested),
            Bytes(h.reserved)
        );
    }
    out.pop();
    let mut sorted: Vec<u64> = held.iter().map(|h| h.requested).collect();
    sorted.sort_unstable();
    let median = sorted[(sorted.len() - 1) / 2];
    let mine = held
        .iter()
        .find(|h| h.device == failed)
        .map_or(0, |h| h.requested);
    if median > 0 && mine as f64 > median as f64 * crate::analysis::compare::BALANCED_RATIO {
        let _ = write!(
            out,
            ". Device {failed} held {:.1}x the median ({}): the work is not spread evenly, and \
             evening it out is the first fix to weigh",
            mine as f64 / median as f64,
            Bytes(median)
        );
    } else {
        let _ = write!(
            out,
            ". Device {failed} held no more than the others: every device is near its limit"
        );
    }
    out
}
