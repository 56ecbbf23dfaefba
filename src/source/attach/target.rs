//! What a process is, before anything is injected into it: its Python version and build (from
//! its executable's name or the libpython it maps), and whether this process may ptrace it
//! (Yama's `ptrace_scope`, CAP_SYS_PTRACE). Pure functions over /proc texts, plus the reads.

use std::path::Path;

/// The Python a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonVersion {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for PythonVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// How memprof can run code in a Python of this version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// 3.8 to 3.13: gdb queues a call (`source::attach::gdb`).
    Gdb,
    /// 3.14 and later: CPython's remote debugging protocol (`source::attach::remote_debug`).
    RemoteDebug,
}

impl PythonVersion {
    /// The mechanism for this version, or why there is none.
    pub fn mechanism(self) -> Result<Mechanism, String> {
        match (self.major, self.minor) {
            (3, 8..=13) => Ok(Mechanism::Gdb),
            (3, 14..) => Ok(Mechanism::RemoteDebug),
            _ => Err(format!(
                "Python {self} is not supported (attach supports Python 3.8 and later)"
            )),
        }
    }
}

/// `python3.11` (or `libpython3.11.so.1.0`) -> 3.11, with whether the name marks a free-threaded
/// build (`python3.13t`).
fn version_in_name(name: &str, prefix: &str) -> Option<(PythonVersion, bool)> {
    let rest = name.strip_prefix(prefix)?;
    let (major, rest) = rest.split_once('.')?;
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let minor = rest.get(..digits)?.parse().ok()?;
    let threaded = rest[digits..].starts_with('t');
    Some((
        PythonVersion {
            major: major.parse().ok()?,
            minor,
        },
        threaded,
    ))
}

/// The Python of a process from its executable's path and its memory map text: a mapped
/// `libpython3.X` wins (an embedding program, or a Python linked to its shared library), else an
/// executable named `python3.X`. Err says why it is not one memprof can attach to.
pub fn python_of(exe: &str, maps: &str) -> Result<PythonVersion, String> {
    let from_maps = maps
        .lines()
        .filter_map(|line| line.rsplit('/').next())
        .find_map(|file| version_in_name(file, "libpython"));
    let base = exe.rsplit('/').next().unwrap_or(exe);
    let found = from_maps.or_else(|| version_in_name(base, "python"));
    match found {
        Some((version, false)) => Ok(version),
        Some((version, true)) => Err(format!(
            "free-threaded Python {version}t is not supported (no GIL to hold while memprof's code runs)"
        )),
        None if base.starts_with("python") => Err(format!(
            "cannot tell which Python {exe} is (its name has no version and it maps no libpython)"
        )),
        None => Err(format!(
            "not a Python process (its executable is {exe} and it maps no libpython)"
        )),
    }
}

/// Reads /proc/PID/exe and /proc/PID/maps under `proc_root` and finds its Python.
pub fn python_of_pid(proc_root: &Path, pid: u32) -> Result<PythonVersion, String> {
    let dir = proc_root.join(pid.to_string());
    let exe = std::fs::read_link(dir.join("exe"))
        .map_err(|e| format!("cannot read /proc/{pid}/exe ({e})"))?;
    let maps = std::fs::read_to_string(dir.join("maps"))
        .map_err(|e| format!("cannot read /proc/{pid}/maps ({e})"))?;
    python_of(&exe.to_string_lossy(), &maps)
}

const CAP_SYS_PTRACE: u32 = 19;

/// Whether the `CapEff:` line of a /proc status text holds CAP_SYS_PTRACE.
pub fn has_ptrace_capability(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_PTRACE) != 0)
}

