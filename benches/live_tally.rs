//! How fast a live stream is folded (`LiveTally::apply`), the work the attach view and the agent
//! do per shim record: 100k records of alloc/free churn over 1000 live allocations on 2 devices.
//! The shim of a busy PyTorch process sends far fewer driver calls than this a second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memprof::source::live::LiveEvent;
use memprof::source::live_tally::LiveTally;
use memprof_wire::{Kind, Record};
use std::hint::black_box;

const RECORDS: u64 = 100_000;

fn stream() -> Vec<LiveEvent> {
    (0..RECORDS)
        .map(|i| {
            let slot = i / 2 % 1000;
            let kind = if i % 2 == 0 { Kind::Alloc } else { Kind::Free };
            LiveEvent::Record(Record {
                ptr: 0x7f00_0000_0000 + slot * 0x10_0000,
                size: (slot + 1) * 4096,
                device: (slot % 2) as i32,
                ..Record::new(kind)
            })
        })
        .collect()
}

fn fold(c: &mut Criterion) {
    let events = stream();
    let mut group = c.benchmark_group("live_tally");
    group.throughput(Throughput::Elements(RECORDS));
    group.bench_function("apply_100k", |b| {
        b.iter(|| {
            let mut tally = LiveTally::default();
            for e in &events {
                tally.apply(black_box(e));
            }
            tally.allocations
        })
    });
    group.finish();
}

criterion_group!(benches, fold);
criterion_main!(benches);
