//! Root discovery (SPEC §5 "Project root R").
//!
//! R is found from `--root DIR` (which must exist) when given, else from the
//! current directory, walking up. A version-control checkout wins over any
//! marker below it, so a stranger's repository cannot split one lock in two
//! by committing a marker or a `.svn/` folder in a subdirectory:
//!
//! 1. the nearest ancestor (itself included) holding `.git` (a directory or
//!    a file), when there is one;
//! 2. else the nearest holding `.svn`;
//! 3. else the nearest holding `.apache-magpie.lock`;
//! 4. else DIR itself, when `--root` was given; else `no_root`.
//!
//! Only file-system metadata is read: no `git` or `svn` process is ever
//! started, and no link is followed to decide whether a marker is there.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Names whose presence makes a directory a project root, strongest first:
/// a nearer weaker marker never hides a stronger one further up.
pub(crate) const MARKERS: [&str; 3] = [".git", ".svn", ".apache-magpie.lock"];

/// Finds the project root from an explicit `--root` or `cwd` upwards.
///
/// # Errors
/// [`Error::NoRoot`] when `--root` does not name a directory or when no
/// ancestor holds a marker; [`Error::Io`] when the current directory cannot
/// be read.
pub(crate) fn discover(explicit: Option<&Path>, cwd: &Path) -> Result<PathBuf> {
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

/// The nearest of `dir` and its ancestors holding the strongest marker
/// found anywhere on the way up.
fn nearest_marked(dir: &Path) -> Option<PathBuf> {
    MARKERS.iter().find_map(|m| {
        dir.ancestors()
            .find(|d| std::fs::symlink_metadata(d.join(m)).is_ok())
            .map(Path::to_path_buf)
    })
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

    #[test]
    fn a_marker_below_a_checkout_makes_no_second_project() {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(top.join("co/.git")).unwrap();
        std::fs::create_dir_all(top.join("co/sub/.svn")).unwrap();
        std::fs::create_dir_all(top.join("co/adopted/deep")).unwrap();
        std::fs::write(top.join("co/adopted/.apache-magpie.lock"), "").unwrap();
        for from in ["co/sub", "co/adopted/deep", "co/adopted", "co"] {
            assert_eq!(discover(None, &top.join(from)).unwrap(), top.join("co"));
        }
        // Below an svn checkout, a marker makes no second project either.
        std::fs::create_dir_all(top.join("wc/.svn")).unwrap();
        std::fs::create_dir_all(top.join("wc/x")).unwrap();
        std::fs::write(top.join("wc/x/.apache-magpie.lock"), "").unwrap();
        assert_eq!(discover(None, &top.join("wc/x")).unwrap(), top.join("wc"));
    }
}
