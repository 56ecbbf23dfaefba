//! Exports for other tools: a PyTorch snapshot pickle (pytorch.org/memory_viz), a Chrome /
//! Perfetto trace, and memprof's own versioned JSON event stream. Each writes to a `Write`
//! it is handed.

pub mod events_json;
pub mod perfetto;
pub mod pickle;
pub mod torch_snapshot;
