//! One function per command (SPEC §2): each takes validated [`Settings`],
//! calls the engine once, and turns its outcome into the command's
//! [`Report`]. Nothing here parses, prints or reads the environment.

use std::ffi::OsString;
use std::time::Duration;

use crate::config::{Action, Settings};
use crate::engine::{self, AcquireRequest, Context};
use crate::error::Result;
use crate::key::LockKey;
use crate::output::{About, Channel, ExitStatus, Report};
use crate::store::{AnyStore, Store};

/// Carries out the settings' action and prints its object on `channel`;
/// returns the exit status.
///
/// # Errors
/// Anything that stops the command before it reaches an outcome (nothing
/// was printed then).
pub fn execute(settings: &Settings, channel: Channel) -> Result<ExitStatus> {
    let report = match &settings.action {
        Action::List => return list(settings),
        other => report(settings, other)?,
    };
    Ok(report.emit(channel))
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
    let outcome = crate::wait::acquire_waiting(store(settings), key, req, wait, &settings.clock)?;
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
    // Found before the lock is touched: a command that cannot start takes no lock.
    let program = crate::run::resolve(cmd, settings.env.path.as_deref())?;
    Ok(
        match crate::run::execute(
            store,
            key,
            req.clone(),
            wait,
            &program,
            cmd,
            &settings.clock,
        )? {
            crate::run::Outcome::NotAcquired(outcome) => {
                Report::acquire(outcome, about(settings, key), || {
                    crate::hint::release_force(key, settings)
                })
            }
            crate::run::Outcome::Interrupted(sig) => Report::interrupted(about(settings, key), sig),
            crate::run::Outcome::Ran { fence, ran } => {
                Report::ran(about(settings, key), fence, &ran)
            }
        },
    )
}

fn renew(
    settings: &Settings,
    key: &LockKey,
    token: Option<&str>,
    ttl: Option<u64>,
) -> Result<Report> {
    let outcome = engine::renew(store(settings), key, token, ttl, &context(settings))?;
    Ok(Report::renew(outcome, about(settings, key)))
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
