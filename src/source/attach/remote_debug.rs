//! Python 3.14 and later: CPython's remote debugging attachment protocol (PEP 768; the CPython
//! docs page "Remote debugging attachment protocol", docs.python.org/3/howto/remote_debugging.html).
//! `_PyRuntime` starts with `_Py_DebugOffsets`; from it memprof finds the main thread's state,
//! writes the bootstrap script's path into its `remote_debugger_support` buffer, sets its
//! `debugger_pending_call` flag and the eval breaker's please-stop bit. The interpreter runs the
//! script on its main thread at its next check between bytecodes, as `sys.remote_exec` does.
//! Nothing is stopped: the writes go through process_vm_writev, which needs the same permission
//! as ptrace.
//!
//! NOT TESTED against a real Python 3.14: none could be installed on the machines memprof was
//! built on. The field order of `_Py_DebugOffsets` below is 3.14's as published in CPython's
//! `Include/internal/pycore_debug_offsets.h`; the table's cookie and version are checked before
//! anything is written, and a mismatch refuses with one line rather than guess.

use super::symbols::{find_file, resolve};
use std::path::PathBuf;

/// How many u64 fields each group of 3.14's `_Py_DebugOffsets` has, in order, up to
/// `debugger_support`: runtime_state, interpreter_state, thread_state, interpreter_frame,
/// code_object, pyobject, type_object, tuple_object, list_object, set_object, dict_object,
/// float_object, long_object, bytes_object, unicode_object, gc, gen_object, llist_node.
const GROUPS_314: [usize; 18] = [3, 16, 9, 8, 11, 2, 4, 3, 3, 4, 3, 2, 3, 3, 4, 2, 4, 2];
/// `_PY_EVAL_PLEASE_STOP_BIT` of the eval breaker.
const PLEASE_STOP: u64 = 1 << 5;

/// The offsets the protocol uses.
#[derive(Debug, PartialEq, Eq)]
pub struct Offsets {
    pub interpreters_head: u64,
    pub threads_main: u64,
    pub eval_breaker: u64,
    pub support: u64,
    pub enabled: u64,
    pub pending_call: u64,
    pub script_path: u64,
    pub script_path_size: u64,
}

/// How many bytes of `_PyRuntime` `parse` reads.
pub const TABLE_BYTES: usize = 8 + 8 * (2 + 86 + 6);

/// Reads 3.14's table from the first bytes of `_PyRuntime`; Err when it is not one.
pub fn parse(table: &[u8]) -> Result<Offsets, String> {
    if table.len() < TABLE_BYTES || &table[..8] != b"xdebugpy" {
        return Err("its _PyRuntime does not start with CPython's debug offsets".to_owned());
    }
    let field = |i: usize| -> u64 {
        let at = 8 + 8 * i;
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&table[at..at + 8]);
        u64::from_le_bytes(bytes)
    };
    let version = field(0);
    let (major, minor) = (version >> 24, (version >> 16) & 0xff);
    if (major, minor) != (3, 14) {
        return Err(format!(
            "its debug offsets are for Python {major}.{minor}; memprof reads 3.14's (attach through gdb is used for 3.8-3.13)"
        ));
    }
    if field(1) != 0 {
        return Err("free-threaded Python is not supported".to_owned());
    }
    // Field indices: 2 + the fields of the groups before.
    let group = |n: usize| 2 + GROUPS_314[..n].iter().sum::<usize>();
    let support = group(GROUPS_314.len());
    Ok(Offsets {
        interpreters_head: field(group(0) + 2),
        threads_main: field(group(1) + 4),
        eval_breaker: field(support),
        support: field(support + 1),
        enabled: field(support + 2),
        pending_call: field(support + 3),
        script_path: field(support + 4),
        script_path_size: field(support + 5),
    })
}

