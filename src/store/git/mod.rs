//! git store (SPEC §8): locks shared by every clone of a repository, with no
//! server to run.
//!
//! A lock is the ref `refs/skill-lock/[NAMESPACE/]<skill>@<owner>__<name>` on
//! the remote (in lowercase; a name git does not take as a ref component, or
//! too long for one, in its digest form, [`LockKey::ref_stem`]). It points
//! at a commit whose tree holds one file, `lock.json`:
//!
//! ```text
//! {"format":1,"state":"held","fence":7,"depth":12,"epoch":0,"record":{...owner record...}}
//! {"format":1,"state":"free","fence":7,"depth":13,"epoch":0}
//! ```
//!
//! and whose parent is the previous state, so a release is a commit (never a
//! ref deletion) and the fence carried in the file keeps growing. The commit
//! message holds the history events of the change, one JSON object a line,
//! so `git log` of the ref is the lock's history. After [`ROLL_DEPTH`]
//! commits (`SKILL_LOCK_GIT_HISTORY_DEPTH`) a change starts a new root commit
//! carrying the fence and the chain number (`epoch`), and the same atomic
//! push keeps the old chain as `refs/skill-lock-archive/[NAMESPACE/]<name>/<epoch
//! mod ARCHIVE_SLOTS>`: a lock keeps its last 10,000 to 11,000 events, and a
//! read fetches one short chain.
//!
//! Every change is one `git push --force-with-lease=<ref>:<oid as read>`: the
//! client checks the lease against the ref it is told in the same
//! connection, and sends that old value with the update, which the server's
//! ref transaction checks under its ref lock. That is the compare-and-swap: a
//! rejected push means the lock changed after it was read, so it is read
//! again and decided again. A push whose outcome is unknown (timeout,
//! dropped connection) is settled by reading the ref back: our commit there,
//! or under a later one, means it was applied.
//!
//! Objects are made in a private bare repository (the cache, see
//! [`GitConfig::parse`]), written there by this process as loose objects
//! (blob, tree, then commit, each renamed into place whole; see `loose.rs`),
//! and pushed from there. What a remote serves is read bounded (SPEC §8):
//! sizes first, with `cat-file --batch-check`, and only state files no
//! larger than a record allows, streamed (see `objects.rs`). A read
//! (`status`, `check`) is one `git ls-remote`, and nothing more when the ref
//! still names the state this host last wrote or read (remembered with it,
//! see `memo.rs`); otherwise a `cat-file` pair, after a `git fetch` when the
//! commit is not in the cache yet. A change reads with one `git fetch
//! --porcelain`, which both names the ref's commit and brings it. A change
//! on a lock this host wrote or read last (or, failing that, saw in its last
//! `list`) is first decided on that state and pushed with it as the lease,
//! saving the read, and so is one on a lock this
//! host never saw, believed absent (leased on the empty value): so an
//! acquire, renew or release is one git process, the push; a wrong guess is
//! rejected by the server, and a guess that changes nothing is never trusted
//! (docs/safety.md, "Deciding without a read"). `list` reads every lock in
//! a bounded number of git processes, whatever their number: one
//! `ls-remote`, the state files the last `list` read from its memo, and the
//! others in one fetch and one `cat-file` pair. `history` reads every lock's
//! chains in one `cat-file --batch` that walks them all (see `walk.rs`).
//!
//! Expiry is judged by this host's wall clock (a record from this boot of
//! this host: by its boot-time clock, as in the file store): a record judged
//! by the wall clock is shown to the engine as stored, with a lease end
//! later than its `expires` by the clock-skew allowance
//! (`SKILL_LOCK_CLOCK_SKEW`, default [`DEFAULT_CLOCK_SKEW`] seconds), so a
//! takeover from another host waits that long past `expires`. git runs with every prompt disabled and a
//! deadline (`SKILL_LOCK_GIT_TIMEOUT`, default 10 s), after which its whole
//! process group is killed and the command answers `store_unavailable`.
//!
//! The files, each using only those below it (no module calls back up):
//! this one holds [`GitStore`] and its [`Store`] methods with the attempt
//! loop (decide, commit, push, read again on a lost race); beside it
//! `list` (every lock in a bounded number of git processes) and `history`
//! (every chain's events); below them `loose` (writing a commit's objects),
//! `chain` (the state file, reading a ref into what the engine is shown,
//! the commit message), `walk` (the history of many chains in one git
//! process), `memo` (what this host remembers of the remote), `objects`
//! (reading lock states out of the cache, bounded, and fetching those it
//! lacks), `remote` (the `Remote`: the cache repository, `ls-remote`,
//! `fetch` and the compare-and-swap `push`), `config` (the URL, its checks
//! and the store's constants), `cmd` (running git with a deadline) and `os`
//! (what the cache directory needs of the OS, one trait). Below `mod.rs`
//! they are free functions over a `Remote`, never methods of the store.

