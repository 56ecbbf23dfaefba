//! Remedies for an OOM: allocator settings replayed through the simulator with the recorded
//! trace and the inferred capacity, and changes to the program that only a plan can size.

use crate::analysis::oom::{shortfall_bytes, Cause, OomFacts, Remedy};
use crate::model::Bytes;
use crate::sim::replay::{self, Prepared};
use crate::sim::AllocatorConfig;

/// `max_split_size_mb` values tried; the best one is offered.
const SPLIT_SIZES_MB: [u64; 4] = [64, 128, 256, 512];

/// A remedy offered without a replay.
pub fn unverified(action: &str) -> Remedy {
    Remedy {
        action: action.to_string(),
        verified: false,
        oom_avoided: None,
        new_peak_reserved_bytes: None,
        new_peak_allocated_bytes: None,
        freed: Vec::new(),
    }
}

/// The change to the program (or its surroundings) the numbers call for, for the causes no
/// allocator setting addresses.
pub fn program_remedy(cause: Cause, facts: &OomFacts) -> Option<Remedy> {
    let shortfall = shortfall_bytes(facts);
    let action = match cause {
        Cause::Growth => format!(
            "stop live memory growing across iterations: at least {} must go (a leak, or \
             tensors kept in a list: see the growing sites)",
            Bytes(shortfall)
        ),
        Cause::Exhaustion => format!(
            "plan: cut live memory at the failing request by at least {} (activation \
             checkpointing, sharding or a smaller batch; size them with `memprof plan`)",
            Bytes(shortfall)
        ),
        Cause::OversizedRequest => format!(
            "plan: make this one request at most {} (a smaller batch or sequence, or a sharded \
             tensor; size them with `memprof plan`)",
            Bytes(
                facts
                    .reserved_bytes
                    .saturating_add(facts.device_free_bytes.unwrap_or(0))
            )
        ),
        Cause::OutsideAllocator => format!(
            "free at least {} held outside the allocator (other processes on the GPU, NCCL or \
             cuBLAS workspaces)",
            Bytes(shortfall)
        ),
        Cause::Fragmentation => return None,
    };
    (shortfall > 0).then(|| unverified(&action))
}

/// Settings not in force in `recorded`, each replayed with the prepared trace under its
/// capacity; ranked: OOM avoided first, then by peak reserved. Empty when the capacity is
/// unknown (without it no replay can run out of memory) or when the replay with the recorded
/// settings does not run out of memory itself (then no other run can say it avoids the OOM).
pub fn verified_remedies(prepared: &Prepared, recorded: &AllocatorConfig) -> Vec<Remedy> {
    let Some(capacity) = prepared.capacity else {
        return Vec::new();
    };
    if prepared.recorded_run.oom.is_none() {
        return Vec::new();
    }
    let try_one = |action: String, config: AllocatorConfig| {
        let run = replay::run(prepared, &config, Some(capacity));
        Remedy {
            action,
            verified: true,
            oom_avoided: Some(run.oom.is_none()),
            new_peak_reserved_bytes: Some(run.peak_reserved_bytes),
            new_peak_allocated_bytes: Some(run.peak_allocated_bytes),
            freed: Vec::new(),
        }
    };
    let mut out = Vec::new();
    if !recorded.expandable_segments {
        let config = AllocatorConfig {
            expandable_segments: true,
            ..recorded.clone()
        };
        out.push(try_one("expandable_segments:True".into(), config));
    }
    if recorded.max_split_size.is_none() {
        let best = SPLIT_SIZES_MB
            .iter()
            .map(|&mb| {
                let config = AllocatorConfig {
                    max_split_size: Some(mb << 20),
                    ..recorded.clone()
                };
                try_one(format!("max_split_size_mb:{mb}"), config)
            })
            .min_by_key(rank);
        out.extend(best);
    }
    if recorded.garbage_collection_threshold.is_none() {
        let fraction = recorded.per_process_memory_fraction;
        let config = AllocatorConfig {
            garbage_collection_threshold: Some(0.8),
            per_process_memory_fraction: Some(fraction.unwrap_or(1.0)),
            ..recorded.clone()
        };
        let action = match fraction {
            Some(_) => "garbage_collection_threshold:0.8".to_string(),
            None => "garbage_collection_threshold:0.8,per_process_memory_fraction:1.0".to_string(),
        };
        out.push(try_one(action, config));
    }
    out.sort_by_key(rank);
    out
}

/// Sort key: avoided first, then the lower peak.
pub fn rank(r: &Remedy) -> (bool, u64) {
    (
        r.oom_avoided != Some(true),
        r.new_peak_reserved_bytes.unwrap_or(u64::MAX),
    )
}
