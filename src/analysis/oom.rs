//! OOM diagnosis: the cause of an out-of-memory error from the numbers at that moment, checked
//! in the order docs/json/diagnose.md gives (oversized request, fragmentation, memory held outside the
//! allocator, exhaustion), and the diagnosis object `diagnose` and `analyze` report.

use super::growth::Growth;
use crate::model::Bytes;
use serde::Serialize;

/// Why an allocation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    OversizedRequest,
    Fragmentation,
    OutsideAllocator,
    Growth,
    Exhaustion,
}

impl Cause {
    pub fn name(self) -> &'static str {
        match self {
            Cause::OversizedRequest => "oversized_request",
            Cause::Fragmentation => "fragmentation",
            Cause::OutsideAllocator => "outside_allocator",
            Cause::Growth => "growth",
            Cause::Exhaustion => "exhaustion",
        }
    }
}

/// The numbers known at the failing request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomFacts {
    pub request_bytes: u64,
    pub reserved_bytes: u64,
    /// Bytes in allocated (or pending-free) blocks.
    pub allocated_bytes: u64,
    /// Largest free cached block; `None` when the input does not say (a log message).
    pub largest_free_block_bytes: Option<u64>,
    /// What the driver reported free.
    pub device_free_bytes: Option<u64>,
    /// The device's total memory.
    pub total_bytes: Option<u64>,
}

impl OomFacts {
    /// Reserved memory not in allocated blocks.
    pub fn cached_free_bytes(&self) -> u64 {
        self.reserved_bytes.saturating_sub(self.allocated_bytes)
    }

    /// Memory held outside the allocator: total - reserved - free, when both are known.
    pub fn outside_bytes(&self) -> Option<u64> {
        let reachable = self.reserved_bytes.checked_add(self.device_free_bytes?)?;
        Some(self.total_bytes?.saturating_sub(reachable))
    }
}

/// The cause of an OOM and one sentence of evidence with the numbers; `growth` is the climb
/// of live memory over the iterations before it, when the trace shows one.
pub fn classify(f: &OomFacts, growth: Option<&Growth>) -> (Cause, String) {
    let request = Bytes(f.request_bytes);
    if let Some(free) = f.device_free_bytes {
        let reachable = f.reserved_bytes.saturating_add(free);
        if f.request_bytes > reachable {
            let outside = f
                .outside_bytes()
                .map(|o| format!(" ({} held outside the allocator)", Bytes(o)))
                .unwrap_or_default();
            return (
                Cause::OversizedRequest,
                format!(
                    "The request of {request} is larger than all the allocator could ever hold: \
                     {} reserved plus {} free on the device{outside}.",
                    Bytes(f.reserved_bytes),
                    Bytes(free)
                ),
            );
        }
    }
    let cached = f.cached_free_bytes();
    let largest_too_small = f
        .largest_free_block_bytes
        .is_none_or(|l| l < f.request_bytes);
    if cached >= f.request_bytes && largest_too_small {
        let largest = match f.largest_free_block_bytes {
            Some(l) => format!("the largest free block was {}", Bytes(l)),
            None => {
                "no free block was large enough (the message does not give the largest)".to_string()
            }
        };
        return (
            Cause::Fragmentation,
            format!(
                "{} of the {} reserved was free in the cache, more than the request of \
                 {request}, but {largest}.",
                Bytes(cached),
                Bytes(f.reserved_bytes)
            ),
        );
    }
    if let Some(outside) = f.outside_bytes().filter(|&o| o >= f.request_bytes) {
        return (
            Cause::OutsideAllocator,
            format!(
                "{} held outside the allocator ({} total - {} reserved - {} free: CUDA context, \
                 NCCL, cuBLAS workspaces or other processes) would have covered the request of \
                 {request}.",
                Bytes(outside),
                Bytes(f.total_bytes.unwrap_or(0)),
                Bytes(f.reserved_bytes),
                Bytes(f.device_free_bytes.unwrap_or(0))
            ),
        );
    }
    let shortfall = shortfall_bytes(f);
    if let Some(g) = growth.filter(|g| g.rise_bytes() > 0 && g.rise_bytes() >= shortfall) {
        return (
            Cause::Growth,
            format!(
                "Live memory at {} climbed in each of {} iterations in a row, from {} to {} \
                 (+{}), more than the {} the request of {request} lacked.",
                g.marker,
                g.iterations,
                Bytes(g.from_bytes),
                Bytes(g.to_bytes),
                Bytes(g.rise_bytes()),
                Bytes(shortfall)
            ),
        );
    }
    let free = f
        .device_free_bytes
        .map(|b| format!("{} free on the device and ", Bytes(b)))
        .unwrap_or_default();
    (
        Cause::Exhaustion,
        format!(
            "Live allocations held {} of the {} reserved; {free}{} free in the cache could not \
             hold the request of {request}.",
            Bytes(f.allocated_bytes),
            Bytes(f.reserved_bytes),
            Bytes(cached)
        ),
    )
}

