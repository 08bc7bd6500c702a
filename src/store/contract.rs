//! The types that cross the store contract, both ways, in one place.
//!
//! In: what a store saw of a lock ([`Current`]; a readable one as a
//! [`Seen`]: the record as stored, when its lease ends, whether its owner
//! can be judged here). Out: the engine's [`Decision`], which the store
//! applies, and what it did ([`Committed`], [`Written`]).
//!
//! The types leave nothing to a convention:
//! - a record about to be created is a [`NewRecord`], which has no fence:
//!   the store assigns one and returns the complete record in [`Written`];
//!   a renewal rewrites an [`OwnerRecord`], whose fence it carries;
//! - a decision that writes a record carries the part of its outcome that
//!   needs what was written (`W`), and the store can only answer it with
//!   [`Committed::Wrote`], which holds the [`Written`]: an outcome without a
//!   record cannot be expressed;
//! - an event about the lock a change writes is a [`Draft`], which only
//!   [`Draft::complete`] turns into an [`Event`], from what the store wrote
//!   ([`Stamp`]); nothing else edits an event the engine made.
//! - a store that writes a record as decided finishes the change in one
//!   call, [`Acquisition::finish`] or [`Renewal::finish`]: the outcome's
//!   part, what was written and the completed events ([`Finished`]).

use crate::history::Event;
use crate::record::{Holder, NewRecord, OwnerRecord, Timestamp};

/// How far this host may judge a record's owner (SPEC §6 "owner_dead").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    /// Its pids, boot and namespaces can be compared with this host's: a
    /// dead owner (or a `run` group still alive) is judged here.
    Comparable,
    /// Recorded by another boot or machine on a store several machines
    /// share, where a hostname or machine id proves nothing: only its lease
    /// judges it, and no pid of it is ever looked up here.
    Foreign,
}

/// When a held lock's lease ends, as the store that keeps it knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseEnd {
    /// The record's own terms: its boot-clock deadline on that same clock,
    /// else its `expires` on the wall clock.
    Recorded,
    /// This wall-clock second, whatever the record says: `expires` plus a
    /// clock-skew allowance (git), or the end of the cluster's lease (etcd).
    Wall(Timestamp),
}

/// A readable lock as a store saw it: the record exactly as stored, and
/// how the store says it is judged. Stores never edit the record to steer
/// the judgement; they say so here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The owner record as stored (its fence the lock's).
    pub record: OwnerRecord,
    /// When its lease ends.
    pub lease_end: LeaseEnd,
    /// Whether its owner can be judged here.
    pub identity: Identity,
}

impl Seen {
    /// A record judged by its own terms, its owner comparable here (the
    /// file store: one machine).
    #[must_use]
    pub fn recorded(record: OwnerRecord) -> Self {
        Self {
            record,
            lease_end: LeaseEnd::Recorded,
            identity: Identity::Comparable,
        }
    }

    /// Its holder.
    #[must_use]
    pub fn holder(&self) -> &Holder {
        &self.record.holder
    }
}

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

/// Where one lock is, as a store names it, and what every answer about it
/// says of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// Its directory, or its key (ref) in a network store.
    pub lock: String,
    /// Seconds a takeover waits past `expires` judged by this host's wall
    /// clock, for stores whose expiry hosts judge with clocks of their own
    /// (git); `None` where no such allowance applies.
    pub clock_skew: Option<u64>,
}

impl Place {
    /// A lock where no clock-skew allowance applies.
    #[must_use]
    pub fn at(lock: String) -> Self {
        Self {
            lock,
            clock_skew: None,
        }
    }
}

/// A history event about the lock a change writes, before the store wrote
/// it: it lacks that lock's fence (and, where the store grants the lease,
/// its end). Only [`Draft::complete`] makes it an [`Event`].
#[derive(Debug, Clone)]
pub struct Draft(Event);

impl Draft {
    /// A draft of `event`; its fence is the written lock's, given by
    /// [`Draft::complete`].
    #[must_use]
    pub fn new(event: Event) -> Self {
        Self(event)
    }

    /// The event, with what the store wrote.
    #[must_use]
    pub fn complete(self, stamp: &Stamp) -> Event {
        let mut ev = self.0;
        ev.fence = match stamp.fence {
            EventFence::Known(fence) => Some(fence),
            EventFence::AtCommit | EventFence::Unwritten => None,
        };
        if let Some(end) = stamp.lease_end {
            ev.expires = Some(end);
        }
        ev
    }
}

/// The fence the events of a written lock carry when they are appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventFence {
    /// The written lock's fence, known before its events are appended.
    Known(u64),
    /// Known only once the change commits, in the same step as its events
    /// (etcd: the transaction's revision). They are stored without one, and
    /// the store gives each the revision it was written at when it reads
    /// the history back.
    AtCommit,
    /// None: the lock was never written (a takeover that buried the stale
    /// lock but could not publish its own, [`Acquisition::interrupted`]).
    Unwritten,
}

/// What the store wrote that the events of a change say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// The written lock's fence.
    pub fence: EventFence,
    /// The end of the lease the store granted, which every event of the
    /// change then says (etcd); `None`: the events keep the expiry the
    /// decision gave them.
    pub lease_end: Option<Timestamp>,
}

