//! Diagnoses of a memprof recording's `oom` entries, from the driver calls alone: what the
//! program held through the driver when the allocation failed and what `cuMemGetInfo` last
//! reported. No simulator replay: a recording does not see the caching allocator's blocks, so
//! no allocator setting can be tried and the largest free cached block is not known.

use super::remedies::program_remedy;
use crate::analysis::oom::{Diagnosis, OomFacts};
use crate::model::{Action, ReplayStarts};

/// The diagnosis of the last `oom` entry of `device`, `None` without one. `total` is the
/// device's total memory (given by the user, or the recording's last `cuMemGetInfo`).
pub fn diagnose_recording_device(
    starts: &ReplayStarts<'_>,
    device: u32,
    total: Option<u64>,
    with_remedies: bool,
) -> Option<Diagnosis> {
    let entries = starts.snapshot().timeline.device(device as usize);
    let index = entries.iter().rposition(|e| e.action() == Action::Oom)?;
    let entry = entries[index];
    let mut replay = starts.replay(device);
    replay.run_through(index);
    let facts = OomFacts {
        request_bytes: entry.size,
        reserved_bytes: replay.reserved(),
        allocated_bytes: replay.live().total(),
        largest_free_block_bytes: None,
        device_free_bytes: entry.device_free(),
        total_bytes: total,
    };
    let mut d = Diagnosis::from_facts(device, Some(index), &facts, None);
    d.evidence.push_str(
        " (From the driver calls of a memprof recording: reserved and allocated are the memory \
         the program held through the driver; a caching allocator's free blocks inside it are \
         not visible.)",
    );
    if total.is_none() {
        d.evidence.push_str(
            " The device's total is not known (no cuMemGetInfo was recorded): give --capacity \
             to test for memory held outside the program.",
        );
    }
    if with_remedies {
        d.remedies.extend(program_remedy(d.cause, &facts, &[]));
    }
    Some(d)
}
