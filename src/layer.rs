//! Personal layer (SPEC §5 "Personal layer P"): where a project keeps what is
//! the user's own and never committed.
//!
//! 1. an adopted project (R holds `.apache-magpie.lock`): `M/.apache-magpie-local/`,
//!    M being the main working tree, so every worktree of one clone shares it;
//! 2. a git checkout: `<git-common-dir>/apache-magpie/`;
//! 3. an svn checkout: `R/.svn/apache-magpie/`;
//! 4. any other folder given as `--root`: `R/.apache-magpie-local/`.
//!
//! Linked worktrees are followed through their `.git` file (`gitdir:`) and the
//! `commondir` file, reading files only.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Which rule of SPEC §5 chose the personal layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Rule 1: an adopted project.
    Adopted,
    /// Rule 2: a git checkout.
    Git,
    /// Rule 3: an svn checkout.
    Svn,
    /// Rule 4: a plain folder.
    Plain,
}

/// The resolved personal layer of a project root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
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
}

impl Layer {
    fn new(anchor: PathBuf, below: &'static [&'static str], kind: LayerKind) -> Self {
        Self {
            dir: below.iter().fold(anchor.clone(), |p, n| p.join(n)),
            kind,
            anchor,
            below,
        }
    }
}

/// The git directories of a checkout: its own and the common one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GitDirs {
    common: PathBuf,
}

/// Reads a small git metadata file: never blocking (a FIFO is refused at
/// once), at most 64 KiB, as text.
fn read_small(path: &Path) -> Result<String> {
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut open, libc::O_NONBLOCK);
    // Windows: a named pipe is not reachable by a path below a checkout,
    // and the type is checked below before anything is read.
    let file = open.open(path).map_err(|e| Error::io("read", path, e))?;
    let meta = file.metadata().map_err(|e| Error::io("read", path, e))?;
    if !meta.is_file() {
        return Err(Error::io(
            "read",
            path,
            std::io::Error::other("it is not a regular file"),
        ));
    }
    let bytes = crate::store::fs::layer::read_bounded(
        file,
        meta.len(),
        crate::store::fs::layer::READ_LIMIT,
    )
    .map_err(|e| Error::io("read", path, e))?;
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

/// Resolves the personal layer of project root `root` (absolute).
///
/// # Errors
/// [`Error::NoRoot`] for a `.git` file that leads nowhere; [`Error::Io`] when
/// a git metadata file cannot be read.
pub fn resolve(root: &Path) -> Result<Layer> {
    let git = read_git_dirs(root)?;
    if root.join(".apache-magpie.lock").exists() {
        // The main working tree owns the common dir `<M>/.git`; for a bare or
        // submodule common dir there is no main tree and R itself is used.
        let main = git
            .as_ref()
            .filter(|g| g.common.file_name().is_some_and(|n| n == ".git"))
            .and_then(|g| g.common.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| root.to_path_buf());
        return Ok(Layer::new(
            main,
            &[".apache-magpie-local"],
            LayerKind::Adopted,
        ));
    }
    if let Some(g) = git {
        return Ok(Layer::new(g.common, &["apache-magpie"], LayerKind::Git));
    }
    // A link named .svn is no svn checkout (svn never makes one); the layer
    // handle refuses it rather than follow it.
    if std::fs::symlink_metadata(root.join(".svn")).is_ok_and(|m| m.is_dir() || m.is_symlink()) {
        return Ok(Layer::new(
            root.to_path_buf(),
            &[".svn", "apache-magpie"],
            LayerKind::Svn,
        ));
    }
    Ok(Layer::new(
        root.to_path_buf(),
        &[".apache-magpie-local"],
        LayerKind::Plain,
    ))
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
        fs::write(wt.join(".apache-magpie.lock"), "").unwrap();
        let l = resolve(&wt).unwrap();
        assert_eq!(
            (l.dir, l.kind),
            (main.join(".apache-magpie-local"), LayerKind::Adopted)
        );
        fs::write(wt.join(".git"), "gitdir: /nowhere/at/all\n").unwrap();
        assert!(matches!(resolve(&wt), Err(Error::NoRoot(_))));
    }
}
