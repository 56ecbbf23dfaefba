//! The `attach --json` document in NVML mode: one process's device memory on each GPU over
//! time, as NVML reports it (`schema_version` 1, `kind` `memprof_attach`).

use super::analyze_json::{Tool, SCHEMA_VERSION};
use crate::model::Bytes;
use crate::source::gpu::Sample;
use serde::Serialize;

/// What NVML mode can and cannot see, stated in the document itself.
pub const NVML_NOTE: &str = "NVML mode: the device memory the driver charges to the process on \
each GPU (PyTorch's reserved segments plus the CUDA context), sampled at the interval. No \
allocations, tensors, stacks or allocator caching are visible; a GPU on which the process has \
no context does not appear; `used` is null where the driver will not say (some vGPU and \
container set-ups).";

#[derive(Debug, Serialize)]
pub struct AttachDocument {
    pub schema_version: u32,
    pub kind: &'static str,
    pub tool: Tool,
    pub pid: u32,
    pub command: Option<String>,
    /// "nvml" (the shim's event stream is not read yet).
    pub mode: &'static str,
    /// Where the samples came from, e.g. "NVML (driver 550.54.15)".
    pub source: String,
    pub interval_s: f64,
    pub note: &'static str,
    pub samples: Vec<PidSample>,
    /// Per device, the highest `used` seen and when.
    pub peak: Vec<DevicePeak>,
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
        }
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
        for device in &devices {
            let Some(used) = device.used else { continue };
            match self.peak.iter_mut().find(|p| p.index == device.index) {
                Some(peak) if peak.used >= used => {}
                Some(peak) => {
                    peak.used = used;
                    peak.time_ms = sample.time_ms;
                }
                None => self.peak.push(DevicePeak {
                    index: device.index,
                    used,
                    time_ms: sample.time_ms,
                }),
            }
        }
        self.samples.push(PidSample {
            time_ms: sample.time_ms,
            devices,
        });
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
