//! Root discovery (SPEC §5 "Project root R").
//!
//! The nearest ancestor (itself included) holding `.git` (directory or file),
//! `.svn` or `.apache-magpie.lock` of `--root DIR` (which must exist) when
//! given, else of the current directory. `--root` at a folder below a
//! checkout therefore names that checkout; only when neither DIR nor any
//! ancestor holds a marker is DIR itself the root. Only file-system metadata
//! is read: no `git` or `svn` process is ever started.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Names whose presence makes a directory a project root.
pub const MARKERS: [&str; 3] = [".git", ".svn", ".apache-magpie.lock"];

/// Finds the project root from an explicit `--root` or `cwd` upwards.
///
/// # Errors
/// [`Error::NoRoot`] when `--root` does not name a directory or when no
/// ancestor holds a marker; [`Error::Io`] when the current directory cannot
/// be read.
pub fn discover(explicit: Option<&Path>, cwd: &Path) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        let abs = if dir.is_absolute() {
            dir.to_path_buf()
        } else {
            cwd.join(dir)
        };
        return match std::fs::canonicalize(&abs) {
            Ok(p) if p.is_dir() => Ok(nearest_marked(&p).unwrap_or(p)),
            Ok(_) => Err(Error::NoRoot(format!(
                "--root {} is not a directory; name an existing project directory",
                abs.display()
            ))),
            Err(e) => Err(Error::NoRoot(format!(
                "--root {} cannot be used ({e}); name an existing project directory",
                abs.display()
            ))),
        };
    }
    nearest_marked(cwd).ok_or_else(|| {
        Error::NoRoot(format!(
            "no project root above {}: no ancestor holds .git, .svn or .apache-magpie.lock; \
         run inside a checkout or pass --root DIR",
            cwd.display()
        ))
    })
}

/// The nearest of `dir` and its ancestors that holds a marker.
fn nearest_marked(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| {
            MARKERS
                .iter()
                .any(|m| std::fs::symlink_metadata(d.join(m)).is_ok())
        })
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nearest_marker_and_honours_root() {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(top.join("a/.svn")).unwrap();
        std::fs::create_dir_all(top.join("a/b/c")).unwrap();
        assert_eq!(discover(None, &top.join("a/b/c")).unwrap(), top.join("a"));
        assert_eq!(discover(None, &top.join("a")).unwrap(), top.join("a"));
        // --root starts discovery: a folder below a checkout names the checkout.
        assert_eq!(
            discover(Some(Path::new("b")), &top.join("a")).unwrap(),
            top.join("a")
        );
        assert_eq!(
            discover(Some(&top.join("a/b/c")), &top).unwrap(),
            top.join("a")
        );
        // No marker at or above DIR: DIR itself.
        std::fs::create_dir_all(top.join("plain/x")).unwrap();
        assert_eq!(
            discover(Some(&top.join("plain/x")), &top).unwrap(),
            top.join("plain/x")
        );
        assert!(matches!(
            discover(Some(Path::new("nope")), &top),
            Err(Error::NoRoot(_))
        ));
    }
}
