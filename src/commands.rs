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
    let report = match &settings.action {
        // Printed as it is read: never all in memory.
        Action::List => return list(settings, &store),
        Action::Acquire { key, req, wait } => acquire(settings, &store, key, req, *wait)?,
        Action::Run {
            key,
            req,
            wait,
            cmd,
            ..
        } => run(settings, &store, key, req, *wait, cmd)?,
        Action::Renew { key, token, ttl } => renew(settings, &store, key, token.as_deref(), *ttl)?,
        Action::Release { key, token, force } => {
            release(settings, &store, key, token.as_deref(), *force)?
        }
        Action::Status { key } => status(settings, &store, key)?,
        Action::Check { key, token } => check(settings, &store, key, token)?,
        Action::History { key, limit } => history(&store, key.as_ref(), *limit)?,
    };
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

/// Refuses while an older version's lock on `key` is held in one of the
/// working-tree layers it used (SPEC §5; docs/contract.md "Upgrading"):
/// read-only, through the layer handle, judged as any file-store lock.
fn refuse_legacy_held(settings: &Settings, key: &LockKey) -> Result<()> {
    for location in &settings.store.legacy {
        let old = crate::store::fs::FileStore::at(location.clone());
        if let engine::State::Held { holder, .. } = engine::state(&old, key, &context(settings))? {
            return Err(crate::error::Error::LegacyHeld {
                path: std::path::PathBuf::from(old.location(key).lock),
                expires: holder.expires.to_string(),
                host: holder.host.escape_default().to_string(),
            });
        }
    }
    Ok(())
}

fn acquire(
    settings: &Settings,
    store: &AnyStore,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
) -> Result<Report> {
    refuse_legacy_held(settings, key)?;
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
    refuse_legacy_held(settings, key)?;
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
        engine::list(&old, &ctx, &mut |entry| {
            legacy.push(entry);
            Ok(())
        })?;
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
