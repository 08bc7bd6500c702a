//! `--wait SECS` (SPEC §2.1): try to acquire until it works or the time is
//! up, sleeping a jittered back-off between attempts that never sleeps past
//! the moment the holder's lease runs out.
//!
//! `run --wait` sleeps on its signal channel instead of the clock, so a
//! SIGINT/SIGTERM/SIGHUP ends the wait at once with nothing acquired
//! ([`acquire_interruptible`], SPEC §2.7); `acquire --wait` keeps the
//! signals' default action, which ends it just as well.

use std::time::{Duration, Instant};

use crate::engine::{self, Acquire, AcquireRequest, Clock, Context};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::store::Store;

/// Sleeps between attempts of `--wait`: doubling from 10 ms to 250 ms, each
/// drawn at random from its upper half, and never past the moment the holder's lease runs out.
#[must_use]
pub(crate) fn backoff(attempt: u32, lease_left_ms: Option<i64>, deadline: Instant) -> Duration {
    let base = 10u64.saturating_mul(1 << attempt.min(5)).min(250);
    let mut r = [0u8; 2];
    let jitter = if getrandom::fill(&mut r).is_ok() {
        u64::from(u16::from_le_bytes(r)) % (base / 2 + 1)
    } else {
        base / 4
    };
    let mut ms = base / 2 + jitter;
    if let Some(left) = lease_left_ms {
        ms = ms.min(u64::try_from(left.max(0)).unwrap_or(0) + 1);
    }
    let until_deadline = deadline.saturating_duration_since(Instant::now());
    Duration::from_millis(ms).min(until_deadline)
}

/// How an interruptible wait ended.
// One value per command: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Waited {
    /// The last attempt's outcome, and when that attempt began (a lease it
    /// acquired lasts at least ttl from then).
    Done {
        /// Acquired, or already running when the time was up.
        outcome: Acquire,
        /// The moment the deciding attempt started, on
        /// [`crate::clock::lease_clock`].
        began: Duration,
    },
    /// A signal came first: nothing was acquired.
    Interrupted(libc::c_int),
}

/// Acquires, retrying until `wait` has passed (SPEC §2.1 `--wait`).
///
/// # Errors
/// Store failures of an attempt.
pub(crate) fn acquire_waiting(
    store: &impl Store,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
    clock: &Clock,
) -> Result<Acquire> {
    let mut sleep = |d: Duration| {
        std::thread::sleep(d);
        None
    };
    match acquire_interruptible(store, key, req, wait, clock, &mut sleep)? {
        Waited::Done { outcome, .. } => Ok(outcome),
        Waited::Interrupted(_) => Err(Error::Internal(
            "a wait without signals was interrupted".into(),
        )),
    }
}

/// [`acquire_waiting`] whose pauses are `pause(d)`: it waits up to `d` and
/// returns a signal that ended the pause early. It is also asked, without
/// waiting, before every attempt, so a signal never leads to an acquire.
///
/// # Errors
/// Store failures of an attempt.
pub(crate) fn acquire_interruptible(
    store: &impl Store,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
    clock: &Clock,
    pause: &mut dyn FnMut(Duration) -> Option<libc::c_int>,
) -> Result<Waited> {
    let deadline = Instant::now() + wait.unwrap_or_default();
    let mut attempt = 0;
    loop {
        if let Some(sig) = pause(Duration::ZERO) {
            return Ok(Waited::Interrupted(sig));
        }
        let began = crate::clock::lease_clock();
        let ctx = Context::with_clock(clock.clone());
        let outcome = engine::acquire(store, key, req, &ctx)?;
        let Acquire::AlreadyRunning { expires_in, .. } = &outcome else {
            return Ok(Waited::Done { outcome, began });
        };
        if Instant::now() >= deadline {
            return Ok(Waited::Done { outcome, began });
        }
        // A `run` group still alive holds its lock past `expires`: then
        // the lease end tells nothing, and the back-off alone paces.
        let left = i64::try_from(expires_in.saturating_mul(1000))
            .ok()
            .filter(|ms| *ms > 0);
        if let Some(sig) = pause(backoff(attempt, left, deadline)) {
            return Ok(Waited::Interrupted(sig));
        }
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_bounded_and_stops_at_the_deadline() {
        let far = Instant::now() + Duration::from_secs(60);
        for attempt in 0..20 {
            let d = backoff(attempt, None, far);
            assert!(
                d >= Duration::from_millis(5) && d <= Duration::from_millis(250),
                "{d:?}"
            );
        }
        assert!(backoff(9, Some(3), far) <= Duration::from_millis(4));
        assert_eq!(backoff(9, None, Instant::now()), Duration::ZERO);
    }
}
