//! `memprof run [-o OUT.memprof] [--torch] [--live] [--follow-forks] -- CMD...`: runs CMD with
//! the recording shim preloaded, passes its exit code through and prints a short summary of each
//! recording on stderr: OUT, and `OUT.<pid>` of every other process that recorded (a CUDA
//! program CMD starts, and with `--follow-forks` a forked child of one that does not exec;
//! `MEMPROF_FORK` in the shim; `OUT.<pid>.<n>` for a program that replaced, by `exec`, one that
//! recorded). Recordings of an earlier run at these names are removed first: only files that
//! start as a recording does (another file at such a name is left alone), and one that cannot be
//! removed only gets a warning. OUT itself must be a new name or an earlier recording: anything
//! else there (a file of the user's, a directory, a device node, a fifo, a link), and a place
//! where no file can be created, is refused with one line before CMD runs. A shim that cannot
//! create its recording after all says so on a socket named in `MEMPROF_REPORT`, and the summary
//! tells which file and why. The summary leaves out a recording whose header names another
//! process than its name, or a start before this run's (a concurrent or earlier run's).
//! `%p` in OUT is a process's pid, as the shim names its file: the summary names CMD's, and the
//! other files of the pattern that this run's processes wrote.
//! SIGINT, SIGTERM and SIGHUP sent to memprof go on to CMD (`Forwarder`); memprof waits for it,
//! removes its live socket should it have been killed before it could, prints the summary and
//! exits with its status.
//! When NVML is present, each process's device memory as NVML sees it is sampled while CMD runs
//! and written into its recording (`run_nvml.rs`).
//! `--torch` also puts a Python start-up hook on CMD's `PYTHONPATH` (`torch_hook.rs`) that turns
//! on PyTorch's memory history and dumps a snapshot next to the recording when the program runs
//! out of memory.
//!
//! With `--live` the attach dashboard (`tui::attach`) follows CMD through the shim's socket while
//! it runs; CMD's output then goes to a log file beside the recording and its input is empty, as
//! the dashboard holds the terminal.

use super::run_nvml::{add_samples, NvmlWatch};
use super::torch_hook::{snapshot_pattern, snapshots_written, TorchHook};
use super::Outcome;
use crate::model::{count, Bytes};
use crate::report::terminal_text::terminal_text;
use crate::source::driver_state::DriverState;
use crate::source::gpu::SystemClock;
use crate::source::live::{socket_path, LiveClient};
use crate::source::live_feed::LiveFeed;
use crate::tui::attach::{AttachApp, Feed};
use crate::tui::terminal;
use crate::tui::theme::Theme;
use anyhow::{bail, Context};
use clap::Args;
use memprof_wire::{
    decode_header, decode_recording, FileHeader, Kind, ProcessInfo, Recording, FILE_HEADER_LEN,
    MAGIC, MAX_PROCESS_BLOCK,
};
use signal_hook::iterator::exfiltrator::origin::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;
use std::ffi::OsString;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, SystemTime};

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where to write the recording (default memprof-run.memprof).
    #[arg(short = 'o', long = "output", value_name = "OUT.memprof")]
    pub output: Option<PathBuf>,
    /// Also turn on PyTorch's memory history in a Python CMD and dump a snapshot next to the
    /// recording when it runs out of memory.
    #[arg(long)]
    pub torch: bool,
    /// Open the attach dashboard on CMD while it runs (CMD's output goes to OUT.log).
    #[arg(long)]
    pub live: bool,
    /// Also record forked children that do not exec, each to OUT.<pid> (a CUDA program started
    /// with exec always records to a file of its own).
    #[arg(long)]
    pub follow_forks: bool,
    /// The program and its arguments (any bytes, as the system passes them); its exit code is
    /// passed through.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Where the recording goes without `-o`.
const DEFAULT_OUT: &str = "memprof-run.memprof";
/// How often `--live` looks for the shim's socket, and refreshes the dashboard.
const SOCKET_POLL: Duration = Duration::from_millis(20);
const LIVE_INTERVAL: Duration = Duration::from_millis(500);

