//! The wire objects of SPEC §3: one type per JSON object an invocation
//! prints, the [`Report`] that tags them by `result`, and what the callers
//! read back from one. Fields appear in declaration order; a field that
//! applies but has no value is `null`. Only the shapes live here: how an
//! engine outcome becomes one is `convert.rs`, how one is printed `writer.rs`.

use serde::Serialize;

use crate::history::Event;
use crate::record::{Holder, Timestamp};

/// What every object about one lock carries: `skill`, `repo` (as given) and `lock`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct About {
    /// Skill, as given.
    pub skill: String,
    /// Repo, as given.
    pub repo: String,
    /// The lock's path (or key in a network store).
    pub lock: String,
    /// Seconds a takeover waits past `expires` for hosts' clocks to differ
    /// (the git store, SPEC §8); absent where the store needs none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_skew: Option<u64>,
}

/// A `took_over` object: why, and the holder replaced.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TookOverJson {
    /// `expired`, `owner_dead` or `corrupt`.
    pub reason: &'static str,
    /// The replaced holder, or null for a corrupt record.
    pub holder: Option<Holder>,
}

/// `acquired` (acquire, run): the lock is ours.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Acquired {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) token: String,
    pub(super) started: Timestamp,
    pub(super) expires: Timestamp,
    pub(super) ttl: u64,
    pub(super) note: Option<String>,
    pub(super) owner_pid: Option<u32>,
    pub(super) fence: u64,
    pub(super) took_over: Option<TookOverJson>,
    /// With `--since`: another acquisition came in between (or the store
    /// cannot tell); `null` without it.
    pub(super) others_since: Option<bool>,
}

/// `already_running` (acquire, run): someone else holds a live lease.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AlreadyRunning {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) holder: Holder,
    pub(super) expires_in: u64,
    pub(super) hint: String,
}

/// `ran` (run, on stderr): CMD ran while the lock was held.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Ran {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) fence: u64,
    /// As `acquired`'s (CMD had it as `SKILL_LOCK_OTHERS_SINCE`).
    pub(super) others_since: Option<bool>,
    pub(super) exit_status: u8,
    pub(super) signal: Option<i32>,
    pub(super) lost: bool,
    pub(super) renewals: u64,
    pub(super) released: bool,
}

/// `interrupted` (run, on stderr): a signal ended `run --wait` before CMD
/// started; nothing was acquired and nothing run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Interrupted {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) signal: i32,
    pub(super) message: String,
}

/// `renewed` (renew).
#[derive(Debug, Clone, Serialize)]
#[allow(clippy::struct_field_names, reason = "the wire names its fields")]
pub(crate) struct Renewed {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) expires: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) renewed: Option<Timestamp>,
    pub(super) ttl: u64,
    pub(super) fence: u64,
    pub(super) was_expired: bool,
    pub(super) expires_in: u64,
}

/// `not_owner` of renew: another token holds the lock.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RenewNotOwner {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) holder: Holder,
    pub(super) expires_in: u64,
}

/// `not_held` of renew: no lock, or only an unreadable one.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RenewNotHeld {
    #[serde(flatten)]
    pub(super) about: About,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stale_reason: Option<&'static str>,
}

/// `released` (release).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Released {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) forced: bool,
    pub(super) holder: Option<Holder>,
}

/// `refused` (release): the token does not hold the lock.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Refused {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) holder: Option<Holder>,
}

/// The state of one lock, as `status` and `list` show it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum LockState {
    /// A live lease.
    Held {
        /// Its holder.
        holder: Holder,
        /// Seconds left.
        expires_in: u64,
    },
    /// A lock the next acquire takes over.
    Stale {
        /// `expired`, `owner_dead` or `corrupt`.
        stale_reason: &'static str,
        /// Its holder, or null when unreadable.
        holder: Option<Holder>,
        /// Seconds left, or null when unreadable.
        expires_in: Option<u64>,
    },
    /// No lock.
    Free,
}

/// `status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    #[serde(flatten)]
    pub(super) about: About,
    /// The latest acquisition's fence, held or not; `null`: none known.
    pub(super) fence: Option<u64>,
    #[serde(flatten)]
    pub(super) state: LockState,
}

/// One lock in a `list` result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ListEntry {
    /// Skill.
    pub skill: String,
    /// Repository (as recorded; lowercase when the record is unreadable).
    pub repo: String,
    /// Held or stale, with the holder.
    #[serde(flatten)]
    pub state: LockState,
    /// Where the lock is.
    pub lock: String,
}

/// `held` (check): the token holds a live lease.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Held {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) expires: Timestamp,
    pub(super) fence: u64,
    pub(super) expires_in: u64,
}

/// `not_owner` of check: another token holds it, or its record is unreadable.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckNotOwner {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) holder: Option<Holder>,
}

/// `expired` (check): the token's lease ran out or its owner died.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Expired {
    #[serde(flatten)]
    pub(super) about: About,
    pub(super) expires: Timestamp,
    pub(super) fence: u64,
    pub(super) stale_reason: &'static str,
}

/// `history`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct History {
    /// The lock asked about, if one was.
    #[serde(flatten)]
    pub(super) about: Option<About>,
    /// Where it looked, when no lock was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) store: Option<String>,
    pub(super) events: Vec<Event>,
}

/// `error` (SPEC §3 "Errors").
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ErrorReport {
    pub(super) error: &'static str,
    pub(super) message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) skill: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) repo: Option<String>,
}

/// The one JSON object of an invocation, tagged by `result`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub(crate) enum Report {
    /// acquire, run: exit 0.
    Acquired(Acquired),
    /// acquire, run: exit 3.
    AlreadyRunning(AlreadyRunning),
    /// run: CMD's exit status.
    Ran(Ran),
    /// run --wait: 128+signal.
    Interrupted(Interrupted),
    /// renew: exit 0.
    Renewed(Renewed),
    /// renew: exit 4.
    #[serde(rename = "not_owner")]
    RenewNotOwner(RenewNotOwner),
    /// renew: exit 4.
    #[serde(rename = "not_held")]
    RenewNotHeld(RenewNotHeld),
    /// release: exit 0.
    Released(Released),
    /// release of a free lock: exit 0.
    #[serde(rename = "not_held")]
    ReleaseNotHeld(About),
    /// release: exit 4.
    Refused(Refused),
    /// status: exit 0.
    Status(Status),
    /// check: exit 0.
    Held(Held),
    /// check: exit 4.
    #[serde(rename = "not_owner")]
    CheckNotOwner(CheckNotOwner),
    /// check: exit 4.
    #[serde(rename = "not_held")]
    CheckNotHeld(About),
    /// check: exit 4.
    Expired(Expired),
    /// history: exit 0.
    History(History),
    /// Any command that could not reach an outcome: exit 2.
    Error(ErrorReport),
}

impl Report {
    /// The token of an `acquired` object (the only one that carries it).
    #[must_use]
    pub(crate) fn token(&self) -> Option<&str> {
        match self {
            Self::Acquired(a) => Some(&a.token),
            _ => None,
        }
    }

    /// The fence an object names as this acquisition's: `acquired`'s, and
    /// `renewed`'s (new when the lease was revived, SPEC §2.2).
    #[cfg(feature = "mcp")]
    #[must_use]
    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Self::Acquired(a) => Some(a.fence),
            Self::Renewed(r) => Some(r.fence),
            _ => None,
        }
    }
}
