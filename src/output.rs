//! Output (SPEC §3): the JSON wire format and the only writer to stdout.
//!
//! Every invocation but `--help`/`--version` prints exactly one [`Report`] as
//! one line. Fields appear in declaration order and are left out when they
//! do not apply to a result; a field that applies but has no value is `null`.
//!
//! Results: `acquired`, `already_running` (acquire, run); `renewed`,
//! `not_owner`, `not_held` (renew); `released`, `not_held`, `refused`
//! (release); `status`; `list`; `held`, `not_owner`, `not_held`, `expired`
//! (check); `history`; `ran` (run, on stderr); `error`. Exit statuses come from [`Report::exit`].

use std::io::Write;

use serde::Serialize;

use crate::engine::TookOver;
use crate::error::Error;
use crate::history::Event;
use crate::record::{Holder, Timestamp};

/// A `took_over` object: why, and the holder replaced.
#[derive(Debug, Clone, Serialize)]
pub struct TookOverJson {
    /// `expired`, `owner_dead` or `corrupt`.
    pub reason: &'static str,
    /// The replaced holder, or null for a corrupt record.
    pub holder: Option<Holder>,
}

impl From<&TookOver> for TookOverJson {
    fn from(t: &TookOver) -> Self {
        Self {
            reason: t.reason.as_str(),
            holder: t.holder.clone(),
        }
    }
}

/// One lock in a `list` result.
#[derive(Debug, Clone, Serialize)]
pub struct ListEntry {
    /// Skill.
    pub skill: String,
    /// Repository (as recorded; lowercase when the record is unreadable).
    pub repo: String,
    /// `held` or `stale`.
    pub state: &'static str,
    /// Why stale, when stale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_reason: Option<&'static str>,
    /// The holder, or null when unreadable.
    pub holder: Option<Holder>,
    /// Seconds left, or null when unreadable.
    pub expires_in: Option<u64>,
    /// Where the lock is.
    pub lock: String,
}

/// The one JSON object of an invocation.
#[derive(Debug, Clone, Default, Serialize)]
#[allow(clippy::option_option)]
pub struct Report {
    /// What happened.
    pub result: &'static str,
    /// SPEC error code, on errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
    /// What to do, on errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Skill, as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// Repo, as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    /// The lock's path (or key in a network store).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// The token: only in `acquired`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Start of the lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<Timestamp>,
    /// End of the lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<Timestamp>,
    /// Time of this renewal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewed: Option<Timestamp>,
    /// Lease length, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    /// The note kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<Option<String>>,
    /// Owner pid kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_pid: Option<Option<u32>>,
    /// Fencing number of the acquisition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fence: Option<u64>,
    /// The stale lock replaced, or null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub took_over: Option<Option<TookOverJson>>,
    /// Renewed a lease that had run out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub was_expired: Option<bool>,
    /// `--force` overrode the holder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced: Option<bool>,
    /// `held`, `stale` or `free` (status).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// Why stale.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_reason: Option<&'static str>,
    /// The holder record (never the token).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<Option<Holder>>,
    /// Seconds left on the holder's lease.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_in: Option<Option<u64>>,
    /// The `release --force` command line for a holder known to be dead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// Seconds a takeover waits past another host's `expires` (git store).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_skew: Option<u64>,
    /// Where `list` looked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<String>,
    /// Every lock (list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locks: Option<Vec<ListEntry>>,
    /// Leftovers of takeovers seen (list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tombstones: Option<usize>,
    /// Status `run` exits with (CMD's, or 128+signal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<u8>,
    /// Signal that ended CMD, or null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<Option<i32>>,
    /// A renewal found the lease lost while CMD ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<bool>,
    /// Renewals made while CMD ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renewals: Option<u64>,
    /// The lock was released when CMD ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
    /// History events, oldest first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<Event>>,
    /// Exit status (not printed).
    #[serde(skip)]
    pub exit: u8,
}

impl Report {
    /// A report with a result and exit status.
    #[must_use]
    pub fn new(result: &'static str, exit: u8) -> Self {
        Self {
            result,
            exit,
            ..Self::default()
        }
    }

    /// The error report of SPEC §3.
    #[must_use]
    pub fn error(err: &Error) -> Self {
        Self {
            error: Some(err.code()),
            message: Some(err.to_string()),
            ..Self::new("error", err.exit_code())
        }
    }

    /// Serializes to one line ending in `\n`.
    #[must_use]
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_else(|e| {
            format!(
                r#"{{"result":"error","error":"internal","message":"cannot print result: {e}"}}"#
            )
            .into_bytes()
        });
        v.push(b'\n');
        v
    }

    /// Prints the report on stdout (or stderr for `run`). A closed pipe is not an error.
    pub fn emit(&self, to_stderr: bool) {
        let line = self.to_line();
        #[allow(clippy::print_stdout)]
        let _ = if to_stderr {
            std::io::stderr().lock().write_all(&line)
        } else {
            let mut out = std::io::stdout().lock();
            out.write_all(&line).and_then(|()| out.flush())
        };
    }
}
