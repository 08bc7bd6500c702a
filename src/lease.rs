//! Lease arithmetic, pure (SPEC §6 `expired`).
//!
//! The clock is passed in as a [`Now`], so every rule here is unit-tested
//! without sleeping. On the host and boot that wrote a record, expiry is
//! judged on the boot-time clock, which wall-clock steps do not move; anywhere
//! else it is judged on the wall clock against the record's `expires`.

use crate::error::{Error, Result};
use crate::record::{Holder, Timestamp};

/// Default lease, seconds.
pub const DEFAULT_TTL: u64 = 7200;
/// Longest lease, seconds (30 days).
pub const MAX_TTL: u64 = 2_592_000;

/// The boot-time clock of this host: its boot id and milliseconds since boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootClock {
    /// `/proc/sys/kernel/random/boot_id` on Linux.
    pub id: String,
    /// `CLOCK_BOOTTIME` in milliseconds (counts suspend, never steps).
    pub ms: u64,
}

/// One reading of the clocks, taken once per command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Now {
    /// Wall clock, milliseconds since the Unix epoch.
    pub wall_ms: i64,
    /// Boot-time clock, where the OS has one.
    pub boot: Option<BootClock>,
}

impl Now {
    /// Reads the system clocks.
    #[must_use]
    #[allow(
        clippy::disallowed_methods,
        reason = "the one reading of the wall clock"
    )]
    pub fn read() -> Self {
        let wall_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Self {
            wall_ms,
            boot: crate::liveness::boot_clock(),
        }
    }

    /// The wall time, whole seconds (rounded down).
    #[must_use]
    pub fn wall(&self) -> Timestamp {
        Timestamp(self.wall_ms.div_euclid(1000))
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

/// Milliseconds left on a lease (zero or less: expired).
#[must_use]
pub fn remaining_ms(holder: &Holder, now: &Now) -> i64 {
    if let (Some(deadline), Some(boot), Some(id)) = (
        holder.deadline_boot_ms,
        now.boot.as_ref(),
        holder.boot_id.as_deref(),
    ) && boot.id == id
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

/// A lease that ends further ahead than any ttl allows (more than 30 days
/// plus 5 minutes from now) cannot have been written by a sane clock; it is
/// treated as corrupt rather than blocking the lock for years.
#[must_use]
pub fn impossible(holder: &Holder, now: &Now) -> bool {
    let limit = i64::try_from((MAX_TTL + FUTURE_SLACK_SECS) * 1000).unwrap_or(i64::MAX);
    remaining_ms(holder, now) > limit
}

/// Whole seconds left, rounded up (a live lease shows at least 1), never negative.
#[must_use]
pub fn expires_in(holder: &Holder, now: &Now) -> u64 {
    let ms = remaining_ms(holder, now).max(0);
    u64::try_from(ms).unwrap_or(0).div_ceil(1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::sample;

    fn now(wall_ms: i64, boot: Option<(&str, u64)>) -> Now {
        Now {
            wall_ms,
            boot: boot.map(|(id, ms)| BootClock { id: id.into(), ms }),
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
        assert!(!impossible(&h, &now(0, None)));
        h.expires = Timestamp(i64::try_from(MAX_TTL + FUTURE_SLACK_SECS).unwrap() + 2);
        assert!(impossible(&h, &now(1000, None)));
    }
}
