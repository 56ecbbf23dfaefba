//! Pinned host memory of PyTorch's own caching host allocator, as newer snapshots carry it
//! (`host_segments` and `host_traces`, written when memory history is recorded with
//! `record_pinned_host_memory=True`): its blocks at the dump and its trace.

use super::event::TraceEntry;

/// One block of the host allocator at the dump. The host allocator never splits a block, so
/// each of PyTorch's host segments is one `cudaHostAlloc` (or `cudaHostRegister`) range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostSegment {
    pub address: u64,
    /// The pinned range's size (`total_size`).
    pub size: u64,
    /// Bytes handed out to a tensor (`allocated_size`): the whole block or nothing.
    pub allocated: u64,
    /// `segment_pool_id`: `(0, 0)` for the default pool, else a CUDA graph's private pool.
    pub pool_id: (i64, i64),
}

/// `host_segments` and `host_traces` of a snapshot that carries some.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostAllocator {
    /// By address.
    pub segments: Vec<HostSegment>,
    /// The host allocator's trace, oldest first (a ring buffer: the oldest may be gone).
    pub trace: Vec<TraceEntry>,
}
