//! The state against the shared table of driver record sequences, and what keepers are told.

use super::*;

#[path = "../../../crates/memprof-wire/tests/data/driver_sequences.rs"]
mod sequences;

use sequences::{Expect, Step};

#[test]
fn every_sequence_of_the_shared_table_ends_in_its_expected_state() {
    for sequence in sequences::sequences() {
        let mut state = DriverState::<()>::default();
        for step in &sequence.steps {
            let figure = |device: &u32, get: fn(&DeviceHeld) -> u64| {
                (state.devices())
                    .find(|&(d, _)| d == *device)
                    .map_or(0, |(_, held)| get(held))
            };
            match *step {
                Step::Apply(r) => state.apply(&r, &mut ()),
                Step::Expect(e) => {
                    let got = match e {
                        Expect::Held { device, .. } => Expect::Held {
                            device,
                            bytes: figure(&device, |d| d.held),
                        },
                        Expect::Managed { device, .. } => Expect::Managed {
                            device,
                            bytes: figure(&device, |d| d.managed),
                        },
                        Expect::Host { device, .. } => Expect::Host {
                            device,
                            bytes: figure(&device, |d| d.host),
                        },
                        Expect::Handles(_) => Expect::Handles(state.handles()),
                        Expect::Mappings(_) => Expect::Mappings(state.mappings().count()),
                    };
                    assert_eq!(got, e, "{}", sequence.name);
                }
            }
        }
    }
}

/// Records every call, to check what keepers are told.
#[derive(Default)]
struct Told(Vec<String>);

impl Keeper for Told {
    type Tag = u32;
    fn tag(&mut self, r: &Record, _memory: Memory, _device: u32) -> u32 {
        r.stack
    }
    fn hold(&mut self, _r: &Record, key: u64, held: &Held<u32>) {
        self.0
            .push(format!("hold {:?} {key:#x} {}", held.memory, held.tag));
    }
    fn release(&mut self, _r: &Record, key: u64, held: &Held<u32>, end: End) {
        self.0
            .push(format!("release {:?} {key:#x} {end:?}", held.memory));
    }
    fn mapped(&mut self, r: &Record, handle: &mut Held<u32>) {
        handle.tag = r.stack;
        self.0.push(format!("mapped {:#x}", r.ptr));
    }
    fn oom(&mut self, r: &Record, device: u32, free: Option<u64>) {
        self.0
            .push(format!("oom {} on {device}, {free:?} free", r.size));
    }
}

fn rec(kind: Kind, ptr: u64, size: u64, aux: u64, stack: u32) -> Record {
    Record {
        ptr,
        size,
        aux,
        stack,
        device: 0,
        ..Record::new(kind)
    }
}

#[test]
fn keepers_are_told_each_change_in_order_and_counts_follow_the_rule() {
    let mut oom = rec(Kind::Alloc, 0, 900, 0, 0);
    oom.result = memprof_wire::CUDA_ERROR_OUT_OF_MEMORY;
    let mut told = (Told::default(), ());
    let mut state = DriverState::default();
    for r in [
        rec(Kind::Alloc, 0x100, 10, 0, 1),
        rec(Kind::Alloc, 0x100, 20, 0, 2),
        rec(Kind::MemGetInfo, 0, 1000, 400, 0),
        oom,
        rec(Kind::VmmCreate, 0, 64, 5, 3),
        rec(Kind::VmmMap, 0x7000, 64, 5, 4),
        rec(Kind::AllocManaged, 0x900, 8, 0, 0),
        rec(Kind::Free, 0x900, 0, 0, 0),
        rec(Kind::VmmUnmap, 0x7000, 64, 0, 0),
        rec(Kind::VmmRelease, 0, 0, 5, 0),
        rec(Kind::Free, 0x555, 0, 0, 0),
    ] {
        state.apply(&r, &mut told);
    }
    assert_eq!(
        told.0 .0,
        [
            "hold Device 0x100 1",
            "release Device 0x100 Replaced",
            "hold Device 0x100 2",
            "oom 900 on 0, Some(400) free",
            "hold Handle 0x5 3",
            "hold Mapping 0x7000 4",
            "mapped 0x7000",
            "hold Managed 0x900 0",
            "release Managed 0x900 Freed",
            "release Mapping 0x7000 Freed",
            "release Handle 0x5 Freed",
        ]
    );
    let c = state.counts();
    assert_eq!(
        (c.allocations, c.frees, c.ooms, c.reused, c.unknown_frees),
        (4, 2, 1, 1, 1)
    );
    assert_eq!(c.first_unknown, Some(10));
    assert_eq!((state.total(), state.peak()), (20, 84));
    assert_eq!((state.addressed(), state.handles()), (1, 0));
}
