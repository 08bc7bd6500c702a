//! The lock operations of SPEC §2 over any [`Store`]: acquire, renew,
//! release, status, check, list.
//!
//! Each mutating operation is one [`Store::update`]: the decision is made on
//! the state read inside the store's critical section, so it can never act on
//! a lock that changed after it looked. Someone else holding the lock is an
//! outcome (`Ok`), not an error.

use crate::clock::Now;
use crate::error::Result;
use crate::history::{Event, EventKind};
use crate::key::LockKey;
use crate::lease::{self, StaleReason, Verdict};
use crate::liveness;
use crate::record::Holder;
use crate::store::{Acquisition, Committed, Current, Decision, Renewal, Store, Terms};

mod acquisition;

pub use crate::clock::Clock;
pub use acquisition::{Acquire, AcquireRequest, TookOver, acquire, others_since};

/// Who is asking: the host and clock every judgement uses.
#[derive(Debug, Clone)]
pub struct Context {
    /// This host's name, as recorded and compared.
    pub host: String,
    /// The clocks, read when the command started.
    pub now: Now,
    /// Where decisions read the clock again, inside the critical section.
    pub clock: Clock,
}

impl Context {
    /// Reads the hostname and the system clocks.
    #[must_use]
    pub fn here() -> Self {
        Self::with_clock(Clock::System)
    }

    /// Reads the hostname; the time comes from `clock`.
    #[must_use]
    pub fn with_clock(clock: Clock) -> Self {
        Self {
            host: liveness::hostname(),
            now: clock.now(),
            clock,
        }
    }

    /// The context with the clock read again.
    #[must_use]
    pub fn at_decision(&self) -> Self {
        Self {
            host: self.host.clone(),
            now: self.clock.now(),
            clock: self.clock.clone(),
        }
    }
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
        /// Seconds left on the lease written, at the decision's clock reading.
        expires_in: u64,
    },
    /// Another token holds it.
    NotOwner {
        /// Its holder.
        holder: Holder,
        /// Seconds left on its lease, at the decision's clock reading.
        expires_in: u64,
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

/// What [`status`] reports: the state, and the fence of the lock's latest
/// acquisition, held or not (SPEC §2.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Held, stale or free.
    pub state: State,
    /// The latest acquisition's fence (`None`: the store knows of none).
    pub fence: Option<u64>,
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

/// One lock of [`list`], judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its key (the repo as recorded; lowercase when the record is unreadable).
    pub key: LockKey,
    /// Where it is.
    pub location: String,
    /// Held or stale (a lock that turned out free is never handed over).
    pub state: State,
}

/// Judges a state read from the store, at the clock reading `now`.
#[must_use]
pub fn judge(current: &Current, now: &Now) -> State {
    match current {
        Current::Free => State::Free,
        Current::Corrupt(_) => State::Stale {
            reason: StaleReason::Corrupt,
            holder: None,
            expires_in: None,
        },
        Current::Held(seen) => {
            let holder = seen.holder().clone();
            match lease::verdict(seen, now) {
                Verdict::Live { expires_in } => State::Held { holder, expires_in },
                Verdict::Stale { reason, expires_in } => State::Stale {
                    reason,
                    holder: Some(holder),
                    expires_in,
                },
            }
        }
    }
}

fn event<F: Copy + Into<Option<u64>>>(
    kind: EventKind,
    key: &LockKey,
    ctx: &Context,
    holder: Option<&Holder<F>>,
) -> Event {
    let mut ev = Event::new(kind, key, ctx.now.wall(), &ctx.host);
    if let Some(h) = holder {
        ev.fence = h.fence.into();
        ev.owner_pid = h.owner_pid;
        ev.note.clone_from(&h.note);
        ev.expires = Some(h.expires);
    }
    ev
}

/// What a renewal waits for from the store: whether the lease had run
/// out, and the clock reading it was decided at.
struct Renewing {
    was_expired: bool,
    now: Now,
}