impl Stamp {
    /// The stamp of a store that writes the record as decided, with `fence`.
    #[must_use]
    pub fn fence(fence: u64) -> Self {
        Self {
            fence: EventFence::Known(fence),
            lease_end: None,
        }
    }
}

/// A new acquisition: the record to create, and the events it makes.
///
/// A revived lease (SPEC §2.2) is one too: its holder's renewal of a lease
/// that a reader may already have called `stale` is written as a new
/// acquisition of the same holder ([`Acquisition::revival`]), so every
/// store gives it a new fence by the one mechanism that hands fences out,
/// and `acquire --since` of a run that read the lock before it answers
/// `others_since: true`.
#[derive(Debug)]
pub struct Acquisition<W> {
    /// The record; the store assigns its fence.
    pub record: NewRecord,
    /// The `took_over` event of the stale or corrupt lock it takes over
    /// (`None`: the lock was free, or this is a revival).
    took_over: Option<Draft>,
    /// For a revival, the fence of the lease it revives: the lock is
    /// rewritten in place, as a takeover rewrites it, with a new fence.
    revived: Option<u64>,
    /// The `acquired` event (for a revival, the `renewed` one).
    acquired: Draft,
    /// The part of the outcome that waits for what was written.
    pub then: W,
}

impl<W> Acquisition<W> {
    /// A new lease: `record` on a free lock, or over a stale or corrupt one
    /// when `took_over` holds its `took_over` event; `acquired` the
    /// `acquired` event.
    pub fn new(record: NewRecord, took_over: Option<Draft>, acquired: Draft, then: W) -> Self {
        Self {
            record,
            took_over,
            revived: None,
            acquired,
            then,
        }
    }

    /// The revival of `held` by its own holder's renewal with `terms`
    /// (SPEC §2.2): the same record (token, owner, note, start) with the
    /// new terms and no fence, so that the store gives it a new one; `event`
    /// makes its `renewed` event from the renewed holder.
    pub fn revival(
        held: &OwnerRecord,
        terms: Terms,
        event: impl FnOnce(&Holder) -> Event,
        then: W,
    ) -> Self {
        let renewed = with_terms(held, terms);
        let acquired = Draft::new(event(&renewed.holder));
        Self {
            record: renewed.unfenced(),
            took_over: None,
            revived: Some(held.holder.fence),
            acquired,
            then,
        }
    }

    /// Replaces a lock that is there (a stale or corrupt lock taken over,
    /// or its own lease revived), rather than creating a free one.
    #[must_use]
    pub fn takes_over(&self) -> bool {
        self.took_over.is_some() || self.revived.is_some()
    }

    /// For a revival, the fence of the lease it revives (the record it
    /// writes has the same token, so a store that recognises its own write
    /// by the token also needs this to tell it from the lease it replaced).
    #[must_use]
    pub fn revives(&self) -> Option<u64> {
        self.revived
    }

    /// Its events, in order, completed with what the store wrote.
    #[must_use]
    pub fn events(&self, stamp: &Stamp) -> Vec<Event> {
        self.took_over
            .iter()
            .chain([&self.acquired])
            .map(|d| d.clone().complete(stamp))
            .collect()
    }

    /// Finishes the acquisition of a store that wrote its record as given
    /// with `fence`, following `prior` (the fence of the lock's latest
    /// acquisition before it, `None`: none known): the decision's part of
    /// the outcome, what was written, and its events completed.
    #[must_use]
    pub fn finish(self, fence: u64, prior: Option<u64>) -> Finished<W> {
        let events = self.events(&Stamp::fence(fence));
        Finished {
            then: self.then,
            written: Written::acquired(self.record, fence, prior),
            events,
        }
    }

    /// The history of a takeover that removed the stale lock but could not
    /// publish the new one (`why`): exactly that, and nothing more.
    #[must_use]
    pub fn interrupted(&self, why: &str) -> Vec<Event> {
        let Some(draft) = &self.took_over else {
            return Vec::new();
        };
        let mut ev = draft.clone().complete(&Stamp {
            fence: EventFence::Unwritten,
            lease_end: None,
        });
        ev.reason = Some(format!(
            "{}; the stale lock was removed but the new one was not published: {why}",
            ev.reason.as_deref().unwrap_or("stale")
        ));
        vec![ev]
    }
}

/// A change that wrote a record, finished by the store that wrote it as
/// the decision gave it ([`Acquisition::finish`], [`Renewal::finish`]).
#[derive(Debug)]
pub struct Finished<W> {
    /// The decision's part of the outcome.
    pub then: W,
    /// What was written.
    pub written: Written,
    /// The change's history events, completed.
    pub events: Vec<Event>,
}

impl<W> Finished<W> {
    /// What the decision came to, and the events to append.
    #[must_use]
    pub fn committed<K>(self) -> (Committed<K, W>, Vec<Event>) {
        (Committed::Wrote(self.then, self.written), self.events)
    }
}