/// Reads `len` bytes at `addr` of `pid`.
fn read(pid: u32, addr: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` covers `buf`, which lives until after the call; the remote range is only
    // read by the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n != len as isize {
        return Err(format!(
            "cannot read PID {pid}'s memory at {addr:#x} ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(buf)
}

/// Writes `bytes` at `addr` of `pid`.
fn write(pid: u32, addr: u64, bytes: &[u8]) -> Result<(), String> {
    let local = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: `local` covers `bytes`, only read; the kernel checks the remote range.
    let n = unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n != bytes.len() as isize {
        return Err(format!(
            "cannot write PID {pid}'s memory at {addr:#x} ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn u64_at(pid: u32, addr: u64) -> Result<u64, String> {
    let bytes = read(pid, addr, 8)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes);
    Ok(u64::from_le_bytes(word))
}

fn i32_at(pid: u32, addr: u64) -> Result<i32, String> {
    let bytes = read(pid, addr, 4)?;
    Ok(i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Asks the main thread of `pid` to run the script at `script` (a path as the job sees it).
pub fn inject(pid: u32, script: &str) -> Result<(), String> {
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let maps = std::fs::read_to_string(proc_dir.join("maps"))
        .map_err(|e| format!("cannot read /proc/{pid}/maps ({e})"))?;
    let exe = std::fs::read_link(proc_dir.join("exe"))
        .map_err(|e| format!("cannot read /proc/{pid}/exe ({e})"))?;
    let exe_name = exe.file_name().map(|n| n.to_string_lossy().into_owned());
    let (path, start) = find_file(&maps, |name| name.starts_with("libpython"))
        .or_else(|| find_file(&maps, |name| Some(name) == exe_name.as_deref()))
        .ok_or("cannot find Python's code in its memory map")?;
    let data = std::fs::read(proc_dir.join("root").join(path.trim_start_matches('/')))
        .map_err(|e| format!("cannot read {path} ({e})"))?;
    let runtime = resolve(&data, start, &["_PyRuntime"]).map_err(|e| format!("{path}: {e}"))?[0];
    let offsets =
        parse(&read(pid, runtime, TABLE_BYTES)?).map_err(|e| format!("PID {pid}: {e}"))?;
    let interp = u64_at(pid, runtime + offsets.interpreters_head)?;
    if interp == 0 {
        return Err(format!(
            "PID {pid} has no interpreter (it is starting or ending)"
        ));
    }
    if i32_at(pid, interp + offsets.enabled)? == 0 {
        return Err(format!(
            "PID {pid} turned remote debugging off (-X disable_remote_debug or PYTHON_DISABLE_REMOTE_DEBUG)"
        ));
    }
    let tstate = u64_at(pid, interp + offsets.threads_main)?;
    if tstate == 0 {
        return Err(format!("PID {pid} has no main thread state"));
    }
    let support = tstate + offsets.support;
    if i32_at(pid, support + offsets.pending_call)? != 0 {
        return Err(format!(
            "PID {pid} has a remote debugger's script pending already; try again"
        ));
    }
    let mut path = script.as_bytes().to_vec();
    if path.len() as u64 >= offsets.script_path_size {
        return Err(format!(
            "the script path {script} is too long for PID {pid}"
        ));
    }
    path.push(0);
    write(pid, support + offsets.script_path, &path)?;
    write(pid, support + offsets.pending_call, &1i32.to_le_bytes())?;
    let breaker = u64_at(pid, tstate + offsets.eval_breaker)?;
    write(
        pid,
        tstate + offsets.eval_breaker,
        &(breaker | PLEASE_STOP).to_le_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table laid out as 3.14's, each field holding its own index plus 1000.
    fn table(version: u64) -> Vec<u8> {
        let mut bytes = b"xdebugpy".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(0u64.to_le_bytes());
        for i in 2..(TABLE_BYTES - 8) / 8 {
            bytes.extend((1000 + i as u64).to_le_bytes());
        }
        bytes
    }

    #[test]
    fn reads_the_fields_the_protocol_needs_by_their_place_in_the_table() {
        let offsets = parse(&table(0x030e_00f0)).expect("3.14.0");
        // runtime_state.interpreters_head is field 2 + 2; interpreter_state.threads_main
        // 2 + 3 + 4; debugger_support starts at 2 + 86.
        assert_eq!(offsets.interpreters_head, 1004);
        assert_eq!(offsets.threads_main, 1009);
        assert_eq!(offsets.eval_breaker, 1088);
        assert_eq!(offsets.script_path_size, 1093);
    }

    #[test]
    fn refuses_another_version_or_no_table() {
        assert!(parse(&table(0x030f_00a0))
            .expect_err("refused")
            .contains("Python 3.15"));
        assert!(parse(b"not a table")
            .expect_err("refused")
            .contains("debug offsets"));
    }
}
