//! `acquire` (SPEC §2.1): the request, the decision on what the store
//! shows (keep a live lock, create a free one, take over a stale one), its
//! outcome, and the answer of `--since`.

use super::{Context, State, event, judge};
use crate::error::Result;
use crate::history::EventKind;
use crate::key::LockKey;
use crate::lease::{self, StaleReason};
use crate::liveness::{self, Origin};
use crate::record::{FORMAT, Holder, NewRecord, NoFence, OwnerRecord, hash_token, new_token};
use crate::store::{Acquisition, Committed, Current, Decision, Draft, Store};

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
    /// `--since FENCE`: the fence `status` showed before the run read what
    /// it acts on; the outcome then says whether another acquisition came
    /// in between ([`others_since`]).
    pub since: Option<u64>,
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
        /// With `--since`: did another acquisition come after it (see
        /// [`others_since`])? `None` without `--since`.
        others_since: Option<bool>,
    },
    /// Someone else holds a live lease.
    AlreadyRunning {
        /// Its holder.
        holder: Holder,
        /// Seconds left on its lease.
        expires_in: u64,
    },
}

/// The identity of an acquirer, found once per command (outside the
/// critical section): its token's hash and its processes' start times.
struct Acquirer<'a> {
    key: &'a LockKey,
    req: &'a AcquireRequest,
    token_sha256: String,
    owner_start: Option<u64>,
    group_start: Option<u64>,
}

impl Acquirer<'_> {
    /// The record of a new lease taken at `ctx` (its fence is the store's to assign).
    fn record(&self, ctx: &Context) -> NewRecord {
        let term = lease::term(&ctx.now, self.req.ttl);
        let here = Origin::here();
        OwnerRecord {
            holder: Holder {
                skill: self.key.skill().to_owned(),
                repo: self.key.repo().to_owned(),
                started: term.start,
                expires: term.expires,
                renewed: None,
                ttl: self.req.ttl,
                note: self.req.note.clone(),
                host: ctx.host.clone(),
                owner_pid: self.req.owner_pid,
                fence: NoFence,
                boot_id: ctx.now.boot.as_ref().map(|b| b.id.clone()),
                owner_start: self.owner_start,
                deadline_boot_ms: term.deadline_boot_ms,
                machine: here.machine.clone(),
                pid_ns: here.pid_ns,
                pid_ns_start: here.pid_ns_start,
                time_ns: ctx.now.boot.as_ref().and_then(|b| b.time_ns),
                owner_pgid: self.req.owner_pgid,
                group_start: self.group_start,
                format: FORMAT,
            },
            token_sha256: self.token_sha256.clone(),
        }
    }

    /// The decision on `current`, made at `ctx`: keep a live lock, create
    /// a free one, take over a stale one.
    fn decide(&self, current: &Current, ctx: &Context) -> Decision<Acquire, Option<TookOver>> {
        let record = self.record(ctx);
        let acquired = Draft::new(event(
            EventKind::Acquired,
            self.key,
            ctx,
            Some(&record.holder),
        ));
        let (took_over, then) = match judge(current, &ctx.now) {
            State::Held { holder, expires_in } => {
                return Decision::keep(Acquire::AlreadyRunning { holder, expires_in });
            }
            State::Free => (None, None),
            State::Stale { reason, holder, .. } => {
                let mut took_over = event::<u64>(EventKind::TookOver, self.key, ctx, None);
                took_over.reason = Some(reason.as_str().to_owned());
                took_over.previous.clone_from(&holder);
                took_over.owner_pid = self.req.owner_pid;
                took_over.note.clone_from(&self.req.note);
                (
                    Some(Draft::new(took_over)),
                    Some(TookOver { reason, holder }),
                )
            }
        };
        Decision::Acquire(Acquisition::new(record, took_over, acquired, then))
    }
}

/// The answer of `--since FENCE` (SPEC §2.1): did another acquisition of the
/// lock get a fence above `since` before this one, or can the store not
/// tell? `prior` is the fence of the acquisition before this one, as the
/// store knew it in the step that made this one ([`crate::store::Written`]).
///
/// Only "`prior` is `since`" says no: then the acquisition `status` showed
/// was the last one. A prior above it is someone else's; one below it (or
/// none, for a fence `status` did show) means the store's memory was reset
/// or trimmed since, and it cannot tell. A store that knows of no
/// acquisition, asked from `status`'s `null` (given as 0), says no. This
/// compares fences for equality only, so it holds where fences are not
/// consecutive (etcd's revisions).
#[must_use]
pub fn others_since(prior: Option<u64>, since: u64) -> bool {
    match prior {
        Some(p) => p != since,
        None => since != 0,
    }
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
    let acquirer = Acquirer {
        key,
        req,
        token_sha256: hash_token(&token),
        owner_start: req.owner_pid.and_then(liveness::process_start),
        group_start: req.owner_pgid.and_then(liveness::process_start),
    };
    // The clock is read inside the critical section: time spent waiting
    // for the guard neither shortens the lease nor hides an expiry.
    let committed = store.update(key, &mut |current| {
        Ok(acquirer.decide(current, &ctx.at_decision()))
    })?;
    Ok(match committed {
        Committed::Done(outcome) => outcome,
        Committed::Wrote(took_over, written) => Acquire::Acquired {
            token,
            others_since: req
                .since
                .map(|since| others_since(written.prior_fence, since)),
            holder: written.record.holder,
            took_over,
        },
    })
}
