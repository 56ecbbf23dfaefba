//! GPU sampling: what the devices and their processes use, from NVML, a recorded replay, or a
//! scripted fake. Everything above `source/` sees only the `GpuSampler` trait and these types.

mod background;
mod nvml;
mod procfs;
mod replay;
mod scripted;

pub use background::Background;
pub use nvml::{open_nvml, NvmlSampler};
pub use procfs::ProcView;
pub use replay::{Recorder, Replay, ReplayWriter};
pub use scripted::Scripted;

use crate::model::Bytes;
use serde::{Deserialize, Serialize};

/// One device at one instant. A field the device or driver does not report is `None`, never 0.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// NVML's index of the device (the order `nvidia-smi` lists them in).
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub total: Option<Bytes>,
    pub used: Option<Bytes>,
    pub free: Option<Bytes>,
    /// Percent of the last sample period a kernel ran (NVML's `gpu` utilization).
    pub utilization_gpu_percent: Option<u32>,
    /// Percent of the last sample period device memory was read or written.
    pub utilization_memory_percent: Option<u32>,
}

/// One process's use of one device at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSample {
    /// The PID as NVML reports it: the host's PID namespace's. Inside a container (another
    /// PID namespace) /proc cannot map it, so `command` is then `None`.
    pub pid: u32,
    /// The device's NVML index.
    pub device: u32,
    /// Device memory the process holds; `None` where the driver will not say (some vGPU and
    /// container set-ups).
    pub used: Option<Bytes>,
    /// The process's command line, when /proc lets us read it.
    pub command: Option<String>,
}

/// Everything sampled at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the Unix epoch, from the injected clock.
    pub time_ms: u64,
    pub devices: Vec<DeviceSample>,
    pub processes: Vec<ProcessSample>,
}

/// Why a sample could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// No NVML on this machine (no driver, or not a GPU machine): a clear message, not a crash.
    #[error("NVML is not available: {0}")]
    Unavailable(String),
    /// NVML answered with an error.
    #[error("NVML call {call} failed: {message}")]
    Nvml { call: &'static str, message: String },
    /// A recorded replay is malformed (or a recording could not be written).
    #[error("{source_name}: line {line}: {message}")]
    Replay {
        source_name: String,
        line: usize,
        message: String,
    },
    /// A recorded replay or script has no more samples.
    #[error("no more samples")]
    Exhausted,
    /// The sampling thread has not answered for this long (a driver call that hangs).
    #[error("NVML has not answered for {seconds} s")]
    Stalled { seconds: u64 },
}

/// A source of device and process samples. NVML, a recorded replay and the scripted fake
/// implement it; dashboards and the agent take a `&mut dyn GpuSampler`.
pub trait GpuSampler {
    /// Takes one sample now.
    fn sample(&mut self) -> Result<Sample, SampleError>;
    /// Where the samples come from, for headers and error messages ("NVML 12.535.104",
    /// "replay of run.jsonl", "scripted").
    fn describe(&self) -> String;
}

/// A boxed sampler is a sampler (so wrappers such as `Recorder` take any of them).
impl<S: GpuSampler + ?Sized> GpuSampler for Box<S> {
    fn sample(&mut self) -> Result<Sample, SampleError> {
        (**self).sample()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// The wall clock, injected so dashboards and tests agree on time.
pub trait Clock {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The real wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that reads a fixed time, for tests and snapshot rendering.
#[derive(Clone, Copy, Debug)]
pub struct FixedClock(pub u64);

impl Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}
