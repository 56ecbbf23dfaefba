//! Scrape latency of `memprof agent` with 8 devices and 200 processes (target: under 10 ms):
//! rendering the OpenMetrics text from a sample (also with 64 of the processes running the
//! shim), and a whole HTTP round trip to /metrics (connect, request, read the answer) against
//! the real server on loopback. Then `scrapes_under_attack` prints p50 / p99 of 500 scrapes
//! (fresh connection each) while a slowloris, a pipelining client that never reads its
//! answers, a client that announced a body it never sends and 200 idle connections are all
//! connected (target: p99 under 10 ms).

use criterion::{criterion_group, criterion_main, Criterion};
use memprof::agent::{Cache, Exporter, ShimProcess};
use memprof::model::Bytes;
use memprof::report::prometheus::{render, AgentStatus};
use memprof::source::gpu::{DeviceSample, ProcessSample, Sample};
use memprof::source::live_libraries::LibraryFigures;
use memprof::source::live_tally::DeviceFigures;
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The most library series a process gets per device (and pinned): 8 libraries and `other`.
fn libraries(i: u32) -> Vec<(String, LibraryFigures)> {
    (0..9u64)
        .map(|l| {
            let name = if l == 8 {
                "other".to_owned()
            } else {
                format!("libext{l}.so.{i}")
            };
            let held = Bytes((u64::from(i) + l) << 20);
            let figures = LibraryFigures {
                library: Some(name.clone()),
                held,
                peak: held,
            };
            (name, figures)
        })
        .collect()
}

/// 64 processes running the shim, one device each, each with as many library series as it can
/// have.
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
            libraries: [(i % DEVICES, libraries(i))].into(),
            pinned: libraries(i),
        })
        .collect()
}

/// One scrape on a fresh connection, as the round trip above; the answer's length.
fn scrape_once(addr: SocketAddr) -> usize {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .expect("send");
    let mut body = Vec::with_capacity(128 << 10);
    stream.read_to_end(&mut body).expect("read");
    assert!(body.ends_with(b"# EOF\n"));
    body.len()
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
    group.bench_function("http_round_trip", |b| b.iter(|| scrape_once(addr)));
    group.finish();
    stop();
    server.join().expect("the server stops");
}

/// Scrape latency with hostile clients connected (all on loopback, each bounded in time).
fn scrapes_under_attack(_: &mut Criterion) {
    const SCRAPES: usize = 500;
    let cache = Arc::new(Cache::default());
    cache.store(render(&machine(), &[], "node7", AgentStatus::default()));
    let exporter = Exporter::bind("127.0.0.1:0", cache).expect("bind loopback");
    let addr = exporter.local_addr().expect("an IP address");
    let stop = exporter.stopper();
    let server = std::thread::spawn(move || exporter.serve());
    let timed = || -> (Vec<Duration>, Duration) {
        let began = Instant::now();
        let mut took: Vec<Duration> = (0..SCRAPES)
            .map(|_| {
                let start = Instant::now();
                black_box(scrape_once(addr));
                start.elapsed()
            })
            .collect();
        took.sort();
        (took, began.elapsed())
    };
    let at = |took: &[Duration], q: f64| {
        took[((took.len() as f64 * q).ceil() as usize).clamp(1, took.len()) - 1]
    };
    // The same scrapes with no other client, to tell the machine's noise from the clients'.
    let (quiet, _) = timed();

    // A slowloris: one header byte every 100 ms (the agent cuts it after its header timeout).
    let measuring = Arc::new(AtomicBool::new(true));
    let slowloris_cut = Arc::new(AtomicBool::new(false));
    let slowloris = {
        let (measuring, cut) = (Arc::clone(&measuring), Arc::clone(&slowloris_cut));
        let mut slow = TcpStream::connect(addr).expect("connect");
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Trickle: ")
            .expect("send");
        std::thread::spawn(move || {
            while measuring.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                if slow.write_all(b"a").is_err() {
                    cut.store(true, Ordering::SeqCst);
                    return;
                }
            }
        })
    };
    // A client pipelining requests until the agent stops taking them, never reading (at most
    // 100,000 requests or 3 s).
    let mut pipe = TcpStream::connect(addr).expect("connect");
    pipe.set_write_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let start = Instant::now();
    let mut pipelined = 0;
    while pipelined < 100_000 && start.elapsed() < Duration::from_secs(3) {
        if pipe
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: pipe\r\n\r\n")
            .is_err()
        {
            break;
        }
        pipelined += 1;
    }
    // A body announced and never sent, and idle connections.
    let mut no_body = TcpStream::connect(addr).expect("connect");
    no_body
        .write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .expect("send");
    let idle: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();

    let (took, window) = timed();
    measuring.store(false, Ordering::SeqCst);
    println!(
        "agent_scrape_under_attack: {SCRAPES} scrapes in {window:.2?} with a slowloris{}, \
         {pipelined} pipelined requests never read, a body never sent and 200 idle \
         connections: p50 {:.2?}, p99 {:.2?}, max {:.2?} (target p99 < 10 ms); with no other \
         client: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
        if slowloris_cut.load(Ordering::SeqCst) {
            " (cut before the end)"
        } else {
            ""
        },
        at(&took, 0.50),
        at(&took, 0.99),
        at(&took, 1.0),
        at(&quiet, 0.50),
        at(&quiet, 0.99),
        at(&quiet, 1.0),
    );
    slowloris.join().expect("the slowloris ends");
    drop((pipe, no_body, idle));
    stop();
    server.join().expect("the server stops");
}

criterion_group!(benches, scrape, scrapes_under_attack);
criterion_main!(benches);
