//! Forked children: `MEMPROF_FORK`, read when the shim is loaded. `off` (the default, and any
//! other value) makes a child that forks and does not exec record nothing; `record` makes it
//! start over at its first recorded call, with its own file `OUT.<pid>` (or, when `OUT` holds
//! `%p`, `OUT` with the child's pid there), header, writer thread and live socket; a child that
//! makes no call writes nothing. A child that execs starts over anyway: the shim is loaded again
//! in the new program. When the fork handlers cannot be registered, children record nothing.
//!
//! A child inherits the parent's memory as it was at `fork`: the events still in the buffers
//! (they are the parent's, and the parent writes them), the lanes of threads it does not have,
//! the recording file's descriptor (its offset is shared with the parent's), the live socket and
//! its clients, the stack table (the child's file needs its own definitions), the counters, the
//! forking thread's cached thread id, the count of threads waiting in `fork`, and the writer lock
//! in whatever state it was, but no thread other than the one that forked. So, with `record`:
//!
//! - Before `fork` (the prepare handler) the forking thread takes the writer lock, having asked
//!   the writer to give it up after its current batch (`waiting`): in the child the lock is
//!   never held by a thread that is not there. It tries for at most about a second (the lock's
//!   holder may be the very thread that forks, from a signal handler; the writer thread blocks
//!   signals): without the lock the child records nothing. The guard is kept in a static slot
//!   named by the holder's `pthread_self` (the same in the child), not in thread-local storage,
//!   whose first use would allocate and take the loader's lock while the writer lock is held.
//!   The parent's handler gives the lock back.
//! - The child's handler allocates nothing and takes no lock (another thread may have held the
//!   allocator's lock at `fork`): it drops the guard (a futex wake), and `recorder::forked_child`
//!   empties the buffers and frees the lanes of the threads that are not there, keeping the
//!   forking thread's, noted by the prepare handler; zeroes the counters; forgets the thread id
//!   (a thread-local `Cell`). It also forgets the threads that were waiting in `fork`: they are
//!   not in the child, and the child's writer would otherwise pause after every batch.
//! - The child's first recorded call (`recorder::start`) replaces the inherited writer state,
//!   which closes the inherited descriptors without removing the parent's socket file, and opens
//!   the child's own.
//! - The fork handlers of libraries loaded before the shim run before the shim's child handler;
//!   a hooked call they make still sees the parent's state. From the prepare handler to the end
//!   of the parent's or the child's handler, a hook in a process other than the one that forked
//!   (`in_fork_child`) forwards the call without recording it.
//!
//! A `fork` in a recording process with `record` waits for the writer's current batch, which
//! holds everything the buffers had when the writer took it (up to tens of MiB of writes), and
//! holds the writer lock for the whole `fork` (which may take long in a process with much
//! memory mapped): meanwhile the buffers may fill and hooks wait for room, and an `_exit` on
//! another thread may give up its flush (`recorder::flush_before_exit`). `vfork` and
//! `posix_spawn` run no fork handlers; their children exec or exit.

use crate::recorder::{self, Writer};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// Whether forked children record (`MEMPROF_FORK=record`).
static RECORD: AtomicBool = AtomicBool::new(false);
/// Whether this process is a forked child that started over (or will at its first event).
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// Threads inside `fork` waiting for the writer lock.
static WAITING: AtomicU32 = AtomicU32::new(0);
/// Threads between the prepare handler and the end of the parent's or the child's handler.
static FORKING: AtomicU32 = AtomicU32::new(0);
/// The pid of this process, as the constructor (or, in a forked child, the child handler) saw
/// it: in a child before its handler has run, it is still the parent's.
static PROCESS_PID: AtomicU32 = AtomicU32::new(0);
/// How long the prepare handler tries the writer lock, and how often.
const LOCK_WAIT: Duration = Duration::from_secs(1);
const LOCK_POLL: Duration = Duration::from_micros(100);

