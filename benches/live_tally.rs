//! How fast a live stream is folded (`LiveTally::apply`), the work the attach view and the agent
//! do per shim record: 100k records of alloc/free churn over 1000 live allocations on 2 devices
//! (the shim of a busy PyTorch process sends far fewer driver calls than this a second); and one
//! frame of the attach view (target: under 5 ms) with 8 devices, 600 points each and 100,000
//! allocations alive.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memprof::source::gpu::Clock;
use memprof::source::live::LiveEvent;
use memprof::source::live_feed::LiveFeed;
use memprof::source::live_tally::LiveTally;
use memprof::tui::attach::{AttachApp, Feed};
use memprof::tui::theme::Theme;
use memprof::tui::Dashboard;
use memprof_wire::{Kind, Record};
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

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

/// A clock one second further at every reading.
struct Ticking(Cell<u64>);

impl Clock for Ticking {
    fn now_ms(&self) -> u64 {
        self.0.replace(self.0.get() + 1000)
    }
}

fn frame(c: &mut Criterion) {
    let clock = Ticking(Cell::new(1_796_034_000_000));
    let (to, feed) = LiveFeed::manual();
    let mut app = AttachApp::new(
        1,
        Some("python train.py".into()),
        Feed::Shim(feed),
        &clock,
        Duration::from_secs(1),
        Theme::colored(),
        "",
    );
    for tick in 0..600u64 {
        for i in 0..(100_000 / 600 + 1) {
            let n = tick * 1000 + i;
            let record = Record {
                ptr: 0x7f00_0000_0000 + n * 0x1000,
                size: (n % 977 + 1) * 4096,
                device: (n % 8) as i32,
                ..Record::new(Kind::Alloc)
            };
            if to.send(Ok(LiveEvent::Record(record))).is_err() {
                return;
            }
        }
        app.on_tick();
    }
    let mut terminal = Terminal::new(TestBackend::new(200, 60)).expect("a test terminal");
    c.bench_function("attach_frame_200x60_8gpu_100k_alive", |b| {
        b.iter(|| {
            terminal
                .draw(|f| app.render(f.area(), f.buffer_mut()))
                .map(|_| ())
        })
    });
}

criterion_group!(benches, fold, frame);
criterion_main!(benches);