/// Bytes the program must give up at the failing request for it to fit: the request less
/// the most one place could offer it (the device's free memory or the largest free cached
/// block; free cached blocks do not join with device memory).
pub fn shortfall_bytes(f: &OomFacts) -> u64 {
    let one_place = f
        .device_free_bytes
        .unwrap_or(0)
        .max(f.largest_free_block_bytes.unwrap_or(0));
    f.request_bytes.saturating_sub(one_place)
}

/// An allocation site in a diagnosis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OomSite {
    /// `file:line:function`.
    pub frame: String,
    /// The library function the frame called that allocated (as `Site::via`).
    pub via: Option<String>,
    pub bytes: u64,
}

/// What kind of change a remedy asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemedyKind {
    /// Allocator settings: the whole string to set, in `alloc_conf`.
    AllocConf,
    /// Free the tensors some sites keep across iterations earlier.
    FreeEarlier,
    /// Cut live memory at the failing request by `bytes` (checkpointing, sharding, a smaller
    /// batch): no replay can say which.
    ReduceLive,
    /// Free memory held outside PyTorch's allocator.
    OutsideAllocator,
}

/// One allocator setting a remedy changes against the recorded settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SettingChange {
    pub key: String,
    /// The recorded value; `None` when the key was not set.
    pub recorded: Option<String>,
    pub new: String,
}

/// A way out of the OOM.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Remedy {
    pub kind: RemedyKind,
    /// What to do, in one line.
    pub action: String,
    /// For `alloc_conf`: the complete settings string to set (the recorded settings with the
    /// change), for the variable `env`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<&'static str>,
    /// Python to run as well, where a setting is a call rather than part of the string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// For `alloc_conf`: what differs from the recorded settings.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<SettingChange>,
    /// Replayed through the simulator.
    pub verified: bool,
    pub oom_avoided: Option<bool>,
    pub new_peak_reserved_bytes: Option<u64>,
    /// Peak of allocated bytes in the replay.
    pub new_peak_allocated_bytes: Option<u64>,
    /// OOM retries that got their request in the replay (each a full cache flush and a
    /// device synchronize).
    pub new_oom_retries: Option<u64>,
    /// `torch.cuda.empty_cache()` calls in the replay (the program's own).
    pub new_empty_cache_calls: Option<u64>,
    /// For `reduce_live` and `outside_allocator`: the bytes to cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// For `free_earlier`: the sites freed, with the bytes they held at the OOM; for
    /// `reduce_live`: the sites holding the most at the OOM, to cut from.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<OomSite>,
}

impl Remedy {
    /// A remedy of `kind` described by `action`, not replayed.
    pub fn unverified(kind: RemedyKind, action: impl Into<String>) -> Remedy {
        Remedy {
            kind,
            action: action.into(),
            alloc_conf: None,
            env: None,
            code: None,
            changed: Vec::new(),
            verified: false,
            oom_avoided: None,
            new_peak_reserved_bytes: None,
            new_peak_allocated_bytes: None,
            new_oom_retries: None,
            new_empty_cache_calls: None,
            bytes: None,
            sites: Vec::new(),
        }
    }
}

/// The state at the failing request (replayed), each figure of that one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AtOom {
    pub reserved_bytes: u64,
    /// Bytes in allocated blocks, pending-free ones included.
    pub allocated_bytes: u64,
    /// Reserved bytes not in allocated blocks.
    pub free_in_cache_bytes: u64,
    /// `None` when the input does not give it (a log message, a recording).
    pub largest_free_block_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
}

