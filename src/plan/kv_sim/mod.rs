//! The KV-cache pool simulator: a request stream served with continuous batching (one decode
//! step adds one token to every running sequence) under paged allocation (blocks on demand,
//! shared prefix blocks, recompute-style preemption when blocks run out) and under contiguous
//! reservation of the maximum length per request, reporting utilisation, waste, preemptions
//! and concurrency over time. `reference/planner-math.md` §3.2-3.4.

mod contiguous;
mod paged;
mod stats;
mod workload;

pub use contiguous::simulate_contiguous;
pub use paged::simulate_paged;
pub use stats::{Sample, SimResult};
pub use workload::{parse_workload, Request, WorkloadError};

#[cfg(test)]
mod tests;
