//! The NVML sampler: every device's memory, utilization and processes from the driver's
//! libnvidia-ml.so.1, loaded at run time through `nvml-wrapper` (nothing of NVML is needed to
//! build). A field the device does not support is `None`.

use super::procfs::ProcView;
use super::{Clock, DeviceSample, GpuSampler, ProcessSample, Sample, SampleError};
use crate::model::Bytes;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;

/// Samples NVML. Holds the library open (and NVML initialized) for its lifetime.
pub struct NvmlSampler {
    nvml: Nvml,
    clock: Box<dyn Clock + Send>,
    procs: ProcView,
    driver: Option<String>,
}

/// Opens the driver's NVML (`libnvidia-ml.so.1`, found the way the dynamic loader finds it).
pub fn open_nvml(clock: Box<dyn Clock + Send>) -> Result<Box<dyn GpuSampler + Send>, SampleError> {
    NvmlSampler::open(None, clock, ProcView::system()).map(|s| Box::new(s) as _)
}

impl NvmlSampler {
    /// Opens NVML from `library` (a path or a name for the dynamic loader; the driver's
    /// `libnvidia-ml.so.1` when `None`), resolving PIDs through `procs`.
    pub fn open(
        library: Option<&OsStr>,
        clock: Box<dyn Clock + Send>,
        procs: ProcView,
    ) -> Result<Self, SampleError> {
        let mut builder = Nvml::builder();
        if let Some(path) = library {
            builder.lib_path(path);
        }
        let nvml = builder.init().map_err(|e| {
            SampleError::Unavailable(match e {
                NvmlError::LibloadingError(e) => {
                    format!("cannot load libnvidia-ml.so.1 ({e}); is the NVIDIA driver installed?")
                }
                NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_owned(),
                NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_owned(),
                other => other.to_string(),
            })
        })?;
        let driver = optional(nvml.sys_driver_version(), "nvmlSystemGetDriverVersion")?;
        Ok(Self {
            nvml,
            clock,
            procs,
            driver,
        })
    }

    /// The driver version NVML reports, e.g. "550.54.15".
    pub fn driver_version(&self) -> Option<&str> {
        self.driver.as_deref()
    }

    fn device(&self, index: u32, device: &Device<'_>) -> Result<DeviceSample, SampleError> {
        let memory = optional(device.memory_info(), "nvmlDeviceGetMemoryInfo_v2")?;
        let utilization = optional(device.utilization_rates(), "nvmlDeviceGetUtilizationRates")?;
        Ok(DeviceSample {
            index,
            name: optional(device.name(), "nvmlDeviceGetName")?,
            uuid: optional(device.uuid(), "nvmlDeviceGetUUID")?,
            total: memory.as_ref().map(|m| Bytes(m.total)),
            used: memory.as_ref().map(|m| Bytes(m.used)),
            free: memory.as_ref().map(|m| Bytes(m.free)),
            utilization_gpu_percent: utilization.as_ref().map(|u| u.gpu),
            utilization_memory_percent: utilization.as_ref().map(|u| u.memory),
        })
    }

    /// Compute processes, then graphics processes not already listed (a process with both
    /// kinds of context appears in both lists with the same figure).
    fn processes(
        &self,
        index: u32,
        device: &Device<'_>,
        out: &mut Vec<ProcessSample>,
    ) -> Result<(), SampleError> {
        let compute = optional(
            device.running_compute_processes(),
            "nvmlDeviceGetComputeRunningProcesses_v3",
        )?;
        let graphics = optional(
            device.running_graphics_processes(),
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
        )?;
        let first = out.len();
        for info in compute.into_iter().chain(graphics).flatten() {
            if out[first..].iter().any(|p| p.pid == info.pid) {
                continue;
            }
            out.push(self.process(index, &info));
        }
        Ok(())
    }

    fn process(&self, device: u32, info: &ProcessInfo) -> ProcessSample {
        // NVML's PID is /proc's in the host's PID namespace; inside a container it cannot be
        // mapped (see `procfs`), so it is kept as it is and `command` is `None`.
        ProcessSample {
            pid: info.pid,
            device,
            used: match info.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(Bytes(bytes)),
                UsedGpuMemory::Unavailable => None,
            },
            command: self.procs.command(info.pid),
        }
    }
}

impl GpuSampler for NvmlSampler {
    fn sample(&mut self) -> Result<Sample, SampleError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| failed("nvmlDeviceGetCount_v2", e))?;
        let time_ms = self.clock.now_ms();
        let mut devices = Vec::with_capacity(count as usize);
        let mut processes = Vec::new();
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| failed("nvmlDeviceGetHandleByIndex_v2", e))?;
            devices.push(self.device(index, &device)?);
            self.processes(index, &device, &mut processes)?;
        }
        Ok(Sample {
            time_ms,
            devices,
            processes,
        })
    }

    fn describe(&self) -> String {
        match &self.driver {
            Some(version) => format!("NVML (driver {version})"),
            None => "NVML".to_owned(),
        }
    }
}

/// A field the device, the driver or our permissions do not offer is `None`; a device that
/// fell off the bus or an NVML failure is an error.
fn optional<T>(result: Result<T, NvmlError>, call: &'static str) -> Result<Option<T>, SampleError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(
            NvmlError::NotSupported
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::NoPermission
            | NvmlError::NotFound,
        ) => Ok(None),
        Err(e) => Err(failed(call, e)),
    }
}

fn failed(call: &'static str, e: NvmlError) -> SampleError {
    SampleError::Nvml {
        call,
        message: e.to_string(),
    }
}
