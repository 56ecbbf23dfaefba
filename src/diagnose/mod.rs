//! OOM root cause: diagnoses of the `oom` entries of a snapshot (the numbers from the
//! simulator's replay of the recorded trace, remedies replayed under other settings), of a
//! memprof recording (the driver calls alone) and of the OOM messages of a log (the numbers the
//! message prints).

pub(crate) mod classify;
mod free_earlier;
mod log;
mod pressure;
mod recording;
pub mod remedies;
mod snapshot;

pub use classify::{classify_ooms, Origin};
pub use log::diagnose_log;
pub use pressure::pressure;
pub use recording::diagnose_recording_device;
pub use snapshot::{diagnose_device, Depth};

#[cfg(test)]
mod tests;