use std::path::PathBuf;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;
use crate::record::OwnerRecord;
use crate::store::{Committed, Current, Decision, Listed, Place, Store};

mod chain;
mod cmd;
mod config;
mod history;
mod list;
mod loose;
mod memo;
mod objects;
mod os;
mod remote;
mod walk;

use chain::{CommitKind, RefState, STATE_FORMAT, StateFile, message};
pub use config::{
    ARCHIVE_PREFIX, ARCHIVE_SLOTS, DEFAULT_CLOCK_SKEW, DEFAULT_TIMEOUT, GitConfig, MAX_CLOCK_SKEW,
    REF_PREFIX, REMOTE_NAME, ROLL_DEPTH, has_secret, redact, validate_remote,
};
use remote::{Pushed, Remote};

/// The git store.
#[derive(Debug, Clone)]
pub struct GitStore {
    remote: Remote,
}

impl GitStore {
    /// Opens the store `config` names: its remote is resolved (see
    /// [`GitConfig::resolve`]); nothing is fetched until the first operation.
    ///
    /// # Errors
    /// As [`GitConfig::resolve`].
    pub fn open(config: GitConfig) -> Result<Self> {
        Ok(Self::from_config(config.resolve()?))
    }

    /// The store for a configuration taken as it is (its remote already resolved).
    #[must_use]
    pub fn from_config(config: GitConfig) -> Self {
        Self {
            remote: Remote::new(config),
        }
    }

    /// The store's URL as given, but with a relative path to the remote
    /// made absolute (as it was resolved), so that it names the same
    /// remote from any directory (a hint, SPEC §8).
    #[must_use]
    pub fn url_from_anywhere(&self) -> String {
        self.remote.config.url_from_anywhere()
    }
}

/// An attempt whose push outcome was unknown, kept to recognise it later.
struct Pending<K, W> {
    commit: String,
    /// Its state file.
    body: Vec<u8>,
    /// What it comes to once it is known to have landed.
    committed: Committed<K, W>,
}

impl Store for GitStore {
    fn describe(&self) -> String {
        redact(&self.remote.config.url)
    }

    /// The lock's ref, and the clock-skew allowance every answer reports.
    fn location(&self, key: &LockKey) -> Place {
        Place {
            lock: self.remote.lock_ref(key),
            clock_skew: Some(self.remote.config.clock_skew),
        }
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let deadline = Instant::now() + self.remote.config.timeout;
        Ok(chain::read_seen(&self.remote, key, deadline)?.current)
    }

