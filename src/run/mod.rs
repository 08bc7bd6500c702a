//! `run` (SPEC §2.7): the command-wrapper mode of flock(1) for callers with a
//! stable pid.
//!
//! The owner of the lock is **everything CMD starts**, not this wrapper:
//!
//! 1. CMD is resolved on PATH before the lock is touched ([`resolve`]).
//! 2. A [`Keeper`] is started first (this binary again, `keeper.rs`): it
//!    leads a process group of its own, outside the wrapper's group, and on
//!    Linux is a child subreaper. The wrapper hands it, over a pipe, how to
//!    release the lock ([`Reach`]: the store's URL never in an argument).
//!    Its pid is the group id named in the record (`owner_pgid`, with its
//!    start time) before the lock is taken; the record names no `owner_pid`.
//!    So the lock is held while the keeper lives, even past `expires`
//!    (`liveness::group_alive`; the keeper lives until the last process of
//!    CMD's tree is gone), and otherwise by its lease alone: no death of a
//!    process makes it `owner_dead` while a daemon of CMD's may still run.
//! 3. After the acquire the keeper starts CMD as its child in a **new
//!    process group** of CMD's own (with `SKILL_LOCK_TOKEN`,
//!    `SKILL_LOCK_FENCE` and, with `--since`, `SKILL_LOCK_OTHERS_SINCE`:
//!    [`lease_env`]), so what CMD sends to its group (`kill 0`,
//!    `kill -9 -PGID`) never reaches the keeper. What CMD starts stays in
//!    the keeper's tree even when it leaves the group or the session: it
//!    is re-parented to the keeper, not to init. Forwarded signals go to
//!    every process of the tree.
//! 4. A [`Renewer`] keeps the end of the lease it last confirmed on a clock
//!    that never steps and counts suspend, renews every ttl/3, retries a
//!    failed renewal quickly, and names the moment to stop: a margin before
//!    that end. At that moment (or as soon as a renewal finds the lock lost)
//!    the tree is stopped, SIGTERM then SIGKILL after a grace, all before
//!    the confirmed end, and `run` exits 128+signal with `"lost": true`.
//! 5. When CMD ends, what it left running is stopped the same way, and the
//!    lock is released only once the keeper reports that nothing is left;
//!    the wrapper then tells the keeper it is `done`.
//! 6. The wrapper sends the keeper each moment to stop at (step 4), so a
//!    wrapper that is stopped or starved, not dead, still has the tree
//!    stopped before the confirmed lease ends; and when the wrapper dies
//!    however (SIGKILL of it or of its whole group), the keeper's pipe
//!    closes: it stops the tree at once and, once nothing of it is left,
//!    releases the lock itself with the token (this binary's `release`).
//! 7. When the keeper dies instead (a SIGKILL aimed at it), the wrapper
//!    stops what it can reach of CMD (its process group), never releases
//!    (a process CMD started may live on where nobody sees it), leaves the
//!    lock to its lease, and reports `"lost": true`.

mod keeper;
mod reach;
mod renewer;
mod terminal;

pub use keeper::{KEEPER_ARG, Keeper, ReleaseOrder, Report, main_if_keeper};
pub use reach::Reach;
pub use renewer::{Margins, Renewer};

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::Duration;

use crate::engine::{self, Acquire, AcquireRequest, Context, Renew};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::liveness;
use crate::signals::{self, Signals};
use crate::store::Store;
use crate::wait::{self, Waited};
use terminal::Terminal;

mod outcome;
pub use outcome::{OTHERS_SINCE_VAR, Outcome, Ran, lease_env};

/// Prepares signal handling; call before any other thread is started.
pub fn prepare() {
    signals::block();
}

pub use crate::clock::lease_clock;

