//! Lease arithmetic and the stale verdict (SPEC §6).
//!
//! Expiry is the lease's question and is answered here; whether a record's
//! owner is gone is asked of [`crate::liveness`], which knows nothing of
//! leases (the dependency goes one way). The clock is passed in as a
//! [`Now`](crate::clock::Now), so every rule here is unit-tested without sleeping. On the same
//! boot-time clock that wrote a record (same boot id and same time
//! namespace), expiry is judged on that clock, which wall-clock steps do not
//! move; anywhere else it is judged on the wall clock against `expires`.
//! A store says how a lock it saw is judged ([`Seen`], a type of the store
//! contract: the lease end it knows, whether the owner is comparable here)
//! without editing the record, and [`verdict`] is the one judgement every
//! answer uses.

use crate::clock::Now;
use crate::error::{Error, Result};
use crate::liveness::{self, Origin};
use crate::record::{Holder, Timestamp};
use crate::store::{Identity, LeaseEnd, Seen};

/// Default lease, seconds.
pub const DEFAULT_TTL: u64 = 7200;
/// Longest lease, seconds (30 days).
pub const MAX_TTL: u64 = 2_592_000;

/// Why a lock is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleReason {
    /// now ≥ expires.
    Expired,
    /// The owner is certainly gone: its pid died or was reused in the boot
    /// and pid namespace that recorded it, or its machine rebooted since.
    OwnerDead,
    /// The record cannot be read or parsed.
    Corrupt,
}

impl StaleReason {
    /// The SPEC spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::OwnerDead => "owner_dead",
            Self::Corrupt => "corrupt",
        }
    }
}

/// Parses `--ttl`: whole seconds, 1..=2592000.
///
/// # Errors
/// [`Error::InvalidTtl`].
pub fn parse_ttl(text: &str) -> Result<u64> {
    match text.parse::<u64>() {
        Ok(t) if (1..=MAX_TTL).contains(&t) => Ok(t),
        _ => Err(Error::InvalidTtl(text.to_owned())),
    }
}

/// The times of a lease of `ttl` seconds starting at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// Now, to the second (rounded down).
    pub start: Timestamp,
    /// Expiry, to the second (rounded up, so a lease is never shorter than asked).
    pub expires: Timestamp,
    /// The same instant as `expires` on the boot-time clock.
    pub deadline_boot_ms: Option<u64>,
}

/// Computes the term of a new or renewed lease.
#[must_use]
pub fn term(now: &Now, ttl: u64) -> Term {
    let ttl_ms = i64::try_from(ttl.saturating_mul(1000)).unwrap_or(i64::MAX);
    let end_ms = now.wall_ms.saturating_add(ttl_ms);
    let expires = Timestamp(end_ms.div_euclid(1000) + i64::from(end_ms.rem_euclid(1000) != 0));
    let ahead = u64::try_from(expires.0 * 1000 - now.wall_ms).unwrap_or(0);
    Term {
        start: now.wall(),
        expires,
        deadline_boot_ms: now.boot.as_ref().map(|b| b.ms.saturating_add(ahead)),
    }
}

/// True when `holder`'s boot-clock deadline was set on the clock `now` reads:
/// the same boot and the same time namespace.
#[must_use]
pub fn same_boot_clock(holder: &Holder, now: &Now) -> bool {
    match (now.boot.as_ref(), holder.boot_id.as_deref()) {
        (Some(boot), Some(id)) => boot.id == id && boot.time_ns == holder.time_ns,
        _ => false,
    }
}

/// The boot-clock deadline a renewal of `holder` at `now` records: the new
/// term's, when the renewer reads the clock the record's deadline is on;
/// otherwise none (the wall clock then judges), since the record keeps the
/// boot and namespaces of its acquirer.
#[must_use]
pub fn renewed_deadline(holder: &Holder, now: &Now, term: &Term) -> Option<u64> {
    term.deadline_boot_ms
        .filter(|_| same_boot_clock(holder, now))
}

/// The verdict on a readable lock at one clock reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A live lease with `expires_in` seconds left.
    Live {
        /// Seconds left, rounded up.
        expires_in: u64,
    },
    /// The next acquire takes it over.
    Stale {
        /// Why.
        reason: StaleReason,
        /// Seconds left on the lease (0 when expired; None when the lease
        /// itself is impossible).
        expires_in: Option<u64>,
    },
}

/// Judges a lock a store saw (SPEC §6): an impossible lease is corrupt;
/// otherwise expired, owner gone (only where its identity is comparable), or live.
#[must_use]
pub fn verdict(seen: &Seen, now: &Now) -> Verdict {
    verdict_at(seen, now, Origin::here())
}

