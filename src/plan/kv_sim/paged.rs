//! Paged allocation (vLLM's PagedAttention): blocks of `block_size` tokens taken as sequences
//! grow, full prefix blocks shared by requests of one prefix group, and when a decode step
//! finds no free block the most recently admitted sequence is preempted (its blocks freed, the
//! request re-queued at the front with what it generated so far as prompt).

use super::stats::{Sample, SimResult, Tracker};
use super::workload::Request;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// A request waiting for admission, with its progress so far.
#[derive(Clone)]
struct Waiting<'a> {
    request: &'a Request,
    tokens: u64,
    left: u64,
}

struct Running<'a> {
    request: &'a Request,
    tokens: u64,
    left: u64,
    /// Blocks of this sequence alone.
    own: u64,
    /// Full prefix blocks shared through its group.
    shared: u64,
}

struct Pool<'a> {
    free: u64,
    block: u64,
    /// Prefix group -> (shared blocks, sequences holding them).
    groups: FxHashMap<&'a str, (u64, u64)>,
}

impl<'a> Pool<'a> {
    /// Full prefix blocks a request can share.
    fn shareable(&self, r: &Request) -> u64 {
        if r.prefix_group.is_some() {
            r.prefix / self.block
        } else {
            0
        }
    }

    /// Blocks admitting `w` takes from the free list.
    fn admission_cost(&self, w: &Waiting<'a>) -> u64 {
        let shared = self.shareable(w.request);
        let own = w.tokens.div_ceil(self.block).saturating_sub(shared);
        let group_alive = w
            .request
            .prefix_group
            .as_deref()
            .is_some_and(|g| self.groups.contains_key(g));
        if group_alive {
            own
        } else {
            own + shared
        }
    }

    fn admit(&mut self, w: Waiting<'a>) -> Running<'a> {
        let cost = self.admission_cost(&w);
        self.free -= cost;
        let shared = self.shareable(w.request);
        if let Some(g) = w.request.prefix_group.as_deref() {
            if shared > 0 {
                self.groups.entry(g).or_insert((shared, 0)).1 += 1;
            }
        }
        Running {
            request: w.request,
            tokens: w.tokens,
            left: w.left,
            own: w.tokens.div_ceil(self.block).saturating_sub(shared),
            shared,
        }
    }

    fn release(&mut self, r: &Running<'a>) {
        self.free += r.own;
        if r.shared == 0 {
            return;
        }
        if let Some(g) = r.request.prefix_group.as_deref() {
            if let Some(entry) = self.groups.get_mut(g) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    self.free += entry.0;
                    self.groups.remove(g);
                }
            }
        }
    }
}

/// Serves `requests` (sorted by arrival) from `blocks` blocks of `block_size` tokens, running
/// at most `max_running` sequences at once when given (vLLM's `max_num_seqs`).
pub fn simulate_paged(
    requests: &[Request],
    blocks: u64,
    block_size: u64,
    max_running: Option<u64>,
) -> SimResult {
    let cap = max_running.map_or(usize::MAX, |n| {
        usize::try_from(n.max(1)).unwrap_or(usize::MAX)
    });
    let block_size = block_size.max(1);
    let mut tracker = Tracker::default();
    let mut pool = Pool {
        free: blocks,
        block: block_size,
        groups: FxHashMap::default(),
    };
    let mut next = 0;
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut step = 0u64;
    while next < requests.len() || !waiting.is_empty() || !running.is_empty() {
        if running.is_empty() && waiting.is_empty() {
            step = step.max(requests[next].arrival);
        }
        while next < requests.len() && requests[next].arrival <= step {
            let r = &requests[next];
            waiting.push_back(Waiting {
                request: r,
                tokens: r.prompt,
                left: r.output,
            });
            next += 1;
        }
        while let Some(w) = waiting.front() {
            // Prompt plus the first generated token must fit an empty pool.
            if (w.tokens + 1).div_ceil(block_size) > blocks {
                tracker.rejected += 1;
                waiting.pop_front();
                continue;
            }
            if running.len() >= cap || pool.admission_cost(w) > pool.free {
                break;
            }
            if let Some(w) = waiting.pop_front() {
                running.push(pool.admit(w));
            }
        }
        // Decode: every sequence adds a token, taking a block when it crosses a boundary;
        // without a free block the newest sequence is preempted until one frees up.
        let mut i = 0;
        while i < running.len() {
            let needs_block =
                running[i].tokens + 1 > (running[i].own + running[i].shared) * block_size;
            if needs_block && pool.free == 0 {
                if let Some(victim) = running.pop() {
                    pool.release(&victim);
                    tracker.preemptions += 1;
                    waiting.push_front(Waiting {
                        request: victim.request,
                        tokens: victim.tokens,
                        left: victim.left,
                    });
                }
                continue;
            }
            let r = &mut running[i];
            if needs_block {
                pool.free -= 1;
                r.own += 1;
            }
            r.tokens += 1;
            r.left -= 1;
            i += 1;
        }
        let shared_tokens: u64 = pool.groups.values().map(|(b, _)| b * block_size).sum();
        tracker.record(Sample {
            step,
            running: running.len() as u64,
            waiting: waiting.len() as u64,
            used_tokens: shared_tokens
                + running
                    .iter()
                    .map(|r| r.tokens - r.shared * block_size)
                    .sum::<u64>(),
            allocated_tokens: (blocks - pool.free) * block_size,
        });
        let mut kept = Vec::with_capacity(running.len());
        for r in running {
            if r.left == 0 {
                pool.release(&r);
                tracker.completed += 1;
            } else {
                kept.push(r);
            }
        }
        running = kept;
        step += 1;
    }
    tracker.finish()
}
