//! The lock operations of SPEC §2 over any [`Store`]: acquire, renew,
//! release, status, check, list.
//!
//! Each mutating operation is one [`Store::update`]: the decision is made on
//! the state read inside the store's critical section, so it can never act on
//! a lock that changed after it looked. Someone else holding the lock is an
//! outcome (`Ok`), not an error.

use crate::error::Result;
use crate::history::{Event, EventKind};
use crate::key::LockKey;
use crate::lease::{self, Now};
use crate::liveness::{self, StaleReason};
use crate::record::{FORMAT, Holder, OwnerRecord, hash_token, new_token};
use crate::store::{Change, Current, Decision, Store};

/// Who is asking: the host and clock every judgement uses.
#[derive(Debug, Clone)]
pub struct Context {
    /// This host's name, as recorded and compared.
    pub host: String,
    /// The clocks, read when the command started.
    pub now: Now,
    /// Where decisions read the clock again, inside the critical section
    /// (`Now::read`; a test may pin it to `now`).
    pub clock: Option<fn() -> Now>,
}

impl Context {
    /// Reads the hostname and the clocks.
    #[must_use]
    pub fn here() -> Self {
        Self {
            host: liveness::hostname(),
            now: Now::read(),
            clock: Some(Now::read),
        }
    }

    /// The context with the clock read again (when it has a clock).
    #[must_use]
    pub fn at_decision(&self) -> Self {
        Self {
            host: self.host.clone(),
            now: self.clock.map_or_else(|| self.now.clone(), |read| read()),
            clock: self.clock,
        }
    }
}

/// What an acquire asks for.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Lease, seconds.
    pub ttl: u64,
    /// Free text kept in the record.
    pub note: Option<String>,
    /// Process whose death makes the lock stale.
    pub owner_pid: Option<u32>,
    /// `run`'s process group: the lock is held while any member lives
    /// (SPEC §2.7); its leader must be alive when acquiring.
    pub owner_pgid: Option<u32>,
}

/// A stale lock that an acquire replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TookOver {
    /// Why it was stale.
    pub reason: StaleReason,
    /// Its holder (None for a corrupt record).
    pub holder: Option<Holder>,
}

/// The outcome of [`acquire`].
// One value per command: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquire {
    /// The lock is ours.
    Acquired {
        /// The token proving it; printed once, stored only hashed.
        token: String,
        /// The record as written.
        holder: Holder,
        /// The stale lock replaced, if any.
        took_over: Option<TookOver>,
    },
    /// Someone else holds a live lease.
    AlreadyRunning {
        /// Its holder.
        holder: Holder,
        /// Seconds left on its lease.
        expires_in: u64,
    },
}

/// The outcome of [`renew`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renew {
    /// The lease was extended.
    Renewed {
        /// The record as written.
        holder: Holder,
        /// It had run out (or its owner died) and nobody had taken it over.
        was_expired: bool,
    },
    /// Another token holds it.
    NotOwner {
        /// Its holder.
        holder: Holder,
    },
    /// No lock at all (or only an unreadable one).
    NotHeld {
        /// Set when an unreadable record is there.
        corrupt: bool,
    },
}

/// The outcome of [`release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// The lock was removed.
    Released {
        /// The holder removed (None for a corrupt record).
        holder: Option<Holder>,
        /// `--force` overrode a token that did not match (or was not given).
        forced: bool,
    },
    /// Nothing to release.
    NotHeld,
    /// The token does not hold the lock.
    Refused {
        /// The actual holder (None for a corrupt record).
        holder: Option<Holder>,
    },
}

/// What [`status`] and [`list`] report of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// A live lease.
    Held {
        /// Its holder.
        holder: Holder,
        /// Seconds left.
        expires_in: u64,
    },
    /// A lock the next acquire takes over.
    Stale {
        /// Why.
        reason: StaleReason,
        /// Its holder, if readable.
        holder: Option<Holder>,
        /// Seconds left on the lease (0 when expired).
        expires_in: Option<u64>,
    },
    /// No lock.
    Free,
}

/// The outcome of [`check`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// The token holds a live lease.
    Held {
        /// Its record.
        holder: Holder,
        /// Seconds left.
        expires_in: u64,
    },
    /// Another token holds it (or its record is unreadable).
    NotOwner {
        /// The holder, if readable.
        holder: Option<Holder>,
    },
    /// No lock.
    NotHeld,
    /// The token's lease ran out or its owner died.
    Expired {
        /// Why.
        reason: StaleReason,
        /// Its record.
        holder: Holder,
    },
}

