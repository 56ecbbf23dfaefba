//! Hooks record events into per-thread buffers (`buffers.rs`); one writer thread drains them,
//! in time order, into `MEMPROF_OUT` and the live socket.
//!
//! Each entry is a record, the depth of its call stack and the stack's return addresses
//! (`stack.rs`; allocations only, unless `MEMPROF_STACKS=0`). The writer gives each distinct
//! stack an id (`stacks.rs`), writes its definition and the mappings it needs before the first
//! record that uses it, and puts the id in the record.

use crate::buffers::{Merged, Producing, HEAD_WORDS, RECORD_WORDS};
use crate::live::Server;
use crate::stack::{self, MAX_DEPTH};
use crate::stacks::Stacks;
use memprof_wire::{FileHeader, Kind, ProcessInfo, Record, PROCESS_ENTRY_HEAD, RECORD_LEN};
use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

/// Whether hooks capture call stacks (`MEMPROF_STACKS=0` turns it off).
static STACKS: AtomicBool = AtomicBool::new(true);
/// Events that could not be recorded (full buffers without a writer, write error).
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Events that found the buffers full and were written after the hook waited for the writer.
static DELAYED: AtomicU64 = AtomicU64::new(0);
/// Whether the writer thread is draining the buffers (a hook that finds them full waits).
static WRITER_ALIVE: AtomicBool = AtomicBool::new(false);
/// How long a hook whose buffers are full waits for a writer that is being started.
const MAX_START_WAIT_NS: u64 = 1_000_000_000;
/// The writer thread's kernel id (0 before it runs): a hook it runs (from a signal handler) must
/// not wait for itself.
static WRITER_TID: AtomicU32 = AtomicU32::new(0);

const IDLE: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const OFF: u8 = 3;
static STATE: AtomicU8 = AtomicU8::new(IDLE);
/// The process that opened the recording (a `vfork` child shares this memory but not the file).
static RECORDING_PID: AtomicU32 = AtomicU32::new(0);
/// How many programs that replace one another (`exec`) in one process get `OUT.<pid>.<n>`.
const MAX_EXEC_SUFFIX: u32 = 1000;
/// How many times `_exit` tries the writer lock, 1 ms apart, before it gives up on the flush.
// Used by `exit.rs`, which unit tests do not build (it would replace the test binary's `_exit`).
#[cfg_attr(test, allow(dead_code))]
const EXIT_LOCK_TRIES: u32 = 100;

pub(crate) struct Writer {
    file: Option<File>,
    written: u64,
    closed: bool,
    /// The live socket, unless `MEMPROF_LISTEN=0` or it could not be made.
    live: Option<Server>,
    /// Stack ids and the mappings written so far.
    stacks: Stacks,
    /// Entries taken from the buffers and not yet written.
    merge: Merged,
    /// What a drain writes to the file, and to the live socket: its definitions and its
    /// records apart (kept to be reused).
    file_bytes: Vec<u8>,
    live_defs: Vec<u8>,
    live_bytes: Vec<u8>,
}

impl Writer {
    const fn new() -> Writer {
        Writer {
            file: None,
            written: 0,
            closed: false,
            live: None,
            stacks: Stacks::new(),
            merge: Merged::new(),
            file_bytes: Vec::new(),
            live_defs: Vec::new(),
            live_bytes: Vec::new(),
        }
    }
}

static WRITER: Mutex<Writer> = Mutex::new(Writer::new());

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    /// This thread's kernel id, once looked up (0 before): a system call per event costs more
    /// than the rest of the hook.
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as inside a hook; `None` when it already is (a nested call, which
/// is forwarded without being recorded).
pub struct Guard(());

impl Guard {
    pub fn enter() -> Option<Guard> {
        IN_HOOK
            .try_with(|inside| (!inside.replace(true)).then_some(Guard(())))
            .ok()
            .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|inside| inside.set(false));
    }
}

/// `CLOCK_MONOTONIC` in ns: the clock records are stamped with.
pub(crate) fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// `CLOCK_REALTIME` in ns since the Unix epoch; `None` if the clock is before it.
fn wall_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_REALTIME is always supported.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).ok()?;
    Some(
        secs.wrapping_mul(1_000_000_000)
            .wrapping_add(ts.tv_nsec as u64),
    )
}

fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length, which is what gethostname is told.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Bytes of the command line kept in the process block (the rest is left out).
const MAX_ARGS_BYTES: usize = 64 << 10;

/// This process's arguments from `/proc/self/cmdline`, the first 64 KiB of them.
fn command_line() -> Vec<String> {
    match std::fs::read("/proc/self/cmdline") {
        Ok(raw) => kept_args(&raw),
        Err(_) => Vec::new(),
    }
}

/// The arguments of a /proc cmdline that fit in `MAX_ARGS_BYTES` of process block.
fn kept_args(raw: &[u8]) -> Vec<String> {
    // Each argument ends with a NUL; an empty argument is kept.
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    if raw.is_empty() {
        return Vec::new();
    }
    // Each argument costs its entry head too: 100,000 empty arguments must not make a block
    // the reader refuses.
    let mut kept = 0;
    raw.split(|&b| b == 0)
        .take_while(|a| {
            kept += a.len() + PROCESS_ENTRY_HEAD;
            kept <= MAX_ARGS_BYTES
        })
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

fn tid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// `tid()`, remembered per thread. A forked child forgets its only thread's (`forked_child`).
fn cached_tid() -> u32 {
    TID.try_with(|cached| {
        if cached.get() == 0 {
            cached.set(tid());
        }
        cached.get()
    })
    .unwrap_or_else(|_| tid())
}

fn pid() -> u32 {
    // SAFETY: getpid takes no arguments and cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// Whether events of this kind carry a call stack: the calls that make memory addressable
/// (device memory, or pinned host memory).
fn wants_stack(kind: Kind) -> bool {
    kind.allocates() || kind.pins_host() || kind == Kind::VmmMap
}

/// Records an event stamped now, after its call returned; fills in time, thread, process and
/// (for allocations) the call stack. Keeps `errno`.
// Not inlined, so that the stack walk sees the same shim frames above every hook.
#[inline(never)]
pub fn record(event: Record) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    if ensure_started() {
        // Before the clock is read: the writer holds back newer events until this one is in.
        let producing = Producing::begin();
        let ts_ns = producing.stamped(now_ns());
        publish_event(event, ts_ns, &producing);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The time of a call that gives memory back, read before the call is made; the writer holds
/// back newer events of other threads until its event is recorded (or `STALE_NS` of
/// `buffers.rs` passed). So a free comes before anything that follows the call's start in
/// another thread: an allocation that gets the freed address back, above all.
pub struct Stamp {
    producing: Producing,
    ts_ns: u64,
}

/// Stamps a call that gives memory back (a free, unmap or release), before it is made; `None`
/// when nothing is recorded. Keeps `errno`.
pub fn stamp() -> Option<Stamp> {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    let stamp = ensure_started().then(|| {
        let producing = Producing::begin();
        let ts_ns = producing.stamped(now_ns());
        Stamp { producing, ts_ns }
    });
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    stamp
}

/// Records the event of a call stamped before it was made (`stamp`). Keeps `errno`.
pub fn record_stamped(event: Record, stamp: Stamp) {
    // SAFETY: __errno_location returns this thread's errno slot, valid for the thread's life.
    let errno = unsafe { *libc::__errno_location() };
    publish_event(event, stamp.ts_ns, &stamp.producing);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Fills in time, thread, process and (for allocations) the call stack, and publishes.
// Inlined into `record`, whose frame the stack walk expects.
#[inline(always)]
fn publish_event(mut event: Record, ts_ns: u64, producing: &Producing) {
    event.ts_ns = ts_ns;
    event.tid = cached_tid();
    // The process that opened this recording (a forked child opens its own: `forked_child`).
    event.pid = RECORDING_PID.load(Ordering::Relaxed);
    let mut head = [0u64; HEAD_WORDS];
    head[..RECORD_WORDS].copy_from_slice(&words(&event));
    if wants_stack(event.kind) && STACKS.load(Ordering::Relaxed) {
        let mut frames = [0u64; MAX_DEPTH];
        let depth = stack::capture(&mut frames);
        head[RECORD_WORDS] = depth as u64;
        publish(producing, &head, &frames[..depth]);
    } else {
        publish(producing, &head, &[]);
    }
}

/// A record's encoding (`Record::encode`) as little-endian words.
fn words(event: &Record) -> [u64; RECORD_WORDS] {
    let lo_hi = |lo: u32, hi: u32| u64::from(lo) | u64::from(hi) << 32;
    [
        lo_hi(event.kind as u32 | u32::from(event.flags) << 16, event.tid),
        event.ts_ns,
        event.ptr,
        event.size,
        event.stream,
        event.aux,
        lo_hi(event.pid, event.device as u32),
        lo_hi(event.result, event.stack),
    ]
}

/// Publishes an entry; when the buffers are full, waits for the writer as long as it drains
/// them (or, for up to a second, while it is being started), and counts the event as delayed;
/// without a writer (it could not be started, is gone, was closed by the final flush, or is the
/// calling thread) counts it as dropped.
fn publish(producing: &Producing, head: &[u64; HEAD_WORDS], frames: &[u64]) {
    if producing.push(head, frames) {
        return;
    }
    let me = cached_tid();
    // The thread starting the writer might wait for a lock this thread's caller holds.
    let since = now_ns();
    let coming = || {
        STATE.load(Ordering::Acquire) == STARTING
            && now_ns().wrapping_sub(since) < MAX_START_WAIT_NS
    };
    while (WRITER_ALIVE.load(Ordering::Acquire) || coming())
        && WRITER_TID.load(Ordering::Relaxed) != me
    {
        // SAFETY: sched_yield takes no arguments.
        unsafe { libc::sched_yield() };
        if producing.push(head, frames) {
            DELAYED.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    DROPPED.fetch_add(1, Ordering::Relaxed);
}

/// Starts recording on the first event; false when recording is off, and in a forked child
/// before the shim's child handler has run (another library's fork handler): it still has the
/// parent's state, and may hold the writer lock that `start` would wait for (`fork.rs`).
fn ensure_started() -> bool {
    if crate::fork::in_fork_child() {
        return false;
    }
    match STATE.load(Ordering::Acquire) {
        RUNNING | STARTING => true,
        OFF => false,
        _ => {
            // Before any thread can see STARTING: events recorded meanwhile carry it.
            RECORDING_PID.store(pid(), Ordering::Release);
            if STATE
                .compare_exchange(IDLE, STARTING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return STATE.load(Ordering::Acquire) != OFF;
            }
            let on = start();
            STATE.store(if on { RUNNING } else { OFF }, Ordering::Release);
            on
        }
    }
}

pub(crate) fn lock() -> MutexGuard<'static, Writer> {
    WRITER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The writer lock, if it is free now.
pub(crate) fn try_lock() -> std::sync::TryLockResult<MutexGuard<'static, Writer>> {
    WRITER.try_lock()
}

fn start() -> bool {
    let forked = crate::fork::in_child();
    if forked {
        // The parent's file, socket and stack table: closed and forgotten here, never written.
        drop(std::mem::replace(&mut *lock(), Writer::new()));
    }
    let Some(out) = std::env::var_os("MEMPROF_OUT") else {
        return false;
    };
    // Bytes: a file name need not be UTF-8.
    let out = std::os::unix::ffi::OsStringExt::into_vec(out);
    STACKS.store(
        std::env::var_os("MEMPROF_STACKS").is_none_or(|v| v != "0"),
        Ordering::Relaxed,
    );
    // Never overwrite: a second process with the same MEMPROF_OUT (a CUDA program started by
    // the recorded one) records to `OUT.<pid>` instead, and so does a forked child (`fork.rs`)
    // unless `%p` already names it. A program that replaced (`exec`) one that recorded keeps its
    // pid: it records to `OUT.<pid>.<n>`, the first of them that is free.
    let path = with_pid(&out, pid());
    let own = suffixed(&path, pid());
    let first = (!forked || out.windows(2).any(|w| w == b"%p")).then(|| path.clone());
    let names = first
        .into_iter()
        .chain(std::iter::once(own.clone()))
        .chain((1..=MAX_EXEC_SUFFIX).map(|n| suffixed(&own, n)));
    let mut file = None;
    let mut last = path.clone();
    for name in names {
        let opened = File::options()
            .write(true)
            .create_new(true)
            .open(std::ffi::OsStr::from_bytes(&name));
        match opened {
            Ok(created) => {
                file = Some((created, name));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = name,
            Err(e) => {
                report_unwritten(&name, &e);
                return false;
            }
        }
    }
    let Some((mut file, name)) = file else {
        report_unwritten(
            &last,
            &"it and every other name this process may take exist",
        );
        return false;
    };
    let header = FileHeader {
        pid: pid(),
        start_ns: now_ns(),
    };
    let process = ProcessInfo {
        wall_start_ns: wall_ns(),
        host: host_name(),
        args: command_line(),
    };
    let mut head = header.encode().to_vec();
    head.extend_from_slice(&process.encode());
    if let Err(e) = file.write_all(&head) {
        report_unwritten(&name, &e);
        return false;
    }
    let listen = std::env::var_os("MEMPROF_LISTEN").is_none_or(|v| v != "0");
    let live = if listen {
        Server::open(pid(), head)
    } else {
        None
    };
    {
        let mut writer = lock();
        writer.file = Some(file);
        writer.live = live;
    }
    // Without a writer thread the buffers are still drained at exit.
    WRITER_ALIVE.store(true, Ordering::Release);
    if std::thread::Builder::new()
        .name("memprof-writer".into())
        .spawn(writer_loop)
        .is_err()
    {
        WRITER_ALIVE.store(false, Ordering::Release);
    }
    true
}

/// `out` with the process id for each `%p`.
fn with_pid(out: &[u8], pid: u32) -> Vec<u8> {
    let pid = pid.to_string();
    let mut path = Vec::with_capacity(out.len() + pid.len());
    let mut rest = out;
    while let Some(at) = rest.windows(2).position(|w| w == b"%p") {
        path.extend_from_slice(&rest[..at]);
        path.extend_from_slice(pid.as_bytes());
        rest = &rest[at + 2..];
    }
    path.extend_from_slice(rest);
    path
}

/// `name.<n>`.
fn suffixed(name: &[u8], n: u32) -> Vec<u8> {
    let mut out = name.to_vec();
    out.extend_from_slice(format!(".{n}").as_bytes());
    out
}

/// Tells `memprof run` that the recording could not be created at `path`, on the datagram
/// socket (abstract) that `MEMPROF_REPORT` names, when set: one `pid TAB path TAB error`
/// message, sent without waiting (a missing or full socket loses it).
fn report_unwritten(path: &[u8], error: &dyn std::fmt::Display) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(name) = std::env::var_os("MEMPROF_REPORT") else {
        return;
    };
    let Ok(addr) = SocketAddr::from_abstract_name(name.as_bytes()) else {
        return;
    };
    let Ok(socket) = UnixDatagram::unbound() else {
        return;
    };
    if socket.set_nonblocking(true).is_ok() {
        let mut message = format!("{}\t", pid()).into_bytes();
        message.extend_from_slice(path);
        message.extend_from_slice(format!("\t{error}").as_bytes());
        let _ = socket.send_to_addr(&message, &addr);
    }
}

fn writer_loop() {
    /// Tells waiting hooks that the writer is gone, however the loop ends (a panic too).
    struct Gone;
    impl Drop for Gone {
        fn drop(&mut self) {
            WRITER_ALIVE.store(false, Ordering::Release);
        }
    }
    let _gone = Gone;
    // A signal handler run on this thread while it holds the writer lock could call `fork`,
    // whose prepare handler waits for that lock (`fork.rs`), or a hook: this thread runs only
    // the shim's code, so it takes no signal that can be blocked.
    // SAFETY: `all` is a valid sigset_t, filled by sigfillset before use; a null old set is
    // allowed.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
    WRITER_TID.store(cached_tid(), Ordering::Relaxed);
    loop {
        let (count, closed, more) = {
            let mut writer = lock();
            // Drained first, so that a client accepted now gets in its snapshot what was
            // published before it connected (what was still held back reaches it before the
            // snapshot's end mark: `live_client.rs`).
            let (count, closed) = drain(&mut writer, false);
            let floor = writer.merge.floor();
            let more = writer.live.as_mut().is_some_and(|live| live.accept(floor));
            (count, closed, more)
        };
        if closed {
            return;
        }
        // A `fork` waiting for the lock gets it while the writer sleeps (`fork.rs`); so does
        // the next round's snapshot piece when no client could take more.
        if (count == 0 && !more) || crate::fork::waiting() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Takes what the buffers hold and writes what can go out, in time order (everything with
/// `all`); returns how many events it took and whether the file is closed.
fn drain(writer: &mut Writer, all: bool) -> (u64, bool) {
    if writer.closed {
        return (0, true);
    }
    let Writer {
        file,
        written,
        live,
        stacks,
        merge,
        file_bytes,
        live_defs,
        live_bytes,
        ..
    } = writer;
    // Definitions and records for the file, in order; for the live stream the definitions
    // apart (the socket keeps them for clients that connect later: `live.rs`), then the records.
    file_bytes.clear();
    live_defs.clear();
    live_bytes.clear();
    let mut count = 0u64;
    let taken = merge.drain(now_ns(), all, |head, frames| {
        let mut record = [0u8; RECORD_LEN];
        for (bytes, word) in record.chunks_exact_mut(8).zip(&head[..RECORD_WORDS]) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        let defined = file_bytes.len();
        if let Some(id) = stacks.id(frames, file_bytes) {
            record[60..64].copy_from_slice(&id.to_le_bytes());
        }
        // New definitions only (a stack's first use): most entries copy nothing here.
        live_defs.extend_from_slice(&file_bytes[defined..]);
        file_bytes.extend_from_slice(&record);
        live_bytes.extend_from_slice(&record);
        count += 1;
    });
    if count > 0 {
        let ok = match file.as_mut() {
            Some(file) => file.write_all(file_bytes).is_ok(),
            None => false,
        };
        if ok {
            *written += count;
        } else {
            *file = None;
            DROPPED.fetch_add(count, Ordering::Relaxed);
        }
        if let Some(live) = live.as_mut() {
            live.send(live_defs, live_bytes);
        }
    }
    (taken as u64, false)
}

/// Final flush: drains the buffers and writes the trailer. Registered with `atexit` from the
/// constructor, so it runs after handlers registered later (the CUDA runtime's teardown). Does
/// nothing in a process that did not open the recording (a child made without the fork
/// handlers, by glibc's `_Fork`, would append the parent's events to the parent's file).
extern "C" fn flush_at_exit() {
    if STATE.load(Ordering::Acquire) != RUNNING || RECORDING_PID.load(Ordering::Acquire) != pid() {
        return;
    }
    finish(&mut lock());
}

/// The flush of `_exit` / `_Exit`, which skip `atexit`: as `flush_at_exit`, but it waits at most
/// about 100 ms for the writer lock, and does nothing in a process that did not open the
/// recording (a `vfork` child shares the parent's memory).
#[cfg_attr(test, allow(dead_code))]
pub fn flush_before_exit() {
    if STATE.load(Ordering::Acquire) != RUNNING || RECORDING_PID.load(Ordering::Acquire) != pid() {
        return;
    }
    // `_exit` may come from a signal handler that interrupted malloc: the live socket's
    // bookkeeping (which allocates and frees) is left alone; its clients see the socket close.
    let skip_live = |writer: &mut Writer| std::mem::forget(writer.live.take());
    for _ in 0..EXIT_LOCK_TRIES {
        match WRITER.try_lock() {
            Ok(mut writer) => {
                skip_live(&mut writer);
                return finish(&mut writer);
            }
            Err(TryLockError::Poisoned(poisoned)) => {
                let mut writer = poisoned.into_inner();
                skip_live(&mut writer);
                return finish(&mut writer);
            }
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Writes everything the buffers hold and the trailer, once.
fn finish(writer: &mut Writer) {
    drain(writer, true);
    if writer.closed {
        return;
    }
    writer.closed = true;
    // Hooks called from here on (later exit handlers) must not wait for a writer that is gone.
    WRITER_ALIVE.store(false, Ordering::Release);
    let mut trailer = Record::new(Kind::Trailer);
    trailer.size = writer.written;
    trailer.aux = DROPPED.load(Ordering::Relaxed);
    trailer.stream = DELAYED.load(Ordering::Relaxed);
    trailer.ts_ns = now_ns();
    trailer.pid = pid();
    trailer.tid = tid();
    if let Some(file) = writer.file.as_mut() {
        let _ = file.write_all(&trailer.encode());
    }
    if let Some(mut live) = writer.live.take() {
        live.close(&trailer.encode());
    }
}

/// Whether recording is off for good in this process (no `MEMPROF_OUT`, or it failed to start).
pub(crate) fn is_off() -> bool {
    STATE.load(Ordering::Acquire) == OFF
}

/// In a forked child, from its fork handler (`fork.rs`), as its only thread: without `record`,
/// record nothing (the child shares the parent's file offset and has no writer thread; a child
/// that execs starts over in the new program). With `record`, forget the parent's recording
/// (its events still in the buffers, its counters, this thread's id) so that the next event
/// starts the child's own (`start`). Atomic stores and a thread-local `Cell` only: another thread
/// may have held the allocator's lock.
pub(crate) fn forked_child(record: bool) {
    WRITER_ALIVE.store(false, Ordering::Release);
    if !record || is_off() {
        STATE.store(OFF, Ordering::Release);
        return;
    }
    crate::buffers::discard_in_child();
    DROPPED.store(0, Ordering::Relaxed);
    DELAYED.store(0, Ordering::Relaxed);
    let _ = TID.try_with(|cached| cached.set(0));
    STATE.store(IDLE, Ordering::Release);
}

extern "C" fn init() {
    // SAFETY: registers a plain function with no arguments; called once by the loader.
    unsafe { libc::atexit(flush_at_exit) };
    crate::fork::register();
    // The `_exit` interposers exist outside unit tests only (see lib.rs).
    #[cfg(not(test))]
    crate::exit::resolve();
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_names_are_bytes_with_the_pid_for_each_percent_p() {
        assert_eq!(with_pid(b"/d/x\xff.memprof", 42), b"/d/x\xff.memprof");
        assert_eq!(with_pid(b"/d/%p.memprof", 42), b"/d/42.memprof");
        assert_eq!(with_pid(b"%p-%p", 7), b"7-7");
        assert_eq!(suffixed(b"a\xfe", 3), b"a\xfe.3");
    }

    #[test]
    fn entry_words_are_the_record_encoding() {
        let event = Record {
            kind: Kind::AllocAsync,
            flags: 0x8001,
            tid: 0xdead_beef,
            ts_ns: 1 << 63 | 5,
            ptr: 0x7f00_0000_1000,
            size: u64::MAX,
            stream: 3,
            aux: 4,
            pid: 77,
            device: -1,
            result: 2,
            stack: 0xffff_fffe,
        };
        let bytes: Vec<u8> = words(&event).iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bytes, event.encode());
    }

    #[test]
    fn the_kept_command_line_always_fits_the_block_readers_accept() {
        // 200,000 empty arguments (a 1.8 MB argv the kernel allows) and a few long ones.
        let mut raw = vec![0u8; 200_000];
        for _ in 0..3 {
            raw.extend(std::iter::repeat_n(b'x', 40_000));
            raw.push(0);
        }
        for raw in [&raw[..200_000], &raw[200_000..], &raw[..]] {
            let block = ProcessInfo {
                wall_start_ns: Some(1),
                host: Some("h".into()),
                args: kept_args(raw),
            }
            .encode();
            assert!(block.len() <= MAX_ARGS_BYTES + 64, "{} bytes", block.len());
            assert!(ProcessInfo::decode(&block).is_ok());
        }
        assert_eq!(kept_args(b"prog\0-v\0\0"), ["prog", "-v", ""]);
    }
}