/// [`verdict`] judged from the given origin (tests pass another one).
#[must_use]
pub fn verdict_at(seen: &Seen, now: &Now, here: &Origin) -> Verdict {
    let left = seen_remaining_ms(seen, now);
    if impossible(left) {
        return Verdict::Stale {
            reason: StaleReason::Corrupt,
            expires_in: None,
        };
    }
    let expires_in = ceil_secs(left);
    let holder = seen.holder();
    // `run`'s lock: held while any process of its group lives, past
    // `expires` too (those members may still write); once none does, its
    // wrapper (`owner_pid`) and its lease decide as for any lock.
    let reason = match seen.identity {
        Identity::Foreign => (left <= 0).then_some(StaleReason::Expired),
        Identity::Comparable if liveness::group_verdict(holder, here) == Some(true) => None,
        Identity::Comparable if left <= 0 => Some(StaleReason::Expired),
        Identity::Comparable => {
            liveness::owner_gone(holder, here).then_some(StaleReason::OwnerDead)
        }
    };
    match reason {
        None => Verdict::Live { expires_in },
        Some(reason) => Verdict::Stale {
            reason,
            expires_in: Some(expires_in),
        },
    }
}

/// How long before the `expires` its holder was told a reader of a network
/// store may already call a lease `stale` (SPEC §8: one second).
pub const EARLY_STALE_MS: i64 = 1000;

/// May a reader already call this lease `stale` (or will it, before a
/// renewal decided now lands)? True when its lease has run out as this
/// decision judges it, and on a store whose lease ends by the wall clock
/// (a network store, [`LeaseEnd::Wall`]) also within [`EARLY_STALE_MS`]
/// of the `expires` its holder was told, since a reader there may judge
/// it that much early. A renewal of such a lease revives it: it takes a
/// new fence (SPEC §2.2).
#[must_use]
pub fn readers_may_call_stale(seen: &Seen, now: &Now) -> bool {
    if seen_remaining_ms(seen, now) <= 0 {
        return true;
    }
    match seen.lease_end {
        LeaseEnd::Recorded => false,
        LeaseEnd::Wall(_) => {
            let told = seen
                .holder()
                .expires
                .0
                .saturating_mul(1000)
                .saturating_sub(now.wall_ms);
            told <= EARLY_STALE_MS
        }
    }
}

/// Milliseconds left on the lease of a lock a store saw.
#[must_use]
pub fn seen_remaining_ms(seen: &Seen, now: &Now) -> i64 {
    match seen.lease_end {
        LeaseEnd::Recorded => remaining_ms(seen.holder(), now),
        LeaseEnd::Wall(end) => end.0.saturating_mul(1000).saturating_sub(now.wall_ms),
    }
}

/// Whole seconds left on the lease of a lock a store saw, rounded up,
/// never negative.
#[must_use]
pub fn seen_expires_in(seen: &Seen, now: &Now) -> u64 {
    ceil_secs(seen_remaining_ms(seen, now))
}

fn ceil_secs(ms: i64) -> u64 {
    u64::try_from(ms.max(0)).unwrap_or(0).div_ceil(1000)
}

/// Milliseconds left on a lease (zero or less: expired).
#[must_use]
pub fn remaining_ms(holder: &Holder, now: &Now) -> i64 {
    if let (Some(deadline), Some(boot)) = (holder.deadline_boot_ms, now.boot.as_ref())
        && same_boot_clock(holder, now)
    {
        return i64::try_from(deadline).unwrap_or(i64::MAX)
            - i64::try_from(boot.ms).unwrap_or(i64::MAX);
    }
    holder
        .expires
        .0
        .saturating_mul(1000)
        .saturating_sub(now.wall_ms)
}

/// Slack for clock differences when judging an impossible lease.
pub const FUTURE_SLACK_SECS: u64 = 300;

/// A lease with `left_ms` to run that ends further ahead than any ttl
/// allows (more than 30 days plus 5 minutes from now) cannot have been
/// written by a sane clock; it is treated as corrupt rather than blocking
/// the lock for years.
#[must_use]
pub fn impossible(left_ms: i64) -> bool {
    let limit = i64::try_from((MAX_TTL + FUTURE_SLACK_SECS) * 1000).unwrap_or(i64::MAX);
    left_ms > limit
}