/// Judges a state read from the store.
#[must_use]
pub fn judge(current: &Current, ctx: &Context) -> State {
    match current {
        Current::Free => State::Free,
        Current::Corrupt(_) => State::Stale {
            reason: StaleReason::Corrupt,
            holder: None,
            expires_in: None,
        },
        Current::Held(rec) if lease::impossible(&rec.holder, &ctx.now) => State::Stale {
            reason: StaleReason::Corrupt,
            holder: Some(rec.holder.clone()),
            expires_in: None,
        },
        Current::Held(rec) => {
            let expires_in = lease::expires_in(&rec.holder, &ctx.now);
            match liveness::judge(&rec.holder, &ctx.host, &ctx.now) {
                None => State::Held {
                    holder: rec.holder.clone(),
                    expires_in,
                },
                Some(reason) => State::Stale {
                    reason,
                    holder: Some(rec.holder.clone()),
                    expires_in: Some(expires_in),
                },
            }
        }
    }
}

fn event(kind: EventKind, key: &LockKey, ctx: &Context, holder: Option<&Holder>) -> Event {
    let mut ev = Event::new(kind, key, ctx.now.wall(), &ctx.host);
    if let Some(h) = holder {
        ev.fence = Some(h.fence);
        ev.owner_pid = h.owner_pid;
        ev.note.clone_from(&h.note);
        ev.expires = Some(h.expires);
    }
    ev
}

/// Takes the lock for `key` when it is free or stale (SPEC §2.1).
///
/// # Errors
/// Store I/O failure.
pub fn acquire<S: Store>(
    store: &S,
    key: &LockKey,
    req: &AcquireRequest,
    ctx: &Context,
) -> Result<Acquire> {
    let token = new_token()?;
    let token_sha256 = hash_token(&token);
    let owner_start = req.owner_pid.and_then(liveness::process_start);
    let group_start = req.owner_pgid.and_then(liveness::process_start);
    let committed = store.update(key, &mut |current| {
        // The clock is read here, inside the critical section: time spent
        // waiting for the guard neither shortens the lease nor hides an expiry.
        let ctx = &ctx.at_decision();
        let term = lease::term(&ctx.now, req.ttl);
        let record = OwnerRecord {
            holder: Holder {
                skill: key.skill().to_owned(),
                repo: key.repo().to_owned(),
                started: term.start,
                expires: term.expires,
                renewed: None,
                ttl: req.ttl,
                note: req.note.clone(),
                host: ctx.host.clone(),
                owner_pid: req.owner_pid,
                fence: 0,
                boot_id: ctx.now.boot.as_ref().map(|b| b.id.clone()),
                owner_start,
                deadline_boot_ms: term.deadline_boot_ms,
                owner_pgid: req.owner_pgid,
                group_start,
                format: FORMAT,
            },
            token_sha256: token_sha256.clone(),
        };
        let mut acquired_event = event(EventKind::Acquired, key, ctx, Some(&record.holder));
        acquired_event.fence = None;
        let took_over_event = |reason: StaleReason, holder: Option<&Holder>| {
            let mut ev = event(EventKind::TookOver, key, ctx, None);
            ev.reason = Some(reason.as_str().to_owned());
            ev.previous = holder.cloned();
            ev.owner_pid = req.owner_pid;
            ev.note.clone_from(&req.note);
            ev
        };
        Ok(match judge(current, ctx) {
            State::Held { holder, expires_in } => Decision::keep(Err((holder, expires_in))),
            State::Free => Decision {
                change: Change::Create(record),
                events: vec![acquired_event],
                value: Ok(None),
            },
            State::Stale { reason, holder, .. } => Decision {
                change: Change::Takeover(record),
                events: vec![took_over_event(reason, holder.as_ref()), acquired_event],
                value: Ok(Some(TookOver { reason, holder })),
            },
        })
    })?;
    Ok(match (committed.value, committed.written) {
        (Ok(took_over), Some(written)) => Acquire::Acquired {
            token,
            holder: written.holder,
            took_over,
        },
        (Err((holder, expires_in)), _) => Acquire::AlreadyRunning { holder, expires_in },
        (Ok(_), None) => {
            return Err(crate::error::Error::Internal(
                "acquire committed without a record".into(),
            ));
        }
    })
}

