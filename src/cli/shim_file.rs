//! Where `memprof run` finds the recording shim: `MEMPROF_SHIM`, else `libmemprof_shim.so` next
//! to the binary (a development build, or an install that put it there), else the copy this
//! binary carries (`build.rs`), written once into the user's cache folder.
//!
//! The cache file is LD_PRELOADed into the user's programs, so whoever can write it runs code as
//! them: it lives in `$XDG_CACHE_HOME/memprof` (or `~/.cache/memprof`), a folder of mode 0700
//! owned by the user (made so, or refused), never a shared one like `/tmp`; it is named by the
//! content's hash, written to a temporary file and renamed into place (a concurrent `memprof
//! run` sees the old file or the whole new one), and compared byte for byte before each use.

use anyhow::{bail, Context};
use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// File name of the shim next to the `memprof` binary.
const SHIM_NAME: &str = "libmemprof_shim.so";

/// The shim this binary was built with.
static EMBEDDED: &[u8] = include_bytes!(env!("MEMPROF_EMBEDDED_SHIM"));
/// Its content hash, which names it in the cache.
const EMBEDDED_HASH: &str = env!("MEMPROF_EMBEDDED_SHIM_HASH");

/// The absolute path of the shim to preload.
pub fn find() -> anyhow::Result<PathBuf> {
    preloadable(located()?)
}

/// `path`, unless LD_PRELOAD cannot carry it: the loader splits its value at spaces and colons,
/// and would only warn that it cannot open the pieces while the program runs unrecorded.
fn preloadable(path: PathBuf) -> anyhow::Result<PathBuf> {
    let text = path.as_os_str().as_encoded_bytes();
    if text
        .iter()
        .any(|b| matches!(b, b' ' | b'\t' | b'\n' | b':'))
    {
        bail!(
            "the recording shim {} cannot be preloaded: LD_PRELOAD splits a path at spaces and \
             colons (set MEMPROF_SHIM, or XDG_CACHE_HOME, to a path without them)",
            path.display()
        );
    }
    Ok(path)
}

/// Where the shim is: `MEMPROF_SHIM`, beside the binary, else the cache.
fn located() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MEMPROF_SHIM") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("MEMPROF_SHIM names {}, which is not a file", path.display());
        }
        // LD_PRELOAD reads a relative path from the child's working directory, and the loader
        // only warns when it cannot open it: hand it an absolute one.
        return std::fs::canonicalize(&path)
            .with_context(|| format!("MEMPROF_SHIM names {}", path.display()));
    }
    let exe = std::env::current_exe().context("cannot find the memprof binary")?;
    let beside = exe.with_file_name(SHIM_NAME);
    if beside.is_file() {
        return Ok(beside);
    }
    let dir = cache_dir()?;
    write_out(&dir).with_context(|| {
        format!(
            "cannot write the recording shim into {} (set MEMPROF_SHIM to use another copy)",
            dir.display()
        )
    })
}

/// `$XDG_CACHE_HOME/memprof` (an absolute XDG_CACHE_HOME only, as the XDG rules say), else
/// `$HOME/.cache/memprof`.
fn cache_dir() -> anyhow::Result<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = match xdg {
        Some(base) => base,
        None => match std::env::var_os("HOME").map(PathBuf::from) {
            Some(home) if home.is_absolute() => home.join(".cache"),
            _ => bail!(
                "cannot find a cache folder for the recording shim: neither XDG_CACHE_HOME nor \
                 HOME is an absolute path (set MEMPROF_SHIM to a libmemprof_shim.so)"
            ),
        },
    };
    Ok(base.join("memprof"))
}

/// The embedded shim as a file in `dir`: the one there when it holds the same bytes, else
/// written anew.
fn write_out(dir: &Path) -> anyhow::Result<PathBuf> {
    private_dir(dir)?;
    let path = dir.join(format!("libmemprof_shim-{EMBEDDED_HASH}.so"));
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if meta.is_file()
            && meta.uid() == euid()
            && std::fs::read(&path).is_ok_and(|bytes| bytes == EMBEDDED)
        {
            return Ok(path);
        }
    }
    let temp = dir.join(format!(
        ".libmemprof_shim-{EMBEDDED_HASH}.{}",
        std::process::id()
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&temp)?;
        file.write_all(EMBEDDED)?;
        file.sync_all()?;
        std::fs::rename(&temp, &path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e.into());
    }
    Ok(path)
}

/// Makes `dir` (and its parents) exist, and checks that it is a folder, not a link, owned by
/// this user; a folder of this user that others may enter is made private (mode 0700).
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    if meta.uid() != euid() {
        bail!(
            "{} belongs to another user (uid {})",
            dir.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_is_written_once_into_a_private_folder_and_rewritten_when_changed() {
        let base = tempfile::tempdir().expect("a temporary folder");
        let dir = base.path().join("cache/memprof");
        let path = write_out(&dir).expect("written");
        assert_eq!(std::fs::read(&path).expect("read"), EMBEDDED);
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert!(path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(EMBEDDED_HASH)));

        // A damaged copy is replaced; a folder others may enter is made private.
        std::fs::write(&path, b"not a shim").expect("write");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(write_out(&dir).expect("rewritten"), path);
        assert_eq!(std::fs::read(&path).expect("read"), EMBEDDED);
        assert_eq!(mode(&dir), 0o700);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file is left: {names:?}");
    }

    #[test]
    fn a_path_that_ld_preload_would_split_is_refused() {
        let fine = PathBuf::from("/home/ada/.cache/memprof/libmemprof_shim-1.so");
        assert_eq!(preloadable(fine.clone()).expect("allowed"), fine);
        for split in [
            "/home/Ada Lovelace/.cache/memprof/x.so",
            "/data:1/memprof/x.so",
        ] {
            let err = preloadable(PathBuf::from(split)).expect_err("refused");
            assert!(
                err.to_string()
                    .contains("LD_PRELOAD splits a path at spaces and colons"),
                "{err}"
            );
        }
    }

    #[test]
    fn a_link_in_place_of_the_folder_is_refused() {
        let base = tempfile::tempdir().expect("a temporary folder");
        let elsewhere = base.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        let dir = base.path().join("memprof");
        std::os::unix::fs::symlink(&elsewhere, &dir).expect("symlink");
        let err = write_out(&dir).expect_err("refused");
        assert!(err.to_string().contains("is not a folder"), "{err}");
    }
}
