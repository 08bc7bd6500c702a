//! Root discovery (SPEC §5 "Project root R").
//!
//! The walk goes up from `--root DIR` (which must exist) when given, else
//! from the current directory, and stops below the first directory the
//! invoking user does not own; a marker counts only when the user owns it
//! ([`crate::ownership`]). Then:
//!
//! 1. R is the nearest directory holding `.git` or `.svn`, except that a
//!    `.git` below a `.svn` is svn content, a `.svn` below a `.git` is git
//!    content, an svn external belongs to its outer working copy and a
//!    submodule to its superproject: such a marker is passed over;
//! 2. else the nearest directory holding `.apache-magpie.lock`;
//! 3. else DIR, when `--root` was given; else `no_root`.
//!
//! A tree can forge any of these markers (an svn working copy can commit a
//! `.git`, an archive can carry anything), so no marker below another kind
//! of checkout can split what that checkout decided. Only file-system
//! metadata is read: no `git` or `svn` process is started (but for git's
//! `safe.directory`, asked only when ownership differs).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::layer::{common_dir_of, git_dir_of};
use crate::ownership::User;

pub(crate) use crate::layer::{GIT, SVN};
/// The marker of an adopted project that is no checkout.
pub(crate) const ADOPTED: &str = ".apache-magpie.lock";

/// Which rule of SPEC §5 made R the project root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RootRule {
    /// Rule 1: a git checkout or svn working copy.
    Checkout,
    /// Rule 2: an adopted folder (`.apache-magpie.lock`).
    Adopted,
    /// Rule 3: `--root DIR` with no marker.
    Explicit,
}

impl RootRule {
    /// The rule in words, for `doctor`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Checkout => "§5 root rule 1: the nearest git checkout or svn working copy",
            Self::Adopted => "§5 root rule 2: the nearest folder holding .apache-magpie.lock",
            Self::Explicit => "§5 root rule 3: --root DIR, no marker at or above it",
        }
    }
}

/// The project root and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Root {
    /// R, canonical.
    pub dir: PathBuf,
    /// The rule that chose it.
    pub rule: RootRule,
    /// Where the original tool would have put its project root from the
    /// same start: the nearest directory holding any marker (SPEC §5
    /// "Upgrading from the original tool").
    pub original: Option<PathBuf>,
}

/// The markers one directory on the walk holds (the user's own only).
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    git: bool,
    svn: bool,
    adopted: bool,
}

/// Finds the project root from an explicit `--root` or `cwd` upwards.
///
/// # Errors
/// [`Error::NoRoot`] when `--root` does not name a directory or when no
/// directory on the walk holds a marker.
pub(crate) fn discover(explicit: Option<&Path>, cwd: &Path, user: &User) -> Result<Root> {
    let start = match explicit {
        Some(dir) => {
            let abs = if dir.is_absolute() {
                dir.to_path_buf()
            } else {
                cwd.join(dir)
            };
            match std::fs::canonicalize(&abs) {
                Ok(p) if p.is_dir() => p,
                Ok(_) => {
                    return Err(Error::NoRoot(format!(
                        "--root {} is not a directory; name an existing project directory",
                        abs.display()
                    )));
                }
                Err(e) => {
                    return Err(Error::NoRoot(format!(
                        "--root {} cannot be used ({e}); name an existing project directory",
                        abs.display()
                    )));
                }
            }
        }
        // The current directory is already absolute and resolved (getcwd);
        // on Windows, canonicalizing would spell it `\\?\C:\...`.
        None => cwd.to_path_buf(),
    };
    let walk = walk(&start, user);
    let original = walk
        .iter()
        .find(|(_, m)| m.git || m.svn || m.adopted)
        .map(|(d, _)| d.clone());
    if let Some(dir) = checkout(&walk) {
        return Ok(Root {
            dir,
            rule: RootRule::Checkout,
            original,
        });
    }
    if let Some((dir, _)) = walk.iter().find(|(_, m)| m.adopted) {
        return Ok(Root {
            dir: dir.clone(),
            rule: RootRule::Adopted,
            original,
        });
    }
    if explicit.is_some() {
        return Ok(Root {
            dir: start,
            rule: RootRule::Explicit,
            original,
        });
    }
    Err(Error::NoRoot(format!(
        "no project root above {}: no directory of yours on the way up holds .git, .svn or \
         .apache-magpie.lock (the walk stops at a directory another user owns); run inside a \
         checkout of your own, pass --root DIR, or name a store with --store \
         (`skill-lock doctor` says what it found)",
        cwd.display()
    )))
}

/// The directories from `start` up, with their markers, stopping below the
/// first one the user does not own.
fn walk(start: &Path, user: &User) -> Vec<(PathBuf, Marks)> {
    let mut out = Vec::new();
    for d in start.ancestors() {
        if !user.owns(d) {
            break;
        }
        let has = |name: &str| user.owns(&d.join(name));
        out.push((
            d.to_path_buf(),
            Marks {
                git: has(GIT),
                svn: has(SVN),
                adopted: has(ADOPTED),
            },
        ));
    }
    out
}

