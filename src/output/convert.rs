//! From engine outcomes to wire objects: one constructor of [`Report`] per
//! command, so that each command's fields are chosen in one place.

use super::wire::{
    About, Acquired, AlreadyRunning, CheckNotOwner, ErrorReport, Expired, Held, History,
    Interrupted, ListEntry, LockState, Ran, Refused, Released, RenewNotHeld, RenewNotOwner,
    Renewed, Report, Status, TookOverJson,
};
use crate::engine::{self, Acquire, Check, Entry, Release, Renew, State, TookOver};
use crate::error::Error;
use crate::history::Event;
use crate::key::LockKey;
use crate::store::Place;

impl About {
    /// The lock `key`, where its store says it is.
    #[must_use]
    pub(crate) fn new(key: &LockKey, location: Place) -> Self {
        Self {
            skill: key.skill().to_owned(),
            repo: key.repo().to_owned(),
            lock: location.lock,
            clock_skew: location.clock_skew,
        }
    }
}

impl From<TookOver> for TookOverJson {
    fn from(t: TookOver) -> Self {
        Self {
            reason: t.reason.as_str(),
            holder: t.holder,
        }
    }
}

impl From<State> for LockState {
    fn from(state: State) -> Self {
        match state {
            State::Held { holder, expires_in } => Self::Held { holder, expires_in },
            State::Stale {
                reason,
                holder,
                expires_in,
            } => Self::Stale {
                stale_reason: reason.as_str(),
                holder,
                expires_in,
            },
            State::Free => Self::Free,
        }
    }
}

impl From<Entry> for ListEntry {
    fn from(judged: Entry) -> Self {
        Self {
            skill: judged.key.skill().to_owned(),
            repo: judged.key.repo().to_owned(),
            state: LockState::from(judged.state),
            lock: judged.location,
        }
    }
}

impl Report {
    /// The error object of SPEC §3; `lock` names the skill and repo as given.
    #[must_use]
    pub(crate) fn error(err: &Error, lock: Option<(String, String)>) -> Self {
        let (skill, repo) = lock.unzip();
        Self::Error(ErrorReport {
            error: err.code(),
            message: err.to_string(),
            skill,
            repo,
        })
    }

    /// The object of an acquire; `hint` is asked for only when the lock is held.
    pub(crate) fn acquire(outcome: Acquire, about: About, hint: impl FnOnce() -> String) -> Self {
        match outcome {
            Acquire::Acquired {
                token,
                holder,
                took_over,
                others_since,
            } => Self::Acquired(Acquired {
                about,
                token,
                started: holder.started,
                expires: holder.expires,
                ttl: holder.ttl,
                note: holder.note,
                owner_pid: holder.owner_pid,
                fence: holder.fence,
                took_over: took_over.map(TookOverJson::from),
                others_since,
            }),
            Acquire::AlreadyRunning { holder, expires_in } => {
                Self::AlreadyRunning(AlreadyRunning {
                    about,
                    holder,
                    expires_in,
                    hint: hint(),
                })
            }
        }
    }

    /// The object of a `run` that ran CMD.
    #[must_use]
    pub(crate) fn ran(
        about: About,
        fence: u64,
        others_since: Option<bool>,
        ran: &crate::run::Completion,
    ) -> Self {
        Self::Ran(Ran {
            about,
            fence,
            others_since,
            exit_status: ran.exit_status,
            signal: ran.signal,
            lost: ran.lost,
            renewals: ran.renewals,
            released: ran.released,
        })
    }

    /// The object of a `run --wait` that a signal ended before CMD started.
    #[must_use]
    pub(crate) fn interrupted(about: About, signal: i32) -> Self {
        Self::Interrupted(Interrupted {
            about,
            signal,
            message: format!(
                "{} arrived before the command started: nothing was run, and the lock is not held",
                crate::signals::name(signal)
            ),
        })
    }

    /// The object of a renew.
    #[must_use]
    pub(crate) fn renew(outcome: Renew, about: About) -> Self {
        match outcome {
            Renew::Renewed {
                holder,
                was_expired,
                expires_in,
            } => Self::Renewed(Renewed {
                about,
                expires: holder.expires,
                renewed: holder.renewed,
                ttl: holder.ttl,
                fence: holder.fence,
                was_expired,
                expires_in,
            }),
            Renew::NotOwner { holder, expires_in } => Self::RenewNotOwner(RenewNotOwner {
                about,
                holder,
                expires_in,
            }),
            Renew::NotHeld { corrupt } => Self::RenewNotHeld(RenewNotHeld {
                about,
                stale_reason: corrupt.then_some("corrupt"),
            }),
        }
    }

    /// The object of a release.
    #[must_use]
    pub(crate) fn release(outcome: Release, about: About) -> Self {
        match outcome {
            Release::Released { holder, forced } => Self::Released(Released {
                about,
                forced,
                holder,
            }),
            Release::NotHeld => Self::ReleaseNotHeld(about),
            Release::Refused { holder } => Self::Refused(Refused { about, holder }),
        }
    }

    /// The object of a status.
    #[must_use]
    pub(crate) fn status(status: engine::Status, about: About) -> Self {
        Self::Status(Status {
            about,
            fence: status.fence,
            state: LockState::from(status.state),
        })
    }

    /// The object of a check.
    #[must_use]
    pub(crate) fn check(outcome: Check, about: About) -> Self {
        match outcome {
            Check::Held { holder, expires_in } => Self::Held(Held {
                about,
                expires: holder.expires,
                fence: holder.fence,
                expires_in,
            }),
            Check::NotOwner { holder } => Self::CheckNotOwner(CheckNotOwner { about, holder }),
            Check::NotHeld => Self::CheckNotHeld(about),
            Check::Expired { reason, holder } => Self::Expired(Expired {
                about,
                expires: holder.expires,
                fence: holder.fence,
                stale_reason: reason.as_str(),
            }),
        }
    }

    /// The object of a history: of one lock (`about`), or of the whole `store`.
    #[must_use]
    pub(crate) fn history(about: Option<About>, store: String, events: Vec<Event>) -> Self {
        let store = about.is_none().then_some(store);
        Self::History(History {
            about,
            store,
            events,
        })
    }
}
