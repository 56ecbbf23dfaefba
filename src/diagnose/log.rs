//! Diagnoses from OOM messages alone: the message gives the request, the device total, what
//! is free, allocated and reserved, but neither the largest free block nor the sites.

use crate::analysis::oom::{Cause, Diagnosis, OomFacts};
use crate::diagnose::remedies::{program_remedy, unreplayed_setting};
use crate::source::oom_log::LoggedOom;

/// One diagnosis per message, with the remedies the numbers support (none verified: a log
/// has no trace to replay).
pub fn diagnose_log(messages: &[LoggedOom]) -> Vec<Diagnosis> {
    messages
        .iter()
        .map(|m| {
            let facts = OomFacts {
                request_bytes: m.request_bytes,
                reserved_bytes: m.reserved_bytes,
                allocated_bytes: m.allocated_bytes,
                largest_free_block_bytes: None,
                device_free_bytes: Some(m.free_bytes),
                total_bytes: Some(m.total_bytes),
            };
            let mut d = Diagnosis::from_facts(m.device, None, &facts, None);
            d.evidence
                .push_str(&format!(" (from a {} message)", m.format.name()));
            if d.cause == Cause::Fragmentation {
                d.remedies
                    .push(unreplayed_setting("expandable_segments", "True"));
            }
            d.remedies.extend(program_remedy(d.cause, &facts, &[]));
            d
        })
        .collect()
}