    /// The fence in the ref's state file, held or free (a release commits
    /// it again): the ref is one atomic value, so it names no acquisition
    /// that a read of the same ref does not show.
    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        let deadline = Instant::now() + self.remote.config.timeout;
        Ok(chain::read_seen(&self.remote, key, deadline)?
            .fence
            .filter(|f| *f > 0))
    }

    /// One read: the ref names one commit, whose state file holds both the
    /// state and the lock's last fence (a release keeps it), so the fence
    /// belongs to exactly the state returned (one `ls-remote` when this
    /// host has that commit's state, SPEC §2.4).
    fn read_with_fence(&self, key: &LockKey) -> Result<(Current, Option<u64>)> {
        let deadline = Instant::now() + self.remote.config.timeout;
        let seen = chain::read_seen(&self.remote, key, deadline)?;
        Ok((seen.current, seen.fence.filter(|f| *f > 0)))
    }

    fn update<K, W>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
    ) -> Result<Committed<K, W>> {
        let start = Instant::now();
        let deadline = start + self.remote.config.timeout;
        // Leave a quarter of the time to settle a push whose outcome is unknown.
        let push_deadline = start + self.remote.config.timeout.mul_f64(0.75);
        let r = self.remote.lock_ref(key);
        let mut pending: Vec<Pending<K, W>> = Vec::new();
        let mut unknown_why = None;
        // The ref as this host last wrote or read it (alone or in a
        // `list`), or absent when this host never saw it: deciding on it and pushing with it as the lease
        // (the server's compare-and-swap) saves the read when nobody changed
        // the lock since (acquire, renew, release). A push that lands proves
        // the ref was exactly that state, so everything decided on it (the
        // fence, `prior_fence`, a takeover and its events) is what a read
        // would have given. A decision to change nothing is not trusted on
        // this view: it is made again on a fresh read; so is a lost race.
        let guess = self
            .remembered(&r)
            .or_else(|| memo::never_seen(&self.remote, &r).then(RefState::absent));
        if let Some(seen) = guess {
            match self.attempt(key, &r, &seen, decide, push_deadline, true)? {
                Step::Done(c) => return Ok(c),
                Step::Again => {}
                Step::Unknown(p, why) => {
                    unknown_why = Some(why);
                    pending.push(p);
                }
            }
        }
        loop {
            let seen = match chain::read_fetching(&self.remote, key, deadline)
                .and_then(|s| chain::with_fence(&self.remote, s))
            {
                Ok(s) => s,
                Err(e) if pending.is_empty() => return Err(e),
                Err(e) => {
                    return Err(self.remote.unavailable(&format!(
                        "a push's outcome is unknown ({}) and the ref could not be read back ({e}); run status to see whether this lock is held (its token is lost: if it is, release it with --force)",
                        unknown_why.unwrap_or_default()
                    )));
                }
            };
            if let Some(tip) = &seen.oid {
                for i in 0..pending.len() {
                    if chain::contains(&self.remote, tip, &pending[i].commit)? {
                        let p = pending.swap_remove(i);
                        memo::remember(&self.remote, &r, Some((&p.commit, &p.body)));
                        return Ok(p.committed);
                    }
                }
            }
            let push_left = push_deadline.saturating_duration_since(Instant::now());
            if push_left.is_zero() {
                return Err(if pending.is_empty() {
                    self.remote.unavailable("the lock kept changing under this command (lost every race until the deadline)")
                } else {
                    self.remote.unavailable(&format!(
                        "a push's outcome is unknown ({}), and the lock does not show it",
                        unknown_why.unwrap_or_default()
                    ))
                });
            }
            match self.attempt(key, &r, &seen, decide, push_deadline, false)? {
                Step::Done(c) => return Ok(c),
                Step::Again => {}
                Step::Unknown(p, why) => {
                    unknown_why = Some(why);
                    pending.push(p);
                }
            }
        }
    }

    /// Every lock ref, in a bounded number of git processes (see `list.rs`).
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        list::visit_locks(&self.remote, visit)
    }

    /// One lock's events or every lock's, all chains walked in one git
    /// process (see `history.rs`).
    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        history::history(&self.remote, key, limit)
    }
}

/// What one decide-and-push attempt came to.
enum Step<K, W> {
    /// Applied (or nothing to apply).
    Done(Committed<K, W>),
    /// Lost a race (or a guess was wrong): read and decide again.
    Again,
    /// The push's outcome is unknown.
    Unknown(Pending<K, W>, String),
}

impl GitStore {
    /// The state this host last wrote to `r` (or read of it: alone, or
    /// else in the last `list`), to decide on without a read.
    fn remembered(&self, r: &str) -> Option<RefState> {
        let prefix = self.remote.ns_prefix(REF_PREFIX);
        let (oid, body) =
            memo::memo(&self.remote, r).or_else(|| memo::listed(&self.remote, &prefix, r))?;
        let seen = chain::interpret_state(&self.remote, &oid, &body);
        matches!(seen.current, Current::Free | Current::Held(_)).then_some(seen)
    }

    /// Decides on `seen` and pushes the change with `seen` as the lease.
    /// `guess`: `seen` was not read from the remote, so a decision to change
    /// nothing proves nothing and a lost race is no news.
    fn attempt<K, W>(
        &self,
        key: &LockKey,
        r: &str,
        seen: &RefState,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
        push_deadline: Instant,
        guess: bool,
    ) -> Result<Step<K, W>> {
        let next = match next_state(r, seen, decide(&seen.current)?)? {
            Next::Commit(next) => next,
            // Nothing to write: only a refusal of a held lock records events.
            Next::Nothing(_) if guess => return Ok(Step::Again),
            Next::Nothing(outcome) => return Ok(Step::Done(Committed::Done(outcome))),
        };
        let (state, parent, archive) = self.roll(key, seen, next.state);
        let msg = message(key, next.what, state.fence, &next.events)?;
        let body = serde_json::to_vec(&state).map_err(|e| Error::Internal(e.to_string()))?;
        let commit = loose::make_commit(&self.remote, &body, parent, &msg)?;
        let archive = archive.as_ref().map(|(old, a)| (old.as_str(), a.as_str()));
        match self.remote.push(r, seen.oid.as_deref(), &commit, archive, push_deadline)? {
            Pushed::Done => {
                memo::remember(&self.remote, r, Some((&commit, &body)));
                Ok(Step::Done(next.committed))
            }
            Pushed::Lost => {
                if guess {
                    memo::remember(&self.remote, r, None);
                }
                Ok(Step::Again)
            }
            Pushed::Refused(why) => Err(self.remote.unavailable(&format!(
                "the remote refused the update of {r}: {why}; check that you may push refs under {REF_PREFIX}"
            ))),
            Pushed::Unknown(why) => Ok(Step::Unknown(
                Pending {
                    commit,
                    body,
                    committed: next.committed,
                },
                why,
            )),
        }
    }

