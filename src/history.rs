//! Event history (SPEC §2.8): the store-neutral schema of every change of a
//! lock's state, for the operator's question after a doubled post. Each
//! store keeps its events its own way (the file store in `run/`, etcd under
//! its prefix, git in its commit messages); no event ever holds a token.

use serde::{Deserialize, Serialize};

use crate::key::LockKey;
use crate::record::{Holder, Timestamp};

/// What happened to a lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A run acquired the lock (after a takeover too).
    Acquired,
    /// A stale lock was replaced; `previous` is the holder removed.
    TookOver,
    /// A lease was extended.
    Renewed,
    /// A lock was released by its holder (or without a token).
    Released,
    /// An operator's `--force` removed someone else's lock.
    ForcedRelease,
    /// A release or renew with a token that did not hold the lock.
    Refused,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened.
    pub time: Timestamp,
    /// What happened.
    pub event: EventKind,
    /// The lock's name (`skill@owner__name`), for filtering.
    pub lock: String,
    /// Skill, as given by the run that made the change.
    pub skill: String,
    /// Repository, as given by the run that made the change.
    pub repo: String,
    /// Fence of the acquisition concerned.
    pub fence: Option<u64>,
    /// Host of the process that made the change.
    pub host: String,
    /// Process that made the change.
    pub pid: u32,
    /// Owner pid of the (new) holder, if any.
    pub owner_pid: Option<u32>,
    /// Note of the (new) holder.
    pub note: Option<String>,
    /// Why: `expired`/`owner_dead`/`corrupt` for a takeover, or what was refused.
    pub reason: Option<String>,
    /// Expiry after an acquire or renewal.
    pub expires: Option<Timestamp>,
    /// The holder that was replaced, released or refused.
    pub previous: Option<Holder>,
}

impl Event {
    /// A new event about `key` made by this process now.
    #[must_use]
    pub fn new(kind: EventKind, key: &LockKey, time: Timestamp, host: &str) -> Self {
        Self {
            time,
            event: kind,
            lock: key.name(),
            skill: key.skill().to_owned(),
            repo: key.repo().to_owned(),
            fence: None,
            host: host.to_owned(),
            pid: std::process::id(),
            owner_pid: None,
            note: None,
            reason: None,
            expires: None,
            previous: None,
        }
    }
}
