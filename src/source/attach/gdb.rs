//! Queues memprof's bootstrap in a Python 3.8-3.13 process through gdb, as memray's `attach`
//! does, but with one call instead of running code under a stopped thread: gdb attaches, maps
//! one page with the job's `mmap`, copies the bootstrap text into it, and calls
//! `Py_AddPendingCall(PyRun_SimpleString, page)`, then detaches. The job is stopped only for
//! those two calls. Python then runs the text on its main thread, at its next check between
//! bytecodes, holding the GIL, exactly where it runs a signal handler; nothing runs at a point
//! the interpreter did not choose.
//!
//! Why gdb and not a ptrace injector of memprof's own: an inferior call has to save and restore
//! every register (the vector ones too), align the stack below the red zone, restart a system
//! call the thread was stopped in, and survive a signal arriving meanwhile. gdb does all of that
//! and has for decades; with `unwindonsignal` a call it has to interrupt is unwound, leaving the
//! thread as it was. Our own injector would save one process start (~0.1 s, not while the job is
//! stopped) at the price of all that code. The addresses are resolved by memprof
//! (`symbols.rs`), so gdb loads no symbol table while the job is stopped.
//!
//! A signal that reaches the job while gdb holds it is passed on as it arrives (`handle all
//! nostop noprint pass`): Python's handler only sets a flag, which the called function does not
//! mind, and the job's own SIGUSR1 or SIGTERM is not lost. SIGINT and SIGTRAP stay gdb's (a
//! SIGINT arriving in those milliseconds is taken by gdb, not the job).
//!
//! `Py_AddPendingCall` needs neither the GIL nor a thread state (CPython's docs), takes only the
//! interpreter's pending-call lock, and `mmap` is a bare system call: neither can deadlock on a
//! lock the stopped thread holds, except in the few instructions where the main thread itself
//! pops a pending call; gdb then never returns, memprof interrupts it after `GDB_WAIT`, and gdb
//! unwinds the call.

use super::symbols::Functions;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long gdb may take from start to detach before memprof interrupts it.
const GDB_WAIT: Duration = Duration::from_secs(20);

/// The gdb command file for queuing the text at `text_file` (NUL-terminated, under a page).
pub fn script(pid: u32, f: &Functions, text_file: &Path) -> String {
    format!(
        "set confirm off\n\
         set pagination off\n\
         set unwindonsignal on\n\
         set print thread-events off\n\
         handle all nostop noprint pass\n\
         attach {pid}\n\
         set $p = (char *) ((void *(*)(void *, unsigned long, int, int, int, long)) {mmap:#x})(0, 4096, 3, 34, -1, 0)\n\
         if $p == (char *) -1\n\
         \x20 printf \"MEMPROF mmap failed\\n\"\n\
         else\n\
         \x20 restore {text} binary $p\n\
         \x20 set $r = ((int (*)(void *, void *)) {add:#x})((void *) {run:#x}, (void *) $p)\n\
         \x20 printf \"MEMPROF queued %d\\n\", $r\n\
         end\n\
         detach\n",
        mmap = f.mmap,
        add = f.add_pending_call,
        run = f.run_simple_string,
        text = text_file.display(),
    )
}

/// What gdb's output says happened; Err is the one-line reason.
pub fn outcome(pid: u32, output: &str) -> Result<(), String> {
    if output.contains("MEMPROF queued 0") {
        return Ok(());
    }
    if output.contains("ptrace: Operation not permitted") {
        return Err(format!(
            "ptrace is not permitted on PID {pid} (another user's process, a container without SYS_PTRACE, Yama's ptrace_scope, or a process that made itself undumpable)"
        ));
    }
    if output.contains("MEMPROF queued -1") {
        return Err(format!(
            "Python in PID {pid} refused the call (its queue of pending calls is full); try again"
        ));
    }
    if output.contains("MEMPROF mmap failed") {
        return Err(format!("could not map a page in PID {pid}"));
    }
    if output.contains(REGISTERS_NOT_WRITTEN) {
        return Err(format!(
            "gdb could not set the registers of PID {pid} to make its call (\"{REGISTERS_NOT_WRITTEN}\": this gdb and this kernel disagree on the size of the CPU's extended register state); check that the job still runs"
        ));
    }
    let last = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output");
    Err(format!(
        "gdb could not queue memprof's call in PID {pid}: {}",
        crate::report::terminal_text::terminal_lines(last).trim_end()
    ))
}

/// What a gdb that cannot set a stopped thread's registers prints: some gdb builds and kernels
/// disagree on the size of the CPU's extended register state (seen on Intel CPUs with AMX).
/// Such a failed call can leave the thread's interrupted system call broken, so it is found on
/// a process of memprof's own before gdb stops the job.
const REGISTERS_NOT_WRITTEN: &str = "Couldn't write extended state status";

