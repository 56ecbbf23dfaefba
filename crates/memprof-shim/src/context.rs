//! Which device each thread's current context belongs to, so that records of calls that do not
//! name a device (`cuMemAlloc`, `cuMemGetInfo`, ...) carry it. Contexts are learnt from
//! `cuDevicePrimaryCtxRetain` and `cuCtxCreate_v2` into a fixed table (no allocation, no lock);
//! the current one per thread from `cuCtxSetCurrent` and `cuCtxCreate_v2`. Not followed:
//! `cuCtxPushCurrent` / `cuCtxPopCurrent` and contexts made before the shim was loaded; then the
//! device stays unknown (-1), never guessed.

use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// Contexts remembered (a process has one primary context per device, plus any it creates).
const SLOTS: usize = 256;

static CONTEXTS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static DEVICES: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

thread_local! {
    /// The device of this thread's current context; -1 when unknown.
    static CURRENT: Cell<i32> = const { Cell::new(-1) };
}

fn first_slot(ctx: u64) -> usize {
    // Context handles are pointers: drop the alignment bits, then mix.
    ((ctx >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SLOTS
}

/// Remembers that `ctx` belongs to `device`. A full table forgets it (its calls stay unknown).
pub fn learn(ctx: u64, device: i32) {
    if ctx == 0 {
        return;
    }
    let start = first_slot(ctx);
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        let held =
            match CONTEXTS[slot].compare_exchange(0, ctx, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => ctx,
                Err(held) => held,
            };
        if held == ctx {
            DEVICES[slot].store(device, Ordering::Release);
            return;
        }
    }
}

/// The device of `ctx`; -1 when not known.
fn device_of(ctx: u64) -> i32 {
    if ctx == 0 {
        return -1;
    }
    let start = first_slot(ctx);
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        match CONTEXTS[slot].load(Ordering::Acquire) {
            0 => return -1,
            held if held == ctx => return DEVICES[slot].load(Ordering::Acquire),
            _ => {}
        }
    }
    -1
}

/// `ctx` became this thread's current context.
pub fn set_current(ctx: u64) {
    let device = device_of(ctx);
    let _ = CURRENT.try_with(|current| current.set(device));
}

/// The device of this thread's current context; -1 when unknown.
pub fn current_device() -> i32 {
    CURRENT.try_with(Cell::get).unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_map_to_devices_and_threads_keep_their_own_current_one() {
        learn(0x7f00_0000_1000, 3);
        learn(0x7f00_0000_2000, 1);
        assert_eq!(current_device(), -1);
        set_current(0x7f00_0000_1000);
        assert_eq!(current_device(), 3);
        std::thread::spawn(|| {
            assert_eq!(current_device(), -1, "a new thread has no current context");
            set_current(0x7f00_0000_2000);
            assert_eq!(current_device(), 1);
        })
        .join()
        .expect("thread");
        assert_eq!(current_device(), 3);
        set_current(0x7f00_0000_3000);
        assert_eq!(
            current_device(),
            -1,
            "an unknown context is an unknown device"
        );
        set_current(0);
        assert_eq!(current_device(), -1);
    }

    #[test]
    fn colliding_contexts_all_find_their_device() {
        // More contexts than a cluster, all in the table.
        let base = 0x5500_0000_0000u64;
        for i in 0..100u64 {
            learn(base + i * 0x10_0000, i as i32);
        }
        for i in 0..100u64 {
            assert_eq!(device_of(base + i * 0x10_0000), i as i32);
        }
    }
}
