//! `memprof run --torch`: a private directory holding `torch_hook.py` as `sitecustomize.py`, put
//! first on the command's `PYTHONPATH`, and where its out-of-memory snapshots go (see the
//! Python file for what it does inside the program).

use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The hook Python imports at start-up.
const HOOK: &str = include_str!("torch_hook.py");

/// The hook's directory; removed when dropped.
pub struct TorchHook {
    dir: PathBuf,
}

impl TorchHook {
    /// Makes a fresh directory (never one that already exists) under the temporary directory.
    pub fn create() -> anyhow::Result<TorchHook> {
        let base = std::env::temp_dir();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = base.join(format!("memprof-torch-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let hook = TorchHook { dir };
        let file = hook.dir.join("sitecustomize.py");
        std::fs::write(&file, HOOK).with_context(|| format!("cannot write {}", file.display()))?;
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
        let dir = hook.dir.clone();
        drop(hook);
        assert!(!dir.exists(), "removed when done");
    }
}
