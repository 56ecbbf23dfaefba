//! The whole-process ledger of a memprof recording: per device, where the process's memory went,
//! at the peak of its device total and at the end. Device memory the driver handed out
//! (allocations and `cuMemCreate` physical memory) is split into PyTorch's caching allocator
//! (the allocations and mappings whose address lies in a segment of the PyTorch snapshot of the
//! same process, by pool), the rest by the shared library that asked for it (`library.rs`), and
//! what no stack attributes; NVML's figure of the process (the samples `memprof run` stores)
//! minus the driver's total is the CUDA context and driver overhead. Pinned host memory (that of
//! PyTorch's host allocator, the ranges holding a host segment of the snapshot, apart; the rest by
//! library) and managed memory are listed beside it.
//!
//! What is held follows the one walk over driver records (`source::driver_state`); the ledger is
//! a keeper of it (`walk.rs`), fed by the same pass that reads the recording into the model
//! (`analyze`, `gate`) or by a pass of its own (`ledger_of`). Its stacks are needed raw, by
//! address.

mod history;
pub mod library;
mod walk;

pub use walk::{ledger_of, LedgerError, LedgerWalk};

use serde::Serialize;

/// A segment of the PyTorch snapshot joined with the recording.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TorchSegment {
    pub device: u32,
    pub address: u64,
    pub size: u64,
    /// `segment_pool_id`: `(0, 0)` for the default pool.
    pub pool_id: (i64, i64),
}

/// One device's ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceLedger {
    pub device: u32,
    /// When the driver's total on this device was highest (the first time it was).
    pub at_peak: LedgerView,
    /// After the last recorded call.
    pub at_end: LedgerView,
}

/// Where the memory was at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LedgerView {
    /// Device memory the driver had handed out: allocations and `cuMemCreate` physical memory.
    pub device_bytes: u64,
    /// NVML's figure of the process on this device, from the sample used for `context_bytes`.
    pub nvml_bytes: Option<u64>,
    /// NVML's figure minus what the driver had handed out at the moment of the sample: the CUDA
    /// context and driver overhead (0 when NVML reported less). `None` without NVML samples.
    pub context_bytes: Option<u64>,
    /// PyTorch's caching allocator; `None` without a PyTorch snapshot to join.
    pub torch: Option<TorchShare>,
    /// Device memory outside PyTorch, by library, most first.
    pub outside_torch: Vec<LibraryBytes>,
    /// Pinned host memory by library, most first (PyTorch's host allocator's apart).
    pub pinned_host: Vec<HostBytes>,
    /// Pinned host memory of PyTorch's host allocator: the pinned ranges holding a host segment
    /// of the snapshot; absent unless the joined snapshot carries host segments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_pinned_host: Option<TorchHostShare>,
    /// `cuMemAllocManaged` memory (not in `device_bytes`).
    pub managed_bytes: u64,
    /// Device memory outside PyTorch whose stack names no library (no stack recorded, or no
    /// frame outside the CUDA runtime and driver).
    pub unattributed_bytes: u64,
}

/// PyTorch's share of device memory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TorchShare {
    pub reserved_bytes: u64,
    pub pools: Vec<PoolBytes>,
}

/// One memory pool of PyTorch's allocator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PoolBytes {
    /// `default`, or `private` (a CUDA graph's pool or a `torch.cuda.MemPool`).
    pub pool: &'static str,
    pub pool_id: [i64; 2],
    pub bytes: u64,
}

/// Device memory one library holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LibraryBytes {
    pub library: String,
    pub bytes: u64,
    /// The most it held on this device at any moment of the recording.
    pub peak_bytes: u64,
    /// Allocations (and physical memory handles) it holds.
    pub count: u64,
}

/// Pinned host memory one library holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HostBytes {
    /// `None` when no frame outside the CUDA runtime and driver names one.
    pub library: Option<String>,
    pub bytes: u64,
    pub peak_bytes: u64,
}

/// Pinned host memory of PyTorch's caching host allocator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TorchHostShare {
    pub bytes: u64,
    /// The most it held (for the device whose context pinned it) at any moment.
    pub peak_bytes: u64,
}
