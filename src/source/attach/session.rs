//! One attach session with a Python job: the folder memprof makes for it (mode 0700, owned by
//! the job's user, under the job's own /tmp), the injection of the bootstrap, the connection to
//! the agent (`agent.py`) and its requests, and detaching: the agent puts the job back as it was
//! and memprof removes the folder. Dropping a session detaches too.

use super::target::{self, Mechanism};
use super::{gdb, remote_debug, symbols::Functions};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The agent's source, run inside the job.
const AGENT: &str = include_str!("agent.py");

/// How long one request may take in the job (a snapshot of a large job takes seconds).
const ANSWER_WAIT: Duration = Duration::from_secs(300);

/// What the agent said about the job when it started.
#[derive(Debug, Clone)]
pub struct Hello {
    pub python: String,
    /// PyTorch's version, when the job imported it.
    pub torch: Option<String>,
    pub cuda_initialized: bool,
    /// `torch.cuda.get_allocator_backend()`: `native` or `cudaMallocAsync`.
    pub backend: Option<String>,
}

/// A connected agent in a job.
pub struct Session {
    pid: u32,
    /// The folder as memprof sees it (through /proc/PID/root when the job has another root).
    folder: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    detached: bool,
    pub hello: Hello,
    /// The longest time one request ran in the job so far (microseconds, the agent's own count).
    pub longest_held_us: u64,
}

/// A Python string literal of `text` (which memprof made: ASCII without quotes or backslashes).
fn py_str(text: &str) -> Result<String, String> {
    if text
        .chars()
        .all(|c| c.is_ascii_graphic() && c != '\'' && c != '\\')
    {
        Ok(format!("'{text}'"))
    } else {
        Err(format!(
            "the folder {text} has characters memprof does not put in Python text"
        ))
    }
}

/// The text queued in the job: read the agent from `dir` and run it with the folder's name,
/// never letting an exception out (a pending call that fails would break the job's next
/// bytecode). It binds no name in `__main__`, where `PyRun_SimpleString` runs.
pub fn bootstrap(dir: &str) -> Result<String, String> {
    let agent = py_str(&format!("{dir}/agent.py"))?;
    let dir = py_str(dir)?;
    Ok(format!(
        "try:\n exec(compile((lambda f: (f.read(), f.close())[0])(open({agent}, 'rb')), {agent}, 'exec'), {{'__name__': '__memprof_attach__', '__memprof_dir__': {dir}}})\nexcept BaseException:\n pass\n"
    ))
}

/// `(uid, gid)` of a /proc status text's real ids.
fn owner(status: &str) -> Option<(u32, u32)> {
    let id = |key: &str| -> Option<u32> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((id("Uid:")?, id("Gid:")?))
}

/// A name nobody else picks: the time and this process's id, hashed with std's random keys.
fn unique_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// Makes the folder for the job in its /tmp: `(as memprof sees it, as the job sees it)`.
fn make_folder(pid: u32) -> Result<(PathBuf, String), String> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let status = std::fs::read_to_string(proc_dir.join("status"))
        .map_err(|e| format!("cannot read /proc/{pid}/status ({e})"))?;
    let (uid, gid) = owner(&status).ok_or(format!("no Uid line in /proc/{pid}/status"))?;
    // The job's /tmp: ours unless it has another root (a container, a chroot).
    let same_root = std::fs::read_link(proc_dir.join("root")).is_ok_and(|r| r == Path::new("/"));
    let tmp = if same_root {
        PathBuf::from("/tmp")
    } else {
        proc_dir.join("root/tmp")
    };
    for _ in 0..8 {
        let name = format!("memprof-attach-{pid}-{:016x}", unique_suffix());
        let mine = tmp.join(&name);
        match std::fs::DirBuilder::new().mode(0o700).create(&mine) {
            Ok(()) => {
                // SAFETY: geteuid has no preconditions.
                if unsafe { libc::geteuid() } == 0 && uid != 0 {
                    std::os::unix::fs::chown(&mine, Some(uid), Some(gid)).map_err(|e| {
                        let _ = std::fs::remove_dir(&mine);
                        format!("cannot give {} to uid {uid} ({e})", mine.display())
                    })?;
                }
                return Ok((mine, format!("/tmp/{name}")));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot make a folder in {} ({e})", tmp.display())),
        }
    }
    Err(format!("cannot make a fresh folder in {}", tmp.display()))
}

