//! PyTorch's allocator figures for one device, as the agent reads them from
//! `torch.cuda.memory_stats()` (its names in the comments), and NVML's figure beside them.

use crate::model::Bytes;
use serde::Serialize;
use serde_json::Value;

/// PyTorch's figures for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TorchDevice {
    /// PyTorch's device index.
    pub device: u32,
    /// `allocated_bytes.all.current`
    pub allocated: Option<Bytes>,
    /// `allocated_bytes.all.peak`
    pub allocated_peak: Option<Bytes>,
    /// `reserved_bytes.all.current`
    pub reserved: Option<Bytes>,
    /// `reserved_bytes.all.peak`
    pub reserved_peak: Option<Bytes>,
    /// `active_bytes.all.current`
    pub active: Option<Bytes>,
    /// `active_bytes.all.peak`
    pub active_peak: Option<Bytes>,
    /// `inactive_split_bytes.all.current`
    pub inactive_split: Option<Bytes>,
    pub num_alloc_retries: Option<u64>,
    pub num_ooms: Option<u64>,
    /// NVML's figure for the process on the device of the same index, where NVML runs.
    pub nvml_used: Option<Bytes>,
}

impl TorchDevice {
    /// NVML's used minus PyTorch's reserved: what the process holds outside PyTorch's caching
    /// allocator (the CUDA context, NCCL, cuBLAS workspaces); None unless both are known.
    pub fn outside_pytorch(&self) -> Option<Bytes> {
        Some(Bytes(self.nvml_used?.0.saturating_sub(self.reserved?.0)))
    }
}

/// The figures of one `stats` answer of the agent; a figure it did not give is None.
pub fn from_answer(answer: &Value) -> Vec<TorchDevice> {
    let get = |d: &Value, key: &str| d[key].as_u64().map(Bytes);
    answer["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| TorchDevice {
            device: d["device"].as_u64().unwrap_or(0) as u32,
            allocated: get(d, "allocated_bytes.all.current"),
            allocated_peak: get(d, "allocated_bytes.all.peak"),
            reserved: get(d, "reserved_bytes.all.current"),
            reserved_peak: get(d, "reserved_bytes.all.peak"),
            active: get(d, "active_bytes.all.current"),
            active_peak: get(d, "active_bytes.all.peak"),
            inactive_split: get(d, "inactive_split_bytes.all.current"),
            num_alloc_retries: d["num_alloc_retries"].as_u64(),
            num_ooms: d["num_ooms"].as_u64(),
            nvml_used: None,
        })
        .collect()
}

/// Fills each device's `nvml_used` from an NVML sample's figure for `pid`.
pub fn add_nvml(devices: &mut [TorchDevice], pid: u32, sample: &crate::source::gpu::Sample) {
    for d in devices {
        d.nvml_used = sample
            .processes
            .iter()
            .filter(|p| p.pid == pid && p.device == d.device)
            .find_map(|p| p.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pytorch_names_and_leaves_missing_ones_unknown() {
        let answer = serde_json::json!({"devices": [{
            "device": 1, "allocated_bytes.all.current": 100, "reserved_bytes.all.current": 200,
            "num_ooms": 2, "num_alloc_retries": null
        }]});
        let d = &from_answer(&answer)[0];
        assert_eq!(d.device, 1);
        assert_eq!(d.allocated, Some(Bytes(100)));
        assert_eq!(d.reserved, Some(Bytes(200)));
        assert_eq!(d.num_ooms, Some(2));
        assert_eq!(d.num_alloc_retries, None);
        assert_eq!(d.active, None);
        assert_eq!(d.outside_pytorch(), None);
        let with_nvml = TorchDevice {
            nvml_used: Some(Bytes(700)),
            ..d.clone()
        };
        assert_eq!(with_nvml.outside_pytorch(), Some(Bytes(500)));
    }
}
