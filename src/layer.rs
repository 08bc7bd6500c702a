//! Personal layer (SPEC §5 "Personal layer P"): where a project keeps what is
//! the user's own and never committed.
//!
//! 1. R holds `.git` and not `.svn`: `C/apache-magpie/`, C being the common
//!    git directory the `.git` leads to, verified to be a real git directory
//!    whose recorded work tree, where it records one, is R;
//! 2. R holds `.svn` and not `.git`: `R/.svn/apache-magpie/`;
//! 3. R holds both: refused, since which one a tree forged cannot be told;
//! 4. no version control (an adopted folder, a plain `--root`):
//!    `R/.apache-magpie-local/`.
//!
//! Only files are read: no git process. Nothing found in a tree is used as
//! configuration; a `skill-lock.toml` there is only looked for, to refuse
//! it ([`Layer::planted_config`]).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A git checkout's marker: a directory, or a file naming one (`gitdir:`).
pub(crate) const GIT: &str = ".git";
/// An svn working copy's top (svn 1.7 and later keep one, at the top).
pub(crate) const SVN: &str = ".svn";

/// The folder, in a working tree, that the original tool used as an adopted
/// project's personal layer (and rule 4 still does).
pub(crate) const LOCAL_DIR: &str = ".apache-magpie-local";

/// Where earlier versions read a store setting; never used now.
pub(crate) const PLANTED_CONFIG: &str = "skill-lock.toml";

/// Which rule of SPEC §5 chose the personal layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LayerKind {
    /// Rule 1: a git checkout.
    Git,
    /// Rule 2: an svn working copy.
    Svn,
    /// Rule 4: a folder that is no checkout.
    Plain,
}

impl LayerKind {
    /// The rule in words, for `doctor`.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::Git => "§5 layer rule 1: the checkout's common git directory",
            Self::Svn => "§5 layer rule 2: the svn working copy's .svn directory",
            Self::Plain => {
                "§5 layer rule 4: .apache-magpie-local in a folder with no version control"
            }
        }
    }
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
    /// Rule 1: the git directory the checkout's `.git` leads to, verified
    /// (a remote name is resolved there, SPEC §8).
    pub git_dir: Option<PathBuf>,
    /// R, the project root.
    pub root: PathBuf,
}

/// The most bytes read of a git metadata file (`.git`, `commondir`, `config`).
const GIT_FILE_LIMIT: usize = 64 * 1024;

/// Reads a small git metadata file: never blocking (a FIFO is refused at
/// once), at most 64 KiB, as text.
fn read_small(path: &Path) -> Result<String> {
    let bytes = crate::bounded::read_regular(path, GIT_FILE_LIMIT)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The git directory G that `dir/.git` leads to, unverified: the `.git`
/// directory, or the `gitdir:` target of a `.git` file, relative to `dir`.
/// `None` when there is no `.git`.
///
/// # Errors
/// [`Error::NoRoot`] for a `.git` file with no `gitdir:` line.
pub(crate) fn git_dir_of(dir: &Path) -> Result<Option<PathBuf>> {
    let dot_git = dir.join(GIT);
    let Ok(meta) = std::fs::symlink_metadata(&dot_git) else {
        return Ok(None);
    };
    if meta.is_dir() {
        return Ok(Some(dot_git));
    }
    let text = read_small(&dot_git)?;
    let Some(target) = text.lines().find_map(|l| l.strip_prefix("gitdir:")) else {
        return Err(refused(&dot_git, "it holds no 'gitdir:' line"));
    };
    Ok(Some(dir.join(target.trim())))
}

/// The common directory that git directory `g` names in its `commondir`
/// (relative to `g`), or `None` when it has none.
pub(crate) fn common_dir_of(g: &Path) -> Option<PathBuf> {
    read_small(&g.join("commondir"))
        .ok()
        .map(|t| g.join(t.trim()))
}

/// A `.git` that rule 1 does not follow: `no_root`, naming it, what is
/// wrong, and `doctor`.
fn refused(dot_git: &Path, why: &str) -> Error {
    Error::NoRoot(format!(
        "{} is not followed: {why}; a .git must lead to a real git directory whose work tree \
         is this checkout (repair it with `git worktree repair`, remove it, or pass --root \
         to a folder outside the tree; `skill-lock doctor` says more)",
        dot_git.display()
    ))
}

/// Is `d` a git directory's core: `HEAD`, `objects/`, `refs/`?
fn has_core(d: &Path) -> bool {
    d.join("HEAD").is_file() && d.join("objects").is_dir() && d.join("refs").is_dir()
}

/// `core.worktree` in the git configuration file `config`, when set.
fn core_worktree(config: &Path) -> Option<String> {
    let text = read_small(config).ok()?;
    let mut in_core = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(head) = line.strip_prefix('[') {
            let name = head.split([']', ' ', '"']).next().unwrap_or("");
            in_core = name.eq_ignore_ascii_case("core") && !head.contains('"');
            continue;
        }
        if !in_core {
            continue;
        }
        if let Some((k, v)) = line.split_once('=')
            && k.trim().eq_ignore_ascii_case("worktree")
        {
            found = Some(v.trim().trim_matches('"').to_owned());
        }
    }
    found
}