/// Extends a held lease to now + ttl (SPEC §2.2).
///
/// # Errors
/// Store I/O failure.
pub fn renew<S: Store>(
    store: &S,
    key: &LockKey,
    token: Option<&str>,
    ttl: Option<u64>,
    ctx: &Context,
) -> Result<Renew> {
    let committed = store.update(key, &mut |current| {
        let ctx = &ctx.at_decision();
        let rec = match current {
            Current::Free => return Ok(Decision::keep(Renew::NotHeld { corrupt: false })),
            Current::Corrupt(_) => return Ok(Decision::keep(Renew::NotHeld { corrupt: true })),
            Current::Held(rec) => rec,
        };
        if let Some(t) = token
            && !rec.token_matches(t)
        {
            let mut ev = event(EventKind::Refused, key, ctx, Some(&rec.holder));
            ev.reason = Some("renew with a token that does not hold the lock".into());
            ev.previous = Some(rec.holder.clone());
            return Ok(Decision {
                change: Change::Keep,
                events: vec![ev],
                value: Renew::NotOwner {
                    holder: rec.holder.clone(),
                },
            });
        }
        let was_expired = liveness::judge(&rec.holder, &ctx.host, &ctx.now).is_some();
        let ttl = ttl.unwrap_or(rec.holder.ttl);
        let term = lease::term(&ctx.now, ttl);
        let mut new = rec.clone();
        new.holder.expires = term.expires;
        new.holder.renewed = Some(term.start);
        new.holder.ttl = ttl;
        new.holder.boot_id = ctx.now.boot.as_ref().map(|b| b.id.clone());
        new.holder.deadline_boot_ms = term.deadline_boot_ms;
        if new.holder.host != ctx.host {
            // A renewal from another host keeps the lease but not the pid link.
            new.holder.boot_id = None;
            new.holder.deadline_boot_ms = None;
        }
        let mut ev = event(EventKind::Renewed, key, ctx, Some(&new.holder));
        if was_expired {
            ev.reason = Some("was_expired".into());
        }
        Ok(Decision {
            change: Change::Rewrite(new.clone()),
            events: vec![ev],
            value: Renew::Renewed {
                holder: new.holder,
                was_expired,
            },
        })
    })?;
    Ok(committed.value)
}

/// Removes a lock (SPEC §2.3).
///
/// # Errors
/// Store I/O failure.
pub fn release<S: Store>(
    store: &S,
    key: &LockKey,
    token: Option<&str>,
    force: bool,
    ctx: &Context,
) -> Result<Release> {
    let committed = store.update(key, &mut |current| {
        let holder = match current {
            Current::Free => return Ok(Decision::keep(Release::NotHeld)),
            Current::Corrupt(_) => None,
            Current::Held(rec) => Some(rec),
        };
        let matches = match (token, holder) {
            (None, _) => true,
            (Some(t), Some(rec)) => rec.token_matches(t),
            (Some(_), None) => false,
        };
        let shown = holder.map(|r| r.holder.clone());
        if !matches && !force {
            let mut ev = event(EventKind::Refused, key, ctx, shown.as_ref());
            ev.reason = Some("release with a token that does not hold the lock".into());
            ev.previous.clone_from(&shown);
            return Ok(Decision {
                change: Change::Keep,
                events: vec![ev],
                value: Release::Refused { holder: shown },
            });
        }
        let forced = force && !(token.is_some() && matches);
        let kind = if forced {
            EventKind::ForcedRelease
        } else {
            EventKind::Released
        };
        let mut ev = event(kind, key, ctx, shown.as_ref());
        ev.previous.clone_from(&shown);
        if holder.is_none() {
            ev.reason = Some("corrupt".into());
        }
        Ok(Decision {
            change: Change::Delete,
            events: vec![ev],
            value: Release::Released {
                holder: shown,
                forced,
            },
        })
    })?;
    Ok(committed.value)
}

/// Reads the state of a lock without changing anything (SPEC §2.4).
///
/// # Errors
/// Store I/O failure.
pub fn status<S: Store>(store: &S, key: &LockKey, ctx: &Context) -> Result<State> {
    Ok(judge(&store.read(key)?, ctx))
}

/// Does `token` hold a live lease on `key`? Read-only (SPEC §2.6).
///
/// # Errors
/// Store I/O failure.
pub fn check<S: Store>(store: &S, key: &LockKey, token: &str, ctx: &Context) -> Result<Check> {
    let current = store.read(key)?;
    Ok(match (&current, judge(&current, ctx)) {
        (Current::Free, _) => Check::NotHeld,
        (Current::Corrupt(_), _) => Check::NotOwner { holder: None },
        (Current::Held(rec), _) if !rec.token_matches(token) => Check::NotOwner {
            holder: Some(rec.holder.clone()),
        },
        (Current::Held(_), State::Held { holder, expires_in }) => {
            Check::Held { holder, expires_in }
        }
        (Current::Held(rec), State::Stale { reason, .. }) => Check::Expired {
            reason,
            holder: rec.holder.clone(),
        },
        (Current::Held(_), State::Free) => Check::NotHeld,
    })
}
