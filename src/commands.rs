//! One function per command (SPEC §2): each takes validated [`Settings`],
//! calls the engine once, and turns its outcome into the command's
//! [`Report`]. Nothing here parses, prints or reads the environment.

use std::ffi::OsString;
use std::time::Duration;

use crate::config::{Action, Settings};
use crate::engine::{self, AcquireRequest, Context};
use crate::error::Result;
use crate::key::LockKey;
use crate::output::{About, Channel, ExitStatus, ListPrinter, Report};
use crate::store::{AnyStore, Store};

/// Carries out the settings' action and prints its object on `channel`;
/// returns the exit status.
///
/// # Errors
/// Anything that stops the command before it reaches an outcome (nothing
/// was printed then).
pub(crate) fn execute(settings: &Settings, channel: Channel) -> Result<ExitStatus> {
    if matches!(settings.action, Action::Acquire { .. }) && crate::output::stdout_closed() {
        // A token printed nowhere must not hold a lock (SPEC §3): with
        // standard output closed, the lock is not even taken.
        return Err(crate::error::Error::io(
            "write the result to",
            "standard output",
            std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "it is closed, so a token would reach nobody; nothing was acquired",
            ),
        ));
    }
    let store = settings.store.open()?;
    if let Action::List = settings.action {
        // Printed as it is read: never all in memory.
        return list(settings, &store);
    }
    let report = report(settings, &store)?;
    match (report.write(channel), &settings.action, report.token()) {
        (
            Ok(()),
            Action::Run {
                conflict_exit_code: Some(n),
                ..
            },
            _,
        ) if report.exit_status() == ExitStatus::AlreadyRunning => Ok(ExitStatus::Conflict(*n)),
        (Ok(()), ..) => Ok(report.exit_status()),
        (Err(e), Action::Acquire { key, .. }, Some(token)) => {
            give_back(settings, &store, key, token, &e);
            Ok(ExitStatus::Error)
        }
        (Err(e), ..) => {
            crate::output::unwritten(&e, &report.gist());
            Ok(ExitStatus::Error)
        }
    }
}

/// The object of the settings' action on the opened `store`, not yet
/// written anywhere: what the command prints, and what the MCP server's
/// tool of the same name answers (SPEC §2.9).
///
/// # Errors
/// Anything that stops the command before it reaches an outcome;
/// [`crate::error::Error::Internal`] for `list`, which is printed as it is
/// read and never held whole.
pub(crate) fn report(settings: &Settings, store: &AnyStore) -> Result<Report> {
    Ok(match &settings.action {
        Action::List => {
            return Err(crate::error::Error::Internal(
                "list is printed as the store reads it, never held as one object".into(),
            ));
        }
        Action::Acquire { key, req, wait } => acquire(settings, store, key, req, *wait)?,
        Action::Run {
            key,
            req,
            wait,
            cmd,
            ..
        } => run(settings, store, key, req, *wait, cmd)?,
        Action::Renew { key, token, ttl } => renew(settings, store, key, token.as_deref(), *ttl)?,
        Action::Release { key, token, force } => {
            release(settings, store, key, token.as_deref(), *force)?
        }
        Action::Status { key } => status(settings, store, key)?,
        Action::Check { key, token } => check(settings, store, key, token)?,
        Action::History { key, limit } => history(store, key.as_ref(), *limit)?,
    })
}

/// An `acquired` result that could not be written in full (standard
/// output full, a broken pipe): its token reached nobody, so the lock is
/// released again, with that token, so never anyone else's (SPEC §3).
fn give_back(
    settings: &Settings,
    store: &AnyStore,
    key: &LockKey,
    token: &str,
    why: &std::io::Error,
) {
    let then = match engine::release(store, key, Some(token), false, &context(settings)) {
        Ok(engine::Release::Released { .. } | engine::Release::NotHeld) => {
            "; the lock it acquired was released again".to_owned()
        }
        Ok(engine::Release::Refused { .. }) => {
            "; the lock it acquired was taken over meanwhile, and left to its new holder".to_owned()
        }
        Err(e) => format!(
            "; releasing the lock it acquired failed ({e}): it stays held, by a token \
             nobody has, until its lease runs out (or an operator runs release --force)"
        ),
    };
    crate::output::unwritten(why, &then);
}

fn context(settings: &Settings) -> Context {
    Context::with_clock(settings.clock.clone())
}

fn about(store: &AnyStore, key: &LockKey) -> About {
    About::new(key, store.location(key))
}

/// The longest an original tool's record may still hold a name (SPEC §5
/// "Upgrading from the original tool"): a record claiming longer is no
/// lease that tool would have written, and holds nothing.
const LEGACY_HORIZON: u64 = 24 * 60 * 60;

/// A lock the original tool holds on `key`, judged by its expiry alone
/// (its pid and process group are never looked up): the holder and the
/// seconds left, when it holds the name. Anything unreadable holds nothing.
fn legacy_hold(
    settings: &Settings,
    key: &LockKey,
) -> Option<(AnyStore, crate::record::Holder, u64)> {
    settings.store.legacy.iter().find_map(|location| {
        let old = AnyStore::File(crate::store::fs::FileStore::at(location.clone()));
        let state = engine::state(&old, key, &context(settings)).ok()?;
        let (holder, left) = by_expiry(state)?;
        Some((old, holder, left))
    })
}