/// The writer lock, held by the forking thread from the prepare handler to the parent's or the
/// child's: only the thread whose `pthread_self` is in `HOLDER` touches it.
struct Held(UnsafeCell<Option<MutexGuard<'static, Writer>>>);

// SAFETY: the cell is written by the thread that holds the writer lock, which then names itself
// in `HOLDER` (release), and read only by the thread `HOLDER` names (acquire), which clears it
// before the guard, and so the lock, is dropped: one thread at a time.
unsafe impl Sync for Held {}

static HELD: Held = Held(UnsafeCell::new(None));
/// The `pthread_self` of the thread whose guard is in `HELD`; 0 when none.
static HOLDER: AtomicUsize = AtomicUsize::new(0);

/// Reads `MEMPROF_FORK` and registers the fork handlers; called once from the constructor.
pub fn register() {
    PROCESS_PID.store(pid(), Ordering::Relaxed);
    let record = std::env::var_os("MEMPROF_FORK").is_some_and(|v| v == "record");
    // SAFETY: registers plain functions with no arguments; called once by the constructor.
    let rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    // Without the handlers a child would keep the parent's state: it must not record.
    RECORD.store(record && rc == 0, Ordering::Relaxed);
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

/// Whether the caller runs in a forked child before the shim's child handler has reset the
/// parent's state (in another library's fork handler). One relaxed load unless a fork is under
/// way.
#[inline]
pub fn in_fork_child() -> bool {
    FORKING.load(Ordering::Relaxed) > 0 && PROCESS_PID.load(Ordering::Relaxed) != pid()
}

fn pid() -> u32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { libc::getpid() as u32 }
}

fn me() -> usize {
    // SAFETY: pthread_self takes no arguments and cannot fail.
    unsafe { libc::pthread_self() as usize }
}

extern "C" fn prepare() {
    FORKING.fetch_add(1, Ordering::AcqRel);
    if !RECORD.load(Ordering::Relaxed) || recorder::is_off() {
        return;
    }
    crate::buffers::before_fork();
    WAITING.fetch_add(1, Ordering::AcqRel);
    let writer = try_lock();
    WAITING.fetch_sub(1, Ordering::AcqRel);
    if let Some(writer) = writer {
        // SAFETY: this thread holds the writer lock, so no other thread touches `HELD` (see
        // `Held`); it names itself holder only once the guard is in.
        unsafe { *HELD.0.get() = Some(writer) };
        HOLDER.store(me(), Ordering::Release);
    }
}

/// The writer lock, tried for at most `LOCK_WAIT`; `None` when it stayed taken.
fn try_lock() -> Option<MutexGuard<'static, Writer>> {
    let since = Instant::now();
    loop {
        match recorder::try_lock() {
            Ok(writer) => return Some(writer),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if since.elapsed() < LOCK_WAIT => {
                std::thread::sleep(LOCK_POLL)
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

/// Takes the guard `prepare` stored, if this thread did.
fn release() -> Option<MutexGuard<'static, Writer>> {
    if HOLDER.load(Ordering::Acquire) != me() {
        return None;
    }
    // SAFETY: `HOLDER` names this thread, so it alone touches `HELD` (see `Held`).
    let held = unsafe { (*HELD.0.get()).take() };
    HOLDER.store(0, Ordering::Release);
    held
}

extern "C" fn parent() {
    // Dropping the guard releases the lock.
    drop(release());
    FORKING.fetch_sub(1, Ordering::AcqRel);
}

extern "C" fn child() {
    // The only thread: the lock is free once its guard is dropped. A child whose forking thread
    // did not hold the lock records nothing: another thread may have held it.
    let held = release();
    let record = held.is_some();
    drop(held);
    // Threads of the parent waiting for the lock (their own forks) are not here.
    WAITING.store(0, Ordering::Release);
    HOLDER.store(0, Ordering::Release);
    if record {
        IN_CHILD.store(true, Ordering::Release);
    }
    recorder::forked_child(record);
    PROCESS_PID.store(pid(), Ordering::Relaxed);
    // The parent's other threads inside `fork` are not here either.
    FORKING.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// The tests change `RECORD` and fork: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// Forks (the handlers the constructor registered run); the child exits with `code()`.
    /// Returns the child's exit status.
    fn fork_and_exit_with(code: fn() -> i32) -> i32 {
        // SAFETY: the child calls only `code` (atomic loads) and `_exit`, which are
        // async-signal-safe.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: ends the child at once, running no exit handlers.
            unsafe { libc::_exit(code()) };
        }
        assert!(child > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out-parameter.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status), "status {status}");
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_child_forgets_the_threads_that_were_waiting_in_fork() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        // As another thread waiting in the prepare handler for the writer lock would.
        WAITING.fetch_add(1, Ordering::AcqRel);
        let in_child = fork_and_exit_with(|| i32::from(waiting()));
        let in_parent = waiting();
        WAITING.fetch_sub(1, Ordering::AcqRel);
        assert!(in_parent);
        assert_eq!(
            in_child, 0,
            "the child's writer would pause after every batch"
        );
    }

    #[test]
    fn prepare_gives_up_on_a_writer_lock_it_cannot_get() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        assert!(!recorder::is_off(), "no test starts recording");
        RECORD.store(true, Ordering::Relaxed);
        // This thread holds the lock, as the writer or a hook inside `start` would when a signal
        // handler on it forks.
        let held = recorder::lock();
        let since = Instant::now();
        prepare();
        let waited = since.elapsed();
        let holder = HOLDER.load(Ordering::Acquire);
        parent();
        drop(held);
        // With the lock free, the forking thread holds it until the parent's handler.
        prepare();
        let holds = HOLDER.load(Ordering::Acquire) == me() && recorder::try_lock().is_err();
        parent();
        let released = recorder::try_lock().is_ok();
        RECORD.store(false, Ordering::Relaxed);
        assert_eq!(holder, 0, "nothing held after the wait");
        assert!(waited >= LOCK_WAIT && waited < 5 * LOCK_WAIT, "{waited:?}");
        assert!(holds && released);
        assert_eq!(FORKING.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_child_whose_forking_thread_did_not_get_the_lock_records_nothing() {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        RECORD.store(true, Ordering::Relaxed);
        // Another thread holds the lock through the whole fork.
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _held = recorder::lock();
            locked_tx.send(()).expect("send");
            let _ = done_rx.recv();
        });
        locked_rx.recv().expect("locked");
        let in_child = fork_and_exit_with(|| i32::from(in_child() || !recorder::is_off()));
        done_tx.send(()).expect("send");
        holder.join().expect("join");
        RECORD.store(false, Ordering::Relaxed);
        assert_eq!(in_child, 0);
    }
}
