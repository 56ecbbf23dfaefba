//! Where `memprof run` finds the recording shim: `MEMPROF_SHIM`, else `libmemprof_shim.so` next
//! to the binary (a development build, or an install that put it there), else the copy this
//! binary carries (`build.rs`), written once into a folder no untrusted user can change.
//!
//! The shim is LD_PRELOADed into the user's programs (as root under `sudo memprof run`), so
//! whoever can change the file, or any folder on the way to it, runs code as them. Checking the
//! file and then handing its path to the loader leaves a gap: a user who may write a folder on
//! the way can swap it between the check and the load, and again before every later `exec` of
//! the job (each one loads the path anew). So the path itself must be safe, not only the file
//! once: every component from `/` down, the file included, must belong to root or to this user
//! and be writable by no one else (group and other write bits clear), as OpenSSH requires of
//! the folders above its keys (`safe_path`). Then only this user or root can change anything
//! on the path, and a later check adds nothing. The path is canonicalized first and the
//! canonical path is what goes into `LD_PRELOAD`, so links on the way (which live in folders
//! that might not be safe) are never followed again.
//!
//! The places tried, each only when that whole chain is safe: the user's cache
//! (`$XDG_CACHE_HOME/memprof` or `~/.cache/memprof`), the runtime folder
//! (`$XDG_RUNTIME_DIR/memprof`), and for root `/var/cache/memprof`: under `sudo -E` HOME is the
//! invoking user's, whose folders root must not trust. No safe place: one line, and the run is
//! refused. Why not an anonymous file (`memfd_create`, preloaded as `/proc/self/fd/N`): each
//! process resolves `/proc/self` as itself, so a child that closed the inherited descriptor (as
//! Python's `subprocess` does by default) finds nothing there, and the loader only warns while
//! that child runs unrecorded; `/proc/<memprof's pid>/fd/N` instead dies with memprof, and once
//! the pid is reused names another process's file: a path an attacker can come to own.
//!
//! The cached copy is named by the content's hash, written to a temporary file and renamed into
//! place (a concurrent `memprof run` sees the old file or the whole new one), and compared byte
//! for byte before each use.

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

/// Where root keeps its copy when the user's folders are not safe (under `sudo -E`).
const ROOT_PLACE: &str = "/var/cache/memprof";

/// The absolute, canonical path of the shim to preload.
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

/// Where the shim is: `MEMPROF_SHIM`, beside the binary, else the first safe place for the
/// embedded copy.
fn located() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("MEMPROF_SHIM") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("MEMPROF_SHIM names {}, which is not a file", path.display());
        }
        // LD_PRELOAD reads a relative path from the child's working directory, and the loader
        // only warns when it cannot open it: hand it an absolute one.
        let canonical = std::fs::canonicalize(&path)
            .with_context(|| format!("MEMPROF_SHIM names {}", path.display()))?;
        if let Some(why) = unsafe_component(&canonical) {
            bail!(
                "MEMPROF_SHIM names {}, which another user could change before it is loaded: \
                 {why}",
                path.display()
            );
        }
        return Ok(canonical);
    }
    let exe = std::env::current_exe().context("cannot find the memprof binary")?;
    let beside = exe.with_file_name(SHIM_NAME);
    if beside.is_file() {
        // One that others could change is passed over for the embedded copy (the same build).
        if let Ok(canonical) = std::fs::canonicalize(&beside) {
            if unsafe_component(&canonical).is_none() {
                return Ok(canonical);
            }
        }
    }
    write_first(&places())
}

/// The places for the embedded copy, in order: the user's cache, the runtime folder, and for
/// root a folder of root's. Each is tried only if safe (`write_out`).
fn places() -> Vec<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    // An absolute XDG_CACHE_HOME only, as the XDG rules say, else `$HOME/.cache`.
    let cache = absolute("XDG_CACHE_HOME").or_else(|| absolute("HOME").map(|h| h.join(".cache")));
    let mut places: Vec<PathBuf> = cache.into_iter().map(|c| c.join("memprof")).collect();
    places.extend(absolute("XDG_RUNTIME_DIR").map(|r| r.join("memprof")));
    if euid() == 0 {
        places.push(PathBuf::from(ROOT_PLACE));
    }
    places
}

/// The embedded shim written out in the first of `places` where that is safe, or one line
/// saying why each was refused.
fn write_first(places: &[PathBuf]) -> anyhow::Result<PathBuf> {
    let mut refused = Vec::new();
    for place in places {
        match write_out(place).and_then(preloadable) {
            Ok(path) => return Ok(path),
            Err(e) => refused.push(format!("{}: {e:#}", place.display())),
        }
    }
    if refused.is_empty() {
        refused.push("neither XDG_CACHE_HOME, HOME nor XDG_RUNTIME_DIR is an absolute path".into());
    }
    bail!(
        "no safe place to write the recording shim ({}); set MEMPROF_SHIM to a \
         libmemprof_shim.so that only you or root can change, in folders only you or root can \
         write",
        refused.join("; ")
    )
}

