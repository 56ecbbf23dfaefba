//! The folders `memprof mcp` may read from (`--root DIR`): a path a tool is given must be a
//! regular file inside one of them once every symlink and `..` is resolved.

use anyhow::{bail, Context};
use std::path::{Component, Path, PathBuf};

/// The canonical root folders; relative paths are taken from the first.
pub struct Roots(Vec<PathBuf>);

impl Roots {
    /// Canonicalizes each `--root` (the current folder when none is given).
    pub fn new(given: &[PathBuf]) -> anyhow::Result<Roots> {
        let given = if given.is_empty() {
            vec![PathBuf::from(".")]
        } else {
            given.to_vec()
        };
        let mut roots = Vec::new();
        for dir in &given {
            let shown = dir.display();
            let canonical = dir
                .canonicalize()
                .with_context(|| format!("--root {shown}: cannot open"))?;
            if !canonical.is_dir() {
                bail!("--root {shown}: not a directory");
            }
            roots.push(canonical);
        }
        Ok(Roots(roots))
    }

    /// The regular file `given` names (relative to the first root), canonical; an error, one
    /// line naming `given`, when it is missing, outside every root, or not a regular file.
    pub fn file(&self, given: &str) -> anyhow::Result<PathBuf> {
        let path = Path::new(given);
        if path.components().any(|c| c == Component::ParentDir) {
            bail!("{given}: `..` is not allowed in a path; give it from the root");
        }
        let joined = self.0[0].join(path);
        let canonical = joined
            .canonicalize()
            .with_context(|| format!("{given}: cannot open"))?;
        if !self.0.iter().any(|root| canonical.starts_with(root)) {
            bail!(
                "{given}: outside the folders this server may read ({}); start it with \
                 --root for that folder",
                self.shown()
            );
        }
        let meta =
            std::fs::metadata(&canonical).with_context(|| format!("{given}: cannot open"))?;
        if !meta.is_file() {
            bail!("{given}: not a regular file");
        }
        Ok(canonical)
    }

    /// The canonical root folders.
    pub fn folders(&self) -> Vec<PathBuf> {
        self.0.clone()
    }

    /// The roots, comma separated.
    fn shown(&self) -> String {
        let all: Vec<String> = self.0.iter().map(|r| r.display().to_string()).collect();
        all.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> (tempfile::TempDir, Roots) {
        let dir = tempfile::tempdir().expect("a scratch folder");
        std::fs::create_dir(dir.path().join("inside")).expect("mkdir");
        std::fs::write(dir.path().join("inside/a.pickle"), b"x").expect("write");
        std::fs::write(dir.path().join("secret"), b"x").expect("write");
        let roots = Roots::new(&[dir.path().join("inside")]).expect("roots");
        (dir, roots)
    }

    fn refusal(roots: &Roots, path: &str) -> String {
        format!("{:#}", roots.file(path).expect_err("refused"))
    }

    #[test]
    fn a_file_under_the_root_is_given_canonical() {
        let (dir, roots) = scratch();
        let found = roots.file("a.pickle").expect("allowed");
        let canonical = dir.path().canonicalize().expect("canonical");
        assert_eq!(found, canonical.join("inside/a.pickle"));
        let absolute = canonical.join("inside/a.pickle");
        assert_eq!(
            roots
                .file(&absolute.display().to_string())
                .expect("allowed"),
            found
        );
    }

    #[test]
    fn parent_components_symlink_escapes_and_folders_are_refused() {
        let (dir, roots) = scratch();
        assert!(refusal(&roots, "../secret").contains("`..` is not allowed"));
        let outside = dir.path().join("secret").display().to_string();
        assert!(refusal(&roots, &outside).contains("outside the folders"));
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("inside/link"))
            .expect("symlink");
        assert!(refusal(&roots, "link").contains("outside the folders"));
        std::fs::create_dir(dir.path().join("inside/sub")).expect("mkdir");
        assert_eq!(refusal(&roots, "sub"), "sub: not a regular file");
        assert!(refusal(&roots, "missing.pickle").starts_with("missing.pickle: cannot open: "));
    }
}