    /// The state to commit on top of `seen` (a new root when its chain is
    /// unreadable or long enough), its parent, and the archive ref that
    /// keeps the old chain when a new one starts.
    fn roll<'a>(
        &self,
        key: &LockKey,
        seen: &'a RefState,
        mut state: StateFile,
    ) -> (StateFile, Option<&'a str>, Option<(String, String)>) {
        let roll = !seen.chainable || seen.depth >= self.remote.config.history_depth;
        if !roll {
            return (state, seen.oid.as_deref(), None);
        }
        state.depth = 1;
        state.epoch = if seen.chainable {
            seen.epoch.saturating_add(1)
        } else {
            seen.epoch
        };
        let archive = match (&seen.oid, seen.chainable) {
            (Some(old), true) => Some((
                old.clone(),
                self.remote
                    .archive_ref(&key.ref_stem(), seen.epoch % ARCHIVE_SLOTS),
            )),
            _ => None,
        };
        (state, None, archive)
    }
}

/// The commit a decision makes on top of a ref's state.
struct Commit<K, W> {
    state: StateFile,
    /// The history events, fenced.
    events: Vec<Event>,
    /// The change, as the commit message names it.
    what: CommitKind,
    /// What the decision comes to once the commit lands.
    committed: Committed<K, W>,
}

/// What a decision asks of a ref.
// One per attempt, moved once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Next<K, W> {
    /// A commit on top of it.
    Commit(Commit<K, W>),
    /// Nothing written (keeping a lock; a refusal of a free or unreadable
    /// one): the outcome.
    Nothing(K),
}

/// The commit a decision asks for on top of `seen`, or nothing.
fn next_state<K, W>(r: &str, seen: &RefState, decision: Decision<K, W>) -> Result<Next<K, W>> {
    let known_fence = || {
        seen.fence.ok_or_else(|| Error::Io {
            action: "read the last fence of",
            path: PathBuf::from(r),
            source: std::io::Error::other(format!(
                "the lock's state ({}) and its recent history are unreadable, so a new fence could repeat one; remove the ref with `git push REMOTE :REF` as an operator",
                match &seen.current {
                    Current::Corrupt(why) => why.as_str(),
                    _ => "?",
                }
            )),
        })
    };
    let held = |rec: &OwnerRecord| held_state(rec, seen.depth, seen.epoch);
    Ok(Next::Commit(match decision {
        Decision::Keep(outcome, events) => match seen.current.record() {
            // Only refusals carry events here; kept when a record is there.
            Some(rec) if !events.is_empty() => Commit {
                state: held(rec)?,
                events,
                what: CommitKind::Refused,
                committed: Committed::Done(outcome),
            },
            _ => return Ok(Next::Nothing(outcome)),
        },
        Decision::Acquire(acq) => {
            let fence = known_fence()?
                .checked_add(1)
                .ok_or_else(|| Error::Internal("the fence would overflow".into()))?;
            let prior = seen.fence.filter(|f| *f > 0);
            let done = acq.finish(fence, prior);
            let state = held(&done.written.record)?;
            let (committed, events) = done.committed();
            Commit {
                state,
                events,
                what: CommitKind::Acquired,
                committed,
            }
        }
        Decision::Renew(renewal) => {
            let state = held(renewal.record())?;
            let (committed, events) = renewal.finish().committed();
            Commit {
                state,
                events,
                what: CommitKind::Renewed,
                committed,
            }
        }
        Decision::Delete(outcome, event) => Commit {
            state: StateFile {
                format: STATE_FORMAT,
                state: "free".into(),
                fence: known_fence()?,
                depth: seen.depth + 1,
                epoch: seen.epoch,
                record: None,
            },
            events: vec![event],
            what: CommitKind::Released,
            committed: Committed::Done(outcome),
        },
    }))
}

/// The state file of a held lock with `rec` (its fence the lock's).
fn held_state(rec: &OwnerRecord, depth: u64, epoch: u64) -> Result<StateFile> {
    let value = serde_json::value::to_raw_value(rec).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(StateFile {
        format: STATE_FORMAT,
        state: "held".into(),
        fence: rec.holder.fence,
        depth: depth + 1,
        epoch,
        record: Some(value),
    })
}