fn decide_renew(
    current: &Current,
    key: &LockKey,
    token: Option<&str>,
    ttl: Option<u64>,
    ctx: &Context,
) -> Decision<Renew, Renewing> {
    let seen = match current {
        Current::Free => return Decision::keep(Renew::NotHeld { corrupt: false }),
        Current::Corrupt(_) => return Decision::keep(Renew::NotHeld { corrupt: true }),
        Current::Held(seen) => seen,
    };
    let rec = &seen.record;
    if let Some(t) = token
        && !rec.token_matches(t)
    {
        let mut ev = event(EventKind::Refused, key, ctx, Some(&rec.holder));
        ev.reason = Some("renew with a token that does not hold the lock".into());
        ev.previous = Some(rec.holder.clone());
        let expires_in = lease::seen_expires_in(seen, &ctx.now);
        let outcome = Renew::NotOwner {
            holder: rec.holder.clone(),
            expires_in,
        };
        return Decision::Keep(outcome, vec![ev]);
    }
    let was_expired = matches!(lease::verdict(seen, &ctx.now), Verdict::Stale { .. });
    let revived = was_expired || lease::readers_may_call_stale(seen, &ctx.now);
    let ttl = ttl.unwrap_or(rec.holder.ttl);
    let term = lease::term(&ctx.now, ttl);
    let terms = Terms {
        expires: term.expires,
        renewed: term.start,
        ttl,
        // The record keeps its acquirer's identity; the boot-clock deadline
        // is renewed only by a renewer on that same clock.
        deadline_boot_ms: lease::renewed_deadline(&rec.holder, &ctx.now, &term),
    };
    let renewed = |holder: &Holder| {
        let mut ev = event(EventKind::Renewed, key, ctx, Some(holder));
        if was_expired {
            ev.reason = Some("was_expired; revived with a new fence".into());
        } else if revived {
            ev.reason = Some("revived with a new fence: a reader may have called it stale".into());
        }
        if revived {
            ev.previous = Some(rec.holder.clone());
        }
        ev
    };
    let then = Renewing {
        was_expired,
        now: ctx.now.clone(),
    };
    // A revived lease is a new acquisition for the fence (SPEC §2.2):
    // another run may have read the lock as `stale` meanwhile, and its
    // `acquire --since` must find that someone held it since.
    if revived {
        return Decision::Acquire(Acquisition::revival(rec, terms, renewed, then));
    }
    Decision::Renew(Renewal::new(rec, terms, renewed, then))
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
        Ok(decide_renew(current, key, token, ttl, &ctx.at_decision()))
    })?;
    // The record as the store wrote it: a network store reports the lease it
    // was granted (etcd raises a short ttl to its minimum), SPEC §8; its
    // `expires_in` is counted on the clock reading the decision was made at.
    Ok(match committed {
        Committed::Done(outcome) => outcome,
        Committed::Wrote(Renewing { was_expired, now }, written) => {
            let holder = written.record.holder;
            Renew::Renewed {
                expires_in: lease::expires_in(&holder, &now),
                holder,
                was_expired,
            }
        }
    })
}

fn decide_release(
    current: &Current,
    key: &LockKey,
    token: Option<&str>,
    force: bool,
    ctx: &Context,
) -> Decision<Release, std::convert::Infallible> {
    let holder = match current {
        Current::Free => return Decision::keep(Release::NotHeld),
        Current::Corrupt(_) => None,
        Current::Held(seen) => Some(&seen.record),
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
        return Decision::Keep(Release::Refused { holder: shown }, vec![ev]);
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
    Decision::Delete(
        Release::Released {
            holder: shown,
            forced,
        },
        ev,
    )
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
        Ok(decide_release(current, key, token, force, ctx))
    })?;
    Ok(match committed {
        Committed::Done(outcome) => outcome,
        Committed::Wrote(never, _) => match never {},
    })
}

/// Reads the state of a lock without changing anything.
///
/// # Errors
/// Store I/O failure.
pub fn state<S: Store>(store: &S, key: &LockKey, ctx: &Context) -> Result<State> {
    let current = store.read(key)?;
    // The clock is read after the store answered: time spent connecting
    // (a network store's failover) is never counted as lease left.
    Ok(judge(&current, &ctx.at_decision().now))
}

