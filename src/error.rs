//! The one closed error enum of the library (SPEC §3 "Errors").
//!
//! `Err` means "could not find out or could not act": someone else holding a
//! lock is an outcome, never an error. Every variant maps to exactly one SPEC
//! error code and exit status 2 ([`crate::output::ExitStatus::Error`]), and
//! its message says what to do.

use std::io;
use std::path::PathBuf;

/// Everything that can stop a command before it reaches an outcome.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line could not be understood.
    #[error("{0}")]
    Usage(String),
    /// The skill name breaks a rule of SPEC §5.
    #[error(
        "invalid skill {skill:?}: {why}; use 1-64 of [A-Za-z0-9._-], starting with a letter or digit"
    )]
    InvalidSkill {
        /// The skill as given.
        skill: String,
        /// Which rule it broke.
        why: String,
    },
    /// The repository breaks a rule of SPEC §5.
    #[error("invalid repo {repo:?}: {why}; give it as owner/name, e.g. apache/airflow")]
    InvalidRepo {
        /// The repo as given.
        repo: String,
        /// Which rule it broke.
        why: String,
    },
    /// `--ttl` out of range or not an integer.
    #[error("invalid ttl {0:?}: give whole seconds from 1 to 2592000 (30 days)")]
    InvalidTtl(String),
    /// `--note` too long, not UTF-8, or holding control characters.
    #[error("invalid note: {0}")]
    InvalidNote(String),
    /// `--owner-pid` not a live process id on this host.
    #[error("invalid owner pid {pid:?}: {why}")]
    InvalidPid {
        /// The pid as given.
        pid: String,
        /// Why it was refused.
        why: String,
    },
    /// No project root could be found.
    #[error("{0}")]
    NoRoot(String),
    /// A file-system operation failed.
    #[error("could not {action} {}: {source}; {}", .path.display(), io_advice(.action, .source))]
    Io {
        /// What was being done, e.g. "create".
        action: &'static str,
        /// The path it failed on.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Something in the personal layer is not what the tool may trust or
    /// touch (SPEC §5 "Trust"): a link, a special file, a foreign or
    /// writable-by-others directory, an oversized file.
    #[error("refusing {}: {why}; {fix}", .path.display())]
    Untrusted {
        /// The path refused.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
        /// The command that fixes it.
        fix: String,
    },
    /// The network store did not answer in time.
    #[error("{0}")]
    StoreUnavailable(String),
    /// A bug or an impossible state.
    #[error("internal error: {0}; please report it")]
    Internal(String),
}

impl Error {
    /// Wraps an I/O error with what was being done and where.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// The SPEC error code (`usage`, `invalid_skill`, ...).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::Usage(_) => "usage",
            Self::InvalidSkill { .. } => "invalid_skill",
            Self::InvalidRepo { .. } => "invalid_repo",
            Self::InvalidTtl(_) => "invalid_ttl",
            Self::InvalidNote(_) => "invalid_note",
            Self::InvalidPid { .. } => "invalid_pid",
            Self::NoRoot(_) => "no_root",
            Self::Io { .. } | Self::Untrusted { .. } => "io",
            Self::StoreUnavailable(_) => "store_unavailable",
            Self::Internal(_) => "internal",
        }
    }
}

/// What to do about a failed file-system operation: a permission failure on
/// a read-only or foreign directory (e.g. a personal layer owned by another
/// user) needs another store, not a retry.
fn io_advice(action: &str, e: &io::Error) -> &'static str {
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            "it is read-only or another user's; use a store you can write, e.g. --store file:DIR"
        }
        io::ErrorKind::BrokenPipe => {
            "run it with standard output open and read, e.g. out=$(skill-lock acquire ...)"
        }
        _ if matches!(action, "read" | "open" | "stat" | "resolve") => {
            "check that it exists and is readable by you"
        }
        _ => "check that the directory exists and is writable by you",
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    fn message(action: &'static str, kind: io::ErrorKind) -> String {
        Error::io(action, "/p/skill-lock.toml", io::Error::from(kind)).to_string()
    }

    #[test]
    fn io_messages_name_the_operation_the_path_and_what_to_do() {
        let m = message("read", io::ErrorKind::PermissionDenied);
        assert!(m.starts_with("could not read /p/skill-lock.toml: "), "{m}");
        assert!(
            m.ends_with("use a store you can write, e.g. --store file:DIR"),
            "{m}"
        );
        let m = message("create", io::ErrorKind::ReadOnlyFilesystem);
        assert!(
            m.starts_with("could not create /p/skill-lock.toml: "),
            "{m}"
        );
        assert!(m.contains("--store file:DIR"), "{m}");
        let m = message("read", io::ErrorKind::InvalidData);
        assert!(
            m.ends_with("check that it exists and is readable by you"),
            "{m}"
        );
        let m = message("write", io::ErrorKind::StorageFull);
        assert!(m.ends_with("writable by you"), "{m}");
    }
}
