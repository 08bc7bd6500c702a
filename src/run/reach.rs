//! How another process reaches the lock `run` holds (SPEC §2.7): what the
//! keeper needs to release it itself when the wrapper died (Unix), the same
//! on every platform so that `run` takes one argument everywhere.

use std::ffi::OsString;
use std::path::PathBuf;

/// Where the lock of a `run` lives, as a separate `release` would be told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reach {
    /// The project root (`--root`), when the store is found from it.
    pub root: Option<PathBuf>,
    /// The store's URL when it was named (`--store`, `SKILL_LOCK_STORE`),
    /// a relative `file:` directory made absolute. It may carry
    /// credentials: it is passed in an environment variable, never as an
    /// argument.
    pub store: Option<String>,
}

impl Reach {
    /// The arguments of `release` for (`skill`, `repo`) after the program
    /// name: every value as `--flag=value`, so none is read as an option.
    #[must_use]
    #[cfg_attr(
        windows,
        expect(
            dead_code,
            reason = "only the Unix keeper releases from another process"
        )
    )]
    pub(crate) fn release_args(&self, skill: &str, repo: &str) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "release".into(),
            skill.into(),
            format!("--repo={repo}").into(),
        ];
        if let Some(root) = &self.root {
            let mut flag = OsString::from("--root=");
            flag.push(root.as_os_str());
            args.push(flag);
        }
        args
    }
}