/// Tries gdb's call on a throwaway `sleep` of memprof's own, before gdb stops the job: Err when
/// gdb cannot set the registers of a process on this machine. Anything else that goes wrong
/// with the trial (no `sleep`, ptrace refused between two children of memprof) tells nothing,
/// and the attach goes on to meet it, or not, on the job itself.
pub fn check_calls_work() -> Result<(), String> {
    let Ok(mut sleeper) = Command::new("sleep")
        .arg("20")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return Ok(());
    };
    let trial = Command::new("gdb")
        .args(["-batch", "-nx", "-nh"])
        .args(["-iex", "set auto-load off"])
        .args(["-iex", "set debuginfod enabled off"])
        .args(["-p", &sleeper.id().to_string()])
        .args(["-ex", "call (int)getpid()"])
        .stdin(Stdio::null())
        .output();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let Ok(trial) = trial else {
        // No gdb: `run` says so.
        return Ok(());
    };
    let text = String::from_utf8_lossy(&trial.stdout) + String::from_utf8_lossy(&trial.stderr);
    if text.contains(REGISTERS_NOT_WRITTEN) {
        return Err(not_written());
    }
    Ok(())
}

/// The reason given when gdb cannot set a thread's registers here.
fn not_written() -> String {
    format!(
        "gdb cannot set a thread's registers on this machine (\"{REGISTERS_NOT_WRITTEN}\": this gdb and this kernel disagree on the size of the CPU's extended register state, as on Intel CPUs with AMX), so the job was not touched; a gdb of another version may not"
    )
}

/// Runs gdb with `script_file`; gdb runs in a process group of its own, so a Ctrl-C in the
/// terminal never reaches it in the middle of a call.
pub fn run(pid: u32, script_file: &Path) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new("gdb")
        .args(["-batch", "-nx", "-nh"])
        .args(["-iex", "set auto-load off"])
        .args(["-iex", "set auto-solib-add off"])
        .args(["-iex", "set debuginfod enabled off"])
        .arg("-x")
        .arg(script_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                "gdb is not installed: attaching to a Python job runs it (apt-get install gdb)"
                    .to_owned()
            }
            _ => format!("cannot start gdb ({e})"),
        })?;
    let start = Instant::now();
    let mut interrupted = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if !interrupted && start.elapsed() > GDB_WAIT => {
                // gdb unwinds the call it is in (`unwindonsignal`) and detaches.
                // SAFETY: kill(2) on our own child, which has not been reaped (try_wait said so).
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
                interrupted = true;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for gdb: {e}")),
        }
    };
    let mut output = String::new();
    for stream in [
        child.stdout.take().map(|s| Box::new(s) as Box<dyn Read>),
        child.stderr.take().map(|s| Box::new(s) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut stream = stream;
        let _ = stream.read_to_string(&mut output);
    }
    if interrupted {
        return Err(format!(
            "gdb did not finish within {} s and was interrupted; PID {pid} was left as it was",
            GDB_WAIT.as_secs()
        ));
    }
    outcome(pid, &output).map_err(|e| {
        if status.success() {
            e
        } else {
            format!("{e} (gdb exited with {status})")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_calls_the_resolved_addresses() {
        let f = Functions {
            add_pending_call: 0x7f00_0000_1000,
            run_simple_string: 0x7f00_0000_2000,
            mmap: 0x7f00_0000_3000,
        };
        let text = script(42, &f, Path::new("/tmp/d/boot.bin"));
        assert!(text.contains("handle all nostop noprint pass\nattach 42\n"));
        assert!(text.contains("long)) 0x7f0000003000)(0, 4096, 3, 34, -1, 0)"));
        assert!(text.contains("  restore /tmp/d/boot.bin binary $p\n"));
        assert!(text.contains("0x7f0000001000)((void *) 0x7f0000002000, (void *) $p)"));
        assert!(text.ends_with("detach\n"));
    }

    #[test]
    fn gdb_output_becomes_one_line() {
        assert_eq!(
            outcome(7, "x\nMEMPROF queued 0\n[Inferior 1 detached]"),
            Ok(())
        );
        assert!(outcome(7, "ptrace: Operation not permitted.\n")
            .expect_err("refused")
            .starts_with("ptrace is not permitted on PID 7"));
        assert!(outcome(7, "MEMPROF queued -1\n")
            .expect_err("refused")
            .contains("full"));
        assert!(outcome(
            7,
            "Couldn't write extended state status: Bad address.\n(gdb exited with exit status: 1)"
        )
        .expect_err("refused")
        .starts_with("gdb could not set the registers of PID 7"));
        assert_eq!(
            outcome(7, "warning: x\nCannot access memory at address 0x10\n\n"),
            Err(
                "gdb could not queue memprof's call in PID 7: Cannot access memory at address 0x10"
                    .to_owned()
            )
        );
    }
}
