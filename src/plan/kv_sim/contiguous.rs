//! Contiguous reservation: each admitted request reserves `max_len` token slots (or its full
//! length when longer) until it finishes, as pre-allocating servers do (Orca(Max),
//! FasterTransformer, static caches).

use super::stats::{Sample, SimResult, Tracker};
use super::workload::Request;
use std::collections::VecDeque;

struct Running {
    tokens: u64,
    left: u64,
    reserved: u64,
}

/// Serves `requests` (sorted by arrival) from `capacity` token slots.
pub fn simulate_contiguous(requests: &[Request], capacity: u64, max_len: u64) -> SimResult {
    let mut tracker = Tracker::default();
    let mut next = 0;
    let mut waiting: VecDeque<&Request> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut reserved = 0u64;
    let mut step = 0u64;
    while next < requests.len() || !waiting.is_empty() || !running.is_empty() {
        if running.is_empty() && waiting.is_empty() {
            step = step.max(requests[next].arrival);
        }
        while next < requests.len() && requests[next].arrival <= step {
            waiting.push_back(&requests[next]);
            next += 1;
        }
        while let Some(r) = waiting.front() {
            let need = max_len.max(r.prompt + r.output);
            if need > capacity {
                tracker.rejected += 1;
                waiting.pop_front();
                continue;
            }
            if reserved + need > capacity {
                break;
            }
            reserved += need;
            running.push(Running {
                tokens: r.prompt,
                left: r.output,
                reserved: need,
            });
            waiting.pop_front();
        }
        for r in &mut running {
            r.tokens += 1;
            r.left -= 1;
        }
        tracker.record(Sample {
            step,
            running: running.len() as u64,
            waiting: waiting.len() as u64,
            used_tokens: running.iter().map(|r| r.tokens).sum(),
            allocated_tokens: reserved,
        });
        running.retain(|r| {
            if r.left == 0 {
                reserved -= r.reserved;
                tracker.completed += 1;
                false
            } else {
                true
            }
        });
        step += 1;
    }
    tracker.finish()
}