/// Finds CMD's program as exec would (a name with a `/` as given, else the
/// first executable file of that name on PATH), so that a command that
/// cannot be started is an error before the lock is touched.
///
/// # Errors
/// [`Error::Usage`] when there is no command, or it is not found or not
/// executable.
pub fn resolve(cmd: &[OsString], path: Option<&std::ffi::OsStr>) -> Result<PathBuf> {
    let Some(program) = cmd.first() else {
        return Err(Error::Usage("run needs a command after --".into()));
    };
    let name = Path::new(program);
    let found = if program.is_empty() {
        None
    } else if program.as_encoded_bytes().contains(&b'/') {
        executable(name).then(|| name.to_path_buf())
    } else {
        let path = path.unwrap_or_else(|| std::ffi::OsStr::new("/usr/bin:/bin"));
        std::env::split_paths(path)
            .map(|dir| {
                if dir.as_os_str().is_empty() {
                    PathBuf::from(".").join(name)
                } else {
                    dir.join(name)
                }
            })
            .find(|candidate| executable(candidate))
    };
    found.ok_or_else(|| {
        Error::Usage(format!(
            "cannot run {:?}: no executable file of that name{}; check the command name, its permissions and PATH (nothing was locked)",
            program.to_string_lossy(),
            if name.components().count() > 1 { "" } else { " on PATH" },
        ))
    })
}

fn executable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated path.
    meta.is_file() && unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } == 0
}

#[cfg(target_os = "linux")]
pub(super) unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__errno_location() }
}

#[cfg(not(target_os = "linux"))]
pub(super) unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__error() }
}

/// Signals and polls a process group until none of it is left: CMD's,
/// whose id is CMD's pid, with its leader's start time (a live process
/// with that pid and another start time is not of it).
#[derive(Debug, Clone, Copy)]
struct Group {
    pgid: u32,
    start: Option<u64>,
}

impl Group {
    /// CMD's group, CMD having started with this pid.
    fn of_cmd(pid: u32) -> Self {
        Self {
            pgid: pid,
            start: liveness::process_start(pid),
        }
    }

    fn alive(self) -> bool {
        liveness::group_alive(self.pgid, self.start) != Some(false)
    }

    /// Polls until the group is gone or `limit` passed; true when gone.
    fn gone_within(self, limit: Duration) -> bool {
        let until = lease_clock() + limit;
        loop {
            if !self.alive() {
                return true;
            }
            if lease_clock() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the last signal sent
    /// (None when nothing was left to stop).
    fn stop(self, grace: Duration) -> Option<libc::c_int> {
        if !self.alive() {
            return None;
        }
        signals::send_group(self.pgid, libc::SIGTERM);
        // A stopped member acts on SIGTERM only once continued.
        signals::send_group(self.pgid, libc::SIGCONT);
        if self.gone_within(grace) {
            return Some(libc::SIGTERM);
        }
        signals::send_group(self.pgid, libc::SIGKILL);
        if !self.gone_within(Duration::from_secs(5)) {
            eprintln!(
                "skill-lock run: process group {} survives SIGKILL (a process in uninterruptible sleep?)",
                self.pgid
            );
        }
        Some(libc::SIGKILL)
    }
}

/// What the supervisor waits for.
// A handful per ttl/3: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Signal(libc::c_int),
    Keeper(Report),
    Renewal {
        began: Duration,
        result: Result<Renew>,
    },
}

/// The lease `run` holds.
struct Lease<'a> {
    key: &'a LockKey,
    token: String,
    fence: u64,
    others_since: Option<bool>,
    ttl: u64,
    began: Duration,
}