/// Reads the state of a lock and the fence of its latest acquisition,
/// without changing anything (SPEC §2.4).
///
/// A record carries its own fence. For a lock with none (free, or
/// unreadable) the store says the latest fence ([`Store::read_with_fence`]:
/// by default it asks for the latest fence, then reads the lock again and
/// reports that second state; git reads both in one atomic value): the
/// fence never names an acquisition that the state reported does not show
/// (one that was taken between the two reads is seen held, or is released
/// already). A `--since` built on it is therefore never answered `false`
/// while an acquisition that `status` called free was writing.
///
/// # Errors
/// Store I/O failure.
pub fn status<S: Store>(store: &S, key: &LockKey, ctx: &Context) -> Result<Status> {
    let (mut current, latest) = store.read_with_fence(key)?;
    // The clock is read after the store answered: time spent connecting
    // (a network store's failover) is never counted as lease left.
    let mut state = judge(&current, &ctx.at_decision().now);
    // A lease judged stale on a read made before the clock was read may
    // have been renewed in between, by a renewal that then saw it live and
    // kept its fence. Read again: the same record means no renewal came
    // before this clock reading, so any later one finds it run out and
    // revives it under a new fence (SPEC §2.2); another record is judged
    // afresh.
    if matches!(state, State::Stale { .. }) && current.record().is_some() {
        let again = store.read(key)?;
        if again.record() != current.record() {
            current = again;
            state = judge(&current, &ctx.at_decision().now);
        }
    }
    let fence = current.record().map(|r| r.holder.fence).or(latest);
    Ok(Status { state, fence })
}

/// Visits every lock of `store` in `list`'s order (SPEC §2.5), judged at
/// the command's clock reading, one at a time as the store reads them (a
/// lock that turned out free is left out); returns the tombstones seen.
///
/// # Errors
/// Store I/O failure, or an error returned by `visit`.
pub fn list<S: Store>(
    store: &S,
    ctx: &Context,
    visit: &mut dyn FnMut(Entry) -> Result<()>,
) -> Result<usize> {
    store.visit_locks(&mut |listed| {
        let state = judge(&listed.current, &ctx.now);
        if state == State::Free {
            return Ok(());
        }
        visit(Entry {
            key: listed.key,
            location: listed.location,
            state,
        })
    })
}