/// Rule 1 with its exceptions: the nearest checkout whose marker no other
/// kind of checkout above it owns.
fn checkout(walk: &[(PathBuf, Marks)]) -> Option<PathBuf> {
    for (i, (dir, m)) in walk.iter().enumerate() {
        if !(m.git || m.svn) {
            continue;
        }
        let above = &walk[i + 1..];
        // A .git anywhere inside an svn working copy is svn content, and a
        // working copy inside another one is an external of it.
        if above.iter().any(|(_, a)| a.svn) {
            continue;
        }
        let outer_git = above.iter().find(|(_, a)| a.git).map(|(d, _)| d);
        if m.svn && !m.git && outer_git.is_some() {
            // A .svn anywhere inside a git checkout is git content.
            continue;
        }
        if m.git
            && let Some(outer) = outer_git
            && is_submodule(dir, outer)
        {
            continue;
        }
        return Some(dir.clone());
    }
    None
}

/// Is the checkout at `dir` a submodule of the checkout at `outer`: does
/// its git directory lie below `C/modules/`, C being `outer`'s common git
/// directory? Anything unreadable is no submodule.
fn is_submodule(dir: &Path, outer: &Path) -> bool {
    let (Ok(Some(g)), Ok(Some(outer_g))) = (git_dir_of(dir), git_dir_of(outer)) else {
        return false;
    };
    let common = common_dir_of(&outer_g).unwrap_or(outer_g);
    match (
        std::fs::canonicalize(&g),
        std::fs::canonicalize(common.join("modules")),
    ) {
        (Ok(g), Ok(modules)) => g.starts_with(modules),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(explicit: Option<&Path>, cwd: &Path) -> PathBuf {
        discover(explicit, cwd, &User::new(None)).unwrap().dir
    }

    #[test]
    fn finds_nearest_marker_and_honours_root() {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(top.join("a/.svn")).unwrap();
        std::fs::create_dir_all(top.join("a/b/c")).unwrap();
        assert_eq!(found(None, &top.join("a/b/c")), top.join("a"));
        assert_eq!(found(None, &top.join("a")), top.join("a"));
        // --root starts discovery: a folder below a checkout names the checkout.
        assert_eq!(found(Some(Path::new("b")), &top.join("a")), top.join("a"));
        assert_eq!(found(Some(&top.join("a/b/c")), &top), top.join("a"));
        // No marker at or above DIR: DIR itself.
        std::fs::create_dir_all(top.join("plain/x")).unwrap();
        let r = discover(Some(&top.join("plain/x")), &top, &User::new(None)).unwrap();
        assert_eq!((r.dir, r.rule), (top.join("plain/x"), RootRule::Explicit));
        assert!(matches!(
            discover(Some(Path::new("nope")), &top, &User::new(None)),
            Err(Error::NoRoot(_))
        ));
    }

    #[test]
    fn a_marker_another_kind_of_tree_forged_makes_no_second_project() {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(top.join("co/.git")).unwrap();
        std::fs::create_dir_all(top.join("co/sub/.svn")).unwrap();
        std::fs::create_dir_all(top.join("co/adopted/deep")).unwrap();
        std::fs::write(top.join("co/adopted/.apache-magpie.lock"), "").unwrap();
        for from in ["co/sub", "co/adopted/deep", "co/adopted", "co"] {
            assert_eq!(found(None, &top.join(from)), top.join("co"));
        }
        // An svn working copy: a committed .git (dir or file) anywhere, an
        // external's .svn, a marker: all the working copy's.
        std::fs::create_dir_all(top.join("wc/.svn")).unwrap();
        std::fs::create_dir_all(top.join("wc/a/.git")).unwrap();
        std::fs::create_dir_all(top.join("wc/a/b")).unwrap();
        std::fs::write(top.join("wc/a/b/.git"), "gitdir: ..\n").unwrap();
        std::fs::create_dir_all(top.join("wc/ext/.svn")).unwrap();
        std::fs::write(top.join("wc/ext/.apache-magpie.lock"), "").unwrap();
        for from in ["wc/a", "wc/a/b", "wc/ext", "wc"] {
            assert_eq!(found(None, &top.join(from)), top.join("wc"), "{from}");
        }
        // The original tool's root is the nearest marker, whatever it is.
        let r = discover(None, &top.join("wc/a/b"), &User::new(None)).unwrap();
        assert_eq!(r.original, Some(top.join("wc/a/b")));
    }

    #[test]
    fn submodules_belong_to_the_superproject_other_nested_clones_do_not() {
        let t = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(t.path()).unwrap();
        for d in ["sup/.git/modules/sub", "sup/sub", "sup/ignored/clone/.git"] {
            std::fs::create_dir_all(top.join(d)).unwrap();
        }
        std::fs::write(top.join("sup/sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        assert_eq!(found(None, &top.join("sup/sub")), top.join("sup"));
        assert_eq!(
            found(None, &top.join("sup/ignored/clone")),
            top.join("sup/ignored/clone")
        );
    }
}