/// Acquires (waiting as asked, ended by a signal), has the keeper run CMD
/// (`program`, found by [`resolve`] before anything touched the lock, with
/// the words `cmd`) as the first process of the tree it owns, supervises
/// the lease, and releases once no process of that tree is left (SPEC §2.7);
/// `reach` tells the keeper how to release it should this wrapper die.
///
/// # Errors
/// Store failures of the acquire; the keeper or CMD failing to start.
#[allow(clippy::too_many_arguments)]
pub fn execute<S: Store + Clone + Send + 'static>(
    store: &S,
    key: &LockKey,
    mut req: AcquireRequest,
    wait: Option<Duration>,
    program: &Path,
    cmd: &[OsString],
    reach: &Reach,
    clock: &crate::engine::Clock,
) -> Result<Outcome> {
    let signals = Signals::listen();
    let order = ReleaseOrder {
        args: reach.release_args(key.skill(), key.repo()),
        store: reach.store.clone().map(OsString::from),
    };
    let mut keeper = Keeper::start(Margins::of(req.ttl).grace, program, cmd, &order)?;
    // Held while the keeper lives, even past `expires` (it lives as long as
    // any process of the tree); once it is gone, by the lease alone: no pid
    // whose death would make the lock stale while a daemon of CMD's runs.
    req.owner_pid = None;
    req.owner_pgid = Some(keeper.pgid());
    let ttl = req.ttl;
    let waited =
        wait::acquire_interruptible(store, key, &req, wait, clock, &mut |d| signals.next(d));
    let (token, fence, others_since, began) = match waited? {
        Waited::Interrupted(sig) => return Ok(Outcome::Interrupted(sig)),
        Waited::Done {
            outcome:
                Acquire::Acquired {
                    token,
                    holder,
                    others_since,
                    ..
                },
            began,
        } => (token, holder.fence, others_since, began),
        Waited::Done { outcome, .. } => return Ok(Outcome::NotAcquired(outcome)),
    };
    let lease = Lease {
        key,
        token,
        fence,
        others_since,
        ttl,
        began,
    };
    if let Some(sig) = signals.next(Duration::ZERO) {
        keeper.quit();
        let _ = engine::release(store, key, Some(&lease.token), false, &Context::here());
        return Ok(Outcome::Interrupted(sig));
    }
    let ran = supervise(store, &lease, keeper, signals)?;
    Ok(Outcome::Ran {
        fence,
        others_since,
        ran,
    })
}

/// Runs CMD under `lease` until no process of its tree is left, or the
/// lease is lost and the tree stopped.
fn supervise<S: Store + Clone + Send + 'static>(
    store: &S,
    lease: &Lease,
    mut keeper: Keeper,
    signals: Signals,
) -> Result<Ran> {
    let mut renewer = Renewer::new(lease.ttl, lease.began);
    keeper.arm(renewer.stop_at());
    let terminal = Terminal::ours_in_foreground();
    keeper.go(
        &lease.token,
        lease.fence,
        lease.others_since,
        terminal.is_some(),
    );
    let (tx, rx) = mpsc::channel();
    keeper.reports(tx.clone(), Event::Keeper);
    signals.forward(tx.clone(), Event::Signal);
    let renew = renewal_worker(store, lease, tx);
    let watched = watch(&rx, &renew, &mut renewer, &mut keeper);
    drop(renew);
    let grace = renewer.margins().grace;
    let (status, lost, ending, stopped_with) = match watched.end {
        End::Failed(message) => {
            keeper.reap();
            drop(terminal);
            let _ = engine::release(
                store,
                lease.key,
                Some(&lease.token),
                false,
                &Context::here(),
            );
            return Err(Error::Usage(message));
        }
        End::Done(status) => (status, false, Ending::Empty, None),
        End::Lost(status, true) => (status, true, Ending::Empty, Some(libc::SIGTERM)),
        End::Lost(status, false) => {
            keeper.stop();
            let (status, ending) = settle(&rx, &mut keeper, status, grace + Duration::from_secs(5));
            (status, true, ending, Some(libc::SIGTERM))
        }
        End::KeeperGone(status) => (status, true, Ending::KeeperGone, None),
    };
    // What is left of CMD's group, where the keeper could not stop it (it
    // was killed); usually nothing.
    let stopped_with = match ending {
        Ending::Survivors => stopped_with,
        Ending::Empty | Ending::KeeperGone => {
            watched.group.and_then(|g| g.stop(grace)).or(stopped_with)
        }
    };
    drop(terminal);
    let released = match ending {
        Ending::Empty => {
            let released = matches!(
                engine::release(
                    store,
                    lease.key,
                    Some(&lease.token),
                    false,
                    &Context::here()
                ),
                Ok(engine::Release::Released { .. })
            );
            keeper.done();
            keeper.reap();
            released
        }
        Ending::KeeperGone | Ending::Survivors => false,
    };
    Ok(ran(status, lost, stopped_with, watched.renewals, released))
}