/// Whether Yama (`ptrace_scope`, None when Yama is absent) lets a process with or without
/// CAP_SYS_PTRACE attach to a process that is not its descendant; Err is the one-line refusal.
pub fn ptrace_allowed(scope: Option<u32>, capable: bool) -> Result<(), String> {
    let fix = "run memprof as root, or set /proc/sys/kernel/yama/ptrace_scope to 0";
    match scope {
        None | Some(0) => Ok(()),
        Some(1) | Some(2) if capable => Ok(()),
        Some(1) => Err(format!(
            "ptrace is not permitted: Yama's ptrace_scope is 1 (only a parent may attach) and memprof has no CAP_SYS_PTRACE; {fix}"
        )),
        Some(2) => Err(
            "ptrace is not permitted: Yama's ptrace_scope is 2 (admin only) and memprof has no CAP_SYS_PTRACE (a container needs --cap-add SYS_PTRACE); run memprof as root"
                .to_owned(),
        ),
        Some(scope) => Err(format!(
            "ptrace is not permitted: Yama's ptrace_scope is {scope} (no process may attach) until the next boot"
        )),
    }
}

/// The Yama check for this process, from /proc.
pub fn check_ptrace(proc_root: &Path) -> Result<(), String> {
    let scope = std::fs::read_to_string(proc_root.join("sys/kernel/yama/ptrace_scope"))
        .ok()
        .and_then(|text| text.trim().parse().ok());
    let status = std::fs::read_to_string(proc_root.join("self/status")).unwrap_or_default();
    ptrace_allowed(scope, has_ptrace_capability(&status))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> PythonVersion {
        PythonVersion { major, minor }
    }

    #[test]
    fn finds_the_version_from_the_executable_or_libpython() {
        assert_eq!(python_of("/usr/bin/python3.11", ""), Ok(v(3, 11)));
        let maps = "7f00-7f10 r-xp 0 08:01 5 /opt/conda/lib/libpython3.9.so.1.0\n";
        assert_eq!(python_of("/usr/bin/uwsgi", maps), Ok(v(3, 9)));
        assert_eq!(python_of("/usr/bin/python3", maps), Ok(v(3, 9)));
        assert_eq!(python_of("/x/python3.14", ""), Ok(v(3, 14)));
        assert!(python_of("/x/python3.13t", "")
            .expect_err("refused")
            .starts_with("free-threaded Python 3.13t"));
        assert_eq!(
            python_of(
                "/usr/bin/sleep",
                "7f00-7f10 r-xp 0 08:01 5 /usr/lib/libc.so.6\n"
            ),
            Err(
                "not a Python process (its executable is /usr/bin/sleep and it maps no libpython)"
                    .to_owned()
            )
        );
        assert!(python_of("/usr/bin/python", "")
            .expect_err("refused")
            .starts_with("cannot tell"));
    }

    #[test]
    fn versions_pick_their_mechanism() {
        assert_eq!(v(3, 8).mechanism(), Ok(Mechanism::Gdb));
        assert_eq!(v(3, 13).mechanism(), Ok(Mechanism::Gdb));
        assert_eq!(v(3, 14).mechanism(), Ok(Mechanism::RemoteDebug));
        assert!(v(3, 7).mechanism().is_err());
        assert!(v(2, 7).mechanism().is_err());
    }

    #[test]
    fn yama_and_the_capability_decide_ptrace() {
        let with = "Name:\tx\nCapEff:\t000001fffeffffff\n";
        let without = "Name:\tx\nCapEff:\t0000000000000000\n";
        assert!(has_ptrace_capability(with));
        assert!(!has_ptrace_capability(without));
        assert!(ptrace_allowed(None, false).is_ok());
        assert!(ptrace_allowed(Some(0), false).is_ok());
        assert!(ptrace_allowed(Some(1), true).is_ok());
        assert!(ptrace_allowed(Some(1), false)
            .expect_err("refused")
            .contains("ptrace_scope is 1"));
        assert!(ptrace_allowed(Some(2), false)
            .expect_err("refused")
            .contains("SYS_PTRACE"));
        assert!(ptrace_allowed(Some(3), true)
            .expect_err("refused")
            .contains("ptrace_scope is 3"));
    }
}