/// The new terms of a renewed lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// The new expiry.
    pub expires: Timestamp,
    /// When it was renewed.
    pub renewed: Timestamp,
    /// The lease asked for, seconds.
    pub ttl: u64,
    /// The new boot-clock deadline, when the renewer reads the clock the
    /// record's deadline is on.
    pub deadline_boot_ms: Option<u64>,
}

/// `held` with the new `terms` of its lease, everything else kept.
fn with_terms(held: &OwnerRecord, terms: Terms) -> OwnerRecord {
    let mut record = held.clone();
    record.holder.expires = terms.expires;
    record.holder.renewed = Some(terms.renewed);
    record.holder.ttl = terms.ttl;
    record.holder.deadline_boot_ms = terms.deadline_boot_ms;
    record
}

/// A renewal: the held record with new terms. It can only be made from the
/// record the store showed ([`Renewal::new`]), so it keeps that record's
/// fence (and everything else but the terms) by construction.
#[derive(Debug)]
pub struct Renewal<W> {
    record: OwnerRecord,
    renewed: Draft,
    /// The part of the outcome that waits for what was written.
    pub then: W,
}

impl<W> Renewal<W> {
    /// Renews `held` with `terms`; `event` makes the `renewed` event from
    /// the renewed holder.
    pub fn new(
        held: &OwnerRecord,
        terms: Terms,
        event: impl FnOnce(&Holder) -> Event,
        then: W,
    ) -> Self {
        let record = with_terms(held, terms);
        let renewed = Draft::new(event(&record.holder));
        Self {
            record,
            renewed,
            then,
        }
    }

    /// The record to write (its fence the lock's).
    #[must_use]
    pub fn record(&self) -> &OwnerRecord {
        &self.record
    }

    /// Finishes the renewal of a store that wrote its record as given
    /// (its fence the lock's): the decision's part of the outcome, what was
    /// written, and its event completed.
    #[must_use]
    pub fn finish(self) -> Finished<W> {
        let events = self.events(&Stamp::fence(self.record.holder.fence));
        Finished {
            then: self.then,
            written: Written::renewed(self.record),
            events,
        }
    }

    /// Its event, completed with what the store wrote.
    #[must_use]
    pub fn events(&self, stamp: &Stamp) -> Vec<Event> {
        vec![self.renewed.clone().complete(stamp)]
    }
}

/// What the engine decided on what a store showed it: the change, the
/// history events it makes, and the outcome.
///
/// `K` is the outcome of a decision that writes no record; `W` the part
/// of the outcome of one that does, completed from [`Written`].
// One per decision, moved once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Decision<K, W> {
    /// Change nothing: the outcome, and events about the lock as it is (a
    /// refusal; empty when nothing is worth recording).
    Keep(K, Vec<Event>),
    /// Create the lock (free) or take it over (stale or corrupt).
    Acquire(Acquisition<W>),
    /// Rewrite the record of the same holder (renewal); the fence is kept.
    /// (A revived lease is an [`Decision::Acquire`]: it takes a new fence.)
    Renew(Renewal<W>),
    /// Remove the lock: the outcome, and the event.
    Delete(K, Event),
}

impl<K, W> Decision<K, W> {
    /// A decision that changes nothing and records nothing.
    pub fn keep(outcome: K) -> Self {
        Self::Keep(outcome, Vec::new())
    }
}

/// What a store wrote for a decision that writes a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The record as stored, with its fence (a network store stamps the
    /// lease it was granted: `expires`, `ttl`).
    pub record: OwnerRecord,
    /// For a new acquisition: the fence of the lock's latest acquisition
    /// before this one, as the store knew it in the same atomic step
    /// (`None`: it knows of none, or a renewal). The engine answers
    /// `--since` from it (SPEC §2.1).
    pub prior_fence: Option<u64>,
}

impl Written {
    /// A renewal's record, written as given.
    #[must_use]
    pub fn renewed(record: OwnerRecord) -> Self {
        Self {
            record,
            prior_fence: None,
        }
    }

    /// A new acquisition's record, with the fence it was given and the one
    /// it follows.
    #[must_use]
    pub fn acquired(record: NewRecord, fence: u64, prior_fence: Option<u64>) -> Self {
        Self {
            record: record.fenced(fence),
            prior_fence,
        }
    }
}

/// What a committed decision came to.
// One per decision, moved once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Committed<K, W> {
    /// It wrote no record: its outcome.
    Done(K),
    /// It wrote one: the decision's part of the outcome, and what was written.
    Wrote(W, Written),
}

/// One lock seen by [`super::Store::visit_locks`].
#[derive(Debug, Clone)]
pub struct Listed {
    /// The lock's key (repo as recorded, or lowercase when unreadable).
    pub key: crate::key::LockKey,
    /// Where it is.
    pub location: String,
    /// What is there.
    pub current: Current,
}

impl Listed {
    /// A listed lock, named as its readable record spells it (the name only
    /// knows the lowercase repo), or by its name when the record is unreadable.
    #[must_use]
    pub fn new(key: crate::key::LockKey, location: String, current: Current) -> Self {
        let key = match current.record() {
            Some(r) => crate::key::LockKey::new(&r.holder.skill, &r.holder.repo)
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
