//! GPU samples as Prometheus metrics in the OpenMetrics text format, encoded by
//! `prometheus-client`. A figure the sample does not have (`None`) has no series at all, and an
//! unknown label (a device name NVML would not give) is left out. Processes running the shim
//! add driver-level figures (`memprof_process_driver_*`) from their live streams.

use crate::agent::ShimProcess;
use crate::model::Bytes;
use crate::source::gpu::{DeviceSample, Sample};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;

/// The HTTP Content-Type of what `render` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Longest command label kept (in bytes); a longer command line is cut at a character boundary.
const COMMAND_LABEL_MAX: usize = 256;

/// A series' labels, in order; only the known ones.
type Labels = Vec<(&'static str, String)>;

/// What the agent knows besides the latest sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// Samples that failed since the agent started.
    pub failed_samples: u64,
}

type GaugeFamily = Family<Labels, Gauge>;
type CounterFamily = Family<Labels, Counter<u64>>;

/// Renders `sample` (taken on `host`, "" when unknown) and the figures of the processes running
/// the shim as a complete OpenMetrics exposition.
pub fn render(sample: &Sample, shims: &[ShimProcess], host: &str, status: AgentStatus) -> String {
    let mut registry = Registry::with_prefix("memprof");
    let total = GaugeFamily::default();
    let used = GaugeFamily::default();
    let free = GaugeFamily::default();
    let utilization = GaugeFamily::default();
    let memory_utilization = GaugeFamily::default();
    let process_used = GaugeFamily::default();
    let time = Gauge::<f64, AtomicU64>::default();
    let failed = Counter::<u64>::default();

    for device in &sample.devices {
        let labels = device_labels(device, host);
        let set = |family: &GaugeFamily, value: Option<i64>| {
            if let Some(value) = value {
                family.get_or_create(&labels).set(value);
            }
        };
        set(&total, device.total.map(gauge_bytes));
        set(&used, device.used.map(gauge_bytes));
        set(&free, device.free.map(gauge_bytes));
        set(&utilization, device.utilization_gpu_percent.map(i64::from));
        set(
            &memory_utilization,
            device.utilization_memory_percent.map(i64::from),
        );
    }
    for process in &sample.processes {
        let Some(bytes) = process.used else { continue };
        let mut labels = match sample.devices.iter().find(|d| d.index == process.device) {
            Some(device) => device_labels(device, host),
            None => base_labels(host, process.device),
        };
        labels.push(("pid", process.pid.to_string()));
        if let Some(command) = &process.command {
            labels.push(("command", command_label(command)));
        }
        process_used.get_or_create(&labels).set(gauge_bytes(bytes));
    }
    time.set(sample.time_ms as f64 / 1000.0);
    failed.inc_by(status.failed_samples);
    register_shims(&mut registry, sample, shims, host);

    registry.register_with_unit(
        "gpu_memory_total",
        "Device memory the GPU has",
        Unit::Bytes,
        total,
    );
    registry.register_with_unit(
        "gpu_memory_used",
        "Device memory in use on the GPU (all processes and the driver)",
        Unit::Bytes,
        used,
    );
    registry.register_with_unit(
        "gpu_memory_free",
        "Device memory free on the GPU",
        Unit::Bytes,
        free,
    );
    registry.register(
        "gpu_utilization_percent",
        "Percent of the last sample period a kernel ran on the GPU",
        utilization,
    );
    registry.register(
        "gpu_memory_utilization_percent",
        "Percent of the last sample period device memory was read or written",
        memory_utilization,
    );
    registry.register_with_unit(
        "process_memory_used",
        "Device memory a process holds on the GPU (NVML's figure)",
        Unit::Bytes,
        process_used,
    );
    registry.register_with_unit(
        "sample_time",
        "When the sample these figures come from was taken (Unix time)",
        Unit::Seconds,
        time,
    );
    registry.register(
        "failed_samples",
        "GPU samples that failed since the agent started",
        failed,
    );

    let mut text = String::new();
    // Writing into a String cannot fail; an encoder error would be a label it cannot write,
    // and every label here is a plain string.
    if let Err(e) = encode(&mut text, &registry) {
        text = format!("# memprof: could not encode the metrics: {e}\n# EOF\n");
    }
    text
}

