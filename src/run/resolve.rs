//! The PATH lookup of `run`'s command (step 1 of [`crate::run`]): CMD's
//! program found as the platform would start it, so that a command that
//! cannot be started is an error before the lock is touched. The search is
//! written once here; what differs (exec's executable check, or
//! `CreateProcess`'s PATHEXT) is the [`Rules`] of `unix.rs` and
//! `windows.rs`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::sys::Exec;
use crate::error::{Error, Result};

/// How a platform finds a program, checked by the compiler on both.
pub(super) trait Rules {
    /// The bytes that make a name a path, taken as given.
    const SEPARATORS: &'static [u8];
    /// The search path when PATH is not set.
    const DEFAULT_PATH: &'static str;
    /// What an empty entry of PATH stands for (`None`: it is skipped).
    const EMPTY_ENTRY: Option<&'static str>;
    /// The failure, after `cannot run NAME: `.
    const NOT_FOUND: &'static str;
    /// Said after [`Rules::NOT_FOUND`] for a bare name.
    const ON_PATH: &'static str;
    /// What to check, in the failure.
    const CHECK: &'static str;
    /// `candidate`, or the file it stands for, when it can be started.
    fn runnable(candidate: PathBuf) -> Option<PathBuf>;
}

/// Finds CMD's program as the platform would (a name with a path separator
/// as given, else the first runnable file of that name on `path`).
///
/// # Errors
/// [`Error::Usage`] when there is no command, or it is not found or cannot
/// be started.
pub(crate) fn resolve(cmd: &[OsString], path: Option<&OsStr>) -> Result<PathBuf> {
    let Some(program) = cmd.first() else {
        return Err(Error::Usage("run needs a command after --".into()));
    };
    let name = Path::new(program);
    let found = if program.is_empty() {
        None
    } else if program
        .as_encoded_bytes()
        .iter()
        .any(|b| Exec::SEPARATORS.contains(b))
    {
        Exec::runnable(name.to_path_buf())
    } else {
        let path = path.unwrap_or_else(|| OsStr::new(Exec::DEFAULT_PATH));
        std::env::split_paths(path).find_map(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(Exec::EMPTY_ENTRY?)
            } else {
                dir
            };
            Exec::runnable(dir.join(name))
        })
    };
    found.ok_or_else(|| {
        Error::Usage(format!(
            "cannot run {:?}: {}{}; {} (nothing was locked)",
            program.to_string_lossy(),
            Exec::NOT_FOUND,
            if name.components().count() > 1 {
                ""
            } else {
                Exec::ON_PATH
            },
            Exec::CHECK,
        ))
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn resolve_finds_programs_and_refuses_what_cannot_start() {
        let sh = resolve(&["sh".into()], Some(OsStr::new("/usr/bin:/bin"))).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        assert!(resolve(&[], None).is_err());
        assert!(resolve(&["".into()], None).is_err());
        assert!(resolve(&["no-such-command-here".into()], None).is_err());
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert!(
            resolve(&[plain.clone().into()], None).is_err(),
            "not executable"
        );
        assert!(resolve(&[dir.path().into()], None).is_err(), "a directory");
    }
}
