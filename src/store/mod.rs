//! Store: where lock records live (SPEC §8), behind one small synchronous trait.
//!
//! The engine never touches files or the network itself. It asks a store to
//! read a lock, or to run one read-decide-act step atomically with respect to
//! every other step on the same lock ([`Store::update`]). The file store does
//! that under a per-lock `flock` guard; a network store does it with a
//! compare-and-swap transaction, re-running the decision when it lost a race.
//!
//! The invariant of the contract: what crosses it is never edited to steer
//! the other side. A store shows the record as stored and says how it is
//! judged ([`Seen`]); the engine builds every outcome from what the store
//! reports it wrote ([`Written`]); events about a written lock are completed
//! in one place ([`Draft::complete`]). The types that cross it are in
//! `contract`, re-exported here.

mod contract;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod fs;
pub mod git;

pub use contract::{
    Acquisition, Committed, Current, Decision, Draft, EventFence, Finished, Identity, LeaseEnd,
    Listed, Place, Renewal, Seen, Stamp, Terms, Written,
};

use crate::error::Result;
use crate::history::Event;
use crate::key::LockKey;

/// The order of `list` (SPEC §2.5): by skill, then by repo compared
/// case-insensitively (the lowercase repo of the lock's name).
#[must_use]
pub fn list_order(key: &LockKey) -> (String, String) {
    (key.skill().to_owned(), key.repo().to_ascii_lowercase())
}

/// Hands `locks` to `visit` in `list`'s order: for a store that reads
/// every lock in one request anyway (a network store).
///
/// # Errors
/// An error returned by `visit`.
pub fn visit_in_order(
    mut locks: Vec<Listed>,
    visit: &mut dyn FnMut(Listed) -> Result<()>,
) -> Result<()> {
    locks.sort_by_cached_key(|l| list_order(&l.key));
    locks.into_iter().try_for_each(visit)
}

/// A place that keeps locks.
///
/// The contract both ways: a store shows the engine what it saw
/// ([`Current`], a readable lock as a [`Seen`]: the record as stored, its
/// lease end and whether its owner can be judged here) and never edits a
/// record to steer a judgement; it applies the [`Decision`] and returns
/// what it wrote ([`Written`]), from which the engine builds every outcome.
pub trait Store {
    /// Where the store is, for `list` (a directory, or a URL).
    fn describe(&self) -> String;

    /// Where one lock is (its directory, or its key in a network store),
    /// and what every answer about it says of the store.
    fn location(&self, key: &LockKey) -> Place;

    /// Reads a lock without taking any guard.
    ///
    /// # Atomicity
    /// Sees either the whole previous or the whole next state, never a mix.
    ///
    /// # Errors
    /// I/O or network failure.
    fn read(&self, key: &LockKey) -> Result<Current>;

    /// The fence of the lock's latest acquisition, held or not (`None`: the
    /// store knows of none), for `status` of a lock that is not held
    /// (SPEC §2.4). Read-only: it creates nothing.
    ///
    /// # Exactness
    /// A fence it returns belongs to an acquisition that a [`Store::read`]
    /// begun after it returns sees (held, or already replaced or released):
    /// never to one still on its way to being published. It is the value
    /// an acquisition made next reports as [`Written::prior_fence`] when
    /// nothing changed in between.
    ///
    /// # Errors
    /// I/O or network failure.
    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>>;

    /// The lock as [`Store::read`] sees it and, when it holds no record,
    /// the fence of its latest acquisition (SPEC §2.4's `status`).
    ///
    /// # Exactness
    /// The fence names no acquisition that the state returned does not
    /// show (held, or already replaced or released). The default reads,
    /// asks [`Store::last_fence`], and reads again, returning the second
    /// state: the fence was read before it. A store whose one read shows
    /// the state and its fence as one atomic value (git: the ref's commit)
    /// answers from that read alone.
    ///
    /// # Errors
    /// I/O or network failure.
    fn read_with_fence(&self, key: &LockKey) -> Result<(Current, Option<u64>)> {
        let current = self.read(key)?;
        if current.record().is_some() {
            return Ok((current, None));
        }
        let latest = self.last_fence(key)?;
        Ok((self.read(key)?, latest))
    }

    /// Runs `decide` on the current state and applies its decision,
    /// atomically with respect to every other `update` of the same lock:
    /// writes the record (assigning a new one its fence) or removes it,
    /// appends its events (completed from what was written), and returns
    /// what it came to ([`Committed`]: the outcome, or for a decision that
    /// wrote a record, its pending part with the [`Written`]).
    ///
    /// # Atomicity
    /// No other update of `key` changes the state between the read that
    /// `decide` sees and the change it asks for. `decide` may run more than
    /// once (a network store retries after losing a race); only the last run's
    /// decision is applied.
    ///
    /// # Errors
    /// I/O or network failure, or an error returned by `decide`.
    fn update<K, W>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
    ) -> Result<Committed<K, W>>;

    /// Visits every lock in the store in `list`'s order (skill, then repo
    /// compared case-insensitively), one at a time, never holding them all
    /// in memory, and returns how many tombstones it saw.
    ///
    /// # Errors
    /// I/O or network failure, or an error returned by `visit`.
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize>;

    /// The newest `limit` events, oldest first, for one lock or all.
    ///
    /// # Errors
    /// I/O or network failure.
    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>>;
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

    fn location(&self, key: &LockKey) -> Place {
        each_store!(self, s => s.location(key))
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        each_store!(self, s => s.read(key))
    }

    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        each_store!(self, s => s.last_fence(key))
    }

    fn read_with_fence(&self, key: &LockKey) -> Result<(Current, Option<u64>)> {
        each_store!(self, s => s.read_with_fence(key))
    }

    fn update<K, W>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
    ) -> Result<Committed<K, W>> {
        each_store!(self, s => s.update(key, decide))
    }

    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        each_store!(self, s => s.visit_locks(visit))
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        each_store!(self, s => s.history(key, limit))
    }
}
