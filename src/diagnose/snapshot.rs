//! Diagnoses of a snapshot's `oom` entries. The numbers at the failing request come from the
//! simulator's replay of the recorded trace with the recorded settings when it reproduces the
//! OOM (exact: the replay matches every allocator decision); otherwise from the trace alone,
//! with blocks at their requested sizes, and the evidence says so. Memory held outside the
//! allocator needs the device's total, which a snapshot does not hold (`--capacity`).
//! Remedies: settings replayed (`remedies`), the named sites' tensors freed earlier and
//! replayed (`free_earlier`), then the changes only a plan can size.

use crate::analysis::growth::find_growth;
use crate::analysis::oom::{Cause, Diagnosis, OomFacts, OomSite};
use crate::analysis::{layout_at, site_label_of, top_sites};
use crate::diagnose::free_earlier::free_earlier;
use crate::diagnose::remedies::{program_remedy, rank, replayed_settings, Recorded};
use crate::model::{replay_device, Action, BlockState, Snapshot};
use crate::sim::replay::{CapacitySource, Prepared};

/// How many live sites follow the failing request's.
const SITES: usize = 5;

/// Whether to replay remedies (`diagnose`) or only classify (`analyze`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    Classify,
    WithRemedies,
}

/// The diagnosis of the last `oom` entry of `prepared`'s device, `None` without one. `total`
/// is the device's total memory when the user gave it.
pub fn diagnose_device(
    snapshot: &Snapshot,
    prepared: &Prepared,
    recorded: &Recorded<'_>,
    total: Option<u64>,
    depth: Depth,
) -> Option<Diagnosis> {
    let device = prepared.device;
    let entries = snapshot.timeline.device(device as usize);
    let index = entries.iter().rposition(|e| e.action() == Action::Oom)?;
    let entry = entries[index];
    let mut replay = replay_device(snapshot, device);
    replay.run_through(index);
    let simulated = prepared
        .recorded_run
        .oom
        .as_ref()
        .filter(|o| o.entry_index == index && prepared.validation.first_mismatch.is_none());
    let mut facts = OomFacts {
        request_bytes: entry.size,
        device_free_bytes: entry.device_free(),
        total_bytes: total,
        ..OomFacts::default()
    };
    let note = match simulated {
        Some(o) => {
            facts.reserved_bytes = o.reserved_bytes;
            facts.allocated_bytes = o.allocated_bytes;
            facts.largest_free_block_bytes = Some(o.largest_free_block_bytes);
            String::new()
        }
        None => {
            facts.reserved_bytes = replay.reserved();
            facts.allocated_bytes = replay.live().total();
            facts.largest_free_block_bytes = Some(
                layout_at(snapshot, device, index)
                    .iter()
                    .flat_map(|s| &s.blocks)
                    .filter(|b| b.state == BlockState::Inactive)
                    .map(|b| b.size)
                    .max()
                    .unwrap_or(0),
            );
            " (The simulator did not reproduce this OOM, so these figures come from the \
             trace alone, with blocks at their requested sizes: free blocks may be smaller.)"
                .to_string()
        }
    };
    let growth = find_growth(snapshot, device, index);
    let mut d = Diagnosis::from_facts(device, Some(index), &facts, growth.as_ref());
    d.evidence.push_str(&note);
    if total.is_none() && matches!(d.cause, Cause::Growth | Cause::Exhaustion) {
        d.evidence.push_str(
            " Memory held outside the allocator is not known: give --capacity (the device's \
             total memory) to test for it.",
        );
    }
    let failing = site_label_of(&snapshot.stacks, entry.stack);
    d.sites.push(OomSite {
        frame: failing.frame,
        via: failing.via,
        bytes: entry.size,
    });
    match growth {
        // The sites that grew, by how much.
        Some(g) if d.cause == Cause::Growth => d.sites.extend(g.sites),
        _ => d.sites.extend(
            top_sites(&snapshot.stacks, replay.live(), SITES)
                .into_iter()
                .map(|s| OomSite {
                    frame: s.frame,
                    via: s.via,
                    bytes: s.bytes,
                }),
        ),
    }
    if depth == Depth::WithRemedies {
        let named: Vec<&str> = d.sites.iter().map(|s| s.frame.as_str()).collect();
        let settings = replayed_settings(prepared, recorded);
        let mut remedies = settings.avoided;
        let early = free_earlier(snapshot, prepared, recorded.config, index, &named);
        match early {
            Some(r) if r.verified && r.oom_avoided != Some(true) => d.tried.push(r),
            Some(r) => remedies.push(r),
            None => {}
        }
        remedies.sort_by_key(rank);
        d.tried.extend(settings.tried);
        d.tried.sort_by_key(rank);
        d.already_on = settings.already_on;
        let replayed = remedies.iter().chain(&d.tried).any(|r| r.verified);
        d.replay_capacity_bytes = prepared.capacity.filter(|_| replayed);
        d.replay_capacity_source = replayed.then_some(match prepared.capacity_source {
            CapacitySource::Given => "given",
            _ => "inferred",
        });
        d.remedies = remedies;
        // The sites that hold the most at the OOM, the failing request's own excepted.
        let holders: Vec<OomSite> = d.sites.iter().skip(1).cloned().collect();
        d.remedies.extend(program_remedy(d.cause, &facts, &holders));
    }
    Some(d)
}
