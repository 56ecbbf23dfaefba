//! Replay throughput of the caching-allocator simulator, in trace entries per second, on
//! synthetic traces of 10^4 to 10^6 entries (10^7 with `MEMPROF_BENCH_10M=1`).
//!
//! A trace is recorded by driving the model itself with a seeded training-like request
//! stream (mostly small tensors, some 1-10 MiB, a few large ones; frees in random order, a
//! bounded live set, two streams), so it replays with every decision reproduced.
//! `validate` is the first pass (`replay::prepare`: rebuild the start state, classify,
//! compare every decision); `what_if` replays the prepared requests under other settings.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use memprof::model::TraceEntry;
use memprof::sim::replay::{self, DeviceTrace};
use memprof::sim::{AllocatorConfig, CachingAllocator, Driver};

const MIB: u64 = 1 << 20;

/// A tiny deterministic generator (64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A recorded trace of at least `n` entries, its stream table and final segments.
fn recorded_trace(n: usize) -> (Vec<TraceEntry>, Vec<u64>, Vec<memprof::model::Segment>) {
    let mut model = CachingAllocator::new(AllocatorConfig::default(), Driver::new(None));
    let mut rng = Lcg(0x5eed);
    let mut live: Vec<u64> = Vec::new();
    let mut entries = Vec::with_capacity(n + 8);
    while entries.len() < n {
        let grow = live.len() < 200 || (live.len() < 2000 && rng.below(2) == 0);
        if grow {
            let size = match rng.below(100) {
                0..=69 => 512 + rng.below(MIB),
                70..=96 => MIB + rng.below(9 * MIB),
                _ => 10 * MIB + rng.below(100 * MIB),
            };
            let stream = if rng.below(10) == 0 { 0x1000 } else { 0 };
            if let Ok(addr) = model.malloc(size, stream) {
                live.push(addr);
            }
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let addr = live.swap_remove(i);
            model.free(addr).ok();
        }
        entries.extend(model.take_events());
    }
    (entries, model.streams().to_vec(), model.layout(0))
}

fn bench(c: &mut Criterion) {
    let mut sizes = vec![10_000usize, 100_000, 1_000_000];
    if std::env::var_os("MEMPROF_BENCH_10M").is_some() {
        sizes.push(10_000_000);
    }
    let recorded = AllocatorConfig::default();
    let expandable = AllocatorConfig::parse("expandable_segments:True").unwrap_or_default();
    let mut group = c.benchmark_group("allocator_sim");
    for n in sizes {
        let (entries, streams, segments) = recorded_trace(n);
        let trace = DeviceTrace {
            device: 0,
            entries: &entries,
            streams: &streams,
            pools: &[],
            segments,
        };
        let prepared = replay::prepare(&trace, &recorded, None);
        assert!(
            prepared.validation.all_match(),
            "the generated trace replays"
        );
        group.throughput(Throughput::Elements(entries.len() as u64));
        group.sample_size(if n >= 1_000_000 { 10 } else { 30 });
        group.bench_with_input(BenchmarkId::new("validate", n), &trace, |b, t| {
            b.iter(|| replay::prepare(t, &recorded, None))
        });
        group.bench_with_input(BenchmarkId::new("what_if_default", n), &prepared, |b, p| {
            b.iter(|| replay::run(p, &recorded, None))
        });
        group.bench_with_input(
            BenchmarkId::new("what_if_expandable", n),
            &prepared,
            |b, p| b.iter(|| replay::run(p, &expandable, None)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
