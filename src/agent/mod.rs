//! The Prometheus agent: a background thread samples the GPUs at an interval and keeps the
//! latest exposition in a cache; the HTTP server (`http`) answers `/metrics` from that cache, so
//! a scrape never waits on NVML or on a slow process.
//!
//! Processes running the shim are followed through their live sockets (`shims`): each has a
//! reader thread of its own, and the sampling loop copies their driver-level figures next to
//! the GPU sample.

mod http;
mod shims;

pub use http::{
    answer_bytes, limits_help, Exporter, HttpError, HEADER_TIMEOUT, MAX_CONNECTIONS, MAX_HEADERS,
    MAX_REQUEST_HEAD, WRITE_TIMEOUT,
};
pub use shims::{ShimProcess, ShimWatch};

use crate::report::prometheus::{render, AgentStatus};
use crate::source::gpu::{GpuSampler, Sample, SampleError};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The latest rendered exposition, shared by the sampling thread and the server.
#[derive(Debug, Default)]
pub struct Cache {
    text: RwLock<Arc<String>>,
}

impl Cache {
    /// The latest exposition (an empty one before the first sample).
    pub fn latest(&self) -> Arc<String> {
        match self.text.read() {
            Ok(text) => Arc::clone(&text),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the exposition.
    pub fn store(&self, text: String) {
        let text = Arc::new(text);
        match self.text.write() {
            Ok(mut slot) => *slot = text,
            Err(poisoned) => *poisoned.into_inner() = text,
        }
    }
}

/// Samples `sampler` (and the shims of `shims`, when given) every `interval` into `cache`,
/// forever (until the process ends). A failed sample is counted
/// (`memprof_failed_samples_total`), reported through `on_error`, and the last good figures
/// stay; a replay that ends leaves its last sample in place.
pub fn sample_forever(
    mut sampler: Box<dyn GpuSampler + Send>,
    mut shims: Option<ShimWatch>,
    interval: Duration,
    host: &str,
    cache: &Cache,
    on_error: &dyn Fn(&SampleError),
) {
    // Until one sample succeeds there are no figures to serve (not zeros): the cache stays
    // empty and the server answers 503.
    let mut last: Option<Sample> = None;
    let mut status = AgentStatus::default();
    loop {
        match sampler.sample() {
            Ok(sample) => last = Some(sample),
            Err(SampleError::Exhausted) => return,
            Err(e) => {
                status.failed_samples += 1;
                on_error(&e);
            }
        }
        let followed = shims.as_mut().map(ShimWatch::poll).unwrap_or_default();
        if let Some(sample) = &last {
            cache.store(render(sample, &followed, host, status));
        }
        std::thread::sleep(interval);
    }
}

/// This machine's host name, for the `host` label; `None` where the kernel does not say.
pub fn host_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim();
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::gpu::{DeviceSample, Scripted};

    /// Hands out one sample, then blocks until `gate` is dropped (a hung NVML call).
    struct Stuck {
        first: Option<Sample>,
        gate: std::sync::mpsc::Receiver<()>,
    }

    impl GpuSampler for Stuck {
        fn sample(&mut self) -> Result<Sample, SampleError> {
            if let Some(sample) = self.first.take() {
                return Ok(sample);
            }
            let _ = self.gate.recv();
            Err(SampleError::Exhausted)
        }

        fn describe(&self) -> String {
            "stuck".to_owned()
        }
    }

    fn get(addr: std::net::SocketAddr, request: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        stream.write_all(request.as_bytes()).expect("send");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("an answer, not a hang");
        answer
    }

    #[test]
    fn scrapes_are_answered_while_the_sampler_hangs() {
        let cache = Arc::new(Cache::default());
        let exporter = Exporter::bind("127.0.0.1:0", Arc::clone(&cache)).expect("bind");
        let addr = exporter.local_addr().expect("an IP address");
        let stop = exporter.stopper();
        let server = std::thread::spawn(move || exporter.serve());
        // Before any sample: no figures, and the scrape says so.
        let early = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
        assert!(early.starts_with("HTTP/1.0 503"), "{early}");
        let (release, gate) = std::sync::mpsc::channel();
        let first = Sample {
            time_ms: 5000,
            ..Sample::default()
        };
        let sampling = {
            let cache = Arc::clone(&cache);
            std::thread::spawn(move || {
                let stuck = Stuck {
                    first: Some(first),
                    gate,
                };
                sample_forever(Box::new(stuck), None, Duration::ZERO, "h", &cache, &|_| {});
            })
        };
        while cache.latest().is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The sampler is now blocked in its second sample; every scrape still answers.
        for _ in 0..3 {
            let answer = get(addr, "GET /metrics HTTP/1.0\r\n\r\n");
            assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
            assert!(answer.contains("application/openmetrics-text"), "{answer}");
            assert!(
                answer.contains("\nmemprof_sample_time_seconds 5.0\n"),
                "{answer}"
            );
        }
        assert!(get(addr, "GET /other HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
        assert!(get(addr, "POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 405"));
        drop(release);
        sampling.join().expect("the sampler ends");
        stop();
        server.join().expect("the server stops");
    }

    /// Fails `left` times like a broken NVML, then ends.
    struct Failing {
        left: u32,
    }

    impl GpuSampler for Failing {
        fn sample(&mut self) -> Result<Sample, SampleError> {
            if self.left == 0 {
                return Err(SampleError::Exhausted);
            }
            self.left -= 1;
            Err(SampleError::Nvml {
                call: "nvmlDeviceGetCount_v2",
                message: "Unknown Error".into(),
            })
        }

        fn describe(&self) -> String {
            "failing".to_owned()
        }
    }

    /// A sampler whose samples fail leaves nothing to serve (not zeros, not time 0).
    #[test]
    fn failing_samples_publish_no_figures() {
        let cache = Cache::default();
        let errors = std::cell::Cell::new(0);
        let sampler = Box::new(Failing { left: 3 });
        sample_forever(sampler, None, Duration::ZERO, "h", &cache, &|_| {
            errors.set(errors.get() + 1)
        });
        assert_eq!(errors.get(), 3);
        assert_eq!(cache.latest().as_str(), "");
    }

    #[test]
    fn a_finished_replay_leaves_its_last_sample_served() {
        let at = |time_ms| Sample {
            time_ms,
            devices: vec![DeviceSample {
                index: 0,
                utilization_gpu_percent: Some(time_ms as u32),
                ..DeviceSample::default()
            }],
            processes: Vec::new(),
        };
        let cache = Cache::default();
        assert_eq!(cache.latest().as_str(), "");
        sample_forever(
            Box::new(Scripted::once(vec![at(1), at(2)])),
            None,
            Duration::ZERO,
            "h",
            &cache,
            &|e| panic!("no errors expected: {e}"),
        );
        let text = cache.latest();
        assert!(
            text.contains("memprof_gpu_utilization_percent{host=\"h\",gpu=\"0\"} 2"),
            "{text}"
        );
    }
}