/// One diagnosed OOM (docs/json/diagnose.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Diagnosis {
    pub device: u32,
    pub entry_index: Option<usize>,
    pub cause: Cause,
    pub evidence: String,
    pub request_bytes: u64,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    pub device_free_bytes: Option<u64>,
    /// `None` when the input does not give it (a log message).
    pub largest_free_block_bytes: Option<u64>,
    /// The device's total memory, when known (`--capacity`, or the message).
    pub total_bytes: Option<u64>,
    /// The figures above, as one object of the moment of the OOM.
    pub at_oom: AtOom,
    /// The failing request's site first, then the sites that hold the most.
    pub sites: Vec<OomSite>,
    /// What avoids the OOM in replay, or cannot be replayed, best first.
    pub remedies: Vec<Remedy>,
    /// Settings replayed that still run out of memory, with their results.
    pub tried: Vec<Remedy>,
    /// Settings a remedy would suggest that the recorded settings already have.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub already_on: Vec<String>,
    /// The device memory the remedies were replayed under (given, or the bracket the trace
    /// shows); `None` when none was replayed.
    pub replay_capacity_bytes: Option<u64>,
    /// Where `replay_capacity_bytes` came from: `given` (--capacity), `inferred` (bracketed by
    /// the trace's OOM retries and `oom` entry); `None` when none was replayed.
    pub replay_capacity_source: Option<&'static str>,
}

impl Diagnosis {
    /// A diagnosis of `facts` without sites or remedies.
    pub fn from_facts(
        device: u32,
        entry_index: Option<usize>,
        facts: &OomFacts,
        growth: Option<&Growth>,
    ) -> Diagnosis {
        let (cause, evidence) = classify(facts, growth);
        Diagnosis {
            device,
            entry_index,
            cause,
            evidence,
            request_bytes: facts.request_bytes,
            reserved_bytes: facts.reserved_bytes,
            allocated_bytes: facts.allocated_bytes,
            device_free_bytes: facts.device_free_bytes,
            largest_free_block_bytes: facts.largest_free_block_bytes,
            total_bytes: facts.total_bytes,
            at_oom: AtOom {
                reserved_bytes: facts.reserved_bytes,
                allocated_bytes: facts.allocated_bytes,
                free_in_cache_bytes: facts.cached_free_bytes(),
                largest_free_block_bytes: facts.largest_free_block_bytes,
                device_free_bytes: facts.device_free_bytes,
            },
            sites: Vec::new(),
            remedies: Vec::new(),
            tried: Vec::new(),
            already_on: Vec::new(),
            replay_capacity_bytes: None,
            replay_capacity_source: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn facts(request: u64, reserved: u64, allocated: u64) -> OomFacts {
        OomFacts {
            request_bytes: request,
            reserved_bytes: reserved,
            allocated_bytes: allocated,
            ..OomFacts::default()
        }
    }

    #[test]
    fn causes_in_order() {
        let mut f = facts(4 * GIB, 10 * GIB, 5 * GIB);
        f.largest_free_block_bytes = Some(2 * GIB);
        f.device_free_bytes = Some(GIB);
        assert_eq!(classify(&f, None).0, Cause::Fragmentation);
        f.request_bytes = 12 * GIB;
        assert_eq!(classify(&f, None).0, Cause::OversizedRequest);
        let mut f = facts(3 * GIB, 10 * GIB, 9 * GIB);
        f.device_free_bytes = Some(GIB);
        f.total_bytes = Some(16 * GIB);
        assert_eq!(classify(&f, None).0, Cause::OutsideAllocator);
        f.total_bytes = Some(12 * GIB);
        let (cause, evidence) = classify(&f, None);
        assert_eq!(cause, Cause::Exhaustion);
        assert!(evidence.contains("9.00 GiB"), "{evidence}");
        assert_eq!(shortfall_bytes(&f), 2 * GIB);
        let mut g = Growth {
            marker: "`snapshot` trace entries".into(),
            iterations: 3,
            from_bytes: 5 * GIB,
            to_bytes: 6 * GIB,
            sites: Vec::new(),
        };
        assert_eq!(classify(&f, Some(&g)).0, Cause::Exhaustion);
        g.to_bytes = 7 * GIB;
        let (cause, evidence) = classify(&f, Some(&g));
        assert_eq!(cause, Cause::Growth);
        assert!(evidence.contains("+2.00 GiB"), "{evidence}");
    }

    #[test]
    fn a_large_enough_block_is_not_fragmentation() {
        let mut f = facts(GIB, 4 * GIB, GIB);
        f.largest_free_block_bytes = Some(2 * GIB);
        assert_eq!(classify(&f, None).0, Cause::Exhaustion);
        f.largest_free_block_bytes = None;
        assert_eq!(classify(&f, None).0, Cause::Fragmentation);
    }
}
