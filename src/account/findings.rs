//! The verdicts an account gives, each a sentence with its evidence, decided once here so
//! that every output words them the same: what a dump without a usable trace can and cannot
//! show, the OOM's cause, what private pools keep to themselves, the optimizer step's
//! temporaries and live memory without a stack.

use super::{peak_is_known, DeviceAccount, MomentKind};
use crate::analysis::categories::{Categories, Unrecorded, Wrapper};
use crate::analysis::DeviceAnalysis;
use crate::model::{count, Bytes};
use serde::{Deserialize, Serialize};

/// Below this share of reserved memory cached free, a dump is at the limit of what the
/// allocator holds.
pub const AT_LIMIT_FREE_SHARE: f64 = 0.05;

/// What a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// The trace cannot tell the peak or the pressure (none, or one entry).
    NoTrace,
    /// A dump without a usable trace whose cache is all but empty: live memory, not
    /// fragmentation, filled the device if it ran out.
    AtLimit,
    /// A dump without a usable trace with memory cached free: what an OOM then would mean.
    IfThisWasAnOom,
    /// An out-of-memory error and its cause.
    Oom,
    /// A private pool's free blocks, which only that pool's requests can use.
    PrivatePool,
    /// What every device held when this one ran out of memory.
    Imbalance,
    /// The optimizer step's own temporaries, and what removes them.
    OptimizerTemporaries,
    /// Live memory without a call stack: why, and what to change.
    UnrecordedStacks,
    /// A user function that passes allocations on for several callers: the callers hold them.
    Wrapper,
}

/// One verdict: its kind, the moment it speaks of, and the sentence every output prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub moment: Option<MomentKind>,
    pub sentence: String,
}

/// The findings of a device whose moments, peaks and pools `account` holds.
pub fn findings(d: &DeviceAnalysis, account: &DeviceAccount, entries: usize) -> Vec<Finding> {
    let mut out = Vec::new();
    let dump = account.dump();
    if !peak_is_known(entries, d.trace.peak_entry_index) {
        let why = match entries {
            0 if d.blocks_have_stacks => {
                "memory history was recorded (the blocks carry stacks) but the trace was not \
                 kept, as with `enabled=\"state\"`"
            }
            0 => "memory history was not recorded",
            _ => "the trace holds one entry",
        };
        out.push(Finding {
            kind: FindingKind::NoTrace,
            moment: None,
            sentence: format!(
                "no trace to judge: {why}, so the peak, OOM retries and empty_cache() calls \
                 are not known; only the state at the dump speaks"
            ),
        });
        out.extend(judge_dump(&dump));
    }
    if let Some(oom) = &d.oom {
        if let Some(g) = &oom.diagnosis {
            let when = account
                .moment_at(MomentKind::Oom, oom.entry_index)
                .and_then(|m| m.seconds())
                .map(|s| format!(", {s:.3} s"))
                .unwrap_or_default();
            out.push(Finding {
                kind: FindingKind::Oom,
                moment: Some(MomentKind::Oom),
                sentence: format!(
                    "out of memory at entry {}{when}: a request of {} failed ({}). {}",
                    oom.entry_index,
                    Bytes(oom.request_bytes),
                    g.cause.name(),
                    g.evidence
                ),
            });
        }
    }
    if let Some(c) = &d.categories {
        out.extend(optimizer_temporaries(c, d.trace.peak_entry_index));
        let known = peak_is_known(entries, d.trace.peak_entry_index);
        out.extend(unrecorded(&c.unrecorded, known));
        out.extend(c.wrappers.iter().map(|w| wrapper(w, known)));
    }
    for p in account.pools.iter().filter(|p| !p.is_default()) {
        let owner = p
            .owner
            .as_deref()
            .map(|o| format!(" ({o})"))
            .unwrap_or_default();
        out.push(Finding {
            kind: FindingKind::PrivatePool,
            moment: Some(MomentKind::Dump),
            sentence: format!(
                "{}{owner} holds {} reserved, {} allocated; its {} cached free serves only \
                 that pool's requests",
                p.name(),
                Bytes(p.reserved_bytes),
                Bytes(p.allocated_bytes),
                Bytes(p.cached_free_bytes)
            ),
        });
    }
    out
}

