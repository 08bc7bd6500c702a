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
//! reports it wrote ([`Written`]); events about a new lock get its fence in
//! one place ([`Decision::events`]).

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod fs;
pub mod git;

use crate::error::Result;
use crate::history::Event;
use crate::key::LockKey;
pub use crate::lease::{Identity, LeaseEnd, Seen};
use crate::record::OwnerRecord;

/// What a store holds for one lock at one moment.
// Short-lived, one per read: boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Current {
    /// No lock.
    Free,
    /// A readable record, and how the store says it is judged.
    Held(Seen),
    /// Something is there, but no readable record (why).
    Corrupt(String),
}

impl Current {
    /// The record, when one is readable.
    #[must_use]
    pub fn record(&self) -> Option<&OwnerRecord> {
        match self {
            Self::Held(seen) => Some(&seen.record),
            Self::Free | Self::Corrupt(_) => None,
        }
    }
}

/// The change a decision asks for.
#[derive(Debug, Clone)]
pub enum Change {
    /// Change nothing.
    Keep,
    /// Create the lock (it was free) with this record; the store assigns
    /// the fence (the record's is not read) and reports it in [`Written`].
    Create(OwnerRecord),
    /// Replace a stale or corrupt lock with this record; the store assigns
    /// the fence, as for [`Change::Create`].
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
    /// Events to append in the same critical section, in order; see
    /// [`Decision::events`].
    events: Vec<Event>,
    /// Which of `events` are about the lock the change creates (they carry
    /// its fence, which only the store knows).
    new_lock: Vec<bool>,
    /// The caller's outcome.
    pub value: T,
}

impl<T> Decision<T> {
    /// A decision that changes nothing and records nothing.
    pub fn keep(value: T) -> Self {
        Self::new(Change::Keep, value)
    }

    /// A decision to make `change`, with no events yet.
    pub fn new(change: Change, value: T) -> Self {
        Self {
            change,
            events: Vec::new(),
            new_lock: Vec::new(),
            value,
        }
    }

    /// Adds an event about the lock as it was (its fence is set already).
    #[must_use]
    pub fn with_event(mut self, event: Event) -> Self {
        self.events.push(event);
        self.new_lock.push(false);
        self
    }

    /// Adds an event about the lock the change creates: it gets that lock's fence.
    #[must_use]
    pub fn with_new_lock_event(mut self, event: Event) -> Self {
        self.events.push(event);
        self.new_lock.push(true);
        self
    }

    /// True when the decision records nothing.
    #[must_use]
    pub fn is_silent(&self) -> bool {
        self.events.is_empty()
    }

    /// The events to append, once the store knows the fence of the lock the
    /// change creates (`None`: not known at write time, e.g. etcd, whose
    /// fence is the transaction's revision; the store then tells it on read).
    #[must_use]
    pub fn events(&self, fence: Option<u64>) -> Vec<Event> {
        self.events
            .iter()
            .zip(&self.new_lock)
            .map(|(ev, &new)| {
                let mut ev = ev.clone();
                if new {
                    ev.fence = fence;
                }
                ev
            })
            .collect()
    }
}

/// What a store wrote for a change that writes a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The record as stored (a network store stamps the lease it was
    /// granted: `expires`, `ttl`).
    pub record: OwnerRecord,
    /// The lock's fence.
    pub fence: u64,
    /// The lease granted, seconds (a network store may raise a short one).
    pub granted_ttl: u64,
    /// For a new acquisition ([`Change::Create`], [`Change::Takeover`]):
    /// the fence of the lock's latest acquisition before this one, as the
    /// store knew it in the same atomic step (`None`: it knows of none).
    /// The engine answers `--since` from it (SPEC §2.1). Not set for a
    /// renewal.
    pub prior_fence: Option<u64>,
}

impl Written {
    /// What a store that writes the record as given (with its fence) wrote.
    #[must_use]
    pub fn as_given(record: OwnerRecord) -> Self {
        Self {
            fence: record.holder.fence,
            granted_ttl: record.holder.ttl,
            record,
            prior_fence: None,
        }
    }

    /// The same, with the fence of the acquisition before this one.
    #[must_use]
    pub fn with_prior(mut self, prior_fence: Option<u64>) -> Self {
        self.prior_fence = prior_fence;
        self
    }

    /// The holder as written, with the fence and the ttl granted.
    #[must_use]
    pub fn holder(self) -> crate::record::Holder {
        let mut holder = self.record.holder;
        holder.fence = self.fence;
        holder.ttl = self.granted_ttl;
        holder
    }
}

/// The result of a committed decision.
#[derive(Debug)]
pub struct Committed<T> {
    /// The caller's outcome.
    pub value: T,
    /// What was written, for Create/Takeover/Rewrite.
    pub written: Option<Written>,
}

/// One lock seen by [`Store::visit_locks`].
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
        let key = match current.record() {
            Some(r) => LockKey::new(&r.holder.skill, &r.holder.repo)
                .ok()
                .filter(|k| k.same_lock(&key))
                .unwrap_or(key),
            None => key,
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
/// record to steer a judgement; it applies the decision's change and
/// returns what it wrote ([`Written`]), from which the engine builds every
/// outcome.
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

    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        each_store!(self, s => s.last_fence(key))
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        each_store!(self, s => s.update(key, decide))
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
