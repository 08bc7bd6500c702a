//! One function per command (SPEC §2): each takes validated [`Settings`],
//! calls the engine once, and turns its outcome into the command's
//! [`Report`]. Nothing here parses, prints or reads the environment.

use std::ffi::OsString;
use std::time::{Duration, Instant};

use crate::config::{Action, Settings};
use crate::engine::{self, Acquire, AcquireRequest, Clock, Context};
use crate::error::Result;
use crate::key::LockKey;
use crate::lease;
use crate::output::{About, ExitStatus, Report};
use crate::store::{AnyStore, Store};

/// Carries out the settings' action and prints its object (on stderr for
/// `run`); returns the exit status.
///
/// # Errors
/// Anything that stops the command before it reaches an outcome (nothing
/// was printed then).
pub fn execute(settings: &Settings) -> Result<ExitStatus> {
    let report = match &settings.action {
        Action::List => return list(settings),
        other => report(settings, other)?,
    };
    Ok(report.emit(settings.action.reports_on_stderr()))
}

/// The object of every action but `list` (which prints as it reads).
fn report(settings: &Settings, action: &Action) -> Result<Report> {
    match action {
        Action::Acquire { key, req, wait } => acquire(settings, key, req, *wait),
        Action::Run {
            key,
            req,
            wait,
            cmd,
        } => run(settings, key, req, *wait, cmd),
        Action::Renew { key, token, ttl } => renew(settings, key, token.as_deref(), *ttl),
        Action::Release { key, token, force } => release(settings, key, token.as_deref(), *force),
        Action::Status { key } => status(settings, key),
        Action::List => Err(crate::error::Error::Internal(
            "list prints as it reads".into(),
        )),
        Action::Check { key, token } => check(settings, key, token),
        Action::History { key, limit } => history(settings, key.as_ref(), *limit),
    }
}

fn store(settings: &Settings) -> &AnyStore {
    &settings.store.store
}

fn context(settings: &Settings) -> Context {
    Context::with_clock(settings.clock.clone())
}

fn about(settings: &Settings, key: &LockKey) -> About {
    About::new(key, store(settings))
}

fn acquire(
    settings: &Settings,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
) -> Result<Report> {
    let outcome = acquire_waiting(store(settings), key, req, wait, &settings.clock)?;
    Ok(Report::acquire(outcome, about(settings, key), || {
        crate::hint::release_force(key, settings)
    }))
}

fn run(
    settings: &Settings,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
    cmd: &[OsString],
) -> Result<Report> {
    let store = store(settings);
    let outcome = acquire_waiting(store, key, req, wait, &settings.clock)?;
    let Acquire::Acquired { token, holder, .. } = &outcome else {
        return Ok(Report::acquire(outcome, about(settings, key), || {
            crate::hint::release_force(key, settings)
        }));
    };
    let ran = crate::run::supervise(store, key, token, holder.fence, req.ttl, cmd)?;
    Ok(Report::ran(about(settings, key), holder.fence, &ran))
}

fn renew(
    settings: &Settings,
    key: &LockKey,
    token: Option<&str>,
    ttl: Option<u64>,
) -> Result<Report> {
    let ctx = context(settings);
    let outcome = engine::renew(store(settings), key, token, ttl, &ctx)?;
    Ok(Report::renew(outcome, about(settings, key), &ctx.now))
}

fn release(settings: &Settings, key: &LockKey, token: Option<&str>, force: bool) -> Result<Report> {
    let outcome = engine::release(store(settings), key, token, force, &context(settings))?;
    Ok(Report::release(outcome, about(settings, key)))
}

fn status(settings: &Settings, key: &LockKey) -> Result<Report> {
    let state = engine::status(store(settings), key, &context(settings))?;
    Ok(Report::status(state, about(settings, key)))
}

fn list(settings: &Settings) -> Result<ExitStatus> {
    crate::output::print_list(store(settings), &context(settings))
}

fn check(settings: &Settings, key: &LockKey, token: &str) -> Result<Report> {
    let outcome = engine::check(store(settings), key, token, &context(settings))?;
    Ok(Report::check(outcome, about(settings, key)))
}

fn history(settings: &Settings, key: Option<&LockKey>, limit: usize) -> Result<Report> {
    let store = store(settings);
    let about = key.map(|k| about(settings, k));
    Ok(Report::history(
        about,
        store.describe(),
        store.history(key, limit)?,
    ))
}

/// Sleeps between attempts of `--wait`: doubling from 10 ms to 250 ms, each
/// drawn at random from its upper half, and never past the moment the holder's lease runs out.
fn backoff(attempt: u32, lease_left_ms: Option<i64>, deadline: Instant) -> Duration {
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

/// Acquires, retrying until `wait` has passed (SPEC §2.1 `--wait`).
fn acquire_waiting(
    store: &impl Store,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
    clock: &Clock,
) -> Result<Acquire> {
    let start = Instant::now();
    let deadline = start + wait.unwrap_or_default();
    let mut attempt = 0;
    loop {
        let ctx = Context::with_clock(clock.clone());
        let outcome = engine::acquire(store, key, req, &ctx)?;
        let Acquire::AlreadyRunning { holder, .. } = &outcome else {
            return Ok(outcome);
        };
        if Instant::now() >= deadline {
            return Ok(outcome);
        }
        let left = lease::remaining_ms(holder, &ctx.now);
        std::thread::sleep(backoff(attempt, Some(left), deadline));
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_in_bounds() {
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
