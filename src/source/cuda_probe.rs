//! The CUDA driver probe: the driver's version and, per device, free and total memory
//! (`cuMemGetInfo_v2` in the device's primary context) and the VMM allocation granularity,
//! through cudarc's dynamically loaded driver API (nothing of CUDA is needed to build).
//!
//! cudarc panics when libcuda cannot be loaded or a function is missing from it; the probe
//! checks both first (`is_culib_present`, then every symbol it will call), so a machine without
//! the driver, or with an old one, gets an error or a `None`, never a crash.

use crate::model::Bytes;
use cudarc::driver::{result, sys};
use serde::Serialize;

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Probe {
    /// The CUDA version the driver supports, as "12.4".
    pub driver_version: String,
    pub devices: Vec<ProbeDevice>,
}

/// One device, seen from a context on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProbeDevice {
    pub ordinal: i32,
    /// `None` where the driver lacks `cuDeviceGetName`.
    pub name: Option<String>,
    pub free: Bytes,
    pub total: Bytes,
    /// `cuMemGetAllocationGranularity` (minimum, recommended) for device memory; `None` on a
    /// driver without the VMM API (before CUDA 10.2) or a device that does not support it.
    pub vmm_granularity: Option<Bytes>,
    pub vmm_granularity_recommended: Option<Bytes>,
}

/// Why the probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot load libcuda.so.1 (the CUDA driver); is the NVIDIA driver installed?")]
    NoDriver,
    #[error("the CUDA driver lacks {0}; it is older than this probe supports")]
    MissingSymbol(&'static str),
    #[error("{call} failed: {code}")]
    Call { call: &'static str, code: String },
}

/// Functions the probe cannot do without.
const REQUIRED: [&str; 8] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuMemGetInfo_v2",
];

/// Probes the driver the dynamic loader finds.
pub fn probe() -> Result<Probe, ProbeError> {
    // SAFETY: loading libcuda runs its initializers, as any CUDA program does.
    if !unsafe { sys::is_culib_present() } {
        return Err(ProbeError::NoDriver);
    }
    if let Some(missing) = REQUIRED.into_iter().find(|name| !has_symbol(name)) {
        return Err(ProbeError::MissingSymbol(missing));
    }
    result::init().map_err(|e| failed("cuInit", e))?;
    let mut version = 0;
    // SAFETY: the symbol is present (checked above) and `version` is a valid out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| failed("cuDriverGetVersion", e))?;
    let count = result::device::get_count().map_err(|e| failed("cuDeviceGetCount", e))?;
    let devices = (0..count).map(device).collect::<Result<_, _>>()?;
    Ok(Probe {
        driver_version: format!("{}.{}", version / 1000, version % 1000 / 10),
        devices,
    })
}

/// Whether libcuda exports `name`. Only called once `is_culib_present` said it loads.
fn has_symbol(name: &str) -> bool {
    // SAFETY: the library loads (checked by the caller), so `culib` does not panic; the symbol
    // is looked up, never called, so the function type given is irrelevant.
    unsafe {
        sys::culib()
            .get::<unsafe extern "C" fn()>(name.as_bytes())
            .is_ok()
    }
}

fn device(ordinal: i32) -> Result<ProbeDevice, ProbeError> {
    let dev = result::device::get(ordinal).map_err(|e| failed("cuDeviceGet", e))?;
    // SAFETY: `dev` came from cuDeviceGet.
    let context = unsafe { result::primary_ctx::retain(dev) }
        .map_err(|e| failed("cuDevicePrimaryCtxRetain", e))?;
    let measured = in_context(dev, context);
    // SAFETY: `dev` came from cuDeviceGet and its primary context was retained above; the
    // context is made not current before it is released.
    let released = unsafe {
        let _ = result::ctx::set_current(std::ptr::null_mut());
        result::primary_ctx::release(dev)
    };
    let device = measured?;
    released.map_err(|e| failed("cuDevicePrimaryCtxRelease_v2", e))?;
    Ok(device)
}

fn in_context(dev: sys::CUdevice, context: sys::CUcontext) -> Result<ProbeDevice, ProbeError> {
    // SAFETY: `context` is the retained primary context of `dev`.
    unsafe { result::ctx::set_current(context) }.map_err(|e| failed("cuCtxSetCurrent", e))?;
    let (free, total) = result::mem_get_info().map_err(|e| failed("cuMemGetInfo_v2", e))?;
    let name = if has_symbol("cuDeviceGetName") {
        Some(result::device::get_name(dev).map_err(|e| failed("cuDeviceGetName", e))?)
    } else {
        None
    };
    let granularity = |option| -> Option<Bytes> {
        if !has_symbol("cuMemGetAllocationGranularity") {
            return None;
        }
        let prop = sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        };
        let mut bytes = 0usize;
        // SAFETY: the symbol is present (checked above); `bytes` and `prop` are valid for the
        // call's duration.
        let code = unsafe { sys::cuMemGetAllocationGranularity(&mut bytes, &prop, option) };
        // An unsupported device answers an error: its granularity is unknown, not 0.
        code.result().ok().map(|()| Bytes(bytes as u64))
    };
    use sys::CUmemAllocationGranularity_flags as Flags;
    Ok(ProbeDevice {
        ordinal: dev,
        name,
        free: Bytes(free as u64),
        total: Bytes(total as u64),
        vmm_granularity: granularity(Flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        vmm_granularity_recommended: granularity(Flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
    })
}

/// The error's name (cudarc's own Display would call cuGetErrorString, which an old or fake
/// driver may lack).
fn failed(call: &'static str, e: result::DriverError) -> ProbeError {
    ProbeError::Call {
        call,
        code: format!("{:?}", e.0),
    }
}
