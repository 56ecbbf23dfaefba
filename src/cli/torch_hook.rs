//! `memprof run --torch`: a private directory holding `torch_hook.py` as `sitecustomize.py`, put
//! first on the command's `PYTHONPATH`, and where its out-of-memory snapshots go (see the
//! Python file for what it does inside the program).
//!
//! Every Python the command starts runs that file, as the command's user (root under `sudo`):
//! whoever could write it, or swap the directory, would run code there. So the directory is
//! made with a name never used before (created exclusively, a fresh name tried when one is
//! taken), mode 0700 and the file 0600 whatever the umask, and only in a temporary directory
//! that others may not write, or may write only as a sticky one (`/tmp`), where they cannot
//! rename or remove what is not theirs.

use anyhow::{bail, Context};
use std::ffi::OsString;
use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The hook Python imports at start-up.
const HOOK: &str = include_str!("torch_hook.py");

/// How many taken names are passed over before giving up.
const TRIES: u32 = 100;

/// The hook's directory; removed when dropped.
pub struct TorchHook {
    dir: PathBuf,
}

impl TorchHook {
    /// Makes a fresh directory (never one that already exists) under the temporary directory.
    pub fn create() -> anyhow::Result<TorchHook> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let stamp = format!("{}-{nanos:x}", std::process::id());
        TorchHook::create_in(&std::env::temp_dir(), &stamp)
    }

    /// Makes a fresh private directory in `base`, named after `stamp` and the number of names
    /// found taken, with the hook in it.
    fn create_in(base: &Path, stamp: &str) -> anyhow::Result<TorchHook> {
        let meta = std::fs::metadata(base)
            .with_context(|| format!("cannot use the temporary directory {}", base.display()))?;
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            bail!(
                "the temporary directory {} may be written by other users and is not sticky: they could swap the Python start-up hook (set TMPDIR to another)",
                base.display()
            );
        }
        let mut tries = 0;
        let dir = loop {
            let dir = base.join(format!("memprof-torch-{stamp}-{tries}"));
            match DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => break dir,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < TRIES => {
                    tries += 1;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create {}", dir.display()))
                }
            }
        };
        let hook = TorchHook { dir };
        // The umask could only take bits away; set exactly 0700, and 0600 on the file.
        std::fs::set_permissions(&hook.dir, Permissions::from_mode(0o700))
            .with_context(|| format!("cannot make {} private", hook.dir.display()))?;
        let file = hook.dir.join("sitecustomize.py");
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| {
                f.set_permissions(Permissions::from_mode(0o600))?;
                f.write_all(HOOK.as_bytes())
            });
        written.with_context(|| format!("cannot write {}", file.display()))?;
        Ok(hook)
    }

    /// `PYTHONPATH` for the command: the hook first, then what was there.
    pub fn python_path(&self, existing: Option<OsString>) -> OsString {
        let mut path = OsString::from(self.dir.as_os_str());
        if let Some(rest) = existing.filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(rest);
        }
        path
    }
}

impl Drop for TorchHook {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where a process's out-of-memory snapshot goes, next to the recording `out`: `OUT` without
/// its extension, then `.oom-%p.pickle` (the hook puts the process id for `%p`).
pub fn snapshot_pattern(out: &Path) -> PathBuf {
    let stem = out.file_stem().map(OsString::from).unwrap_or_default();
    let mut name = stem;
    name.push(".oom-%p.pickle");
    out.with_file_name(name)
}

/// The snapshots the hook wrote for this run, by name.
pub fn snapshots_written(out: &Path) -> Vec<PathBuf> {
    let pattern = snapshot_pattern(out);
    let name = pattern
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((prefix, suffix)) = name.split_once("%p") else {
        return Vec::new();
    };
    let dir = pattern.parent().unwrap_or(Path::new("."));
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(prefix)?.strip_suffix(suffix))
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_go_next_to_the_recording() {
        assert_eq!(
            snapshot_pattern(Path::new("/data/run.memprof")),
            Path::new("/data/run.oom-%p.pickle")
        );
        let hook = TorchHook::create().expect("created");
        assert!(hook.dir.join("sitecustomize.py").is_file());
        let path = hook.python_path(Some("/a:/b".into()));
        assert_eq!(
            path,
            OsString::from(format!("{}:/a:/b", hook.dir.display()))
        );
        assert_eq!(hook.python_path(Some("".into())), hook.dir.as_os_str());
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").mode() & 0o7777;
        assert_eq!(mode(&hook.dir), 0o700);
        assert_eq!(mode(&hook.dir.join("sitecustomize.py")), 0o600);
        let dir = hook.dir.clone();
        drop(hook);
        assert!(!dir.exists(), "removed when done");
    }

    /// A name already taken (another user's folder, or a link planted there) is never used,
    /// nor anything in it: the next one is.
    #[test]
    fn a_taken_name_is_passed_over_and_an_open_folder_refused() {
        let base = tempfile::tempdir().expect("a temporary folder");
        let planted = base.path().join("memprof-torch-7-ab-0");
        std::fs::create_dir(&planted).expect("mkdir");
        std::fs::write(planted.join("sitecustomize.py"), "import evil\n").expect("write");
        let elsewhere = base.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, base.path().join("memprof-torch-7-ab-1"))
            .expect("symlink");
        let hook = TorchHook::create_in(base.path(), "7-ab").expect("created");
        assert_eq!(hook.dir, base.path().join("memprof-torch-7-ab-2"));
        assert_eq!(
            std::fs::read_to_string(hook.dir.join("sitecustomize.py")).expect("read"),
            HOOK
        );
        assert_eq!(
            std::fs::read_to_string(planted.join("sitecustomize.py")).expect("read"),
            "import evil\n"
        );
        assert!(std::fs::read_dir(&elsewhere)
            .expect("list")
            .next()
            .is_none());
        drop(hook);

        std::fs::set_permissions(base.path(), Permissions::from_mode(0o777)).expect("chmod");
        let err = TorchHook::create_in(base.path(), "8-ab")
            .err()
            .expect("refused");
        assert!(
            err.to_string().contains("is not sticky: they could"),
            "{err}"
        );
    }
}