/// The holder and seconds left of a legacy lock whose `expires` is in the
/// future and at most [`LEGACY_HORIZON`] ahead.
fn by_expiry(state: engine::State) -> Option<(crate::record::Holder, u64)> {
    let (holder, left) = match state {
        engine::State::Held { holder, expires_in } => (holder, expires_in),
        engine::State::Stale {
            holder: Some(holder),
            expires_in: Some(left),
            ..
        } => (holder, left),
        _ => return None,
    };
    (left > 0 && left <= LEGACY_HORIZON).then_some((holder, left))
}

/// `already_running` for a name the original tool still holds.
fn legacy_report(
    old: &AnyStore,
    key: &LockKey,
    holder: crate::record::Holder,
    left: u64,
) -> Report {
    let path = old.location(key).lock;
    Report::acquire(
        engine::Acquire::AlreadyRunning {
            holder,
            expires_in: left,
        },
        about(old, key),
        || {
            format!(
                "held by the original skill-lock in {path} until its lease ends; wait for it, \
                 or once that run is known to be gone, delete that directory"
            )
        },
    )
}

fn acquire(
    settings: &Settings,
    store: &AnyStore,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
) -> Result<Report> {
    if let Some((old, holder, left)) = legacy_hold(settings, key) {
        return Ok(legacy_report(&old, key, holder, left));
    }
    let outcome = crate::wait::acquire_waiting(store, key, req, wait, &settings.clock)?;
    Ok(Report::acquire(outcome, about(store, key), || {
        crate::hint::release_force(key, settings, store)
    }))
}

fn run(
    settings: &Settings,
    store: &AnyStore,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
    cmd: &[OsString],
) -> Result<Report> {
    // Found before the lock is touched: a command that cannot start takes no lock.
    let program = crate::run::resolve(cmd, settings.env.path.as_deref())?;
    if let Some((old, holder, left)) = legacy_hold(settings, key) {
        return Ok(legacy_report(&old, key, holder, left));
    }
    Ok(
        match crate::run::execute(
            store,
            key,
            req.clone(),
            wait,
            &program,
            cmd,
            &crate::hint::reach(settings),
            &settings.clock,
        )? {
            crate::run::Outcome::NotAcquired(outcome) => {
                Report::acquire(outcome, about(store, key), || {
                    crate::hint::release_force(key, settings, store)
                })
            }
            crate::run::Outcome::Interrupted(sig) => Report::interrupted(about(store, key), sig),
            crate::run::Outcome::Ran {
                fence,
                others_since,
                ran,
            } => Report::ran(about(store, key), fence, others_since, &ran),
        },
    )
}

fn renew(
    settings: &Settings,
    store: &AnyStore,
    key: &LockKey,
    token: Option<&str>,
    ttl: Option<u64>,
) -> Result<Report> {
    let outcome = engine::renew(store, key, token, ttl, &context(settings))?;
    Ok(Report::renew(outcome, about(store, key)))
}

fn release(
    settings: &Settings,
    store: &AnyStore,
    key: &LockKey,
    token: Option<&str>,
    force: bool,
) -> Result<Report> {
    let outcome = engine::release(store, key, token, force, &context(settings))?;
    Ok(Report::release(outcome, about(store, key)))
}

fn status(settings: &Settings, store: &AnyStore, key: &LockKey) -> Result<Report> {
    let status = engine::status(store, key, &context(settings))?;
    Ok(Report::status(status, about(store, key)))
}

/// `list`: the engine judges each lock as the store reads it and hands it
/// to the printer, which writes it at once. The locks an older version
/// left in working-tree layers are read first, so a failure there prints
/// nothing.
fn list(settings: &Settings, store: &AnyStore) -> Result<ExitStatus> {
    let ctx = context(settings);
    let mut legacy = Vec::new();
    for location in &settings.store.legacy {
        let old = crate::store::fs::FileStore::at(location.clone());
        // Only what holds a name; anything unreadable there is ignored.
        let _ = engine::list(&old, &ctx, &mut |mut entry| {
            if let Some((holder, expires_in)) = by_expiry(entry.state.clone()) {
                entry.state = engine::State::Held { holder, expires_in };
                legacy.push(entry);
            }
            Ok(())
        });
    }
    let mut printer = match ListPrinter::start(&store.describe()) {
        Ok(printer) => printer,
        Err(status) => return Ok(status),
    };
    let visited = engine::list(store, &ctx, &mut |entry| printer.entry(entry));
    printer.finish(visited, legacy)
}

fn check(settings: &Settings, store: &AnyStore, key: &LockKey, token: &str) -> Result<Report> {
    let outcome = engine::check(store, key, token, &context(settings))?;
    Ok(Report::check(outcome, about(store, key)))
}

fn history(store: &AnyStore, key: Option<&LockKey>, limit: usize) -> Result<Report> {
    let about = key.map(|k| about(store, k));
    Ok(Report::history(
        about,
        store.describe(),
        store.history(key, limit)?,
    ))
}
