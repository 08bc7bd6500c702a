//! Exit statuses (SPEC §2 "Exit status"): the closed set an invocation
//! ends with, and the one each wire object means.

use super::Report;

/// How an invocation exits (SPEC §2 "Exit status").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: acquired, renewed, released or nothing to release, read, check holds.
    Success,
    /// 2: bad arguments or input, unreadable store, I/O failure.
    Error,
    /// 3: someone else holds the lock.
    AlreadyRunning,
    /// 4: a token that is not the live holder's, or no lock to renew/check.
    NotYours,
    /// `run`: the status of CMD (128+signal when a signal ended it).
    Ran(u8),
    /// `run --wait` ended by a signal before CMD started: 128+signal.
    Interrupted(u8),
    /// `run --conflict-exit-code N`: CMD was not run because the lock is
    /// held (SPEC §2 "Exit status"), N instead of 3.
    Conflict(u8),
}

impl ExitStatus {
    /// The process exit status.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Error => 2,
            Self::AlreadyRunning => 3,
            Self::NotYours => 4,
            Self::Ran(status) | Self::Interrupted(status) | Self::Conflict(status) => status,
        }
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        Self::from(status.code())
    }
}

impl Report {
    /// The exit status this object means.
    #[must_use]
    pub(crate) fn exit_status(&self) -> ExitStatus {
        match self {
            Self::Acquired(_)
            | Self::Renewed(_)
            | Self::Released(_)
            | Self::ReleaseNotHeld(_)
            | Self::Status(_)
            | Self::Held(_)
            | Self::History(_) => ExitStatus::Success,
            Self::AlreadyRunning(_) => ExitStatus::AlreadyRunning,
            Self::Ran(r) => ExitStatus::Ran(r.exit_status),
            Self::Interrupted(r) => ExitStatus::Interrupted(crate::signals::exit_status(r.signal)),
            Self::RenewNotOwner(_)
            | Self::RenewNotHeld(_)
            | Self::Refused(_)
            | Self::CheckNotOwner(_)
            | Self::CheckNotHeld(_)
            | Self::Expired(_) => ExitStatus::NotYours,
            Self::Error(_) => ExitStatus::Error,
        }
    }
}
