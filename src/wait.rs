//! `--wait SECS` (SPEC §2.1): try to acquire until it works or the time is
//! up, sleeping a jittered back-off between attempts that never sleeps past
//! the moment the holder's lease runs out.
//!
//! `run --wait` sleeps on its signal channel instead of the clock, so a
//! SIGINT/SIGTERM/SIGHUP ends the wait at once with nothing acquired
//! ([`acquire_interruptible`], SPEC §2.7); `acquire --wait` keeps the
//! signals' default action, which ends it just as well.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use crate::engine::{self, Acquire, AcquireRequest, Clock, Context};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::record::Holder;
use crate::store::Store;
use crate::visible::visible;

/// What a person waiting at a terminal is told (SPEC issue 35, as cargo
/// says "Blocking waiting for file lock"): who holds the lock, until when,
/// and when the wait gives up; said again only when that changes (another
/// holder, a renewed or revived lease). Written only when standard error
/// is a terminal, so a script's streams never change; standard output is
/// untouched either way. A holder's host and note are shown escaped
/// ([`visible`]): the record may be forged.
struct Notice {
    to_terminal: bool,
    last: Option<String>,
}

impl Notice {
    fn new() -> Self {
        Self {
            to_terminal: std::io::stderr().is_terminal(),
            last: None,
        }
    }

    /// The line for `holder`, whose lease has `expires_in` seconds left,
    /// with `left` of the wait to go.
    fn line(key: &LockKey, holder: &Holder, expires_in: u64, left: Duration) -> String {
        let until = if expires_in == 0 {
            format!(
                "past its expires {} (a run frozen or still working: held while its processes live)",
                holder.expires
            )
        } else {
            format!(
                "until {} (in {expires_in} s) unless renewed",
                holder.expires
            )
        };
        let note = holder
            .note
            .as_deref()
            .map(|n| format!(", note \"{}\"", visible(n)))
            .unwrap_or_default();
        format!(
            "skill-lock: Blocking waiting for the lock {} on {} held by {} (pid {}, fence {}{note}) {until}; giving up in {} s",
            key.skill(),
            key.repo(),
            visible(&holder.host),
            holder
                .owner_pid
                .or(holder.owner_pgid)
                .map_or_else(|| "unknown".to_owned(), |p| p.to_string()),
            holder.fence,
            left.as_secs()
        )
    }

    /// Says `line` on standard error, if it is a terminal and the line
    /// says something new (the countdown alone is not new).
    fn say(&mut self, key: &LockKey, holder: &Holder, expires_in: u64, left: Duration) {
        if !self.to_terminal {
            return;
        }
        let what = (holder.fence, holder.expires, &holder.host);
        let what = format!("{what:?}");
        if self.last.as_ref() == Some(&what) {
            return;
        }
        self.last = Some(what);
        let line = Self::line(key, holder, expires_in, left);
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }
}

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
    let mut notice = Notice::new();
    loop {
        if let Some(sig) = pause(Duration::ZERO) {
            return Ok(Waited::Interrupted(sig));
        }
        let began = crate::clock::lease_clock();
        let ctx = Context::with_clock(clock.clone());
        let outcome = engine::acquire(store, key, req, &ctx)?;
        let Acquire::AlreadyRunning { expires_in, holder } = &outcome else {
            return Ok(Waited::Done { outcome, began });
        };
        let now = Instant::now();
        if now >= deadline {
            return Ok(Waited::Done { outcome, began });
        }
        notice.say(key, holder, *expires_in, deadline - now);
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