/// Why `path` (canonical) is not safe to preload, naming the first component from `/` down
/// that another user than root or this one owns, or that others may write; `None` when safe.
/// A sticky folder of root's or this user's (`/tmp`) others may write, but may not rename or
/// remove an entry they do not own, and every entry below it is checked in turn.
fn unsafe_component(path: &Path) -> Option<String> {
    let me = euid();
    let mut chain: Vec<&Path> = path.ancestors().collect();
    chain.reverse();
    for part in chain {
        let meta = match std::fs::symlink_metadata(part) {
            Ok(meta) => meta,
            Err(e) => return Some(format!("{}: {e}", part.display())),
        };
        if meta.file_type().is_symlink() {
            return Some(format!("{} is a symbolic link", part.display()));
        }
        if meta.uid() != 0 && meta.uid() != me {
            return Some(format!(
                "{} belongs to another user (uid {})",
                part.display(),
                meta.uid()
            ));
        }
        let sticky_dir = meta.is_dir() && meta.mode() & 0o1000 != 0;
        if meta.mode() & 0o022 != 0 && !sticky_dir {
            return Some(format!(
                "{} may be written by other users (mode {:o})",
                part.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    None
}

/// The embedded shim as a file in `dir`: the one there when it holds the same bytes, else
/// written anew. Its canonical path, every component of which is safe (`unsafe_component`).
fn write_out(dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = private_dir(dir)?;
    let path = dir.join(format!("libmemprof_shim-{EMBEDDED_HASH}.so"));
    if let Ok(meta) = std::fs::symlink_metadata(&path) {
        if meta.is_file()
            && meta.uid() == euid()
            && meta.mode() & 0o022 == 0
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

/// Makes `dir` exist and returns its canonical path, every component of which is safe. The
/// folders above it must be safe already (they are checked before anything is made); missing
/// ones are made private (mode 0700). `dir` itself must be a folder (not a link) of this user;
/// one that others may enter is made private.
fn private_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    let mut existing = dir.to_path_buf();
    let mut missing = Vec::new();
    while let Err(e) = std::fs::symlink_metadata(&existing) {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e).with_context(|| existing.display().to_string());
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                missing.push(name.to_owned());
                existing = parent.to_path_buf();
            }
            _ => bail!("{} does not exist", existing.display()),
        }
    }
    let mut path = std::fs::canonicalize(&existing)
        .with_context(|| format!("cannot resolve {}", existing.display()))?;
    if missing.is_empty() {
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
        if let Some(why) = path.parent().and_then(unsafe_component) {
            bail!("{why}");
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
        }
    } else if let Some(why) = unsafe_component(&path) {
        bail!("{why}");
    }
    for name in missing.iter().rev() {
        path.push(name);
        match DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => {}
            // Made by a concurrent run: checked below like any other.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        }
    }
    if let Some(why) = unsafe_component(&path) {
        bail!("{why}");
    }
    Ok(path)
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

    /// A folder on the way that another user may write (here mode 0777, not sticky) could be
    /// swapped between the check and the load: nothing is written below it, and with no other
    /// place the run is refused in one line naming it.
    #[test]
    fn a_place_below_a_folder_others_may_write_is_refused() {
        let base = tempfile::tempdir().expect("a temporary folder");
        let open = base.path().join("shared");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let dir = open.join("home/.cache/memprof");
        let err = write_out(&dir).expect_err("refused");
        assert!(
            err.to_string()
                .contains("may be written by other users (mode 777)"),
            "{err}"
        );
        assert!(!open.join("home").exists(), "nothing made below it");

        // An existing folder of this user's below it is refused too, file and all.
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert!(write_out(&dir).is_err());
        assert!(std::fs::read_dir(&dir).expect("list").next().is_none());

        let err = write_first(std::slice::from_ref(&dir)).expect_err("no safe place");
        let text = format!("{err:#}");
        assert!(
            text.starts_with("no safe place to write the recording shim ("),
            "{text}"
        );
        assert!(text.contains("set MEMPROF_SHIM"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");

        // The next place that is safe is taken.
        let safe = base.path().join("safe/memprof");
        let path = write_first(&[dir, safe.clone()]).expect("written");
        assert_eq!(
            path.parent(),
            Some(std::fs::canonicalize(&safe).expect("made").as_path())
        );
        assert_eq!(unsafe_component(&path), None);
    }

    #[test]
    fn a_folder_of_another_user_or_a_link_on_the_way_is_named() {
        let base = tempfile::tempdir().expect("a temporary folder");
        let real = base.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let link = base.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let why = unsafe_component(&link).expect("a link is not a canonical path");
        assert!(why.ends_with("link is a symbolic link"), "{why}");
        if euid() == 0 {
            std::os::unix::fs::chown(&real, Some(65534), None).expect("chown");
            let why = unsafe_component(&real.join("x")).expect("another user's folder");
            assert!(why.contains("belongs to another user (uid 65534)"), "{why}");
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