/// Writes `bytes` to a new file `name` in the folder, readable by its owner only.
fn write_file(folder: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, String> {
    let path = folder.join(name);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot write {} ({e})", path.display()))?;
    file.write_all(bytes)
        .map_err(|e| format!("cannot write {} ({e})", path.display()))?;
    let meta = std::fs::metadata(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && meta.uid() != 0 {
        std::os::unix::fs::chown(&path, Some(meta.uid()), Some(meta.gid()))
            .map_err(|e| format!("cannot give {} to its owner ({e})", path.display()))?;
    }
    Ok(path)
}

/// Queues the bootstrap in `pid` by the mechanism its Python takes.
fn inject(pid: u32, mechanism: Mechanism, folder: &Path, job_dir: &str) -> Result<(), String> {
    let text = bootstrap(job_dir)?;
    match mechanism {
        Mechanism::Gdb => {
            let mut bytes = text.into_bytes();
            bytes.push(0);
            let text_file = write_file(folder, "boot.bin", &bytes)?;
            let functions = Functions::of(pid)?;
            gdb::check_calls_work()?;
            let script = write_file(
                folder,
                "inject.gdb",
                gdb::script(pid, &functions, &text_file).as_bytes(),
            )?;
            gdb::run(pid, &script)
        }
        Mechanism::RemoteDebug => {
            write_file(folder, "boot.py", text.as_bytes())?;
            remote_debug::inject(pid, &format!("{job_dir}/boot.py"))
        }
    }
}

impl Session {
    /// Injects the agent into `pid` and connects to it, waiting up to `wait` for the job to run
    /// it (it runs at the job's next bytecode; a job stuck in one long C call runs it later).
    /// `stop` ends the wait early (Ctrl-C). Err is the one-line reason; nothing is left in the
    /// job then but a queued call that finds no folder and does nothing.
    pub fn open(pid: u32, wait: Duration, stop: &AtomicBool) -> Result<Session, String> {
        target::check_ptrace(Path::new("/proc"))?;
        let version = target::python_of_pid(Path::new("/proc"), pid)
            .map_err(|why| format!("PID {pid}: {why}"))?;
        let mechanism = version
            .mechanism()
            .map_err(|why| format!("PID {pid}: {why}"))?;
        let (folder, job_dir) = make_folder(pid)?;
        let connected = write_file(&folder, "agent.py", AGENT.as_bytes())
            .and_then(|_| inject(pid, mechanism, &folder, &job_dir))
            .and_then(|()| connect(pid, &folder, wait, stop));
        let stream = match connected {
            Ok(stream) => stream,
            Err(why) => {
                let _ = std::fs::remove_dir_all(&folder);
                return Err(why);
            }
        };
        // The agent is running: what it was read from is no longer needed.
        for name in ["agent.py", "boot.bin", "boot.py", "inject.gdb"] {
            let _ = std::fs::remove_file(folder.join(name));
        }
        let writer = stream
            .try_clone()
            .map_err(|e| format!("agent socket: {e}"))?;
        let mut session = Session {
            pid,
            folder,
            reader: BufReader::new(stream),
            writer,
            detached: false,
            hello: Hello {
                python: version.to_string(),
                torch: None,
                cuda_initialized: false,
                backend: None,
            },
            longest_held_us: 0,
        };
        let hello = session.request(json!({"cmd": "hello"}))?;
        session.hello = Hello {
            python: version.to_string(),
            torch: hello["torch"].as_str().map(str::to_owned),
            cuda_initialized: hello["cuda_initialized"].as_bool().unwrap_or(false),
            backend: hello["backend"].as_str().map(str::to_owned),
        };
        Ok(session)
    }

    /// Sends one request and reads its answer; an `error` answer is Err.
    pub fn request(&mut self, request: Value) -> Result<Value, String> {
        let pid = self.pid;
        let lost = |e: std::io::Error| format!("lost the connection to PID {pid} ({e})");
        let mut line = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.writer.write_all(&line).map_err(lost)?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer).map_err(lost)? == 0 {
            return Err(format!("PID {pid} closed the connection (did it exit?)"));
        }
        let answer: Value = serde_json::from_str(&answer)
            .map_err(|e| format!("PID {pid} answered something that is not JSON ({e})"))?;
        if let Some(held) = answer["held_us"].as_u64() {
            self.longest_held_us = self.longest_held_us.max(held);
        }
        match answer["error"].as_str() {
            Some(error) => Err(format!(
                "in PID {pid}: {}",
                crate::report::terminal_text::terminal_lines(error).trim_end()
            )),
            None => Ok(answer),
        }
    }

    /// Moves a file the agent wrote in the folder (`path` as the job named it) to `to`.
    pub fn take(&self, path: &str, to: &Path) -> Result<(), String> {
        let name = Path::new(path)
            .file_name()
            .ok_or_else(|| format!("the agent named no file ({path})"))?;
        let from = self.folder.join(name);
        if std::fs::rename(&from, to).is_err() {
            std::fs::copy(&from, to)
                .map_err(|e| format!("cannot copy {} to {} ({e})", from.display(), to.display()))?;
            let _ = std::fs::remove_file(&from);
        }
        Ok(())
    }

    /// Moves the file `name` the agent left in the folder to `to`, if it is there: what an
    /// out-of-memory observer wrote before the job died of the error. False when absent.
    pub fn take_left(&self, name: &str, to: &Path) -> Result<bool, String> {
        if !self.folder.join(name).is_file() {
            return Ok(false);
        }
        self.take(name, to).map(|()| true)
    }

    /// Puts the job back as it was (history, the OOM observer, imports) and removes the folder;
    /// returns what the agent restored.
    pub fn detach(mut self) -> Result<Value, String> {
        self.detached = true;
        let answer = self.request(json!({"cmd": "detach"}));
        let _ = std::fs::remove_dir_all(&self.folder);
        answer.map(|a| a["restored"].clone())
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.detached {
            let _ = self.request(json!({"cmd": "detach"}));
            let _ = std::fs::remove_dir_all(&self.folder);
        }
    }
}

/// Connects to the agent's socket once it listens; Err when `wait` passes, the job ends, or
/// `stop` is set.
fn connect(
    pid: u32,
    folder: &Path,
    wait: Duration,
    stop: &AtomicBool,
) -> Result<UnixStream, String> {
    let socket = folder.join("agent.sock");
    let start = Instant::now();
    loop {
        if let Ok(stream) = UnixStream::connect(&socket) {
            stream
                .set_read_timeout(Some(ANSWER_WAIT))
                .map_err(|e| e.to_string())?;
            return Ok(stream);
        }
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return Err(format!("PID {pid} ended before memprof's code ran in it"));
        }
        if stop.load(Ordering::Relaxed) {
            return Err("interrupted before the job ran memprof's code".to_owned());
        }
        if start.elapsed() > wait {
            return Err(format!(
                "PID {pid} ran no Python bytecode on its main thread for {} s, so memprof's code did not start (a job blocked in one long C call or waiting for input runs it only when it gets back to Python); try again, or give --wait SECS",
                wait.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bootstrap_names_the_folder_and_refuses_odd_characters() {
        let text = bootstrap("/tmp/memprof-attach-7-00ff").expect("bootstrap");
        assert!(text.starts_with("try:\n exec(compile("));
        assert!(text.contains("open('/tmp/memprof-attach-7-00ff/agent.py', 'rb')"));
        assert!(text.contains("'__memprof_dir__': '/tmp/memprof-attach-7-00ff'"));
        assert!(text.ends_with("except BaseException:\n pass\n"));
        assert!(bootstrap("/tmp/it's").is_err());
        assert!(bootstrap("/tmp/a b").is_err());
    }

    #[test]
    fn owner_reads_the_real_ids() {
        let status = "Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t100\t0\t0\t0\n";
        assert_eq!(owner(status), Some((1000, 100)));
        assert_eq!(owner("Name:\tx\n"), None);
    }
}
