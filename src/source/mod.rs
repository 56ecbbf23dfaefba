//! Sources: the only code that turns outside bytes into model values. Parsers take a reader;
//! nothing here opens a path it was not handed, except that the live client finds a shim's
//! socket from its process id, and that files an input names are opened through `open`.

pub mod attach;
pub mod cuda_probe;
pub mod driver_state;
pub mod gpu;
pub mod live;
pub mod live_feed;
pub mod live_libraries;
pub mod live_tally;
pub mod oom_log;
pub mod open;
pub mod pickle;
pub mod prefault;
pub mod prefetch;
pub mod recording;
pub mod sniff;
pub mod torch_snapshot;
pub mod zip_member;