/// Canonical form of `p`, or `p` when it cannot be resolved.
fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Rule 1's check of the git directory of checkout `root`: returns (G, C).
fn verified_git_dirs(root: &Path) -> Result<(PathBuf, PathBuf)> {
    let dot_git = root.join(GIT);
    let g = git_dir_of(root)?.ok_or_else(|| refused(&dot_git, "it vanished"))?;
    let g = std::fs::canonicalize(&g).map_err(|e| {
        refused(
            &dot_git,
            &format!(
                "it leads to {}, which cannot be used ({e}; if that directory exists, it is \
                 outside what this process may read: an agent's sandbox must allow reading and \
                 writing the checkout's common git directory, where its locks live)",
                g.display()
            ),
        )
    })?;
    if !g.join("HEAD").is_file() {
        return Err(refused(&dot_git, &format!("{} holds no HEAD", g.display())));
    }
    let common = match common_dir_of(&g) {
        None if has_core(&g) => g.clone(),
        None => {
            return Err(refused(
                &dot_git,
                &format!(
                    "{} holds no objects/ and refs/, and no commondir",
                    g.display()
                ),
            ));
        }
        Some(c) => {
            let c = canon(&c);
            if !has_core(&c) || c.join("commondir").exists() {
                return Err(refused(
                    &dot_git,
                    &format!(
                        "its commondir leads to {}, which is no common git directory",
                        c.display()
                    ),
                ));
            }
            c
        }
    };
    let recorded = match read_small(&g.join("gitdir")) {
        // A linked worktree's git directory names the worktree's .git file.
        Ok(text) => Some((
            canon(&g.join(text.trim())),
            canon(&dot_git),
            "its gitdir file",
        )),
        Err(_) => core_worktree(&g.join("config"))
            .map(|w| (canon(&g.join(w)), canon(root), "its core.worktree")),
    };
    if let Some((named, want, what)) = recorded
        && named != want
    {
        return Err(refused(
            &dot_git,
            &format!(
                "{} records another work tree ({what} names {})",
                g.display(),
                named.display()
            ),
        ));
    }
    Ok((g, common))
}

/// Resolves the personal layer of project root `root` (canonical, as
/// [`crate::root::discover`] found it).
///
/// # Errors
/// [`Error::NoRoot`] for a `.git` that leads to no verified git directory,
/// or a root holding both `.git` and `.svn`; [`Error::Io`] when a git
/// metadata file cannot be read.
pub(crate) fn resolve(root: &Path) -> Result<Layer> {
    let has = |name: &str| std::fs::symlink_metadata(root.join(name)).is_ok();
    let (git, svn) = (has(GIT), has(SVN));
    if git && svn {
        return Err(Error::NoRoot(format!(
            "{} holds both .git and .svn: which one was committed by the other cannot be told \
             from the files, so no lock is taken here; remove the one that is not yours, or \
             pass --root to a folder outside the tree (`skill-lock doctor` says more)",
            root.display()
        )));
    }
    if git {
        let (g, common) = verified_git_dirs(root)?;
        return Ok(Layer {
            dir: common.join("apache-magpie"),
            kind: LayerKind::Git,
            anchor: common,
            below: &["apache-magpie"],
            git_dir: Some(g),
            root: root.to_path_buf(),
        });
    }
    if svn {
        // A link named .svn is no svn working copy (svn never makes one);
        // the layer handle refuses it rather than follow it.
        return Ok(Layer {
            dir: root.join(SVN).join("apache-magpie"),
            kind: LayerKind::Svn,
            anchor: root.to_path_buf(),
            below: &[SVN, "apache-magpie"],
            git_dir: None,
            root: root.to_path_buf(),
        });
    }
    Ok(Layer {
        dir: root.join(LOCAL_DIR),
        kind: LayerKind::Plain,
        anchor: root.to_path_buf(),
        below: &[LOCAL_DIR],
        git_dir: None,
        root: root.to_path_buf(),
    })
}

