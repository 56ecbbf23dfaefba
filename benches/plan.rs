//! Planner speed: a full `plan train` search (every layout of the GPUs evaluated and ranked),
//! which must finish in well under a second, and `plan pack` on a million lengths.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memprof::plan::activations::Attention;
use memprof::plan::builtin;
use memprof::plan::pack::{plan_packing, PackSettings};
use memprof::plan::recipe::{Optimizer, Precision};
use memprof::plan::search::{search, SearchSpace};
use memprof::plan::train::{Headroom, TrainSetup};
use std::hint::black_box;

fn setup(model: &str, seq_len: u64) -> TrainSetup {
    TrainSetup {
        model: builtin::find(model).expect("built-in model"),
        precision: Precision::Mixed,
        optimizer: Optimizer::AdamW,
        seq_len,
        attention: Attention::Flash,
        compiled_loss: false,
        gpu_memory: 80 << 30,
        headroom: Headroom::default(),
    }
}

fn space(gpus: u64) -> SearchSpace {
    SearchSpace {
        gpus,
        sp: true,
        micro_batch: 1,
        ..SearchSpace::default()
    }
}

fn train_search(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_train_search");
    for (model, gpus, seq) in [
        ("llama-3-8b", 8, 8192),
        ("llama-3.1-70b", 64, 8192),
        ("llama-3.1-405b", 1024, 8192),
    ] {
        let s = setup(model, seq);
        let sp = space(gpus);
        group.bench_function(format!("{model}_{gpus}gpus"), |b| {
            b.iter(|| search(black_box(&s), black_box(&sp), 10).expect("search"))
        });
    }
    group.finish();
}

fn pack_million(c: &mut Criterion) {
    // Deterministic long-tailed lengths (a linear congruential generator, no dependency).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let lengths: Vec<u64> = (0..1_000_000)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            (64.0 / (1.0 - u).max(1e-6).sqrt()) as u64
        })
        .collect();
    let settings = PackSettings {
        max_len: 4096,
        micro_batch: 8,
        buckets: 8,
    };
    let mut group = c.benchmark_group("plan_pack");
    group.sample_size(10);
    group.throughput(Throughput::Elements(lengths.len() as u64));
    group.bench_function("1M_lengths", |b| {
        b.iter(|| plan_packing(black_box(&lengths), &settings).expect("plan"))
    });
    group.finish();
}

criterion_group!(benches, train_search, pack_million);
criterion_main!(benches);
