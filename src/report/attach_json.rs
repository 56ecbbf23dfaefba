//! The `attach --json` document: one process's device memory on each GPU over time, as NVML
//! reports it or, in shim mode, as held through the driver by the shim's event stream, with the
//! stream's counts, or in torch mode as PyTorch's allocator in the job reports it
//! (`schema_version` 1, `kind` `memprof_attach`).

use super::analyze_json::{Tool, SCHEMA_VERSION};
use crate::model::Bytes;
use crate::source::attach::figures::TorchDevice;
use crate::source::gpu::Sample;
use crate::source::live_tally::LiveTally;
use serde::Serialize;

/// What NVML mode can and cannot see, stated in the document itself.
pub const NVML_NOTE: &str = "NVML mode: the device memory the driver charges to the process on \
each GPU (PyTorch's reserved segments plus the CUDA context), sampled at the interval. No \
allocations, tensors, stacks or allocator caching are visible; a GPU on which the process has \
no context does not appear; `used` is null where the driver will not say (some vGPU and \
container set-ups).";

/// What shim mode can and cannot see.
pub const SHIM_NOTE: &str = "Shim mode: every CUDA driver allocation and mapping of the process \
(cuMemAlloc*, cuMemMap) from the shim's live stream; `used` is the memory held through the \
driver at each sample (what PyTorch's caching allocator reserved, without the CUDA context). \
Tensors inside PyTorch's segments are not visible. `shim.libraries` and `shim.pinned_host` split \
device and pinned host memory by the library that asked for it (its stack's first frame outside \
the CUDA runtime). Counts start when attach connected; what was alive then is included in `used` \
but not counted as allocations.";

/// What torch mode can and cannot see.
pub const TORCH_NOTE: &str = "Torch mode: PyTorch's own allocator figures \
(torch.cuda.memory_stats) read by memprof's agent inside the job, which was started without \
memprof; next to them NVML's figure for the process where NVML runs, so that `outside_pytorch` \
(NVML's used minus PyTorch's reserved: the CUDA context, NCCL, cuBLAS workspaces) shows. Devices \
are matched by index: with CUDA_VISIBLE_DEVICES set, PyTorch's index and NVML's differ. The agent \
is removed at the end and the job left as it was (`torch.restored`).";

/// One torch-mode sample.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct TorchSample {
    pub time_ms: u64,
    pub devices: Vec<TorchSampleDevice>,
}

/// A device of a torch-mode sample, with `outside_pytorch` worked out.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct TorchSampleDevice {
    #[serde(flatten)]
    pub figures: TorchDevice,
    pub outside_pytorch: Option<Bytes>,
}

/// The torch-mode series and what the agent said about the job.
#[derive(Debug, PartialEq, Serialize)]
pub struct TorchSeries {
    pub python: String,
    pub torch_version: Option<String>,
    /// `torch.cuda.get_allocator_backend()`: `native` or `cudaMallocAsync`.
    pub backend: Option<String>,
    pub samples: Vec<TorchSample>,
    /// The longest one request of memprof's ran in the job (microseconds, with the GIL at most).
    pub longest_held_us: u64,
    /// What detaching put back (`history_stopped`, `observer_disarmed`); null until detached.
    pub restored: Option<serde_json::Value>,
}

/// The shim stream's counts at the last sample (shim mode only).
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ShimCounts {
    pub allocations: u64,
    pub frees: u64,
    pub alive: usize,
    pub oom_events: u64,
    pub failed_calls: u64,
    /// Records the shim dropped from its recording; null until the process ended.
    pub dropped: Option<u64>,
    /// Records not sent to this client because it read too slowly.
    pub not_sent: u64,
    /// The process ended during the series.
    pub ended: bool,
    /// Device memory held through the driver by library, per device, most first.
    pub libraries: Vec<LibraryShare>,
    /// Pinned host memory by library, most first.
    pub pinned_host: Vec<PinnedShare>,
}