impl Layer {
    /// A `skill-lock.toml` where earlier versions read one (P, R's
    /// `.apache-magpie-local/`, and the original tool's `.apache-magpie-local/`
    /// from `original`), when one is there: never read, only refused when
    /// nothing the user set chooses the store (SPEC §5).
    pub(crate) fn planted_config(&self, original: Option<&Path>) -> Option<PathBuf> {
        [
            Some(self.dir.clone()),
            Some(self.root.join(LOCAL_DIR)),
            original.map(|o| o.join(LOCAL_DIR)),
        ]
        .into_iter()
        .flatten()
        .map(|d| d.join(PLANTED_CONFIG))
        .find(|f| std::fs::symlink_metadata(f).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn git_core(d: &Path) {
        fs::create_dir_all(d.join("objects")).unwrap();
        fs::create_dir_all(d.join("refs")).unwrap();
        fs::write(d.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    }

    #[test]
    fn worktree_leads_to_common_dir() {
        let t = tempfile::tempdir().unwrap();
        let top = fs::canonicalize(t.path()).unwrap();
        let main = top.join("main");
        git_core(&main.join(".git"));
        let wtg = main.join(".git/worktrees/wt");
        fs::create_dir_all(&wtg).unwrap();
        fs::write(wtg.join("HEAD"), "x\n").unwrap();
        fs::write(wtg.join("commondir"), "../..\n").unwrap();
        let wt = top.join("wt");
        fs::create_dir_all(&wt).unwrap();
        fs::write(
            wtg.join("gitdir"),
            format!("{}\n", wt.join(".git").display()),
        )
        .unwrap();
        fs::write(wt.join(".git"), format!("gitdir: {}\n", wtg.display())).unwrap();
        assert_eq!(resolve(&wt).unwrap().dir, main.join(".git/apache-magpie"));
        assert_eq!(resolve(&main).unwrap().kind, LayerKind::Git);
        // Another checkout's .git file naming the same worktree is refused.
        let other = top.join("other");
        fs::create_dir_all(&other).unwrap();
        fs::write(other.join(".git"), format!("gitdir: {}\n", wtg.display())).unwrap();
        assert!(matches!(resolve(&other), Err(Error::NoRoot(_))));
        fs::write(wt.join(".git"), "gitdir: /nowhere/at/all\n").unwrap();
        assert!(matches!(resolve(&wt), Err(Error::NoRoot(_))));
    }

    #[test]
    fn a_git_file_leading_out_of_the_checkout_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let top = fs::canonicalize(t.path()).unwrap();
        let co = top.join("co");
        fs::create_dir_all(&co).unwrap();
        // gitdir: .. (the folder of the user's checkouts) is no git directory.
        fs::write(co.join(".git"), "gitdir: ..\n").unwrap();
        assert!(matches!(resolve(&co), Err(Error::NoRoot(_))));
        // A git directory whose core.worktree names another tree.
        git_core(&top.join("g"));
        fs::write(top.join("g/config"), "[core]\n\tworktree = /elsewhere\n").unwrap();
        fs::write(
            co.join(".git"),
            format!("gitdir: {}\n", top.join("g").display()),
        )
        .unwrap();
        assert!(matches!(resolve(&co), Err(Error::NoRoot(_))));
        // A separate git directory that records no work tree is followed.
        fs::write(top.join("g/config"), "[core]\n\tbare = false\n").unwrap();
        assert_eq!(resolve(&co).unwrap().dir, top.join("g/apache-magpie"));
        // Both .git and .svn: refused.
        fs::create_dir_all(co.join(".svn")).unwrap();
        assert!(matches!(resolve(&co), Err(Error::NoRoot(_))));
    }
}
