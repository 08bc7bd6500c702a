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
//! [`GitConfig::parse`]) with `git hash-object`, `mktree` and `commit-tree`,
//! which are safe for concurrent processes, and pushed from there. A read is
//! one `git ls-remote`, plus a `git fetch` only when the commit is not in the
//! cache yet (a lock this host changed last is never fetched). A change on a
//! lock this host wrote last is first decided on what it wrote and pushed with
//! that as the lease, saving the read; a wrong guess is rejected by the
//! server, and a guess that changes nothing is never trusted.
//!
//! Expiry is judged by this host's wall clock (a record from this boot of
//! this host: by its boot-time clock, as in the file store): a record judged
//! by the wall clock is shown to the engine as stored, with a lease end
//! later than its `expires` by the clock-skew allowance
//! (`SKILL_LOCK_CLOCK_SKEW`, default [`DEFAULT_CLOCK_SKEW`] seconds), so a
//! takeover from another host waits that long past `expires`. git runs with every prompt disabled and a
//! deadline (`SKILL_LOCK_GIT_TIMEOUT`, default 10 s), after which its whole
//! process group is killed and the command answers `store_unavailable`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::{LockKey, is_digest_stem};
use crate::record::{OwnerRecord, random_suffix};
use crate::store::{Change, Committed, Current, Decision, Listed, Store, Written};

mod chain;
mod cmd;
mod config;
mod remote;

use chain::{RefState, StateFile, message};
use cmd::{Mode0700, Output, git_command, jitter, run, transient};
use config::is_local_path;
pub use config::{GitConfig, REMOTE_NAME, has_secret, redact, validate_remote};
use remote::Pushed;

/// Default deadline of one command's git work.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default clock-skew allowance, seconds.
pub const DEFAULT_CLOCK_SKEW: u64 = 30;
/// Largest clock-skew allowance accepted, seconds (it must stay well inside
/// the slack that tells an impossible lease from a long one).
pub const MAX_CLOCK_SKEW: u64 = 120;
/// Commits in a lock's chain before a change starts a new root commit
/// (default of `SKILL_LOCK_GIT_HISTORY_DEPTH`).
pub const ROLL_DEPTH: u64 = 1000;
/// Where lock refs live on the remote.
pub const REF_PREFIX: &str = "refs/skill-lock/";
/// Where a lock's previous chain is kept after a roll-over.
pub const ARCHIVE_PREFIX: &str = "refs/skill-lock-archive/";
/// Archived chains kept per lock (`<archive prefix><name>/<epoch mod this>`).
pub const ARCHIVE_SLOTS: u64 = 10;
const STATE_FILE: &str = "lock.json";
const STATE_FORMAT: u32 = 1;

/// The git store.
#[derive(Debug, Clone)]
pub struct GitStore {
    config: GitConfig,
    /// Whether ssh needs `BatchMode` from us (decided once, on first use).
    batch_ssh: std::sync::OnceLock<bool>,
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
            config,
            batch_ssh: std::sync::OnceLock::new(),
        }
    }

    /// The store's URL as given, but with a relative path to the remote
    /// made absolute (as it was resolved), so that it names the same
    /// remote from any directory (a hint, SPEC §8).
    #[must_use]
    pub fn url_from_anywhere(&self) -> String {
        self.config.url_from_anywhere()
    }

    fn ns_prefix(&self, base: &str) -> String {
        match &self.config.namespace {
            Some(ns) => format!("{base}{ns}/"),
            None => base.to_owned(),
        }
    }

    fn lock_ref(&self, key: &LockKey) -> String {
        format!("{}{}", self.ns_prefix(REF_PREFIX), key.ref_stem())
    }

    fn archive_ref(&self, name: &str, slot: u64) -> String {
        format!("{}{name}/{slot}", self.ns_prefix(ARCHIVE_PREFIX))
    }

    /// The local ref a fetched lock ref is kept under in the cache (so later
    /// fetches only bring what is new).
    fn cache_ref(&self, remote_ref: &str) -> String {
        let h = crate::record::hash_token(&self.config.remote);
        format!("refs/cache/{}/{remote_ref}", &h[..16])
    }
}