/// How the tree ended, for the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The keeper reported that no process of it is left: release.
    Empty,
    /// The keeper vanished (SIGKILLed by pid): a process CMD started may
    /// still run where no one sees it, so the lock is never released here
    /// but left to its lease (SPEC §2.7).
    KeeperGone,
    /// Processes survive SIGKILL: the keeper goes on stopping them and
    /// releases itself once they end (this wrapper's pipe closes unsaid).
    Survivors,
}

/// After the keeper was told to stop the tree: waits (at most `limit`) for
/// it to report that none is left; CMD's status when seen, and how the
/// tree ended.
fn settle(
    rx: &mpsc::Receiver<Event>,
    keeper: &mut Keeper,
    mut status: Option<ExitStatus>,
    limit: Duration,
) -> (Option<ExitStatus>, Ending) {
    let until = lease_clock() + limit;
    while let Some(left) = until.checked_sub(lease_clock()) {
        match rx.recv_timeout(left) {
            Ok(Event::Keeper(Report::Exited { status: s, .. })) => status = Some(s),
            Ok(Event::Keeper(Report::Empty)) => return (status, Ending::Empty),
            Ok(Event::Keeper(Report::Gone)) => {
                say_keeper_gone();
                return (status, Ending::KeeperGone);
            }
            Ok(Event::Signal(sig)) => keeper.signal(sig),
            Ok(_) => {}
            Err(_) => break,
        }
    }
    eprintln!(
        "skill-lock run: processes the command started survive SIGKILL (uninterruptible sleep?); the keeper goes on stopping them and releases the lock once they end"
    );
    (status, Ending::Survivors)
}

fn say_keeper_gone() {
    eprintln!(
        "skill-lock run: the keeper of the command's processes is gone (killed?); stopping what is left of the command's process group; the lock is not released (a process the command started may still run) but left to its lease"
    );
}

/// The exit status and signal `run` reports.
fn ran(
    status: Option<ExitStatus>,
    lost: bool,
    stopped_with: Option<libc::c_int>,
    renewals: u64,
    released: bool,
) -> Ran {
    let signal = status.and_then(|s| s.signal());
    let code = status.and_then(|s| s.code());
    let exit_status = match (lost, code, signal) {
        (true, _, Some(s)) | (false, None, Some(s)) => crate::signals::exit_status(s),
        (true, _, None) => crate::signals::exit_status(stopped_with.unwrap_or(libc::SIGTERM)),
        (false, Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (false, None, None) => 1,
    };
    Ran {
        exit_status,
        signal: signal.or(if lost { stopped_with } else { None }),
        lost,
        renewals,
        released,
    }
}

/// Starts the thread that renews on request (one request, one attempt) and
/// posts each result with the moment it began.
fn renewal_worker<S: Store + Clone + Send + 'static>(
    store: &S,
    lease: &Lease,
    events: mpsc::Sender<Event>,
) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let (store, key, token, ttl) = (
        store.clone(),
        lease.key.clone(),
        lease.token.clone(),
        lease.ttl,
    );
    std::thread::spawn(move || {
        while rx.recv().is_ok() {
            let began = lease_clock();
            let result = engine::renew(&store, &key, Some(&token), Some(ttl), &Context::here());
            if events.send(Event::Renewal { began, result }).is_err() {
                return;
            }
        }
    });
    tx
}

/// Why the watch ended.
enum End {
    /// No process of CMD's tree is left; CMD's status.
    Done(Option<ExitStatus>),
    /// The lease was lost or ends unconfirmed; CMD's status, when already
    /// seen, and whether the keeper already reported the tree gone.
    Lost(Option<ExitStatus>, bool),
    /// CMD could not be started (the keeper's reason).
    Failed(String),
    /// The keeper vanished before the tree was empty; CMD's status, if seen.
    KeeperGone(Option<ExitStatus>),
}

/// What the watch came to.
struct Watched {
    end: End,
    renewals: u64,
    /// CMD's process group, once the keeper reported CMD started.
    group: Option<Group>,
}

