//! The caching-allocator simulator: PyTorch's native CUDA caching allocator as a model
//! (`reference/pytorch-allocator.md` §1), its settings, and the replay of a recorded trace
//! through it (§2.11-2.12) for validation and what-if runs. The model emits the same
//! `TraceEntry` vocabulary as snapshots.

pub mod alloc_conf;
pub mod block_sizes;
mod blocks;
mod caching_allocator;
mod capacity;
mod driver;
mod early_free;
mod engine;
mod expandable;
mod initial;
mod layout;
mod plan;
mod release;
pub mod replay;
pub mod rounding;
pub mod sweep;
mod validation;

pub use alloc_conf::{AllocatorConfig, Backend, ConfError};
pub use caching_allocator::{CachingAllocator, FreeError, OutOfMemory, Stats};
pub use driver::Driver;
pub use early_free::EarlyFree;
pub use layout::LayoutError;
