//! The program's requests rewritten so that chosen allocations are freed earlier than the
//! trace records: a free inserted just after a given entry, and the allocation's own later
//! free (requested, completed, or completed by a synchronization) dropped.

use super::engine::Op;
use rustc_hash::FxHashSet;

/// An allocation to free early: the one at recorded address `addr` just after entry `after`
/// (it must be alive there, allocated by an earlier entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EarlyFree {
    pub after: usize,
    pub addr: u64,
}

/// `ops` with the `frees` applied. A free lands before the first request of a later entry
/// and before the detaches that lead into it (they belong to that request's retry).
pub(super) fn with_early_frees(ops: &[Op], frees: &[EarlyFree]) -> Vec<Op> {
    let mut frees = frees.to_vec();
    frees.sort_by_key(|f| (f.after, f.addr));
    let mut frees = frees.into_iter().peekable();
    let mut out: Vec<Op> = Vec::with_capacity(ops.len() + frees.len());
    // Early-freed addresses whose recorded frees are still to come.
    let mut dropped: FxHashSet<u64> = FxHashSet::default();
    for op in ops {
        if let Some(entry) = op.entry() {
            let detaches = out
                .iter()
                .rev()
                .take_while(|o| matches!(o, Op::Detach { .. }))
                .count();
            let at = out.len() - detaches;
            let due: Vec<Op> = std::iter::from_fn(|| frees.next_if(|f| f.after < entry))
                .map(|f| {
                    dropped.insert(f.addr);
                    Op::Free {
                        entry: f.after,
                        addr: f.addr,
                    }
                })
                .collect();
            out.splice(at..at, due);
        }
        match *op {
            Op::Malloc {
                recorded: Some(a), ..
            } => {
                dropped.remove(&a);
            }
            Op::Free { addr, .. }
            | Op::FreeRequested { addr, .. }
            | Op::FreeCompleted { addr, .. }
            | Op::Detach { addr }
                if dropped.contains(&addr) =>
            {
                continue
            }
            _ => {}
        }
        out.push(*op);
    }
    out.extend(frees.map(|f| Op::Free {
        entry: f.after,
        addr: f.addr,
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn malloc(entry: usize, addr: u64) -> Op {
        Op::Malloc {
            entry,
            size: 1,
            stream: 0,
            pool: (0, 0),
            recorded: Some(addr),
            hint: None,
        }
    }

    /// The ops as (kind, entry, addr) for comparison.
    fn shape(ops: &[Op]) -> Vec<(&'static str, Option<usize>, Option<u64>)> {
        ops.iter()
            .map(|o| match *o {
                Op::Malloc {
                    entry, recorded, ..
                } => ("malloc", Some(entry), recorded),
                Op::Free { entry, addr } => ("free", Some(entry), Some(addr)),
                Op::FreeRequested { entry, addr } => ("requested", Some(entry), Some(addr)),
                Op::FreeCompleted { entry, addr } => ("completed", Some(entry), Some(addr)),
                Op::Detach { addr } => ("detach", None, Some(addr)),
                Op::CompleteDetached => ("complete_detached", None, None),
                Op::EmptyCache => ("empty_cache", None, None),
            })
            .collect()
    }

    #[test]
    fn frees_move_before_later_requests_and_their_own_frees_go() {
        let ops = [
            malloc(0, 0xa),
            malloc(1, 0xb),
            Op::Detach { addr: 0xc },
            malloc(3, 0xd),
            Op::CompleteDetached,
            Op::FreeRequested {
                entry: 4,
                addr: 0xa,
            },
            Op::FreeCompleted {
                entry: 6,
                addr: 0xa,
            },
            malloc(7, 0xa),
            Op::Free {
                entry: 8,
                addr: 0xa,
            },
            Op::Free {
                entry: 9,
                addr: 0xb,
            },
        ];
        let frees = [
            EarlyFree {
                after: 2,
                addr: 0xa,
            },
            EarlyFree {
                after: 20,
                addr: 0xd,
            },
        ];
        assert_eq!(
            shape(&with_early_frees(&ops, &frees)),
            [
                ("malloc", Some(0), Some(0xa)),
                ("malloc", Some(1), Some(0xb)),
                ("free", Some(2), Some(0xa)),
                ("detach", None, Some(0xc)),
                ("malloc", Some(3), Some(0xd)),
                ("complete_detached", None, None),
                // The recorded free of the first 0xa goes; the second 0xa is freed as recorded.
                ("malloc", Some(7), Some(0xa)),
                ("free", Some(8), Some(0xa)),
                ("free", Some(9), Some(0xb)),
                ("free", Some(20), Some(0xd)),
            ]
        );
    }
}