/// The supervisor's loop: forwards signals, schedules renewals, and ends
/// when no process of CMD's tree is left, or the lease is lost or about to
/// end unconfirmed, or the keeper is gone.
fn watch(
    rx: &mpsc::Receiver<Event>,
    renew: &mpsc::Sender<()>,
    renewer: &mut Renewer,
    keeper: &mut Keeper,
) -> Watched {
    let mut renewals = 0;
    let mut exited = None;
    let mut group = None;
    loop {
        let now = lease_clock();
        if now >= renewer.stop_at() {
            eprintln!(
                "skill-lock run: no renewal confirmed the lease, which ends in {} ms; stopping the command and everything it started",
                renewer.confirmed_end().saturating_sub(now).as_millis()
            );
            let end = End::Lost(exited, false);
            return Watched {
                end,
                renewals,
                group,
            };
        }
        if renewer.due(now) && renew.send(()).is_ok() {
            renewer.sent();
        }
        let end = match rx.recv_timeout(renewer.sleep(now)) {
            Ok(Event::Signal(sig)) => {
                keeper.signal(sig);
                None
            }
            Ok(Event::Keeper(report)) => {
                if let Report::Started(pid) = report {
                    group = Some(Group::of_cmd(pid));
                }
                on_report(report, &mut exited, renewer)
            }
            Ok(Event::Renewal { began, result }) => {
                on_renewal(began, result, renewer, keeper, exited, &mut renewals)
            }
            Err(_) => None,
        };
        if let Some(end) = end {
            return Watched {
                end,
                renewals,
                group,
            };
        }
    }
}

/// What a keeper's report means for the watch (`Some`: it ends);
/// `exited` keeps CMD's status once reported.
fn on_report(report: Report, exited: &mut Option<ExitStatus>, renewer: &Renewer) -> Option<End> {
    if let Report::Exited { status, .. } = &report {
        *exited = Some(*status);
    }
    if matches!(report, Report::Exited { .. } | Report::Empty) && lease_clock() >= renewer.stop_at()
    {
        // This wrapper was stopped or starved past the stop
        // moment, and the keeper stopped the tree in its place.
        eprintln!(
            "skill-lock run: no renewal confirmed the lease in time; the command and everything it started were stopped"
        );
        return Some(End::Lost(*exited, report == Report::Empty));
    }
    match report {
        Report::Started(_) => None,
        Report::Failed(message) => Some(End::Failed(message)),
        Report::Exited { leftovers, .. } => {
            if leftovers {
                eprintln!(
                    "skill-lock run: stopping what the command left running (in its process group or not)"
                );
            }
            None
        }
        Report::Empty => Some(End::Done(*exited)),
        Report::Gone => {
            say_keeper_gone();
            Some(End::KeeperGone(*exited))
        }
    }
}

/// What a renewal's answer means for the watch (`Some`: the lease is lost).
fn on_renewal(
    began: Duration,
    result: Result<Renew>,
    renewer: &mut Renewer,
    keeper: &mut Keeper,
    exited: Option<ExitStatus>,
    renewals: &mut u64,
) -> Option<End> {
    match result {
        Ok(Renew::Renewed { .. }) => {
            renewer.confirmed(began);
            keeper.arm(renewer.stop_at());
            *renewals += 1;
            None
        }
        Ok(Renew::NotOwner { holder, .. }) => {
            Renewer::report_lost(&holder);
            Some(End::Lost(exited, false))
        }
        Ok(Renew::NotHeld { .. }) => {
            eprintln!(
                "skill-lock run: the lock was released by someone else; stopping the command and everything it started"
            );
            Some(End::Lost(exited, false))
        }
        Err(e) => {
            renewer.report_failure(&e);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_finds_programs_and_refuses_what_cannot_start() {
        let sh = resolve(&["sh".into()], Some(std::ffi::OsStr::new("/usr/bin:/bin"))).unwrap();
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{sh:?}");
        assert!(resolve(&[], None).is_err());
        assert!(resolve(&["".into()], None).is_err());
        assert!(resolve(&["no-such-command-here".into()], None).is_err());
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        assert!(
            resolve(&[plain.clone().into()], None).is_err(),
            "not executable"
        );
        assert!(resolve(&[dir.path().into()], None).is_err(), "a directory");
    }
}
