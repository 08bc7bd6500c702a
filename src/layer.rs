//! Personal layer (SPEC §5 "Personal layer P"): where a project keeps what is
//! the user's own and never committed.
//!
//! 1. R is in a git checkout, adopted or not, whatever its layout (linked
//!    worktree, separate git directory, worktrees of a bare repository,
//!    submodule): `<git-common-dir>/apache-magpie/`, so every worktree of one
//!    clone shares the locks and no clone can carry or clean them;
//! 2. an svn checkout: `R/.svn/apache-magpie/`;
//! 3. anything else (an adopted folder that is no checkout, a plain
//!    `--root`): `R/.apache-magpie-local/`.
//!
//! The git common directory is found through the `.git` file's `gitdir:`
//! and the `commondir` file, reading files only. Root discovery
//! ([`crate::root`]) has already made R the checkout itself when there is
//! one, so only R is looked at here.
//!
//! The `.apache-magpie-local/` folders of a checkout's working trees are
//! where earlier versions kept an adopted project's locks and configuration;
//! they are named in [`Layer::working`] so that a lock an older version
//! still holds there is never ignored, and a configuration file there (which
//! any repository can commit) is never used.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The folder, in a working tree, that earlier versions used as an adopted
/// project's personal layer (and rule 3 still does).
pub(crate) const LOCAL_DIR: &str = ".apache-magpie-local";

/// Which rule of SPEC §5 chose the personal layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerKind {
    /// Rule 1: a git checkout (adopted or not).
    Git,
    /// Rule 2: an svn checkout.
    Svn,
    /// Rule 3: a folder that is no checkout.
    Plain,
}

/// The resolved personal layer of a project root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layer {
    /// The directory P.
    pub dir: PathBuf,
    /// The rule that chose it.
    pub kind: LayerKind,
    /// The directory P is reached from: one the user (or git) made, whose
    /// path may be followed (the checkout, the git common directory).
    pub anchor: PathBuf,
    /// The names from the anchor down to P, each of which may lie in a
    /// working tree and is opened without following a link (SPEC §5 "Trust").
    pub below: &'static [&'static str],
    /// The `.apache-magpie-local/` folders of the checkout's working trees
    /// (R's, and the main working tree's when R is a linked worktree), which
    /// a repository can write: never read as configuration, and checked for
    /// locks an older version left there. Under rule 3, P is one of them.
    pub working: Vec<PathBuf>,
    /// May P hold the configuration file? Only a layer inside a
    /// version-control directory that no clone carries (rules 1 and 2,
    /// and not a git directory lying inside an svn working copy, which svn
    /// could have committed).
    pub config_allowed: bool,
}

/// The git directories of a checkout: its own and the common one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GitDirs {
    common: PathBuf,
}

/// The most bytes read of a git metadata file (`.git`, `commondir`).
const GIT_FILE_LIMIT: usize = 64 * 1024;

