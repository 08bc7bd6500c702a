//! Who "the invoking user" is (SPEC §5 "Project root R"): the owner whose
//! directories and markers count, as git's `safe.directory` rule
//! (CVE-2022-24765) decides whose repository a command may trust.
//!
//! Owned by the invoking user means: owned by the effective uid; or, when
//! that is 0 (root), by the uid in `SUDO_UID`; or a directory the user's
//! git trusts through `safe.directory` in git's global or system
//! configuration (never a repository's), asked only when ownership differs.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The user sudo ran this process for (`SUDO_UID`, `SUDO_GID`), noted once
/// by [`note_sudo`] when the environment is read: the layer checks count
/// what that user owns as the invoking user's, and what the tool creates
/// belongs to that user (SPEC §5).
static SUDO: OnceLock<Option<(u32, u32)>> = OnceLock::new();

/// Notes `SUDO_UID` and `SUDO_GID` as the environment gave them.
pub(crate) fn note_sudo(uid: Option<&str>, gid: Option<&str>) {
    let parse = |v: Option<&str>| v.and_then(|s| s.trim().parse::<u32>().ok());
    let _ = SUDO.set(parse(uid).map(|u| (u, parse(gid).unwrap_or(u))));
}

/// The (uid, gid) of the user sudo ran a root process for; `None` unless
/// this process runs as root under sudo (never on Windows, which has no
/// sudo's root to act for).
#[cfg(unix)]
pub(crate) fn sudo_owner() -> Option<(u32, u32)> {
    if !sys::is_root() {
        return None;
    }
    SUDO.get().copied().flatten().filter(|(u, _)| *u != 0)
}

/// The invoking user, and git's `safe.directory` list, read at most once.
#[derive(Debug, Default, Clone)]
pub(crate) struct User {
    /// `SUDO_UID`, when running as root under sudo.
    sudo_uid: Option<u32>,
    /// git's global and system `safe.directory` values, read on first need.
    safe: OnceCell<Vec<String>>,
}

impl User {
    /// The user this process acts for; `sudo_uid` is `SUDO_UID` as set.
    pub(crate) fn new(sudo_uid: Option<&str>) -> Self {
        Self {
            sudo_uid: sudo_uid.and_then(|s| s.trim().parse().ok()),
            safe: OnceCell::new(),
        }
    }

    /// The uid whose files the tool makes and whose configuration it reads:
    /// `SUDO_UID` under sudo, else the effective uid.
    #[cfg(unix)]
    pub(crate) fn uid(&self) -> u32 {
        let euid = sys::euid();
        match self.sudo_uid {
            Some(u) if euid == 0 => u,
            _ => euid,
        }
    }

    /// Does the user own the entry at `path` (not following a link)?
    /// `false` when it does not exist.
    pub(crate) fn owns(&self, path: &Path) -> bool {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return false;
        };
        self.owns_meta(&meta) || self.trusted(path)
    }

    /// Is `meta` owned by the user (not counting `safe.directory`)?
    pub(crate) fn owns_meta(&self, meta: &std::fs::Metadata) -> bool {
        sys::owner_is(meta, self.sudo_uid)
    }

    /// Does the user's git trust `dir` through `safe.directory` (global or
    /// system configuration only)?
    fn trusted(&self, dir: &Path) -> bool {
        let safe = self.safe.get_or_init(read_safe_directories);
        safe.iter().any(|entry| safe_matches(entry, dir))
    }
}

/// Does one `safe.directory` value admit `dir`? `*` admits every
/// directory, `PATH/*` every one below PATH, anything else that directory.
fn safe_matches(entry: &str, dir: &Path) -> bool {
    let entry = entry.trim();
    if entry == "*" {
        return true;
    }
    let canon = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| PathBuf::from(p));
    if let Some(prefix) = entry.strip_suffix("/*") {
        return dir.starts_with(canon(prefix));
    }
    Path::new(&canon(entry)) == dir
}

/// git's `safe.directory` values from its global and system configuration,
/// asked from `/` so that no repository's configuration is read. A git that
/// cannot be run trusts nothing more.
fn read_safe_directories() -> Vec<String> {
    let mut out = Vec::new();
    for scope in ["--system", "--global"] {
        let answer = std::process::Command::new("git")
            .current_dir(std::path::MAIN_SEPARATOR_STR)
            .env_remove("GIT_DIR")
            .env_remove("GIT_CONFIG")
            .env_remove("GIT_CONFIG_PARAMETERS")
            .env_remove("GIT_CONFIG_COUNT")
            .args(["config", scope, "--get-all", "safe.directory"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output();
        if let Ok(o) = answer {
            let text = String::from_utf8_lossy(&o.stdout);
            for line in text.lines() {
                if line.is_empty() {
                    // An empty value resets the list, as git reads it.
                    out.clear();
                } else {
                    out.push(line.to_owned());
                }
            }
        }
    }
    out
}

#[cfg(unix)]
mod sys {
    use std::os::unix::fs::MetadataExt;

    pub(super) fn euid() -> u32 {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    }

    pub(super) fn owner_is(meta: &std::fs::Metadata, sudo_uid: Option<u32>) -> bool {
        let me = euid();
        meta.uid() == me || (me == 0 && sudo_uid == Some(meta.uid()))
    }

    pub(super) fn is_root() -> bool {
        euid() == 0
    }
}

#[cfg(windows)]
mod sys {
    /// On Windows the walk does not judge ownership: the layer itself is
    /// opened by handle and its owner checked there (docs/safety.md, "Windows").
    pub(super) fn owner_is(_meta: &std::fs::Metadata, _sudo_uid: Option<u32>) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_directory_values() {
        let t = tempfile::tempdir().unwrap();
        let d = std::fs::canonicalize(t.path()).unwrap();
        let sub = d.join("x");
        std::fs::create_dir(&sub).unwrap();
        assert!(safe_matches("*", &sub));
        assert!(safe_matches(&format!("{}/*", d.display()), &sub));
        assert!(safe_matches(&sub.display().to_string(), &sub));
        assert!(!safe_matches(&d.display().to_string(), &sub));
    }

    #[cfg(unix)]
    #[test]
    fn own_files_are_owned() {
        let t = tempfile::tempdir().unwrap();
        let u = User::new(None);
        assert!(u.owns(t.path()));
        assert!(!u.owns(&t.path().join("missing")));
    }
}