/// Is `name` (after the lock ref prefix) what a lock's ref is named?
fn is_lock_stem(name: &str) -> bool {
    LockKey::from_name(name).is_some_and(|k| k.ref_stem() == name) || is_digest_stem(name)
}

/// The key a digest stem `stem` stands for, read from the lock's record
/// and believed only when it maps to that stem (lowercase, as a key
/// parsed from a name is).
fn recorded_key(current: &Current, stem: &str) -> Option<LockKey> {
    let holder = &current.record()?.holder;
    let name = LockKey::new(&holder.skill, &holder.repo).ok()?.name();
    LockKey::from_name(&name).filter(|k| k.ref_stem() == stem)
}

/// An attempt whose push outcome was unknown, kept to recognise it later.
struct Pending<T> {
    commit: String,
    value: T,
    written: Option<Written>,
}

impl Store for GitStore {
    fn describe(&self) -> String {
        redact(&self.config.url)
    }

    fn location(&self, key: &LockKey) -> String {
        self.lock_ref(key)
    }

    fn clock_skew(&self) -> Option<u64> {
        Some(self.config.clock_skew)
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let deadline = Instant::now() + self.config.timeout;
        Ok(self.read_seen(key, deadline)?.current)
    }

    /// The fence in the ref's state file, held or free (a release commits
    /// it again): the ref is one atomic value, so it names no acquisition
    /// that a read of the same ref does not show.
    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        let deadline = Instant::now() + self.config.timeout;
        Ok(self.read_seen(key, deadline)?.fence.filter(|f| *f > 0))
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        let start = Instant::now();
        let deadline = start + self.config.timeout;
        // Leave a quarter of the time to settle a push whose outcome is unknown.
        let push_deadline = start + self.config.timeout.mul_f64(0.75);
        let r = self.lock_ref(key);
        let mut pending: Vec<Pending<T>> = Vec::new();
        let mut unknown_why = None;
        // The ref as this host last wrote it: deciding on it and pushing with
        // it as the lease saves the read when nobody changed the lock since
        // (renew, release). A decision to change nothing is not trusted on
        // this view: it is made again on a fresh read.
        if let Some(seen) = self.remembered(&r)? {
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
            let seen = match self.read_seen(key, deadline) {
                Ok(s) => s,
                Err(e) if pending.is_empty() => return Err(e),
                Err(e) => {
                    return Err(self.unavailable(&format!(
                        "a push's outcome is unknown ({}) and the ref could not be read back ({e}); run status to see whether this lock is held (its token is lost: if it is, release it with --force)",
                        unknown_why.unwrap_or_default()
                    )));
                }
            };
            if let Some(tip) = &seen.oid {
                for i in 0..pending.len() {
                    if self.contains(tip, &pending[i].commit)? {
                        let p = pending.swap_remove(i);
                        self.remember(&r, Some(&p.commit));
                        return Ok(Committed {
                            value: p.value,
                            written: p.written,
                        });
                    }
                }
            }
            let push_left = push_deadline.saturating_duration_since(Instant::now());
            if push_left.is_zero() {
                return Err(if pending.is_empty() {
                    self.unavailable("the lock kept changing under this command (lost every race until the deadline)")
                } else {
                    self.unavailable(&format!(
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

    /// Reads every lock ref in one `ls-remote` and one `cat-file` batch
    /// (a network store reads them all anyway), then hands them over in order.
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        let deadline = Instant::now() + self.config.timeout;
        let prefix = self.ns_prefix(REF_PREFIX);
        let refs = self.ls_remote(&[format!("{prefix}*")], &prefix, deadline)?;
        // A digest stem's key is known once its record is read.
        let mut named: Vec<(Option<LockKey>, String, String)> = refs
            .into_iter()
            .filter_map(|(r, oid)| {
                let name = r.strip_prefix(&prefix)?;
                let key = LockKey::from_name(name).filter(|k| k.ref_stem() == name);
                (key.is_some() || is_digest_stem(name)).then_some((key, r, oid))
            })
            .collect();
        named.sort_by(|a, b| a.1.cmp(&b.1));
        self.fetch_missing(
            named
                .iter()
                .map(|(_, r, o)| (r.clone(), o.clone()))
                .collect(),
            deadline,
        )?;
        let oids: Vec<&str> = named.iter().map(|(_, _, o)| o.as_str()).collect();
        let bodies = self.read_states(&oids)?;
        let mut locks = Vec::new();
        for ((key, r, oid), body) in named.into_iter().zip(bodies) {
            let seen = match self.interpret(&oid, body)? {
                Some(seen) => seen,
                None => self.read_seen_ref(&r, deadline)?,
            };
            if seen.current == Current::Free {
                continue;
            }
            let Some(key) = key.or_else(|| recorded_key(&seen.current, &r[prefix.len()..])) else {
                continue; // a digest stem whose record does not name it
            };
            locks.push(Listed::new(key, r, seen.current));
        }
        crate::store::visit_in_order(locks, visit)?;
        Ok(0)
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let deadline = Instant::now() + self.config.timeout;
        let lock_prefix = self.ns_prefix(REF_PREFIX);
        let arch_prefix = self.ns_prefix(ARCHIVE_PREFIX);
        let patterns = match key {
            Some(k) => vec![self.lock_ref(k), format!("{arch_prefix}{}/*", k.ref_stem())],
            None => vec![format!("{lock_prefix}*"), format!("{arch_prefix}*")],
        };
        let refs = self.ls_remote(&patterns, "refs/", deadline)?;
        // Chains by lock name: the archived ones and the live one.
        let mut chains: std::collections::BTreeMap<String, (Vec<String>, Option<String>)> =
            std::collections::BTreeMap::new();
        for (r, oid) in &refs {
            if let Some(name) = r.strip_prefix(&lock_prefix) {
                if is_lock_stem(name) {
                    chains.entry(name.to_owned()).or_default().1 = Some(oid.clone());
                }
            } else if let Some((name, slot)) = r
                .strip_prefix(&arch_prefix)
                .and_then(|rest| rest.rsplit_once('/'))
                && is_lock_stem(name)
                && slot.bytes().all(|b| b.is_ascii_digit())
            {
                chains
                    .entry(name.to_owned())
                    .or_default()
                    .0
                    .push(oid.clone());
            }
        }
        let wanted: Vec<(String, String)> = refs
            .iter()
            .filter(|(r, _)| r.starts_with(&lock_prefix) || r.starts_with(&arch_prefix))
            .map(|(r, o)| (r.clone(), o.clone()))
            .collect();
        self.fetch_missing(wanted, deadline)?;
        let mut all = Vec::new();
        for (_, (mut archived, tip)) in chains {
            // Oldest chain first: by the epoch in each archived tip's state.
            let bodies =
                self.read_states(&archived.iter().map(String::as_str).collect::<Vec<_>>())?;
            let epochs: HashMap<String, u64> = archived
                .iter()
                .zip(bodies)
                .map(|(o, b)| {
                    let e = b
                        .and_then(|b| serde_json::from_slice::<StateFile>(&b).ok())
                        .map_or(0, |s| s.epoch);
                    (o.clone(), e)
                })
                .collect();
            archived.sort_by_key(|o| epochs.get(o).copied().unwrap_or(0));
            let mut events = Vec::new();
            for oid in tip.iter().chain(archived.iter().rev()) {
                if events.len() >= limit {
                    break;
                }
                let mut older = self.events_of(oid, limit - events.len())?;
                older.append(&mut events);
                events = older;
            }
            all.append(&mut events);
        }
        // Locks interleave by time; each lock's own order is kept.
        all.sort_by_key(|e| e.time);
        let skip = all.len().saturating_sub(limit);
        Ok(all.split_off(skip))
    }
}

/// What one decide-and-push attempt came to.
enum Step<T> {
    /// Applied (or nothing to apply).
    Done(Committed<T>),
    /// Lost a race (or a guess was wrong): read and decide again.
    Again,
    /// The push's outcome is unknown.
    Unknown(Pending<T>, String),
}

impl GitStore {
    /// The state this host last wrote to `r`, when it is still in the cache.
    fn remembered(&self, r: &str) -> Result<Option<RefState>> {
        let Some(oid) = std::fs::read_to_string(self.tip_file(r))
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| t.len() >= 40 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return Ok(None);
        };
        let Some(body) = self.read_states(&[oid.as_str()])?.pop().flatten() else {
            return Ok(None);
        };
        let seen = self.interpret(&oid, Some(body))?;
        Ok(seen.filter(|s| matches!(s.current, Current::Free | Current::Held(_))))
    }

    fn tip_file(&self, r: &str) -> PathBuf {
        let h = crate::record::hash_token(&format!("{}\n{r}", self.config.remote));
        self.config.cache.join("skill-lock-tips").join(&h[..32])
    }

    /// Remembers (or forgets) the commit this host last pushed to `r`.
    /// Best effort: a lost note only costs the read it would have saved.
    fn remember(&self, r: &str, oid: Option<&str>) {
        let file = self.tip_file(r);
        let Some(oid) = oid else {
            let _ = std::fs::remove_file(&file);
            return;
        };
        let Some(dir) = file.parent() else { return };
        let _ = std::fs::create_dir_all(dir);
        let tmp = dir.join(format!(".{}", random_suffix()));
        if std::fs::write(&tmp, oid).is_ok() && std::fs::rename(&tmp, &file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Decides on `seen` and pushes the change with `seen` as the lease.
    /// `guess`: `seen` was not read from the remote, so a decision to change
    /// nothing proves nothing and a lost race is no news.
    fn attempt<T>(
        &self,
        key: &LockKey,
        r: &str,
        seen: &RefState,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
        push_deadline: Instant,
        guess: bool,
    ) -> Result<Step<T>> {
        let decision = decide(&seen.current)?;
        let Some(next) = next_state(r, seen, &decision)? else {
            // Nothing to write: only a refusal of a held lock records events.
            return Ok(if guess {
                Step::Again
            } else {
                Step::Done(Committed {
                    value: decision.value,
                    written: None,
                })
            });
        };
        let (state, parent, archive) = self.roll(key, seen, next.state);
        let msg = message(key, next.what, state.fence, &next.events)?;
        let commit = self.make_commit(&state, parent, &msg)?;
        let archive = archive.as_ref().map(|(old, a)| (old.as_str(), a.as_str()));
        let written = next
            .written
            .map(|r| Written::as_given(r).with_prior(next.prior));
        let value = decision.value;
        match self.push(r, seen.oid.as_deref(), &commit, archive, push_deadline)? {
            Pushed::Done => {
                self.remember(r, Some(&commit));
                Ok(Step::Done(Committed { value, written }))
            }
            Pushed::Lost => {
                if guess {
                    self.remember(r, None);
                }
                Ok(Step::Again)
            }
            Pushed::Refused(why) => Err(self.unavailable(&format!(
                "the remote refused the update of {r}: {why}; check that you may push refs under {REF_PREFIX}"
            ))),
            Pushed::Unknown(why) => Ok(Step::Unknown(
                Pending {
                    commit,
                    value,
                    written,
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
        let roll = !seen.chainable || seen.depth >= self.config.history_depth;
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
                self.archive_ref(&key.ref_stem(), seen.epoch % ARCHIVE_SLOTS),
            )),
            _ => None,
        };
        (state, None, archive)
    }
}

/// The commit a decision makes on top of a ref's state.
struct Next {
    state: StateFile,
    /// The record written (with its fence), for the outcome.
    written: Option<OwnerRecord>,
    /// For an acquisition: the fence it follows, the one in the state it
    /// replaces (`None`: no acquisition before).
    prior: Option<u64>,
    /// The history events, fenced.
    events: Vec<Event>,
    /// The change, as the commit message names it.
    what: &'static str,
}

/// The state file a decision asks for on top of `seen`, or `None` when
/// nothing is written (keeping a lock; a refusal of a free or unreadable one).
fn next_state<T>(r: &str, seen: &RefState, decision: &Decision<T>) -> Result<Option<Next>> {
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
    let held = |rec: OwnerRecord, fence: u64, what| -> Result<Option<Next>> {
        Ok(Some(Next {
            state: held_state(&rec, fence, seen.depth, seen.epoch)?,
            written: (what != "refused").then_some(rec),
            prior: (what == "acquired")
                .then_some(seen.fence)
                .flatten()
                .filter(|f| *f > 0),
            events: decision.events(Some(fence)),
            what,
        }))
    };
    match &decision.change {
        Change::Keep => match seen.current.record() {
            // Only refusals carry events here; kept when a record is there.
            Some(rec) if !decision.is_silent() => {
                let fence = seen.fence.unwrap_or(rec.holder.fence);
                held(rec.clone(), fence, "refused")
            }
            _ => Ok(None),
        },
        Change::Create(rec) | Change::Takeover(rec) => {
            let fence = known_fence()?
                .checked_add(1)
                .ok_or_else(|| Error::Internal("the fence would overflow".into()))?;
            let mut rec = rec.clone();
            rec.holder.fence = fence;
            held(rec, fence, "acquired")
        }
        Change::Rewrite(rec) => {
            let fence = seen.fence.unwrap_or(rec.holder.fence);
            let mut rec = rec.clone();
            rec.holder.fence = fence;
            held(rec, fence, "renewed")
        }
        Change::Delete => Ok(Some(Next {
            state: StateFile {
                format: STATE_FORMAT,
                state: "free".into(),
                fence: known_fence()?,
                depth: seen.depth + 1,
                epoch: seen.epoch,
                record: None,
            },
            written: None,
            prior: None,
            events: decision.events(None),
            what: "released",
        })),
    }
}

fn held_state(rec: &OwnerRecord, fence: u64, depth: u64, epoch: u64) -> Result<StateFile> {
    let mut rec = rec.clone();
    rec.holder.fence = fence;
    let value = serde_json::to_value(&rec).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(StateFile {
        format: STATE_FORMAT,
        state: "held".into(),
        fence,
        depth: depth + 1,
        epoch,
        record: Some(value),
    })
}

impl GitStore {
    fn fetch_missing(&self, refs: Vec<(String, String)>, deadline: Instant) -> Result<()> {
        let mut missing = Vec::new();
        for (r, oid) in refs {
            if !self.is_commit(&oid)? {
                missing.push((r, oid));
            }
        }
        // What did not arrive is read lock by lock, with its own error.
        let _ = self.fetch(&missing, deadline)?;
        Ok(())
    }

    /// The newest `limit` events in the chain ending at `tip`, oldest first.
    fn events_of(&self, tip: &str, limit: usize) -> Result<Vec<Event>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Each commit holds one to three events: read enough commits (git
        // takes a count up to i32::MAX; a chain is never longer).
        let n = format!(
            "--max-count={}",
            limit.min(usize::try_from(i32::MAX).unwrap_or(usize::MAX))
        );
        let out = self.local(&["log", &n, "--format=%x1e%B", tip], None)?;
        if !out.ok() {
            return Err(self.cache_error(&format!(
                "git log of the lock history failed: {}",
                out.stderr.trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut events = Vec::new();
        // Newest commit first; within a commit, events are in order.
        for commit in text
            .split('\u{1e}')
            .filter(|c| !c.trim().is_empty())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            for line in commit.lines().filter(|l| l.starts_with('{')) {
                if let Ok(ev) = serde_json::from_str::<Event>(line) {
                    events.push(ev);
                }
            }
        }
        let skip = events.len().saturating_sub(limit);
        Ok(events.split_off(skip))
    }
}