/// The device memory one library holds through the driver on one device.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct LibraryShare {
    pub device: u32,
    /// The library's file name; null when no frame outside the CUDA runtime names one.
    pub library: Option<String>,
    pub bytes: Bytes,
    /// The most it held at once since attach connected.
    pub peak_bytes: Bytes,
}

/// The pinned host memory one library holds.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct PinnedShare {
    pub library: Option<String>,
    pub bytes: Bytes,
    pub peak_bytes: Bytes,
}

#[derive(Debug, Serialize)]
pub struct AttachDocument {
    pub schema_version: u32,
    pub kind: &'static str,
    pub tool: Tool,
    pub pid: u32,
    pub command: Option<String>,
    /// "nvml" or "shim".
    pub mode: &'static str,
    /// Where the samples came from, e.g. "NVML (driver 550.54.15)".
    pub source: String,
    pub interval_s: f64,
    pub note: &'static str,
    pub samples: Vec<PidSample>,
    /// Per device, the highest `used` seen and when.
    pub peak: Vec<DevicePeak>,
    /// The stream's counts in shim mode; null in NVML mode.
    pub shim: Option<ShimCounts>,
    /// PyTorch's figures in torch mode; null otherwise.
    pub torch: Option<TorchSeries>,
    /// NVML samples that failed after the first (a transient driver error); the series goes on
    /// without them.
    pub failed_samples: u64,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct PidSample {
    pub time_ms: u64,
    pub devices: Vec<PidDevice>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct PidDevice {
    pub index: u32,
    pub uuid: Option<String>,
    pub used: Option<Bytes>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct DevicePeak {
    pub index: u32,
    pub used: Bytes,
    pub time_ms: u64,
}

impl AttachDocument {
    /// An empty series for `pid`.
    pub fn new(pid: u32, command: Option<String>, source: String, interval_s: f64) -> Self {
        Self {
            schema_version: SCHEMA_VERSION,
            kind: "memprof_attach",
            tool: Tool::this(),
            pid,
            command,
            mode: "nvml",
            source,
            interval_s,
            note: NVML_NOTE,
            samples: Vec::new(),
            peak: Vec::new(),
            shim: None,
            torch: None,
            failed_samples: 0,
        }
    }

    /// An empty series for `pid` read from the shim's stream.
    pub fn new_shim(pid: u32, command: Option<String>, interval_s: f64) -> Self {
        Self {
            mode: "shim",
            source: "memprof shim live stream".to_owned(),
            note: SHIM_NOTE,
            ..Self::new(pid, command, String::new(), interval_s)
        }
    }

    /// An empty torch-mode series for `pid`: PyTorch's figures from the agent in the job,
    /// `source` naming NVML's sampler where NVML runs beside it.
    pub fn new_torch(
        pid: u32,
        command: Option<String>,
        interval_s: f64,
        series: TorchSeries,
        source: String,
    ) -> Self {
        Self {
            mode: "torch",
            note: TORCH_NOTE,
            torch: Some(series),
            ..Self::new(pid, command, source, interval_s)
        }
    }

    /// Adds PyTorch's figures at `time_ms`.
    pub fn push_torch(&mut self, time_ms: u64, devices: Vec<TorchDevice>) {
        if let Some(torch) = self.torch.as_mut() {
            let devices = devices
                .into_iter()
                .map(|figures| TorchSampleDevice {
                    outside_pytorch: figures.outside_pytorch(),
                    figures,
                })
                .collect();
            torch.samples.push(TorchSample { time_ms, devices });
        }
    }

    /// Adds the memory held through the driver per device in `tally` at `time_ms`, and the
    /// stream's counts so far.
    pub fn push_shim(&mut self, time_ms: u64, tally: &LiveTally) {
        let devices = tally
            .devices
            .iter()
            .map(|(&index, d)| PidDevice {
                index,
                uuid: None,
                used: Some(d.held),
            })
            .collect();
        self.push_devices(time_ms, devices);
        for (&index, d) in &tally.devices {
            if let Some(peak) = self.peak.iter_mut().find(|p| p.index == index) {
                // A peak between two samples: known from the stream, timed at this sample.
                if d.peak > peak.used {
                    peak.used = d.peak;
                    peak.time_ms = time_ms;
                }
            }
        }
        self.shim = Some(ShimCounts {
            allocations: tally.allocations,
            frees: tally.frees,
            alive: tally.alive(),
            oom_events: tally.ooms,
            failed_calls: tally.failed,
            dropped: tally.dropped,
            not_sent: tally.lost,
            ended: tally.ended,
            libraries: (tally.libraries.devices().into_iter())
                .flat_map(|device| {
                    (tally.libraries.on_device(device).into_iter()).map(move |f| LibraryShare {
                        device,
                        library: f.library,
                        bytes: f.held,
                        peak_bytes: f.peak,
                    })
                })
                .collect(),
            pinned_host: (tally.libraries.pinned().into_iter())
                .map(|f| PinnedShare {
                    library: f.library,
                    bytes: f.held,
                    peak_bytes: f.peak,
                })
                .collect(),
        });
    }

    /// Adds the process's share of `sample`.
    pub fn push(&mut self, sample: &Sample) {
        let devices: Vec<PidDevice> = sample
            .processes
            .iter()
            .filter(|p| p.pid == self.pid)
            .map(|p| PidDevice {
                index: p.device,
                uuid: sample
                    .devices
                    .iter()
                    .find(|d| d.index == p.device)
                    .and_then(|d| d.uuid.clone()),
                used: p.used,
            })
            .collect();
        self.push_devices(sample.time_ms, devices);
    }

    fn push_devices(&mut self, time_ms: u64, devices: Vec<PidDevice>) {
        for device in &devices {
            let Some(used) = device.used else { continue };
            match self.peak.iter_mut().find(|p| p.index == device.index) {
                Some(peak) if peak.used >= used => {}
                Some(peak) => {
                    peak.used = used;
                    peak.time_ms = time_ms;
                }
                None => self.peak.push(DevicePeak {
                    index: device.index,
                    used,
                    time_ms,
                }),
            }
        }
        self.samples.push(PidSample { time_ms, devices });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::gpu::{DeviceSample, ProcessSample};

    fn sample(time_ms: u64, ours: &[(u32, Option<u64>)]) -> Sample {
        let mut processes: Vec<ProcessSample> = ours
            .iter()
            .map(|&(device, used)| ProcessSample {
                pid: 7,
                device,
                used: used.map(Bytes),
                ..ProcessSample::default()
            })
            .collect();
        processes.push(ProcessSample {
            pid: 8,
            device: 0,
            used: Some(Bytes(1 << 40)),
            ..ProcessSample::default()
        });
        Sample {
            time_ms,
            devices: vec![DeviceSample {
                index: 0,
                uuid: Some("GPU-a".into()),
                ..DeviceSample::default()
            }],
            processes,
        }
    }

    #[test]
    fn keeps_only_the_pid_and_its_peak_per_device() {
        let mut doc = AttachDocument::new(7, None, "scripted".into(), 1.0);
        doc.push(&sample(1, &[(0, Some(100)), (1, None)]));
        doc.push(&sample(2, &[(0, Some(300))]));
        doc.push(&sample(3, &[(0, Some(200)), (1, Some(5))]));
        assert_eq!(
            doc.samples[0].devices,
            [
                PidDevice {
                    index: 0,
                    uuid: Some("GPU-a".into()),
                    used: Some(Bytes(100))
                },
                PidDevice {
                    index: 1,
                    uuid: None,
                    used: None
                },
            ]
        );
        assert_eq!(doc.samples[1].devices.len(), 1);
        assert_eq!(
            doc.peak,
            [
                DevicePeak {
                    index: 0,
                    used: Bytes(300),
                    time_ms: 2
                },
                DevicePeak {
                    index: 1,
                    used: Bytes(5),
                    time_ms: 3
                },
            ]
        );
    }
}
