//! Sources: the only code that turns outside bytes into model values. Parsers take a reader;
//! nothing here opens a path it was not handed.

pub mod gpu;
pub mod oom_log;
pub mod pickle;
pub mod prefetch;
pub mod recording;
pub mod torch_snapshot;