pub fn run(args: &RunArgs) -> anyhow::Result<Outcome> {
    if args.live && !std::io::stdout().is_terminal() {
        bail!("`memprof run --live` opens a dashboard and needs a terminal");
    }
    let shim = super::shim_file::find()?;
    let out = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT));
    // Absolute, so a command that changes directory still records here.
    let out =
        std::path::absolute(&out).with_context(|| format!("cannot resolve {}", out.display()))?;
    // Recordings of this run start no earlier than this (the shim reads the same clock).
    let started = wall_ns(SystemTime::now());
    prepare_output(&out)?;
    for (_, stale) in other_recordings(&out) {
        if !starts_as_recording(&stale) {
            continue;
        }
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "memprof: warning: cannot remove the earlier recording {}: {e}",
                stale.display()
            ),
        }
    }
    let Some((program, rest)) = args.command.split_first() else {
        bail!("no command to run");
    };
    let shown_program = terminal_text(&program.to_string_lossy()).to_string();
    let shown_command = args
        .command
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let mut preload = OsString::from(shim.as_os_str());
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|p| !p.is_empty()) {
        preload.push(" ");
        preload.push(existing);
    }
    let reports = Reports::open();
    let mut command = Command::new(program);
    if let Some(reports) = &reports {
        command.env(REPORT_ENV, &reports.name);
    }
    command
        .args(rest)
        .env("LD_PRELOAD", preload)
        .env("MEMPROF_OUT", &out)
        .env(
            "MEMPROF_FORK",
            if args.follow_forks { "record" } else { "off" },
        );
    let hook = if args.torch {
        // Snapshots of an earlier run must not be taken for this one's.
        for stale in snapshots_written(&out) {
            std::fs::remove_file(&stale)
                .with_context(|| format!("cannot replace {}", stale.display()))?;
        }
        let hook = TorchHook::create()?;
        command
            .env(
                "PYTHONPATH",
                hook.python_path(std::env::var_os("PYTHONPATH")),
            )
            .env("MEMPROF_TORCH_SNAPSHOT", snapshot_pattern(&out));
        Some(hook)
    } else {
        None
    };
    let nvml = NvmlWatch::start();
    // Caught from before CMD starts, so that none of them ends memprof while CMD runs.
    let signals = catch_forwarded().context("cannot catch signals")?;
    let ended = if args.live {
        let log = out.with_extension("log");
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        // The dashboard reads the keys: CMD gets no terminal input.
        command
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().context("cannot share the log file")?)
            .stderr(file);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {shown_program}"))?;
        let pid = child.id();
        let forwarder = Forwarder::start(signals, pid)?;
        watch_live(&mut child, &shown_command)?;
        if !has_ended(child.id())? {
            eprintln!(
                "memprof: the view is closed; waiting for PID {pid} to end (its output is in {})",
                log.display()
            );
        }
        let status = forwarder.wait(&mut child)?;
        eprintln!("memprof: the command's output is in {}", log.display());
        (status, pid)
    } else {
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot run {shown_program}"))?;
        let pid = child.id();
        let forwarder = Forwarder::start(signals, pid)?;
        (forwarder.wait(&mut child)?, pid)
    };
    let (status, pid) = ended;
    // `%p` in OUT is CMD's pid, as the shim names its file; another recorded process names
    // its own (checked below by the pid in its header).
    let pattern = out.clone();
    let out = with_pid(&out, pid);
    drop(hook);
    let samples = nvml.map_or_else(Vec::new, NvmlWatch::stop);
    let others: Vec<PathBuf> = other_recordings(&out)
        .into_iter()
        .chain(
            pid_recordings(&pattern)
                .into_iter()
                .filter(|(of, _)| *of != pid),
        )
        .filter(|(pid, path)| {
            recording_start(path).is_some_and(|(of, wall)| of == *pid && wall >= started)
        })
        .map(|(_, path)| path)
        .collect();
    let unwritten = reports.map_or_else(Vec::new, |r| r.take());
    for u in &unwritten {
        eprintln!(
            "memprof: no recording: {} could not be created ({}); the CUDA memory calls of PID \
             {} went to the driver unrecorded",
            terminal_text(&u.path.to_string_lossy()),
            terminal_text(&u.error),
            u.pid
        );
    }
    if !samples.is_empty() {
        for path in std::iter::once(&out).chain(&others) {
            if let Err(e) = add_samples(path, &samples) {
                eprintln!(
                    "memprof: warning: cannot add NVML samples to {}: {e}",
                    path.display()
                );
            }
        }
    }
    let reported = unwritten.iter().any(|u| u.path == out);
    if (others.is_empty() || out.exists()) && !reported {
        eprintln!("memprof: {}", summary(&out));
    }
    for other in others {
        eprintln!("memprof: {}", summary(&other));
    }
    if args.torch {
        let written = snapshots_written(&out);
        if written.is_empty() {
            eprintln!("memprof: no PyTorch out-of-memory snapshot was written");
        }
        for snapshot in written {
            eprintln!(
                "memprof: PyTorch snapshot at out-of-memory: {}",
                snapshot.display()
            );
        }
    }
    let code = match status.code() {
        Some(code) => code,
        None => {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        }
    };
    Ok(if code == 0 {
        Outcome::Ok
    } else {
        Outcome::Exit(code.clamp(0, 255) as u8)
    })
}