/// Does `token` hold a live lease on `key`? Read-only (SPEC §2.6).
///
/// # Errors
/// Store I/O failure.
pub fn check<S: Store>(store: &S, key: &LockKey, token: &str, ctx: &Context) -> Result<Check> {
    let current = store.read(key)?;
    let now = &ctx.at_decision().now;
    Ok(match (&current, judge(&current, now)) {
        (Current::Free, _) | (Current::Held(_), State::Free) => Check::NotHeld,
        (Current::Corrupt(_), _) => Check::NotOwner { holder: None },
        (Current::Held(seen), _) if !seen.record.token_matches(token) => Check::NotOwner {
            holder: Some(seen.holder().clone()),
        },
        (Current::Held(_), State::Held { holder, expires_in }) => {
            Check::Held { holder, expires_in }
        }
        (Current::Held(seen), State::Stale { reason, .. }) => Check::Expired {
            reason,
            holder: seen.holder().clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    //! The decisions of acquire, renew, release, status and check, over an
    //! in-memory store and a fixed clock: no files, no sleeping.
    #![allow(clippy::match_wildcard_for_single_variants)]

    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use super::*;
    use crate::error::Error;
    use crate::store::{Listed, Place, Seen};

    /// Something a test does between two steps of the engine.
    type Hook = Box<dyn FnOnce(&Memory)>;

    /// A store in memory: one map of locks, fences that survive release, a
    /// history; `racer` runs once, inside the next `last_fence`, and
    /// `read_racer` once, just after the next `read` has read.
    #[derive(Default)]
    struct Memory {
        locks: RefCell<BTreeMap<String, Current>>,
        fences: RefCell<BTreeMap<String, u64>>,
        events: RefCell<Vec<Event>>,
        racer: RefCell<Option<Hook>>,
        read_racer: RefCell<Option<Hook>>,
    }

    impl Memory {
        fn put(&self, key: &LockKey, current: Current) {
            self.locks.borrow_mut().insert(key.name(), current);
        }

        fn kinds(&self) -> Vec<EventKind> {
            self.events.borrow().iter().map(|e| e.event).collect()
        }
    }

    impl Store for Memory {
        fn describe(&self) -> String {
            "memory".into()
        }

        fn location(&self, key: &LockKey) -> Place {
            Place::at(key.name())
        }

        fn read(&self, key: &LockKey) -> Result<Current> {
            let current = self
                .locks
                .borrow()
                .get(&key.name())
                .cloned()
                .unwrap_or(Current::Free);
            let racer = self.read_racer.borrow_mut().take();
            if let Some(race) = racer {
                race(self);
            }
            Ok(current)
        }

        fn update<K, W>(
            &self,
            key: &LockKey,
            decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
        ) -> Result<Committed<K, W>> {
            let name = key.name();
            let (committed, events) = match decide(&self.read(key)?)? {
                Decision::Keep(outcome, events) => (Committed::Done(outcome), events),
                Decision::Delete(outcome, event) => {
                    self.locks.borrow_mut().remove(&name);
                    (Committed::Done(outcome), vec![event])
                }
                Decision::Acquire(acq) => {
                    let mut fences = self.fences.borrow_mut();
                    let fence = fences.entry(name.clone()).or_insert(0);
                    let prior = Some(*fence).filter(|f| *f > 0);
                    *fence += 1;
                    acq.finish(*fence, prior).committed()
                }
                Decision::Renew(renewal) => renewal.finish().committed(),
            };
            if let Committed::Wrote(_, written) = &committed {
                self.put(key, Current::Held(Seen::recorded(written.record.clone())));
            }
            self.events.borrow_mut().extend(events);
            Ok(committed)
        }

        fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
            let racer = self.racer.borrow_mut().take();
            if let Some(race) = racer {
                race(self);
            }
            Ok(self.fences.borrow().get(&key.name()).copied())
        }

        fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
            let locks = self.locks.borrow();
            let locks = locks
                .iter()
                .map(|(name, current)| {
                    let (skill, repo) = name
                        .split_once('@')
                        .ok_or_else(|| Error::Internal(format!("bad name {name}")))?;
                    let key = LockKey::new(skill, &repo.replacen("__", "/", 1))?;
                    Ok(Listed::new(key, name.clone(), current.clone()))
                })
                .collect::<Result<Vec<_>>>()?;
            crate::store::visit_in_order(locks, visit)?;
            Ok(0)
        }

        fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
            let all = self.events.borrow();
            let mine: Vec<Event> = all
                .iter()
                .filter(|e| key.is_none_or(|k| e.lock == k.name()))
                .cloned()
                .collect();
            Ok(mine[mine.len().saturating_sub(limit)..].to_vec())
        }
    }

    const T0: i64 = 1_800_000_000_000;

    /// A context on host `h` whose clock reads `T0 + secs` (no boot clock:
    /// the wall clock decides).
    fn at(secs: i64) -> Context {
        let now = Now {
            wall_ms: T0 + secs * 1000,
            boot: None,
        };
        Context {
            host: "h".into(),
            now: now.clone(),
            clock: Clock::Fixed(now),
        }
    }

    fn key() -> LockKey {
        LockKey::new("s", "o/r").unwrap()
    }

    fn req(ttl: u64) -> AcquireRequest {
        AcquireRequest {
            ttl,
            note: Some("n".into()),
            owner_pid: None,
            owner_pgid: None,
            since: None,
        }
    }

    fn acquired(store: &Memory, ttl: u64, ctx: &Context) -> (String, Holder) {
        match acquire(store, &key(), &req(ttl), ctx).unwrap() {
            Acquire::Acquired { token, holder, .. } => (token, holder),
            other => panic!("not acquired: {other:?}"),
        }
    }

    #[test]
    fn acquire_takes_a_free_lock_refuses_a_live_one_and_takes_over_an_expired_one() {
        let store = Memory::default();
        let (_, first) = acquired(&store, 60, &at(0));
        assert_eq!(
            (first.fence, first.ttl, first.note.as_deref()),
            (1, 60, Some("n"))
        );
        assert_eq!(first.expires.0 - first.started.0, 60);
        match acquire(&store, &key(), &req(60), &at(20)).unwrap() {
            Acquire::AlreadyRunning { holder, expires_in } => {
                assert_eq!((holder, expires_in), (first.clone(), 40));
            }
            other => panic!("{other:?}"),
        }
        match acquire(&store, &key(), &req(60), &at(61)).unwrap() {
            Acquire::Acquired {
                holder, took_over, ..
            } => {
                assert_eq!(holder.fence, 2);
                assert_eq!(
                    took_over,
                    Some(TookOver {
                        reason: StaleReason::Expired,
                        holder: Some(first),
                    })
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            store.kinds(),
            [
                EventKind::Acquired,
                EventKind::TookOver,
                EventKind::Acquired
            ]
        );
        let events = store.history(Some(&key()), 10).unwrap();
        assert_eq!(
            events[2].fence,
            Some(2),
            "the store's fence reaches the event"
        );
    }

    #[test]
    fn a_corrupt_record_is_stale_and_taken_over() {
        let store = Memory::default();
        store.put(&key(), Current::Corrupt("garbage".into()));
        assert_eq!(
            status(&store, &key(), &at(0)).unwrap().state,
            State::Stale {
                reason: StaleReason::Corrupt,
                holder: None,
                expires_in: None
            }
        );
        match acquire(&store, &key(), &req(60), &at(0)).unwrap() {
            Acquire::Acquired { took_over, .. } => assert_eq!(
                took_over,
                Some(TookOver {
                    reason: StaleReason::Corrupt,
                    holder: None
                })
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_decision_reads_the_clock_not_the_start_of_the_command() {
        // Started at 0, decided at 61: the lease of 60 s has run out.
        let store = Memory::default();
        acquired(&store, 60, &at(0));
        let mut ctx = at(0);
        ctx.clock = at(61).clock;
        assert!(matches!(
            acquire(&store, &key(), &req(60), &ctx).unwrap(),
            Acquire::Acquired {
                took_over: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn renew_extends_only_with_the_holders_token() {
        let store = Memory::default();
        assert_eq!(
            renew(&store, &key(), None, None, &at(0)).unwrap(),
            Renew::NotHeld { corrupt: false }
        );
        let (token, first) = acquired(&store, 60, &at(0));
        assert_eq!(
            renew(&store, &key(), Some("other"), None, &at(10)).unwrap(),
            Renew::NotOwner {
                holder: first.clone(),
                expires_in: 50,
            }
        );
        let Renew::Renewed {
            holder,
            was_expired,
            expires_in,
        } = renew(&store, &key(), Some(&token), Some(100), &at(10)).unwrap()
        else {
            panic!("not renewed")
        };
        assert!(!was_expired);
        assert_eq!(expires_in, 100, "counted from the decision's clock reading");
        assert_eq!((holder.fence, holder.ttl), (1, 100));
        assert_eq!(holder.expires.0, first.started.0 + 110);
        assert_eq!(holder.renewed.map(|t| t.0), Some(first.started.0 + 10));
        // Run out, nobody took it over: its own token may still renew it,
        // keeping the ttl it was last given.
        let Renew::Renewed {
            holder,
            was_expired,
            ..
        } = renew(&store, &key(), Some(&token), None, &at(500)).unwrap()
        else {
            panic!("not renewed")
        };
        assert!(was_expired);
        assert_eq!(holder.ttl, 100);
        store.put(&key(), Current::Corrupt("x".into()));
        assert_eq!(
            renew(&store, &key(), Some(&token), None, &at(0)).unwrap(),
            Renew::NotHeld { corrupt: true }
        );
    }

    #[test]
    fn a_revived_lease_takes_a_new_fence_that_since_sees() {
        let store = Memory::default();
        // B reads status while A's lease has run out (stale), then A revives.
        let (token, first) = acquired(&store, 10, &at(0));
        let since = shown(&store, &at(20));
        assert_eq!(since, first.fence);
        let Renew::Renewed {
            holder,
            was_expired,
            ..
        } = renew(&store, &key(), Some(&token), None, &at(21)).unwrap()
        else {
            panic!("not renewed")
        };
        assert!(was_expired);
        assert!(holder.fence > first.fence, "a revival takes a new fence");
        assert_eq!(holder.started, first.started, "the same holder");
        // A renewal of a live lease keeps it.
        let Renew::Renewed { holder: kept, .. } =
            renew(&store, &key(), Some(&token), None, &at(22)).unwrap()
        else {
            panic!("not renewed")
        };
        assert_eq!(kept.fence, holder.fence);
        release(&store, &key(), Some(&token), false, &at(23)).unwrap();
        let (_, _, others) = acquired_since(&store, since, &at(24));
        assert_eq!(others, Some(true), "B must read again");
        let events = store.events.borrow();
        let revival = events
            .iter()
            .find(|e| e.event == EventKind::Renewed && e.previous.is_some())
            .expect("the revival is in the history");
        assert_eq!(revival.fence, Some(holder.fence));
        assert_eq!(
            revival.previous.as_ref().map(|p| p.fence),
            Some(first.fence)
        );
    }

    #[test]
    fn renew_counts_what_is_left_on_the_clock_reading_it_decided_at() {
        // The command started at 0 and decided at 10 (it waited, e.g. for a
        // network store's failover): the lease written ends 100 s after the
        // decision, so 100 s are left, not 110.
        let store = Memory::default();
        let (token, _) = acquired(&store, 60, &at(0));
        let mut ctx = at(0);
        ctx.clock = at(10).clock;
        let Renew::Renewed { expires_in, .. } =
            renew(&store, &key(), Some(&token), Some(100), &ctx).unwrap()
        else {
            panic!("not renewed")
        };
        assert_eq!(expires_in, 100);
        let Renew::NotOwner { expires_in, .. } =
            renew(&store, &key(), Some("other"), None, &ctx).unwrap()
        else {
            panic!("renewed with another token")
        };
        assert_eq!(expires_in, 100);
    }

    #[test]
    fn release_needs_the_token_or_force() {
        let store = Memory::default();
        assert_eq!(
            release(&store, &key(), None, false, &at(0)).unwrap(),
            Release::NotHeld
        );
        let (token, first) = acquired(&store, 60, &at(0));
        assert_eq!(
            release(&store, &key(), Some("other"), false, &at(1)).unwrap(),
            Release::Refused {
                holder: Some(first.clone())
            }
        );
        assert_eq!(
            release(&store, &key(), Some("other"), true, &at(1)).unwrap(),
            Release::Released {
                holder: Some(first),
                forced: true
            }
        );
        let (token2, second) = acquired(&store, 60, &at(2));
        assert_ne!(token, token2);
        assert_eq!(second.fence, 2, "the fence survives a release");
        assert_eq!(
            release(&store, &key(), Some(&token2), true, &at(3)).unwrap(),
            Release::Released {
                holder: Some(second),
                forced: false
            }
        );
        store.put(&key(), Current::Corrupt("x".into()));
        assert_eq!(
            release(&store, &key(), Some(&token), false, &at(4)).unwrap(),
            Release::Refused { holder: None }
        );
        assert_eq!(
            release(&store, &key(), None, false, &at(4)).unwrap(),
            Release::Released {
                holder: None,
                forced: false
            }
        );
        assert_eq!(
            store.kinds(),
            [
                EventKind::Acquired,
                EventKind::Refused,
                EventKind::ForcedRelease,
                EventKind::Acquired,
                EventKind::Released,
                EventKind::Refused,
                EventKind::Released
            ]
        );
    }

    #[test]
    fn check_holds_only_for_the_live_holders_token() {
        let store = Memory::default();
        assert_eq!(check(&store, &key(), "t", &at(0)).unwrap(), Check::NotHeld);
        let (token, first) = acquired(&store, 60, &at(0));
        assert_eq!(
            check(&store, &key(), &token, &at(59)).unwrap(),
            Check::Held {
                holder: first.clone(),
                expires_in: 1
            }
        );
        assert_eq!(
            check(&store, &key(), "other", &at(1)).unwrap(),
            Check::NotOwner {
                holder: Some(first.clone())
            }
        );
        assert_eq!(
            check(&store, &key(), &token, &at(60)).unwrap(),
            Check::Expired {
                reason: StaleReason::Expired,
                holder: first
            }
        );
        assert!(store.kinds().len() == 1, "check is read-only");
        store.put(&key(), Current::Corrupt("x".into()));
        assert_eq!(
            check(&store, &key(), &token, &at(0)).unwrap(),
            Check::NotOwner { holder: None }
        );
    }

    #[test]
    fn others_since_is_false_only_when_the_prior_fence_is_the_one_given() {
        assert!(
            !others_since(Some(5), 5),
            "status showed the last acquisition"
        );
        assert!(others_since(Some(6), 5), "someone acquired since");
        assert!(others_since(Some(4), 5), "the store forgot: it cannot tell");
        assert!(!others_since(None, 0), "none known, none shown");
        assert!(others_since(None, 3), "the store forgot every acquisition");
        assert!(
            others_since(Some(5), 0),
            "status knew of none, the store of one"
        );
    }

    fn acquired_since(store: &Memory, since: u64, ctx: &Context) -> (String, Holder, Option<bool>) {
        let mut r = req(10);
        r.since = Some(since);
        match acquire(store, &key(), &r, ctx).unwrap() {
            Acquire::Acquired {
                token,
                holder,
                others_since,
                ..
            } => (token, holder, others_since),
            other => panic!("not acquired: {other:?}"),
        }
    }

    /// What `status` showed as the fence, as a skill passes it to `--since`
    /// (`null` as 0).
    fn shown(store: &Memory, ctx: &Context) -> u64 {
        status(store, &key(), ctx).unwrap().fence.unwrap_or(0)
    }

    #[test]
    fn status_shows_the_latest_fence_held_or_not() {
        let store = Memory::default();
        assert_eq!(
            status(&store, &key(), &at(0)).unwrap(),
            Status {
                state: State::Free,
                fence: None
            }
        );
        let (token, first) = acquired(&store, 10, &at(0));
        assert_eq!(
            status(&store, &key(), &at(1)).unwrap().fence,
            Some(first.fence)
        );
        let stale = status(&store, &key(), &at(20)).unwrap();
        assert!(matches!(stale.state, State::Stale { .. }));
        assert_eq!(stale.fence, Some(first.fence));
        release(&store, &key(), Some(&token), false, &at(21)).unwrap();
        assert_eq!(
            status(&store, &key(), &at(22)).unwrap(),
            Status {
                state: State::Free,
                fence: Some(first.fence)
            }
        );
    }

    #[test]
    fn since_answers_whether_another_acquisition_came_in_between() {
        let store = Memory::default();
        // Never acquired: status shows null, the first acquisition says no.
        let since = shown(&store, &at(0));
        assert_eq!(since, 0);
        let (t, _, others) = acquired_since(&store, since, &at(1));
        assert_eq!(others, Some(false));
        release(&store, &key(), Some(&t), false, &at(2)).unwrap();
        // Nobody in between.
        let since = shown(&store, &at(3));
        let (t, _, others) = acquired_since(&store, since, &at(4));
        assert_eq!(others, Some(false));
        release(&store, &key(), Some(&t), false, &at(5)).unwrap();
        // Another run acquired and released in between.
        let since = shown(&store, &at(6));
        let (t, _) = acquired(&store, 10, &at(7));
        release(&store, &key(), Some(&t), false, &at(8)).unwrap();
        let (t, _, others) = acquired_since(&store, since, &at(9));
        assert_eq!(others, Some(true));
        release(&store, &key(), Some(&t), false, &at(10)).unwrap();
        // Another run acquired and its lease ran out: this one takes it over.
        let since = shown(&store, &at(11));
        acquired(&store, 10, &at(12));
        let Acquire::Acquired {
            took_over,
            others_since,
            ..
        } = acquire(&store, &key(), &with_since(since), &at(30)).unwrap()
        else {
            panic!("not taken over")
        };
        assert!(took_over.is_some());
        assert_eq!(others_since, Some(true));
        // Status showed that expired lock: taking it over says no.
        let since = shown(&store, &at(50));
        let (_, _, others) = acquired_since(&store, since, &at(51));
        assert_eq!(others, Some(false));
        // Without --since, nothing is said.
        let Acquire::Acquired { others_since, .. } =
            acquire(&store, &key(), &req(10), &at(70)).unwrap()
        else {
            panic!("not taken over")
        };
        assert_eq!(others_since, None);
    }

    fn with_since(since: u64) -> AcquireRequest {
        let mut r = req(10);
        r.since = Some(since);
        r
    }

    #[test]
    fn a_store_that_forgot_its_fences_cannot_tell() {
        let store = Memory::default();
        let (t, _) = acquired(&store, 10, &at(0));
        release(&store, &key(), Some(&t), false, &at(1)).unwrap();
        let (t, _) = acquired(&store, 10, &at(2));
        release(&store, &key(), Some(&t), false, &at(3)).unwrap();
        let since = shown(&store, &at(4));
        assert_eq!(since, 2);
        // Counter set back below the fence status showed.
        store.fences.borrow_mut().insert(key().name(), 1);
        let (t, _, others) = acquired_since(&store, since, &at(5));
        assert_eq!(others, Some(true));
        release(&store, &key(), Some(&t), false, &at(6)).unwrap();
        // Counter gone altogether.
        let since = shown(&store, &at(7));
        store.fences.borrow_mut().clear();
        let (_, _, others) = acquired_since(&store, since, &at(8));
        assert_eq!(others, Some(true));
    }

    #[test]
    fn status_never_calls_free_a_lock_acquired_while_it_read_the_fence() {
        let store = Memory::default();
        let (t, _) = acquired(&store, 10, &at(0));
        release(&store, &key(), Some(&t), false, &at(1)).unwrap();
        // Between status's first look (free) and its fence, a run acquires.
        *store.racer.borrow_mut() = Some(Box::new(|s: &Memory| {
            acquired(s, 60, &at(2));
        }));
        let seen = status(&store, &key(), &at(3)).unwrap();
        assert!(matches!(seen.state, State::Held { .. }), "{seen:?}");
        assert_eq!(seen.fence, Some(2), "the fence of the lock it shows");
    }

    #[test]
    fn status_never_calls_stale_a_lease_renewed_between_its_read_and_its_clock() {
        let store = Memory::default();
        let (token, first) = acquired(&store, 10, &at(0));
        // status reads the record, then its holder renews it (live at 9:
        // no revival, the same fence), then status reads the clock at 11.
        *store.read_racer.borrow_mut() = Some(Box::new(move |s: &Memory| {
            renew(s, &key(), Some(&token), None, &at(9)).unwrap();
        }));
        let seen = status(&store, &key(), &at(11)).unwrap();
        assert!(matches!(seen.state, State::Held { .. }), "{seen:?}");
        assert_eq!(seen.fence, Some(first.fence));
        // Nobody renewed: stale, and a renewal after it revives.
        let seen = status(&store, &key(), &at(30)).unwrap();
        assert!(matches!(seen.state, State::Stale { .. }), "{seen:?}");
    }

    /// A context at `secs` on this process's real boot clock: records it
    /// writes carry this boot's id, so their pids can be judged here.
    fn on_this_boot(secs: i64) -> Context {
        let mut ctx = at(secs);
        ctx.now.boot = Now::read().boot;
        ctx.clock = Clock::Fixed(ctx.now.clone());
        ctx
    }

    #[test]
    fn a_dead_owner_is_judged_only_where_its_identity_is_certain() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let mut r = req(600);
        r.owner_pid = Some(dead);
        // Written without a boot id (identity uncertain): the lease alone judges.
        let uncertain = Memory::default();
        acquire(&uncertain, &key(), &r, &at(0)).unwrap();
        assert!(matches!(
            status(&uncertain, &key(), &at(1)).unwrap().state,
            State::Held { .. }
        ));
        if Now::read().boot.is_none() {
            return; // no boot clock here: no pid is ever judged
        }
        let store = Memory::default();
        acquire(&store, &key(), &r, &on_this_boot(0)).unwrap();
        assert!(matches!(
            status(&store, &key(), &on_this_boot(1)).unwrap().state,
            State::Stale {
                reason: StaleReason::OwnerDead,
                ..
            }
        ));
        assert!(matches!(
            acquire(&store, &key(), &req(60), &on_this_boot(1)).unwrap(),
            Acquire::Acquired {
                took_over: Some(TookOver {
                    reason: StaleReason::OwnerDead,
                    ..
                }),
                ..
            }
        ));
        let mut listed = Vec::new();
        list(&store, &on_this_boot(1), &mut |e| {
            listed.push(e);
            Ok(())
        })
        .unwrap();
        assert_eq!(listed.len(), 1);
    }
}
