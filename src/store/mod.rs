//! Store: where lock records live (SPEC §8), behind one small synchronous trait.
//!
//! The engine never touches files or the network itself. It asks a store to
//! read a lock, or to run one read-decide-act step atomically with respect to
//! every other step on the same lock ([`Store::update`]). The file store does
//! that under a per-lock `flock` guard; a network store does it with a
//! compare-and-swap transaction, re-running the decision when it lost a race.

#[cfg(feature = "etcd")]
#[allow(
    clippy::disallowed_methods,
    reason = "the etcd store reads its own TLS, credential and timeout variables and stamps history keys with the wall clock"
)]
pub mod etcd;
pub mod fs;
pub mod git;

use crate::error::Result;
use crate::history::Event;
use crate::key::LockKey;
use crate::record::OwnerRecord;

/// What a store holds for one lock at one moment.
// Short-lived, one per read: boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    /// No lock.
    Free,
    /// A readable record.
    Held(OwnerRecord),
    /// Something is there, but no readable record (why).
    Corrupt(String),
}

/// The change a decision asks for.
#[derive(Debug, Clone)]
pub enum Change {
    /// Change nothing.
    Keep,
    /// Create the lock (it was free). The store assigns the fence.
    Create(OwnerRecord),
    /// Replace a stale or corrupt lock through a tombstone. The store assigns the fence.
    Takeover(OwnerRecord),
    /// Replace the record of the same holder (renewal); the fence is kept.
    Rewrite(OwnerRecord),
    /// Remove the lock.
    Delete,
}

/// A decision: the change, the history events it makes, and what to report.
#[derive(Debug)]
pub struct Decision<T> {
    /// What to change.
    pub change: Change,
    /// Events to append in the same critical section; an event whose `fence`
    /// is `None` receives the fence the store assigned to the new record.
    pub events: Vec<Event>,
    /// The caller's outcome.
    pub value: T,
}

impl<T> Decision<T> {
    /// A decision that changes nothing and records nothing.
    pub fn keep(value: T) -> Self {
        Self {
            change: Change::Keep,
            events: Vec::new(),
            value,
        }
    }
}

/// The result of a committed decision.
#[derive(Debug)]
pub struct Committed<T> {
    /// The caller's outcome.
    pub value: T,
    /// The record as written (with its fence), for Create/Takeover/Rewrite.
    pub written: Option<OwnerRecord>,
}

/// One lock seen by [`Store::list`].
#[derive(Debug, Clone)]
pub struct Listed {
    /// The lock's key (repo as recorded, or lowercase when unreadable).
    pub key: LockKey,
    /// Where it is.
    pub location: String,
    /// What is there.
    pub current: Current,
}

impl Listed {
    /// A listed lock, named as its readable record spells it (the name only
    /// knows the lowercase repo), or by its name when the record is unreadable.
    #[must_use]
    pub fn new(key: LockKey, location: String, current: Current) -> Self {
        let key = match &current {
            Current::Held(r) => LockKey::new(&r.holder.skill, &r.holder.repo)
                .ok()
                .filter(|k| k.same_lock(&key))
                .unwrap_or(key),
            _ => key,
        };
        Self {
            key,
            location,
            current,
        }
    }
}

/// The order of `list` (SPEC §2.5): by skill, then by repo compared
/// case-insensitively (the lowercase repo of the lock's name).
#[must_use]
pub fn list_order(key: &LockKey) -> (String, String) {
    (key.skill().to_owned(), key.repo().to_ascii_lowercase())
}

/// Everything [`Store::list`] saw.
#[derive(Debug, Clone)]
pub struct Listing {
    /// Locks in no particular order.
    pub locks: Vec<Listed>,
    /// Leftovers of takeovers and releases.
    pub tombstones: usize,
}

/// A place that keeps locks.
pub trait Store {
    /// Where the store is, for `list` (a directory, or a URL).
    fn describe(&self) -> String;

    /// Where one lock is (its directory, or its key in a network store).
    fn location(&self, key: &LockKey) -> String;

    /// Reads a lock without taking any guard.
    ///
    /// # Atomicity
    /// Sees either the whole previous or the whole next state, never a mix.
    ///
    /// # Errors
    /// I/O or network failure.
    fn read(&self, key: &LockKey) -> Result<Current>;

    /// Runs `decide` on the current state and applies its change, atomically
    /// with respect to every other `update` of the same lock.
    ///
    /// # Atomicity
    /// No other update of `key` changes the state between the read that
    /// `decide` sees and the change it asks for. `decide` may run more than
    /// once (a network store retries after losing a race); only the last run's
    /// decision is applied.
    ///
    /// # Errors
    /// I/O or network failure, or an error returned by `decide`.
    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>>;

    /// Every lock in the store.
    ///
    /// # Errors
    /// I/O or network failure.
    fn list(&self) -> Result<Listing>;

    /// Visits every lock in the store in `list`'s order (skill, then repo
    /// compared case-insensitively), one at a time, and returns how many
    /// tombstones it saw. A store that can read its locks one by one
    /// overrides this so that the locks are never all in memory at once.
    ///
    /// # Errors
    /// I/O or network failure, or an error returned by `visit`.
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        let Listing {
            mut locks,
            tombstones,
        } = self.list()?;
        locks.sort_by_cached_key(|l| list_order(&l.key));
        for lock in locks {
            visit(lock)?;
        }
        Ok(tombstones)
    }

    /// The newest `limit` events, oldest first, for one lock or all.
    ///
    /// # Errors
    /// I/O or network failure.
    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>>;

    /// Seconds a takeover waits past `expires` judged by this host's wall
    /// clock, for stores whose expiry hosts judge with clocks of their own
    /// (git); `None` where no such allowance applies.
    fn clock_skew(&self) -> Option<u64> {
        None
    }
}

/// The store chosen for an invocation (SPEC §8).
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// Lock directories in a personal layer or `file:DIR`.
    File(fs::FileStore),
    /// Keys in an etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(etcd::EtcdStore),
    /// Refs in a git remote.
    Git(git::GitStore),
}

macro_rules! each_store {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnyStore::File($s) => $e,
            #[cfg(feature = "etcd")]
            AnyStore::Etcd($s) => $e,
            AnyStore::Git($s) => $e,
        }
    };
}

impl Store for AnyStore {
    fn describe(&self) -> String {
        each_store!(self, s => s.describe())
    }

    fn location(&self, key: &LockKey) -> String {
        each_store!(self, s => s.location(key))
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        each_store!(self, s => s.read(key))
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        each_store!(self, s => s.update(key, decide))
    }

    fn list(&self) -> Result<Listing> {
        each_store!(self, s => s.list())
    }

    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        each_store!(self, s => s.visit_locks(visit))
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        each_store!(self, s => s.history(key, limit))
    }

    fn clock_skew(&self) -> Option<u64> {
        each_store!(self, s => s.clock_skew())
    }
}