/// Waits for the shim's socket in `child` (it opens at the first recorded call) and shows the
/// attach dashboard on it until the viewer quits; says so when the command ends first.
fn watch_live(child: &mut Child, command: &str) -> anyhow::Result<()> {
    let pid = child.id();
    let socket = socket_path(pid);
    eprintln!("memprof: waiting for PID {pid}'s first CUDA memory call");
    while !socket.exists() {
        if has_ended(child.id())? {
            eprintln!("memprof: the command ended before any CUDA memory call; no live view");
            return Ok(());
        }
        std::thread::sleep(SOCKET_POLL);
    }
    let client = match LiveClient::connect(pid) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("memprof: no live view: {e}");
            return Ok(());
        }
    };
    let feed = Feed::Shim(LiveFeed::start(client)?);
    let clock = SystemClock;
    let theme = Theme::from_no_color(std::env::var_os("NO_COLOR").as_deref());
    let mut app = AttachApp::new(
        pid,
        Some(command.to_owned()),
        feed,
        &clock,
        LIVE_INTERVAL,
        theme,
        "",
    );
    terminal::run(&mut app).context("terminal")?;
    Ok(())
}

/// Makes `out` ready for the shim, which never overwrites: a recording there (an earlier run's)
/// is removed, and anything else (a file of the user's, a directory, a device node, a fifo, a
/// link) is refused and left as it is. A new name is created and removed once, so that a place
/// the recording cannot be written to is refused before CMD runs.
fn prepare_output(out: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let shown = terminal_text(&out.to_string_lossy()).to_string();
    let meta = match std::fs::symlink_metadata(out) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return std::fs::File::create_new(out)
                .and_then(|_| std::fs::remove_file(out))
                .with_context(|| format!("cannot write the recording to {shown}"));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot write the recording to {shown}")),
    };
    let kind = meta.file_type();
    let what = if kind.is_file() {
        if starts_as_recording(out) {
            return std::fs::remove_file(out)
                .with_context(|| format!("cannot replace the earlier recording {shown}"));
        }
        "a file that is not a memprof recording; it is left as it is"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_fifo() {
        "a fifo"
    } else {
        "not a regular file"
    };
    bail!("{shown} is {what}: -o names a new file or an earlier recording to replace")
}

/// The environment variable that names the report socket to the shim.
const REPORT_ENV: &str = "MEMPROF_REPORT";

/// A recording a shim of this run could not create, as it reported.
struct Unwritten {
    pid: u32,
    path: PathBuf,
    error: String,
}

/// Where the shims of this run say that they could not create their recording: a datagram
/// socket in the abstract namespace (nothing on disk to clean up), named in `MEMPROF_REPORT`.
/// A shim sends without waiting, and only then: no report means no failure.
struct Reports {
    socket: std::os::unix::net::UnixDatagram,
    name: String,
}

impl Reports {
    /// `None` when no socket can be made (the run goes on without reports).
    fn open() -> Option<Reports> {
        use std::os::linux::net::SocketAddrExt;
        let name = format!(
            "memprof-run-{}-{}",
            std::process::id(),
            wall_ns(SystemTime::now())
        );
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).ok()?;
        let socket = std::os::unix::net::UnixDatagram::bind_addr(&addr).ok()?;
        socket.set_nonblocking(true).ok()?;
        Some(Reports { socket, name })
    }

    /// Every report sent so far: `pid TAB path TAB error` each (the path is bytes, and may
    /// hold a tab: it is what lies between the first tab and the last).
    fn take(self) -> Vec<Unwritten> {
        use std::os::unix::ffi::OsStrExt;
        let mut found = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.socket.recv(&mut buf) {
            let message = &buf[..n];
            let (Some(first), Some(last)) = (
                message.iter().position(|&b| b == b'\t'),
                message.iter().rposition(|&b| b == b'\t'),
            ) else {
                continue;
            };
            let pid = std::str::from_utf8(&message[..first])
                .ok()
                .and_then(|p| p.parse().ok());
            if let (Some(pid), true) = (pid, first < last) {
                let path = std::ffi::OsStr::from_bytes(&message[first + 1..last]);
                let error = String::from_utf8_lossy(&message[last + 1..]);
                let error = error.as_ref();
                found.push(Unwritten {
                    pid,
                    path: PathBuf::from(path),
                    // The OS error number adds nothing for a person.
                    error: error
                        .split(" (os error")
                        .next()
                        .unwrap_or(error)
                        .trim_end()
                        .to_string(),
                });
            }
        }
        found
    }
}