/// Reads a small git metadata file: never blocking (a FIFO is refused at
/// once), at most 64 KiB, as text.
fn read_small(path: &Path) -> Result<String> {
    let bytes = crate::bounded::read_regular(path, GIT_FILE_LIMIT)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn read_git_dirs(root: &Path) -> Result<Option<GitDirs>> {
    let dot_git = root.join(".git");
    let Ok(meta) = std::fs::metadata(&dot_git) else {
        return Ok(None);
    };
    let git_dir = if meta.is_dir() {
        dot_git
    } else {
        let text = read_small(&dot_git)?;
        let Some(target) = text.lines().find_map(|l| l.strip_prefix("gitdir:")) else {
            return Err(Error::NoRoot(format!(
                "{} holds no 'gitdir:' line; repair it (git worktree repair) or pass --root",
                dot_git.display()
            )));
        };
        let target = root.join(target.trim());
        if !target.is_dir() {
            return Err(Error::NoRoot(format!(
                "{} points to {}, which does not exist; repair the worktree \
                 (git worktree repair / prune) or pass --root",
                dot_git.display(),
                target.display()
            )));
        }
        target
    };
    let commondir = git_dir.join("commondir");
    let common = match std::fs::symlink_metadata(&commondir) {
        Ok(_) => git_dir.join(read_small(&commondir)?.trim()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => git_dir,
        Err(e) => return Err(Error::io("read", &commondir, e)),
    };
    let common = std::fs::canonicalize(&common).map_err(|e| Error::io("resolve", &common, e))?;
    Ok(Some(GitDirs { common }))
}

/// Resolves the personal layer of project root `root` (absolute, as
/// [`crate::root::discover`] found it).
///
/// # Errors
/// [`Error::NoRoot`] for a `.git` file that leads nowhere; [`Error::Io`] when
/// a git metadata file cannot be read.
pub(crate) fn resolve(root: &Path) -> Result<Layer> {
    let mut working = vec![root.join(LOCAL_DIR)];
    if let Some(g) = read_git_dirs(root)? {
        // A linked worktree's main working tree `<M>/.git`: earlier versions
        // kept an adopted project's locks in `<M>/.apache-magpie-local`.
        if let Some(main) = g
            .common
            .file_name()
            .filter(|n| *n == ".git")
            .and(g.common.parent())
            .filter(|m| *m != root)
        {
            working.push(main.join(LOCAL_DIR));
        }
        let config_allowed = !inside_svn(&g.common);
        return Ok(Layer {
            dir: g.common.join("apache-magpie"),
            kind: LayerKind::Git,
            anchor: g.common,
            below: &["apache-magpie"],
            working,
            config_allowed,
        });
    }
    // A link named .svn is no svn checkout (svn never makes one); the layer
    // handle refuses it rather than follow it.
    if std::fs::symlink_metadata(root.join(".svn")).is_ok() {
        return Ok(Layer {
            dir: root.join(".svn").join("apache-magpie"),
            kind: LayerKind::Svn,
            anchor: root.to_path_buf(),
            below: &[".svn", "apache-magpie"],
            working,
            config_allowed: true,
        });
    }
    Ok(Layer {
        dir: root.join(LOCAL_DIR),
        kind: LayerKind::Plain,
        anchor: root.to_path_buf(),
        below: &[LOCAL_DIR],
        working,
        config_allowed: false,
    })
}

/// Is `dir` inside an svn working copy (an ancestor holds `.svn`)? A git
/// directory there may have been committed to svn by a stranger.
fn inside_svn(dir: &Path) -> bool {
    dir.ancestors()
        .skip(1)
        .any(|d| std::fs::symlink_metadata(d.join(".svn")).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn worktree_leads_to_common_dir_and_adopted_to_main_tree() {
        let t = tempfile::tempdir().unwrap();
        let top = fs::canonicalize(t.path()).unwrap();
        let main = top.join("main");
        fs::create_dir_all(main.join(".git/worktrees/wt")).unwrap();
        fs::write(main.join(".git/worktrees/wt/commondir"), "../..\n").unwrap();
        let wt = top.join("wt");
        fs::create_dir_all(&wt).unwrap();
        fs::write(
            wt.join(".git"),
            format!("gitdir: {}\n", main.join(".git/worktrees/wt").display()),
        )
        .unwrap();
        assert_eq!(resolve(&wt).unwrap().dir, main.join(".git/apache-magpie"));
        assert_eq!(resolve(&main).unwrap().kind, LayerKind::Git);
        // Adopted or not, the locks live in the git common directory.
        fs::write(wt.join(".apache-magpie.lock"), "").unwrap();
        let l = resolve(&wt).unwrap();
        assert_eq!(
            (&l.dir, l.kind, l.config_allowed),
            (&main.join(".git/apache-magpie"), LayerKind::Git, true)
        );
        assert_eq!(
            l.working,
            [
                wt.join(".apache-magpie-local"),
                main.join(".apache-magpie-local")
            ]
        );
        fs::write(wt.join(".git"), "gitdir: /nowhere/at/all\n").unwrap();
        assert!(matches!(resolve(&wt), Err(Error::NoRoot(_))));
    }
}
