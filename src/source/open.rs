//! Opening a file that an input names (a recording's mapped libraries, the recording or
//! snapshot found beside an input): only a regular file, opened without blocking and checked
//! on the opened file, each named once by its canonical path, and, inside `memprof mcp`,
//! only under the server's roots.

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The folders every file opened here must be under, once `confine` has set them.
static ROOTS: OnceLock<Vec<PathBuf>> = OnceLock::new();

/// Confines every later `regular` open of this process to `roots` (canonical folders); for
/// `memprof mcp`, whose clients name files under its `--root`. Set once; later calls change
/// nothing and return false.
pub fn confine(roots: Vec<PathBuf>) -> bool {
    ROOTS.set(roots).is_ok()
}

/// A file opened by `regular`, with the canonical path it was opened by.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub canonical: PathBuf,
}

impl Opened {
    /// A path that opens this very file again (`/proc/self/fd/N`), for a library that takes a
    /// path: the name can no longer be swapped for another file.
    pub fn fd_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// Opens `path` for reading if it is a regular file: its canonical path (symbolic links and
/// `.` resolved, so that every spelling of one file is one name), under the roots when
/// confined, opened with `O_NONBLOCK` (a FIFO or a device cannot hang the open) and checked
/// with `fstat` on the opened file (so a name swapped after a check cannot matter).
pub fn regular(path: &Path) -> io::Result<Opened> {
    regular_under(path, ROOTS.get().map(Vec::as_slice))
}

/// `regular`, under `roots` when given.
fn regular_under(path: &Path, roots: Option<&[PathBuf]>) -> io::Result<Opened> {
    let canonical = std::fs::canonicalize(path)?;
    if let Some(roots) = roots {
        if !roots.iter().any(|root| canonical.starts_with(root)) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "outside the server's --root folders",
            ));
        }
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&canonical)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(Opened { file, canonical })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking_and_spellings_are_one_file() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let fifo = dir.path().join("pipe");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: `name` is a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        let refused = regular(&fifo).expect_err("a FIFO is not a regular file");
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
        assert!(regular(dir.path()).is_err(), "a folder is refused");

        let file = dir.path().join("lib.so");
        std::fs::write(&file, b"x").expect("written");
        let spelled = dir.path().join(".").join(".").join("lib.so");
        let (a, b) = (
            regular(&file).expect("opens"),
            regular(&spelled).expect("opens"),
        );
        assert_eq!(a.canonical, b.canonical);
        let again = std::fs::read(a.fd_path()).expect("the same file again");
        assert_eq!(again, b"x");
    }

    #[test]
    fn under_roots_only_files_inside_them_open_whatever_the_path_says() {
        let dir = tempfile::tempdir().expect("a scratch folder");
        let (inside, outside) = (dir.path().join("root"), dir.path().join("elsewhere"));
        std::fs::create_dir_all(&inside).expect("made");
        std::fs::create_dir_all(&outside).expect("made");
        let secret = outside.join("libsecret.so");
        std::fs::write(&secret, b"x").expect("written");
        let own = inside.join("lib.so");
        std::fs::write(&own, b"x").expect("written");
        std::os::unix::fs::symlink(&secret, inside.join("link.so")).expect("linked");
        let roots = [std::fs::canonicalize(&inside).expect("canonical")];
        let under = |p: &Path| regular_under(p, Some(&roots[..]));
        assert!(under(&own).is_ok());
        for refused in [
            secret.clone(),
            inside.join("link.so"),
            inside.join("../elsewhere/libsecret.so"),
        ] {
            let e = under(&refused).expect_err("outside the root");
            assert_eq!(
                e.kind(),
                io::ErrorKind::PermissionDenied,
                "{}",
                refused.display()
            );
        }
        assert!(regular_under(&secret, None).is_ok(), "unconfined, it opens");
    }
}
