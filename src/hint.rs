//! The `hint` of `already_running` (SPEC §2.1): the exact `release --force`
//! command line an operator pastes into a shell on this host to free a lock
//! whose holder is known to be dead.
//!
//! It starts with `$SKILL_LOCK_LAUNCHER` when set (a launch line, used as
//! given), else with `skill-lock` when that name on `PATH` is this very
//! program, else with this program's absolute path; it names the store
//! (`--store`, a relative `file:` or `git:` path made absolute) or the
//! project root (`--root`, byte for byte, a root that is not UTF-8
//! included) so that it reaches the same lock from any directory. Every
//! word is shell-quoted, on one line a terminal only displays
//! ([`crate::shell::quote_os`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::{Environment, Settings, StoreSource};
use crate::key::LockKey;
pub(crate) use crate::shell::quote as shell_quote;
use crate::shell::quote_os;
use crate::store::AnyStore;

use sys::{PROGRAM, STORE_VARIABLE, call, is_executable, same_file};

/// The `release --force` command line for `key` in the settings' store
/// (`store`, as opened: a git store knows where its remote resolved to).
#[must_use]
pub(crate) fn release_force(key: &LockKey, settings: &Settings, store: &AnyStore) -> String {
    let mut line = launcher(&settings.env);
    let _ = write!(
        line,
        " release {} --repo {} --force",
        shell_quote(key.skill()),
        shell_quote(key.repo())
    );
    let choice = &settings.store;
    match (choice.source, &choice.url, &choice.root) {
        // A URL with credentials is named the way it was given: the
        // variable, never its value (SPEC §8).
        (StoreSource::Env, Some(url), _) if crate::store::git::has_secret(url) => {
            line.push_str(" --store ");
            line.push_str(STORE_VARIABLE);
        }
        (StoreSource::Flag | StoreSource::Env, Some(url), _) => {
            let url = if let AnyStore::Git(git) = store {
                git.url_from_anywhere()
            } else {
                absolute_url(url, &settings.env.cwd)
            };
            let _ = write!(line, " --store {}", shell_quote(&url));
        }
        (_, _, Some(root)) => {
            let _ = write!(line, " --root {}", quote_os(root_word(root).as_os_str()));
        }
        _ => {}
    }
    line
}

/// The root as the hint names it: itself, or, when its name ends in a
/// newline (which a shell's command substitution would drop), the same
/// directory spelled with a final `/`.
fn root_word(root: &Path) -> PathBuf {
    let ends_in_newline = root
        .file_name()
        .is_some_and(|n| n.as_encoded_bytes().last() == Some(&b'\n'));
    if ends_in_newline {
        let mut spelled = root.as_os_str().to_owned();
        spelled.push("/");
        PathBuf::from(spelled)
    } else {
        root.to_path_buf()
    }
}

/// Where `run`'s keeper finds the same lock to release it when the
/// wrapper died: the store as the hint names it (its URL, made absolute,
/// or the project root), the URL only ever in the release's environment.
#[must_use]
pub(crate) fn reach(settings: &Settings) -> crate::run::Reach {
    let choice = &settings.store;
    match (choice.source, &choice.url) {
        (StoreSource::Flag | StoreSource::Env, Some(url)) => crate::run::Reach {
            root: None,
            store: Some(absolute_url(url, &settings.env.cwd)),
        },
        _ => crate::run::Reach {
            root: choice.root.clone(),
            store: None,
        },
    }
}

/// A `file:` URL with a relative directory, made absolute against `cwd`.
fn absolute_url(url: &str, cwd: &Path) -> String {
    match url.strip_prefix("file:") {
        Some(dir) if Path::new(dir).is_relative() => {
            format!("file:{}", cwd.join(dir).display())
        }
        _ => url.to_owned(),
    }
}

/// How the operator starts this program from a shell.
fn launcher(env: &Environment) -> String {
    if let Some(line) = &env.launcher {
        return line.to_string_lossy().into_owned();
    }
    let Some(exe) = &env.exe else {
        return "skill-lock".to_owned();
    };
    match on_path(&shell_path(env, exe), PROGRAM) {
        Some(found) if same_file(&found, exe) => "skill-lock".to_owned(),
        _ => call(shell_quote(&exe.display().to_string())),
    }
}

/// `PATH` as the operator's shell has it: under uv (`uvx --from ...`), the
/// first entry is uv's tool environment, which only this process sees, so a
/// hint that relied on it would say "command not found" when pasted.
fn shell_path(env: &Environment, exe: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = env
        .path
        .as_deref()
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    if env.under_uv && dirs.first().map(PathBuf::as_path) == exe.parent() {
        dirs.remove(0);
    }
    dirs
}