/// What `memprof run` passes on to CMD rather than dying of it.
const FORWARDED: [libc::c_int; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

/// Catches the forwarded signals but those memprof was started with ignored (`nohup`,
/// a background job), which stay ignored, for CMD too.
fn catch_forwarded() -> std::io::Result<SignalsInfo<WithOrigin>> {
    let ignored = |signal: libc::c_int| {
        // SAFETY: with a null new action, sigaction only writes the current one into `old`, a
        // valid, zeroed struct.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        }
    };
    SignalsInfo::<WithOrigin>::new(FORWARDED.into_iter().filter(|&s| !ignored(s)))
}

/// Sends CMD the signals sent to memprof while it runs, so that memprof outlives it, prints the
/// summary and passes its status through. A signal from the terminal (Ctrl-C, a hang-up) went
/// to CMD's process group already and is not sent twice.
struct Forwarder {
    handle: signal_hook::iterator::Handle,
    thread: std::thread::JoinHandle<()>,
}

impl Forwarder {
    fn start(mut signals: SignalsInfo<WithOrigin>, pid: u32) -> anyhow::Result<Forwarder> {
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("memprof-forward".into())
            .spawn(move || {
                for origin in signals.forever() {
                    if origin.cause == Cause::Kernel {
                        continue;
                    }
                    // SAFETY: kill only sends a signal. CMD is not reaped before this thread
                    // ends (`wait`), so its pid is still its own.
                    unsafe {
                        libc::kill(pid as libc::pid_t, origin.signal);
                    }
                }
            })
            .context("cannot start the signal forwarder")?;
        Ok(Forwarder { handle, thread })
    }

    /// Waits for CMD to end, stops forwarding, then reaps it (so that no signal can reach
    /// another process that got its pid).
    fn wait(self, child: &mut Child) -> anyhow::Result<std::process::ExitStatus> {
        while !wait_unreaped(child.id(), 0).context("waiting for the command")? {}
        remove_stale_socket(child.id());
        self.handle.close();
        // The thread only forwards; a panic there has nothing to report here.
        let _ = self.thread.join();
        child.wait().context("waiting for the command")
    }
}

/// Removes the live socket of CMD, which has ended but is not reaped yet (so its pid is still
/// its own): the shim removes it at exit, but a process killed by a signal cannot.
fn remove_stale_socket(pid: u32) {
    use std::os::unix::fs::FileTypeExt;
    let path = socket_path(pid);
    if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(&path);
    }
}

/// Whether CMD has ended, without reaping it (its pid stays its own, for the forwarder).
fn has_ended(pid: u32) -> anyhow::Result<bool> {
    wait_unreaped(pid, libc::WNOHANG).context("waiting for the command")
}

/// `waitid` for `pid` with `WEXITED | WNOWAIT | flags`: whether it has ended (false when
/// interrupted, or not yet with `WNOHANG`), leaving it to be reaped by `Child::wait`.
fn wait_unreaped(pid: u32, flags: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: `info` is a valid, zeroed siginfo_t that waitid fills (its pid stays 0 when
    // WNOHANG finds nothing ended); WNOWAIT leaves the child waitable.
    let (rc, found) = unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | flags,
        );
        (rc, info.si_pid() != 0)
    };
    if rc == 0 {
        return Ok(found);
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::Interrupted {
        return Ok(false);
    }
    Err(e)
}

/// The files named as recordings of other processes beside `out` (`OUT.<pid>`, and
/// `OUT.<pid>.<n>`), with the pid their name gives, by pid and `n`.
fn other_recordings(out: &Path) -> Vec<(u32, PathBuf)> {
    use std::os::unix::ffi::OsStrExt;
    let (Some(dir), Some(name)) = (out.parent(), out.file_name().map(|n| n.as_bytes())) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, u32, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let file = entry.file_name();
            let suffix = file.as_bytes().strip_prefix(name)?.strip_prefix(b".")?;
            let suffix = std::str::from_utf8(suffix).ok()?;
            let (pid, n) = match suffix.split_once('.') {
                Some((pid, n)) => (number(pid)?, number(n)?),
                None => (number(suffix)?, 0),
            };
            Some((pid, n, entry.path()))
        })
        .collect();
    found.sort();
    found
        .into_iter()
        .map(|(pid, _, path)| (pid, path))
        .collect()
}

/// `digits` as a number, when it is only ASCII digits.
fn number(digits: &str) -> Option<u32> {
    digits
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| digits.parse().ok())?
}

