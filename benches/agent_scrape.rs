//! Scrape latency of `memprof agent` with 8 devices and 200 processes (target: under 10 ms):
//! rendering the OpenMetrics text from a sample (also with 64 of the processes running the
//! shim), and a whole HTTP round trip to /metrics (connect, request, read the answer) against
//! the real server on loopback.

use criterion::{criterion_group, criterion_main, Criterion};
use memprof::agent::{Cache, Exporter, ShimProcess};
use memprof::model::Bytes;
use memprof::report::prometheus::{render, AgentStatus};
use memprof::source::gpu::{DeviceSample, ProcessSample, Sample};
use memprof::source::live_tally::DeviceFigures;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

const DEVICES: u32 = 8;
const PROCESSES: u32 = 200;

fn machine() -> Sample {
    let total = 80u64 << 30;
    let devices = (0..DEVICES)
        .map(|index| DeviceSample {
            index,
            name: Some("NVIDIA H100 80GB HBM3".into()),
            uuid: Some(format!("GPU-{index:08x}-8d1c-4e0a-9a57-1b2c3d4e5f60")),
            total: Some(Bytes(total)),
            used: Some(Bytes(total / 2 + u64::from(index))),
            free: Some(Bytes(total / 2 - u64::from(index))),
            utilization_gpu_percent: Some(90),
            utilization_memory_percent: Some(45),
        })
        .collect();
    let processes = (0..PROCESSES)
        .map(|i| ProcessSample {
            pid: 10_000 + i,
            device: i % DEVICES,
            used: Some(Bytes((u64::from(i) + 1) << 24)),
            command: Some(format!(
                "/usr/bin/python3 -m torch.distributed.run --nproc-per-node 8 train.py --rank {i}"
            )),
        })
        .collect();
    Sample {
        time_ms: 1_700_000_000_000,
        devices,
        processes,
    }
}

/// 64 processes running the shim, one device each.
fn shims() -> Vec<ShimProcess> {
    (0..64u32)
        .map(|i| ShimProcess {
            pid: 10_000 + i,
            command: Some(format!("/usr/bin/python3 train.py --rank {i}")),
            devices: [(
                i % DEVICES,
                DeviceFigures {
                    held: Bytes(u64::from(i) << 30),
                    peak: Bytes(u64::from(i + 1) << 30),
                    allocations: 1_000_000,
                    frees: 999_000,
                    ..DeviceFigures::default()
                },
            )]
            .into(),
            lost: 0,
        })
        .collect()
}

fn scrape(c: &mut Criterion) {
    let sample = machine();
    let mut group = c.benchmark_group("agent_scrape_8gpu_200proc");
    group.bench_function("render", |b| {
        b.iter(|| render(black_box(&sample), &[], "node7", AgentStatus::default()))
    });

    let shims = shims();
    group.bench_function("render_with_64_shims", |b| {
        b.iter(|| render(black_box(&sample), &shims, "node7", AgentStatus::default()))
    });

    let cache = Arc::new(Cache::default());
    cache.store(render(&sample, &[], "node7", AgentStatus::default()));
    let exporter = Exporter::bind("127.0.0.1:0", cache).expect("bind loopback");
    let addr = exporter.local_addr().expect("an IP address");
    let stop = exporter.stopper();
    let server = std::thread::spawn(move || exporter.serve());
    group.bench_function("http_round_trip", |b| {
        b.iter(|| {
            let mut stream = TcpStream::connect(addr).expect("connect");
            stream
                .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
                .expect("send");
            let mut body = Vec::with_capacity(128 << 10);
            stream.read_to_end(&mut body).expect("read");
            assert!(body.ends_with(b"# EOF\n"));
            body.len()
        })
    });
    group.finish();
    stop();
    server.join().expect("the server stops");
}

criterion_group!(benches, scrape);
criterion_main!(benches);