/// Whole seconds left, rounded up (a live lease shows at least 1), never negative.
#[must_use]
pub fn expires_in(holder: &Holder, now: &Now) -> u64 {
    ceil_secs(remaining_ms(holder, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::BootClock;
    use crate::record::tests::sample;

    fn now(wall_ms: i64, boot: Option<(&str, u64)>) -> Now {
        Now {
            wall_ms,
            boot: boot.map(|(id, ms)| BootClock {
                id: id.into(),
                time_ns: Some(4_026_531_834),
                ms,
            }),
        }
    }

    #[test]
    fn ttl_bounds() {
        assert_eq!(parse_ttl("1").unwrap(), 1);
        assert_eq!(parse_ttl("2592000").unwrap(), MAX_TTL);
        for bad in ["0", "2592001", "-1", "1.5", "", "x", "99999999999999999999"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn term_never_shorter_than_asked_and_boot_deadline_matches() {
        let t = term(&now(10_400, Some(("b", 500))), 5);
        assert_eq!((t.start, t.expires), (Timestamp(10), Timestamp(16)));
        assert_eq!(t.deadline_boot_ms, Some(500 + 5_600));
        let t = term(&now(10_000, None), 5);
        assert_eq!((t.expires, t.deadline_boot_ms), (Timestamp(15), None));
    }

    #[test]
    fn same_boot_uses_boot_clock_other_boot_uses_wall() {
        let mut h = sample(None).holder;
        h.expires = Timestamp(100);
        h.boot_id = Some("b".into());
        h.deadline_boot_ms = Some(50_000);
        // Wall clock stepped far ahead, same boot: still 10 s left.
        assert_eq!(remaining_ms(&h, &now(900_000, Some(("b", 40_000)))), 10_000);
        // Another boot: wall clock decides.
        assert_eq!(remaining_ms(&h, &now(99_000, Some(("c", 1)))), 1_000);
        assert_eq!(expires_in(&h, &now(99_001, None)), 1);
        assert_eq!(expires_in(&h, &now(100_000, None)), 0);
        assert_eq!(expires_in(&h, &now(200_000, None)), 0);
        // Same boot id, another time namespace: another clock, so the wall decides.
        let mut other_ns = now(99_000, Some(("b", 40_000)));
        if let Some(b) = other_ns.boot.as_mut() {
            b.time_ns = Some(1);
        }
        assert_eq!(remaining_ms(&h, &other_ns), 1_000);
        assert!(!impossible(remaining_ms(&h, &now(0, None))));
        h.expires = Timestamp(i64::try_from(MAX_TTL + FUTURE_SLACK_SECS).unwrap() + 2);
        assert!(impossible(remaining_ms(&h, &now(1000, None))));
    }

    #[test]
    fn a_renewal_revives_what_a_reader_may_already_call_stale() {
        let mut rec = sample(None);
        rec.holder.expires = Timestamp(100);
        rec.holder.deadline_boot_ms = None;
        rec.holder.owner_pgid = None;
        // Its own terms (the file store): only once the lease has run out.
        let seen = Seen::recorded(rec.clone());
        assert!(!readers_may_call_stale(&seen, &now(99_500, None)));
        assert!(readers_may_call_stale(&seen, &now(100_000, None)));
        // A cluster's lease (etcd): a reader may call it stale a second
        // before the expires its holder was told, however long the
        // cluster's lease still runs.
        let seen = Seen {
            lease_end: LeaseEnd::Wall(Timestamp(102)),
            ..Seen::recorded(rec)
        };
        assert!(!readers_may_call_stale(&seen, &now(98_999, None)));
        assert!(readers_may_call_stale(&seen, &now(99_000, None)));
        assert!(readers_may_call_stale(&seen, &now(101_000, None)));
    }

    #[test]
    fn a_seen_lock_is_judged_by_the_lease_end_and_identity_its_store_gives() {
        // An owner that rebooted since on this machine: certainly gone,
        // where its identity can be compared.
        let here = Origin {
            machine: Some("m".into()),
            boot_id: Some("now".into()),
            pid_ns: None,
            pid_ns_start: None,
            time_ns: None,
        };
        let mut rec = sample(None);
        rec.holder.expires = Timestamp(100);
        rec.holder.machine = Some("m".into());
        rec.holder.boot_id = Some("before".into());
        rec.holder.owner_pid = Some(4242);
        rec.holder.deadline_boot_ms = None;
        let at = now(90_000, None);
        let mut seen = Seen::recorded(rec);
        assert_eq!(
            verdict_at(&seen, &at, &here),
            Verdict::Stale {
                reason: StaleReason::OwnerDead,
                expires_in: Some(10)
            }
        );
        // Foreign (a store machines share): its lease alone judges it.
        seen.identity = Identity::Foreign;
        assert_eq!(
            verdict_at(&seen, &at, &here),
            Verdict::Live { expires_in: 10 }
        );
        // A lease end the store knows better than the record: it decides,
        // and the record is left as stored.
        seen.lease_end = LeaseEnd::Wall(Timestamp(130));
        assert_eq!(
            verdict_at(&seen, &now(120_000, None), &here),
            Verdict::Live { expires_in: 10 }
        );
        assert_eq!(seen.holder().expires, Timestamp(100));
        assert_eq!(
            verdict_at(&seen, &now(130_000, None), &here),
            Verdict::Stale {
                reason: StaleReason::Expired,
                expires_in: Some(0)
            }
        );
        // An impossible end is corrupt, whoever says it.
        let far = i64::try_from(MAX_TTL + FUTURE_SLACK_SECS).unwrap() + 200;
        seen.lease_end = LeaseEnd::Wall(Timestamp(far));
        assert_eq!(
            verdict_at(&seen, &now(0, None), &here),
            Verdict::Stale {
                reason: StaleReason::Corrupt,
                expires_in: None
            }
        );
    }
}