/// The `memprof_process_driver_*` families of the processes running the shim.
fn register_shims(registry: &mut Registry, sample: &Sample, shims: &[ShimProcess], host: &str) {
    let reserved = GaugeFamily::default();
    let peak = GaugeFamily::default();
    let allocations = CounterFamily::default();
    let frees = CounterFamily::default();
    let ooms = CounterFamily::default();
    let not_sent = CounterFamily::default();
    let by_library = GaugeFamily::default();
    let pinned = GaugeFamily::default();
    for process in shims {
        let with_process = |mut labels: Labels| {
            labels.push(("pid", process.pid.to_string()));
            if let Some(command) = &process.command {
                labels.push(("command", command_label(command)));
            }
            labels
        };
        for (&gpu, figures) in &process.devices {
            let labels = with_process(match sample.devices.iter().find(|d| d.index == gpu) {
                Some(device) => device_labels(device, host),
                None => base_labels(host, gpu),
            });
            reserved
                .get_or_create(&labels)
                .set(gauge_bytes(figures.held));
            peak.get_or_create(&labels).set(gauge_bytes(figures.peak));
            allocations
                .get_or_create(&labels)
                .inc_by(figures.allocations);
            frees.get_or_create(&labels).inc_by(figures.frees);
            ooms.get_or_create(&labels).inc_by(figures.ooms);
        }
        for (&gpu, libraries) in &process.libraries {
            let labels = with_process(match sample.devices.iter().find(|d| d.index == gpu) {
                Some(device) => device_labels(device, host),
                None => base_labels(host, gpu),
            });
            for (library, figures) in libraries {
                let mut labels = labels.clone();
                labels.push(("library", library.clone()));
                by_library
                    .get_or_create(&labels)
                    .set(gauge_bytes(figures.held));
            }
        }
        let mut labels = Vec::new();
        if !host.is_empty() {
            labels.push(("host", host.to_owned()));
        }
        let labels = with_process(labels);
        for (library, figures) in &process.pinned {
            let mut labels = labels.clone();
            labels.push(("library", library.clone()));
            pinned.get_or_create(&labels).set(gauge_bytes(figures.held));
        }
        not_sent.get_or_create(&labels).inc_by(process.lost);
    }
    registry.register_with_unit(
        "process_driver_reserved",
        "Device memory a shim process holds through the CUDA driver now (cuMemAlloc* and \
         cuMemCreate alive: what PyTorch's caching allocator reserved, without the CUDA context)",
        Unit::Bytes,
        reserved,
    );
    registry.register_with_unit(
        "process_driver_peak_reserved",
        "The most process_driver_reserved has been since the agent connected to the shim",
        Unit::Bytes,
        peak,
    );
    registry.register(
        "process_driver_allocations",
        "Driver allocations and cuMemCreate handles of a shim process since the agent connected",
        allocations,
    );
    registry.register(
        "process_driver_frees",
        "Driver frees and cuMemRelease calls of a shim process since the agent connected",
        frees,
    );
    registry.register(
        "process_driver_oom_events",
        "Driver allocations of a shim process that failed with out-of-memory since the agent \
         connected",
        ooms,
    );
    registry.register_with_unit(
        "process_driver",
        "Device memory a shim process holds through the CUDA driver now, by the library that \
         asked for it (the first frame of its native stack outside the CUDA runtime and driver): \
         the 8 that hold most per device, the rest as library=\"other\"",
        Unit::Bytes,
        by_library,
    );
    registry.register_with_unit(
        "process_pinned_host",
        "Pinned host memory a shim process holds now (cuMemHostAlloc, cuMemAllocHost, \
         cuMemHostRegister), by library as process_driver_bytes",
        Unit::Bytes,
        pinned,
    );
    registry.register(
        "process_shim_records_not_sent",
        "Records a shim did not send to the agent because the agent read too slowly",
        not_sent,
    );
}

/// `host` (left out when unknown, the empty string) and `gpu`.
fn base_labels(host: &str, gpu: u32) -> Labels {
    let mut labels = Vec::with_capacity(6);
    if !host.is_empty() {
        labels.push(("host", host.to_owned()));
    }
    labels.push(("gpu", gpu.to_string()));
    labels
}

fn device_labels(device: &DeviceSample, host: &str) -> Labels {
    let mut labels = base_labels(host, device.index);
    if let Some(uuid) = &device.uuid {
        labels.push(("uuid", uuid.clone()));
    }
    if let Some(name) = &device.name {
        labels.push(("name", name.clone()));
    }
    labels
}

/// Gauges hold i64: 8 EiB and up saturates (no device is near that).
fn gauge_bytes(bytes: Bytes) -> i64 {
    i64::try_from(bytes.0).unwrap_or(i64::MAX)
}

