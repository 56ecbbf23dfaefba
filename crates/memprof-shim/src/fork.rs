//! Forked children: `MEMPROF_FORK`, read when the shim is loaded. `off` (the default, and any
//! other value) makes a child that forks and does not exec record nothing; `record` makes it
//! start over at its first recorded call, with its own file `OUT.<pid>` (or, when `OUT` holds
//! `%p`, `OUT` with the child's pid there), header, writer thread and live socket; a child that
//! makes no call writes nothing. A child that execs starts over anyway: the shim is loaded again
//! in the new program.
//!
//! A child inherits the parent's memory as it was at `fork`: the events still in the buffers
//! (they are the parent's, and the parent writes them), the lanes of threads it does not have, the recording file's descriptor (its offset is
//! shared with the parent's), the live socket and its clients, the stack table (the child's file
//! needs its own definitions), the counters, the forking thread's cached thread id, and the
//! writer lock in whatever state it was, but no thread other than the one that forked. So, with
//! `record`:
//!
//! - Before `fork` (the prepare handler) the forking thread takes the writer lock, having asked
//!   the writer to give it up after its current batch (`waiting`): in the child the lock is
//!   never held by a thread that is not there. The parent's handler gives it back.
//! - The child's handler only stores atomics and releases the lock (`recorder::forked_child`:
//!   it empties the buffers and frees the lanes of the threads that are not there, keeping the
//!   forking thread's, noted by the prepare handler; zeroes the counters; forgets the thread
//!   id): another thread may have held the allocator's lock at `fork`, so it allocates nothing.
//! - The child's first recorded call (`recorder::start`) replaces the inherited writer state,
//!   which closes the inherited descriptors without removing the parent's socket file, and opens
//!   the child's own.
//!
//! A `fork` in a recording process with `record` waits for the writer's current batch (a few
//! writes). `vfork` and `posix_spawn` run no fork handlers; their children exec or exit.

use crate::recorder::{self, Writer};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::MutexGuard;

/// Whether forked children record (`MEMPROF_FORK=record`).
static RECORD: AtomicBool = AtomicBool::new(false);
/// Whether this process is a forked child that started over (or will at its first event).
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// Threads inside `fork` waiting for the writer lock.
static WAITING: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The writer lock, held by the forking thread from the prepare handler to the parent's or
    /// the child's. Its first use registers its destructor, which allocates: only the prepare
    /// handler does that; the others touch it only when `HOLDS` says it holds the lock.
    static HELD: RefCell<Option<MutexGuard<'static, Writer>>> = const { RefCell::new(None) };
    /// Whether `HELD` holds the lock (nothing to destroy, so touching it never allocates).
    static HOLDS: Cell<bool> = const { Cell::new(false) };
}

/// Reads `MEMPROF_FORK` and registers the fork handlers; called once from the constructor.
pub fn register() {
    let record = std::env::var_os("MEMPROF_FORK").is_some_and(|v| v == "record");
    RECORD.store(record, Ordering::Relaxed);
    // SAFETY: registers plain functions with no arguments; called once by the constructor.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Whether this process is a forked child that records to a file of its own.
pub fn in_child() -> bool {
    IN_CHILD.load(Ordering::Acquire)
}

/// Whether a thread inside `fork` waits for the writer lock: the writer gives it up after the
/// batch it is writing.
pub fn waiting() -> bool {
    WAITING.load(Ordering::Acquire) > 0
}

extern "C" fn prepare() {
    if !RECORD.load(Ordering::Relaxed) || recorder::is_off() {
        return;
    }
    crate::buffers::before_fork();
    WAITING.fetch_add(1, Ordering::AcqRel);
    let writer = recorder::lock();
    WAITING.fetch_sub(1, Ordering::AcqRel);
    // Fails only while this thread's storage is being destroyed: the lock is then released at
    // once, and the child records nothing (see `child`).
    let stored = HELD.try_with(|held| *held.borrow_mut() = Some(writer));
    let _ = HOLDS.try_with(|holds| holds.set(stored.is_ok()));
}

/// Takes the guard `prepare` stored, if it did.
fn release() -> Option<MutexGuard<'static, Writer>> {
    if !HOLDS
        .try_with(|holds| holds.replace(false))
        .unwrap_or(false)
    {
        return None;
    }
    HELD.try_with(|held| held.borrow_mut().take())
        .ok()
        .flatten()
}

extern "C" fn parent() {
    // Dropping the guard releases the lock.
    drop(release());
}

extern "C" fn child() {
    // The only thread: the lock is free once its guard is dropped. A child whose forking thread
    // did not hold the lock records nothing: another thread may have held it.
    let held = release();
    let record = held.is_some();
    drop(held);
    if record {
        IN_CHILD.store(true, Ordering::Release);
    }
    recorder::forked_child(record);
}