/// The first executable file called `name` in `dirs`, as a shell finds it.
fn on_path(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    dirs.iter()
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// The shell's spellings and file checks: a POSIX shell's on Unix.
#[cfg(unix)]
mod sys {
    use std::path::Path;

    /// How the hint names the store variable: the shell's spelling.
    pub(super) const STORE_VARIABLE: &str = "\"$SKILL_LOCK_STORE\"";

    /// The program's file name as a shell finds it on PATH.
    pub(super) const PROGRAM: &str = "skill-lock";

    /// A quoted program path made a command: as is for a POSIX shell.
    pub(super) fn call(program: String) -> String {
        program
    }

    /// An executable regular file.
    pub(super) fn is_executable(p: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }

    /// Are `a` and `b` the same file (same device and inode, links followed)?
    pub(super) fn same_file(a: &Path, b: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
}

/// The shell's spellings and file checks: PowerShell's on Windows.
#[cfg(windows)]
mod sys {
    use std::path::Path;

    /// How the hint names the store variable: PowerShell's spelling (cmd's
    /// would be %SKILL_LOCK_STORE%).
    pub(super) const STORE_VARIABLE: &str = "$env:SKILL_LOCK_STORE";

    /// The program's file name as a shell finds it on PATH.
    pub(super) const PROGRAM: &str = "skill-lock.exe";

    /// A quoted program path made a command: PowerShell's call operator
    /// `&` before it (PowerShell reads a quoted word first as a string; in
    /// cmd, paste the line without `& `).
    pub(super) fn call(program: String) -> String {
        if program.starts_with(['"', '\'']) {
            format!("& {program}")
        } else {
            program
        }
    }

    /// A regular file (Windows runs any by its extension).
    pub(super) fn is_executable(p: &Path) -> bool {
        p.is_file()
    }

    /// Are `a` and `b` the same file (canonical paths)?
    pub(super) fn same_file(a: &Path, b: &Path) -> bool {
        match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn uvs_own_path_entry_is_not_the_shells() {
        let env = |under_uv| Environment {
            cwd: PathBuf::from("/w"),
            path: Some("/cache/env/bin:/usr/bin".into()),
            under_uv,
            ..Environment::default()
        };
        let exe = Path::new("/cache/env/bin/skill-lock");
        assert_eq!(shell_path(&env(true), exe), [PathBuf::from("/usr/bin")]);
        assert_eq!(shell_path(&env(false), exe).len(), 2);
        assert_eq!(
            shell_path(&env(true), Path::new("/elsewhere/skill-lock")).len(),
            2
        );
    }

    /// A store URL with a password is named the way it was given, as the
    /// variable, so the hint works pasted and never shows the secret.
    #[test]
    fn a_store_with_credentials_is_named_by_its_variable() {
        use crate::config::{Action, Settings, StoreChoice, StoreSpec, Vars};
        use crate::store::git::GitConfig;
        let url = "git:https://someone:s3cret@example.com/coord.git";
        let key = LockKey::new("s", "o/r").unwrap();
        let hint = |url: &str, source| {
            let config = GitConfig::parse(url, Path::new("/w"), &Vars::default()).unwrap();
            let settings = Settings {
                action: Action::List,
                store: StoreChoice {
                    spec: StoreSpec::Git(config),
                    source,
                    url: Some(url.to_owned()),
                    root: None,
                    legacy: Vec::new(),
                    origin: None,
                },
                clock: crate::engine::Clock::System,
                env: Environment {
                    launcher: Some("skill-lock".into()),
                    ..Environment::default()
                },
            };
            let store = AnyStore::File(crate::store::fs::FileStore::new(Path::new("/w")));
            release_force(&key, &settings, &store)
        };
        let line = hint(url, StoreSource::Env);
        assert_eq!(
            line,
            "skill-lock release s --repo o/r --force --store \"$SKILL_LOCK_STORE\""
        );
        // Without a secret the URL itself is named, as given.
        let plain = "git:ssh://git@example.com/coord.git";
        assert!(hint(plain, StoreSource::Env).ends_with(&format!("--store {plain}")));
    }

    #[test]
    fn relative_file_urls_become_absolute() {
        let cwd = Path::new("/w");
        assert_eq!(absolute_url("file:locks", cwd), "file:/w/locks");
        assert_eq!(absolute_url("file:/x", cwd), "file:/x");
        assert_eq!(absolute_url("etcd://h:1", cwd), "etcd://h:1");
    }
}