fn command_label(command: &str) -> String {
    let mut end = command.len().min(COMMAND_LABEL_MAX);
    while !command.is_char_boundary(end) {
        end -= 1;
    }
    command[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::gpu::ProcessSample;

    fn sample() -> Sample {
        Sample {
            time_ms: 1_700_000_000_500,
            devices: vec![
                DeviceSample {
                    index: 0,
                    name: Some("NVIDIA H100 80GB HBM3".into()),
                    uuid: Some("GPU-a".into()),
                    total: Some(Bytes(85_899_345_920)),
                    used: Some(Bytes(1 << 30)),
                    free: Some(Bytes(85_899_345_920 - (1 << 30))),
                    utilization_gpu_percent: Some(87),
                    utilization_memory_percent: None,
                },
                DeviceSample {
                    index: 1,
                    ..DeviceSample::default()
                },
            ],
            processes: vec![
                ProcessSample {
                    pid: 42,
                    device: 0,
                    used: Some(Bytes(512 << 20)),
                    command: Some("python \"train.py\"".into()),
                },
                ProcessSample {
                    pid: 43,
                    device: 0,
                    used: None,
                    ..ProcessSample::default()
                },
            ],
        }
    }

    #[test]
    fn every_known_figure_is_one_series_and_unknowns_are_absent() {
        let text = render(&sample(), &[], "node7", AgentStatus { failed_samples: 3 });
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            series,
            [
                "memprof_gpu_memory_total_bytes{host=\"node7\",gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H100 80GB HBM3\"} 85899345920",
                "memprof_gpu_memory_used_bytes{host=\"node7\",gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H100 80GB HBM3\"} 1073741824",
                "memprof_gpu_memory_free_bytes{host=\"node7\",gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H100 80GB HBM3\"} 84825604096",
                "memprof_gpu_utilization_percent{host=\"node7\",gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H100 80GB HBM3\"} 87",
                "memprof_process_memory_used_bytes{host=\"node7\",gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H100 80GB HBM3\",pid=\"42\",command=\"python \\\"train.py\\\"\"} 536870912",
                "memprof_sample_time_seconds 1700000000.5",
                "memprof_failed_samples_total 3",
            ]
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn unknown_labels_are_left_out() {
        let mut sample = sample();
        sample.devices[1].utilization_gpu_percent = Some(3);
        sample.processes[1].used = Some(Bytes(9));
        sample.processes[1].device = 5;
        let text = render(&sample, &[], "", AgentStatus::default());
        assert!(
            text.contains("\nmemprof_gpu_utilization_percent{gpu=\"1\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("\nmemprof_process_memory_used_bytes{gpu=\"5\",pid=\"43\"} 9\n"),
            "{text}"
        );
        assert!(!text.contains("host="));
    }

    fn lib(name: &str, held: u64) -> (String, crate::source::live_libraries::LibraryFigures) {
        let figures = crate::source::live_libraries::LibraryFigures {
            library: Some(name.to_owned()),
            held: Bytes(held),
            peak: Bytes(held),
        };
        (name.to_owned(), figures)
    }

    #[test]
    fn shim_processes_get_driver_series_per_device() {
        use crate::source::live_tally::DeviceFigures;
        let figures = DeviceFigures {
            held: Bytes(300),
            peak: Bytes(900),
            ooms: 2,
            allocations: 5,
            frees: 4,
            ..DeviceFigures::default()
        };
        let shim = ShimProcess {
            pid: 42,
            command: Some("python train.py".into()),
            devices: [(0, figures), (3, DeviceFigures::default())].into(),
            lost: 7,
            libraries: [(0, vec![lib("libnccl.so.2", 200), lib("a\"b\\c\nd", 100)])].into(),
            pinned: vec![lib("unattributed", 5)],
        };
        let text = render(&sample(), &[shim], "node7", AgentStatus::default());
        let gpu0 = "host=\"node7\",gpu=\"0\",uuid=\"GPU-a\",name=\"NVIDIA H100 80GB HBM3\",pid=\"42\",command=\"python train.py\"";
        let gpu3 = "host=\"node7\",gpu=\"3\",pid=\"42\",command=\"python train.py\"";
        for line in [
            format!("memprof_process_driver_reserved_bytes{{{gpu0}}} 300"),
            format!("memprof_process_driver_peak_reserved_bytes{{{gpu0}}} 900"),
            format!("memprof_process_driver_allocations_total{{{gpu0}}} 5"),
            format!("memprof_process_driver_frees_total{{{gpu0}}} 4"),
            format!("memprof_process_driver_oom_events_total{{{gpu0}}} 2"),
            format!("memprof_process_driver_reserved_bytes{{{gpu3}}} 0"),
            "memprof_process_shim_records_not_sent_total{host=\"node7\",pid=\"42\",command=\"python train.py\"} 7".to_owned(),
            format!("memprof_process_driver_bytes{{{gpu0},library=\"libnccl.so.2\"}} 200"),
            // Escaped as the text format requires.
            format!("memprof_process_driver_bytes{{{gpu0},library=\"a\\\"b\\\\c\\nd\"}} 100"),
            "memprof_process_pinned_host_bytes{host=\"node7\",pid=\"42\",command=\"python train.py\",library=\"unattributed\"} 5".to_owned(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn long_commands_are_cut_on_a_character_boundary() {
        let long = "é".repeat(200);
        let cut = command_label(&long);
        assert_eq!(cut.len(), COMMAND_LABEL_MAX);
        assert!(long.starts_with(&cut));
    }
}