/// The optimizer step's temporaries at their most, with the change that removes them: a
/// foreach implementation's are its per-step copies; a hand-written step's are its
/// out-of-place arithmetic.
fn optimizer_temporaries(c: &Categories, peak: Option<usize>) -> Option<Finding> {
    let t = c.optimizer_temporaries.as_ref()?;
    let at_peak = c
        .at_peak
        .iter()
        .find(|b| b.category == "optimizer_temporary")
        .map(|b| b.bytes)
        .filter(|_| peak.is_some())
        .unwrap_or(0);
    let at_peak = if at_peak > 0 {
        format!(" ({} of them at the peak)", Bytes(at_peak))
    } else {
        String::new()
    };
    let advice = match t.implementation.as_deref() {
        Some(i) if i.starts_with("_fused_") => format!(
            "made by {i}; they are the fused kernel's own, so only a smaller optimizer state \
             (8-bit, Adafactor) or fewer parameters per step lowers them"
        ),
        Some(i) => format!(
            "made by {i}, the foreach implementation, which works on copies of every \
             parameter's tensors at once; a fused optimizer (`fused=True`) or `foreach=False` \
             removes most of that {} transient",
            Bytes(t.peak_bytes)
        ),
        None => format!(
            "made by the step's own arithmetic at {}; written in place (`mul_`, `addcdiv_`, \
             `add_`) the step would not allocate them",
            t.site
        ),
    };
    Some(Finding {
        kind: FindingKind::OptimizerTemporaries,
        moment: None,
        sentence: format!(
            "optimizer step temporaries: {} (requested) alive at once inside the optimizer \
             step (after entry {}, {} {}){at_peak}, {advice}",
            Bytes(t.peak_bytes),
            t.peak_entry_index,
            t.count,
            if t.count == 1 {
                "allocation"
            } else {
                "allocations"
            }
        ),
    })
}

/// A wrapper's memory, attributed to its callers.
fn wrapper(w: &Wrapper, peak_known: bool) -> Finding {
    let callers: Vec<String> = w
        .callers
        .iter()
        .map(|c| format!("{} ({})", c.site, Bytes(c.bytes)))
        .collect();
    let more = w.caller_count.saturating_sub(w.callers.len());
    let more = if more > 0 {
        format!(" and {} more", count(more as u64, "caller", "callers"))
    } else {
        String::new()
    };
    Finding {
        kind: FindingKind::Wrapper,
        moment: Some(if peak_known {
            MomentKind::PeakRequested
        } else {
            MomentKind::Dump
        }),
        sentence: format!(
            "{} is the innermost user frame of {} alive {}, made for {} distinct callers; by \
             caller: {}{more}",
            w.site,
            Bytes(w.bytes),
            if peak_known {
                "at the peak"
            } else {
                "at the dump"
            },
            w.caller_count,
            callers.join(", ")
        ),
    }
}

/// Live memory that has no stack: made before recording began (the model built first), or
/// made during it by a thread whose frames were not kept.
fn unrecorded(u: &Unrecorded, peak_known: bool) -> Vec<Finding> {
    let when = if peak_known {
        "at the peak"
    } else {
        "at the dump"
    };
    let moment = Some(if peak_known {
        MomentKind::PeakRequested
    } else {
        MomentKind::Dump
    });
    let mut out = Vec::new();
    if u.before_trace_bytes > 0 && peak_known {
        out.push(Finding {
            kind: FindingKind::UnrecordedStacks,
            moment,
            sentence: format!(
                "<no stack recorded>: {} (requested) in {} alive {when} was allocated before \
                 recording began (the model was built, or moved to the GPU, before \
                 `torch.cuda.memory._record_memory_history()` was called); call it before \
                 building the model to see who made them",
                Bytes(u.before_trace_bytes),
                count(u.before_trace_count as u64, "allocation", "allocations")
            ),
        });
    }
    if u.in_trace_bytes > 0 {
        out.push(Finding {
            kind: FindingKind::UnrecordedStacks,
            moment,
            sentence: format!(
                "<no stack recorded>: {} (requested) in {} alive {when} was allocated while \
                 recording but without frames: with `stacks=\"python\"` an allocation made off \
                 the Python thread (the autograd engine's backward) has none, as has one \
                 recorded with `context=None`; record with `stacks=\"all\"` (and \
                 `context=\"all\"`) to see them",
                Bytes(u.in_trace_bytes),
                count(u.in_trace_count as u64, "allocation", "allocations")
            ),
        });
    }
    out
}

/// What the state at the dump alone says, for a device whose trace cannot say more.
fn judge_dump(dump: &super::Figures) -> Option<Finding> {
    let reserved = dump.reserved_bytes.filter(|&r| r > 0)?;
    let free = dump.cached_free_bytes?;
    let share = dump.cached_free_share()?;
    if share < AT_LIMIT_FREE_SHARE {
        let active = dump.active_bytes.unwrap_or(reserved - free);
        return Some(Finding {
            kind: FindingKind::AtLimit,
            moment: Some(MomentKind::Dump),
            sentence: format!(
                "at the limit of what the allocator holds: {} of {} reserved is active and {} \
                 ({:.0}%) cached free, so if this dump came from an OOM, live memory filled \
                 the device, not fragmentation; cut live memory (its largest holders are \
                 listed by site)",
                Bytes(active),
                Bytes(reserved),
                Bytes(free),
                share * 100.0
            ),
        });
    }
    let largest = dump.largest_free_block_bytes?;
    Some(Finding {
        kind: FindingKind::IfThisWasAnOom,
        moment: Some(MomentKind::Dump),
        sentence: format!(
            "if this dump came from an OOM: {} ({:.0}% of reserved) sat cached free, the \
             largest free block {}; a request above {} but within what the device had left \
             failed for fragmentation (expandable_segments:True lets the allocator use such \
             memory), a larger one for want of memory",
            Bytes(free),
            share * 100.0,
            Bytes(largest),
            Bytes(largest)
        ),
    })
}
