//! NVML's process IDs seen through this machine's /proc: the command line of the process NVML
//! reports, where /proc can show it.
//!
//! NVML reports PIDs of the host's (initial) PID namespace. When this process runs in that
//! namespace they are /proc's PIDs as they are, and the command line is read from
//! /proc/PID/cmdline. Inside a container's PID namespace the host PIDs are not visible at all
//! (/proc/PID/status `NSpid` lists a process's PIDs from /proc's namespace inwards, never
//! outwards), so the PID is left as NVML reported it and the command is `None`: a PID that
//! happens to exist in the container would be a different process.

use std::path::{Path, PathBuf};

/// The inode number the kernel gives the initial PID namespace (PROC_PID_INIT_INO).
const INITIAL_PID_NAMESPACE: &str = "pid:[4026531836]";

/// What a `/proc` tree can tell about NVML's PIDs.
#[derive(Clone, Debug)]
pub struct ProcView {
    root: PathBuf,
    host_namespace: bool,
}

impl ProcView {
    /// This machine's /proc; whether we share the host's PID namespace is read from
    /// /proc/self/ns/pid.
    pub fn system() -> Self {
        let root = PathBuf::from("/proc");
        let host_namespace = std::fs::read_link(root.join("self/ns/pid"))
            .is_ok_and(|link| link.as_os_str() == INITIAL_PID_NAMESPACE);
        Self {
            root,
            host_namespace,
        }
    }

    /// A /proc tree at `root`, in the host's PID namespace or not.
    pub fn new(root: &Path, host_namespace: bool) -> Self {
        Self {
            root: root.to_path_buf(),
            host_namespace,
        }
    }

    /// Whether NVML's PIDs are this /proc's.
    pub fn host_namespace(&self) -> bool {
        self.host_namespace
    }

    /// The command line of the process NVML calls `nvml_pid`: /proc/PID/cmdline with its NUL
    /// separators as spaces; `None` outside the host's PID namespace, or when it cannot be read
    /// or is empty (a zombie, or a process that exited).
    pub fn command(&self, nvml_pid: u32) -> Option<String> {
        if !self.host_namespace {
            return None;
        }
        let pid = nvml_pid;
        let bytes = std::fs::read(self.root.join(pid.to_string()).join("cmdline")).ok()?;
        let text: Vec<String> = bytes
            .split(|b| *b == 0)
            .filter(|part| !part.is_empty())
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect();
        (!text.is_empty()).then(|| text.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_proc(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("memprof-procfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("42")).expect("temp dir");
        std::fs::create_dir_all(dir.join("43")).expect("temp dir");
        std::fs::write(dir.join("42/cmdline"), b"python\0train.py\0--lr\x000.1\0").expect("write");
        std::fs::write(dir.join("43/cmdline"), b"").expect("write");
        dir
    }

    #[test]
    fn reads_command_lines_in_the_host_namespace() {
        let root = temp_proc("host");
        let view = ProcView::new(&root, true);
        assert_eq!(
            view.command(42).as_deref(),
            Some("python train.py --lr 0.1")
        );
        assert_eq!(view.command(43), None, "empty cmdline: a zombie");
        assert_eq!(view.command(44), None, "no such process");
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_container_namespace_never_guesses_a_command() {
        let root = temp_proc("container");
        let view = ProcView::new(&root, false);
        assert_eq!(view.command(42), None);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn our_own_command_line_is_found_on_this_machine() {
        let view = ProcView::system();
        if view.host_namespace() {
            let command = view.command(std::process::id());
            assert!(command.is_some_and(|c| !c.is_empty()));
        }
    }
}