/// `out` with `pid` for each `%p` in its file name (as the shim names its recording).
fn with_pid(out: &Path, pid: u32) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let bytes = out.as_os_str().as_bytes();
    if !bytes.windows(2).any(|w| w == b"%p") {
        return out.to_path_buf();
    }
    let mut named = Vec::with_capacity(bytes.len() + 10);
    let mut rest = bytes;
    while let Some(at) = rest.windows(2).position(|w| w == b"%p") {
        named.extend_from_slice(&rest[..at]);
        named.extend_from_slice(pid.to_string().as_bytes());
        rest = &rest[at + 2..];
    }
    named.extend_from_slice(rest);
    PathBuf::from(std::ffi::OsStr::from_bytes(&named))
}

/// With one `%p` in the file name of `pattern`, the files beside it named so for some pid,
/// with that pid, by pid; none without.
fn pid_recordings(pattern: &Path) -> Vec<(u32, PathBuf)> {
    use std::os::unix::ffi::OsStrExt;
    let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
        return Vec::new();
    };
    let name = name.as_bytes();
    let Some(at) = name.windows(2).position(|w| w == b"%p") else {
        return Vec::new();
    };
    let (prefix, suffix) = (&name[..at], &name[at + 2..]);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u32, PathBuf)> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let file = entry.file_name();
            let pid = file.as_bytes().strip_prefix(prefix)?.strip_suffix(suffix)?;
            Some((number(std::str::from_utf8(pid).ok()?)?, entry.path()))
        })
        .collect();
    found.sort();
    found
}

/// Whether `path` is a regular file (not followed through a link) that starts with a
/// recording's magic.
fn starts_as_recording(path: &Path) -> bool {
    if !std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file()) {
        return false;
    }
    let mut magic = [0u8; MAGIC.len()];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok()
        && &magic == MAGIC
}

/// The pid in a recording's header and the wall clock at its start (`None` for a file that is
/// not a recording, or one without a start time).
fn recording_start(path: &Path) -> Option<(u32, u64)> {
    let file = std::fs::File::open(path).ok()?;
    let mut head = Vec::new();
    file.take((FILE_HEADER_LEN + 4 + MAX_PROCESS_BLOCK) as u64)
        .read_to_end(&mut head)
        .ok()?;
    let header = FileHeader::decode(&head).ok()?;
    if decode_header(&head).ok()? < 2 {
        return None;
    }
    let (process, _) = ProcessInfo::decode(head.get(FILE_HEADER_LEN..)?).ok()?;
    Some((header.pid, process.wall_start_ns?))
}

/// `time` in ns since the Unix epoch (0 before it).
fn wall_ns(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64)
}

/// One line about the recording.
fn summary(path: &Path) -> String {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(_) => {
            return format!(
                "no recording written to {} (no CUDA memory calls seen)",
                path.display()
            )
        }
    };
    match decode_recording(&bytes) {
        Ok(recording) => {
            let s = Summary::of(&recording);
            let mut dropped = match recording.dropped {
                Some(0) => String::new(),
                Some(n) => format!(", {} dropped", count(n, "event", "events")),
                None => ", recording cut short".to_string(),
            };
            if recording.delayed > 0 {
                dropped.push_str(&format!(
                    ", {} delayed (the program waited for the writer)",
                    count(recording.delayed, "event", "events")
                ));
            }
            format!(
                "recorded {} to {} ({}, {}, {} out-of-memory); peak live device memory \
                 {}{dropped}",
                count(s.calls, "call", "calls"),
                path.display(),
                count(s.allocations, "allocation", "allocations"),
                count(s.frees, "free", "frees"),
                s.ooms,
                Bytes(s.peak)
            )
        }
        Err(e) => format!("cannot read the recording {}: {e}", path.display()),
    }
}

/// Counts and peak of a recording, by the one walk over driver records
/// (`source::driver_state`): device memory is allocations and `cuMemCreate` physical memory;
/// managed memory, mappings and reserved address space are not in the peak.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Driver calls recorded (NVML samples are not calls).
    pub calls: u64,
    /// Device and managed allocations and handles made, and those freed or released.
    pub allocations: u64,
    pub frees: u64,
    pub ooms: u64,
    /// The most device memory held on all devices together.
    pub peak: u64,
}

impl Summary {
    pub fn of(recording: &Recording) -> Summary {
        let mut state = DriverState::<()>::default();
        let mut calls = 0;
        for r in &recording.records {
            if r.kind != Kind::NvmlSample {
                calls += 1;
            }
            state.apply(r, &mut ());
        }
        let counts = state.counts();
        Summary {
            calls,
            allocations: counts.allocations,
            frees: counts.frees,
            ooms: counts.ooms,
            peak: state.peak(),
        }
    }
}
