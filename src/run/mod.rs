//! `run` (SPEC §2.7): the command-wrapper mode of flock(1) for callers with a
//! stable pid. The one telling of `run`'s steps: the files below point here.
//!
//! The logic is written once, here and in `watch.rs`: the acquire, the
//! supervisor's watch loop, the renewal worker and the verdict on each
//! renewal, the ending and `run`'s exit status; the PATH lookup in
//! `resolve.rs`. What owns CMD's processes is the platform's (`unix.rs`: a
//! keeper process, `windows.rs`: a Job Object), behind the [`TreeOwner`]
//! trait that both `CmdTree`s implement, which reports what happens to the
//! tree as `TreeReport`s.
//!
//! On Unix the owner of the lock is **everything CMD starts**, not this
//! wrapper:
//!
//! 1. CMD is resolved on PATH before the lock is touched ([`resolve`]).
//! 2. A keeper is started first (this binary again, `unix/keeper.rs`): it
//!    leads a process group of its own, outside the wrapper's group (a
//!    signal to that group, a CI cancel, job control, `timeout -s KILL`,
//!    does not reach it), blocks or ignores every signal a terminal or a
//!    group signal sends (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP,
//!    SIGTTIN, SIGTTOU), and on Linux is a child subreaper. The wrapper
//!    hands it, over a pipe (`unix/protocol.rs`), how to release the lock
//!    ([`Reach`]: the store's URL never in an argument). Its pid is the
//!    group id named in the record (`owner_pgid`, with its start time)
//!    before the lock is taken; the record names no `owner_pid`. So the
//!    lock is held while the keeper lives, even past `expires`
//!    (`liveness::group_alive`; the keeper lives until the last process of
//!    CMD's tree is gone), and otherwise by its lease alone: no death of a
//!    process makes it `owner_dead` while a daemon of CMD's may still run.
//! 3. After the acquire the keeper starts CMD as its child in a **new
//!    process group** of CMD's own (with `SKILL_LOCK_TOKEN`,
//!    `SKILL_LOCK_FENCE` and, with `--since`, `SKILL_LOCK_OTHERS_SINCE`:
//!    [`lease_env`]), made the terminal's foreground when `run` was, so
//!    what CMD sends to its group (`kill 0`, `kill -9 -PGID`) never reaches
//!    the keeper. What CMD starts stays in the keeper's tree even when it
//!    leaves the group or the session: it is re-parented to the keeper,
//!    not to init (`liveness::tree` walks it). Forwarded signals go to
//!    every process of the tree.
//! 4. A `Renewer` keeps the end of the lease it last confirmed on a clock
//!    that never steps and counts suspend, renews every ttl/3, retries a
//!    failed renewal quickly, and names the moment to stop: a margin before
//!    that end. At that moment (or as soon as a renewal finds the lock lost)
//!    the tree is stopped, SIGTERM and SIGCONT, then SIGKILL after a grace
//!    until none is left, all before the confirmed end, and `run` exits
//!    128+signal with `"lost": true`.
//! 5. When CMD ends, what it left running is stopped the same way; the
//!    keeper reaps everything re-parented to it and reports `empty` once
//!    it has no child and nothing of CMD's group is left. The lock is
//!    released only then; the wrapper then tells the keeper it is `done`.
//! 6. The wrapper sends the keeper each moment to stop at (step 4), so a
//!    wrapper that is stopped or starved, not dead, still has the tree
//!    stopped before the confirmed lease ends; and when the wrapper dies
//!    however (SIGKILL of it or of its whole group), the keeper's pipe
//!    closes: it stops the tree at once and, once nothing of it is left,
//!    releases the lock itself with the token (this binary's `release`,
//!    the token in `SKILL_LOCK_TOKEN`, the store's URL in
//!    `SKILL_LOCK_STORE`: never another run's lock).
//! 7. When the keeper dies instead (a SIGKILL aimed at it), the wrapper
//!    stops what it can reach of CMD (its process group), never releases
//!    (a process CMD started may live on where nobody sees it), leaves the
//!    lock to its lease, and reports `"lost": true`.
//!
//! What escapes where the platform has no subreaper (macOS, other Unix):
//! a process that leaves CMD's process group (`setsid`, `setpgid`) and
//! whose parent then exits is re-parented to init (launchd) and no longer
//! found; everything that stays in the group is found and stopped.
//!
//! On Windows (SPEC §10) the owner of the lock is this wrapper (`owner_pid`,
//! with its creation time), and CMD with everything it starts lives in a
//! Job Object that kills every process in it when its last handle closes,
//! which this wrapper holds: nothing outlives the wrapper, so its death
//! proves CMD's processes gone (why that is enough: `windows.rs`). CMD is
//! resolved on PATH with PATHEXT (step 1); after the acquire it is created
//! suspended, put into the job and only then resumed, so it runs no
//! instruction outside it; a lost lease terminates the whole job (exit
//! 143, 128+SIGTERM); when CMD ends, what it left in the job is
//! terminated, and the lock is released once the job has no process left.
//! Console events (Ctrl-C, Ctrl-Break, close) reach CMD from Windows itself
//! (it shares the console); the wrapper survives them ([`crate::signals`])
//! and reports a CMD ended by one as 128+number.

mod outcome;
mod reach;
mod renewer;
mod resolve;
mod watch;
per_os!();

pub(crate) use outcome::{Completion, Outcome, lease_env};
pub(crate) use reach::Reach;
pub(crate) use resolve::resolve;

use std::ffi::OsString;
use std::path::Path;
use std::process::{ExitCode, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use crate::engine::{self, Acquire, AcquireRequest, Context, Renew};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::signals::{self, Signals};
use crate::store::Store;
use crate::wait::{self, Waited};
use renewer::{Margins, Renewer};
use sys::CmdTree;
use watch::{End, watch};

/// What owns CMD's processes, declared once and implemented by each
/// platform's `CmdTree` (`unix.rs`: the wrapper's side of the keeper;
/// `windows.rs`: the Job Object), so the compiler checks that every
/// platform has every step (steps above); a step a platform has no use
/// for is an empty function there, which says why.
trait TreeOwner: Sized {
    /// Said when CMD ended and left processes running.
    const LEFTOVERS: &'static str;
    /// Said when the owner of the tree vanished before the tree was empty.
    const TREE_GONE: &'static str;
    /// Said when processes survive the stop.
    const SURVIVORS: &'static str;

    /// When this process was started as the owner of a tree (the keeper),
    /// runs it to its end; `None` otherwise.
    fn main_if_keeper() -> Option<Result<ExitCode>>;

    /// Before the acquire: readies the owner of the tree of `program`
    /// (with the words `cmd`); `grace` is the time between SIGTERM and
    /// SIGKILL; `reach` is how the lock on `key` is released should this
    /// wrapper die.
    ///
    /// # Errors
    /// The owner could not be started.
    fn start(
        grace: Duration,
        program: &Path,
        cmd: &[OsString],
        key: &LockKey,
        reach: &Reach,
    ) -> Result<Self>;

    /// The `owner_pid` and `owner_pgid` of the record.
    fn owner(&self) -> (Option<u32>, Option<u32>);

    /// Starts CMD under the lease (`token`, `fence`, `--since`'s answer).
    fn go(&mut self, token: &str, fence: u64, others_since: Option<bool>);

    /// Hands every report to `tx` as `wrap(report)`, from a thread of its
    /// own; the last is [`TreeReport::Empty`] or [`TreeReport::Gone`].
    fn reports<T: Send + 'static>(&mut self, tx: mpsc::Sender<T>, wrap: fn(TreeReport) -> T);

    /// CMD started with `pid`.
    fn started(&mut self, pid: u32);

    /// The tree is to be stopped at `stop_at` on the lease clock, even
    /// when this wrapper is stopped or starved by then.
    fn arm(&mut self, stop_at: Duration);

    /// Forwards `sig` to every process of the tree.
    fn signal(&mut self, sig: libc::c_int);

    /// Stops the tree now.
    fn stop(&mut self);

    /// Stops what is left of the tree where its owner could not (it
    /// vanished); the last signal sent, if any.
    fn stop_what_is_left(&mut self, grace: Duration) -> Option<libc::c_int>;

    /// Gives the terminal lent to CMD back to `run`.
    fn take_back_terminal(&mut self);

    /// Before CMD started: lets the owner go.
    fn quit(&mut self);

    /// This wrapper dealt with the lock: the owner must not release it.
    fn done(&mut self);

    /// Waits for the owner to end.
    fn reap(&mut self);
}

/// When this process was started as `run`'s keeper, runs it to its end
/// and returns its exit status; `None` otherwise. `Some(Err)`: the keeper's
/// argument was typed by hand (the caller prints the usual error object).
#[must_use]
pub(crate) fn main_if_keeper() -> Option<Result<ExitCode>> {
    CmdTree::main_if_keeper()
}

/// Prepares signal handling; call before any other thread is started.
pub(crate) fn prepare() {
    signals::block();
}

pub(crate) use crate::clock::lease_clock;

/// What the owner of CMD's tree reports to the supervisor (the keeper over
/// its pipe on Unix; the job's watcher thread on Windows).
#[derive(Debug, Clone, PartialEq, Eq)]
enum TreeReport {
    /// CMD started with this pid.
    Started(u32),
    /// CMD could not be started (the reason).
    Failed(String),
    /// CMD itself ended; `leftovers`: processes it started are still alive
    /// (they are being stopped).
    Exited {
        /// CMD's wait status (None: it could not be read).
        status: Option<ExitStatus>,
        /// Something of CMD's was left running.
        leftovers: bool,
    },
    /// No process of CMD's is left.
    Empty,
    /// The owner of the tree vanished before [`TreeReport::Empty`] (the
    /// keeper was killed; a Job Object cannot vanish while `run` holds it).
    #[cfg_attr(windows, allow(dead_code, reason = "only a keeper can vanish"))]
    Gone,
}

/// What the supervisor waits for.
// A handful per ttl/3: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Notice {
    Signal(libc::c_int),
    Tree(TreeReport),
    Renewal {
        began: Duration,
        result: Result<Renew>,
    },
    /// A renewal asked for was not sent: when the worker came to it, the
    /// confirmed lease had already ended (this process was frozen or
    /// starved past it). Renewing then would revive the lease (SPEC §2.7).
    TooLate,
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

/// Acquires (waiting as asked, ended by a signal), has CMD (`program`,
/// found by [`resolve`] before anything touched the lock, with the words
/// `cmd`) run as the first process of a tree the platform owns, supervises
/// the lease, and releases once no process of that tree is left (SPEC
/// §2.7); `reach` tells the keeper how to release it should this wrapper
/// die (Unix; on Windows nothing outlives the wrapper).
///
/// # Errors
/// Store failures of the acquire; the keeper, the job or CMD failing to
/// start.
#[allow(clippy::too_many_arguments)]
pub(crate) fn execute<S: Store + Clone + Send + 'static>(
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
    let mut tree = CmdTree::start(Margins::of(req.ttl).grace, program, cmd, key, reach)?;
    // The record names whose life holds the lock (Unix: the keeper's
    // group, held while any process of the tree lives; Windows: this
    // wrapper, whose death takes the whole job with it).
    (req.owner_pid, req.owner_pgid) = tree.owner();
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
        tree.quit();
        let _ = engine::release(store, key, Some(&lease.token), false, &Context::here());
        return Ok(Outcome::Interrupted(sig));
    }
    let ran = supervise(store, &lease, tree, signals)?;
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
    mut tree: CmdTree,
    signals: Signals,
) -> Result<Completion> {
    let mut renewer = Renewer::new(lease.ttl, lease.began);
    tree.arm(renewer.stop_at());
    tree.go(&lease.token, lease.fence, lease.others_since);
    let (tx, rx) = mpsc::channel();
    tree.reports(tx.clone(), Notice::Tree);
    signals.forward(tx.clone(), Notice::Signal);
    let renew = renewal_worker(store, lease, tx);
    let watched = watch(&rx, &renew, &mut renewer, &mut tree, lease.fence);
    drop(renew);
    let grace = renewer.margins().grace;
    let mut last_signal = watched.last_signal;
    let (status, lost, ending, stopped_with) = match watched.end {
        End::Failed(message) => {
            tree.reap();
            tree.take_back_terminal();
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
        End::Lost(status, true) => (status, true, Ending::Empty, Some(signals::SIGTERM)),
        End::Lost(status, false) => {
            tree.stop();
            let limit = grace + Duration::from_secs(5);
            let (status, ending) = settle(&rx, &mut tree, status, limit, &mut last_signal);
            (status, true, ending, Some(signals::SIGTERM))
        }
        End::TreeGone(status) => (status, true, Ending::TreeGone, None),
    };
    // What is left of CMD's group where the keeper could not stop it (it
    // was killed); usually nothing.
    let stopped_with = match ending {
        Ending::Survivors => stopped_with,
        Ending::Empty | Ending::TreeGone => tree.stop_what_is_left(grace).or(stopped_with),
    };
    tree.take_back_terminal();
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
            tree.done();
            tree.reap();
            released
        }
        Ending::TreeGone | Ending::Survivors => false,
    };
    let end = TreeEnd {
        status,
        lost,
        stopped_with,
        last_signal,
    };
    Ok(completion(&end, watched.renewals, released))
}

/// How the tree ended, for the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The tree's owner reported that no process of it is left: release.
    Empty,
    /// The keeper vanished (SIGKILLed by pid): a process CMD started may
    /// still run where no one sees it, so the lock is never released here
    /// but left to its lease (SPEC §2.7).
    TreeGone,
    /// Processes survive SIGKILL (termination of the job): the lock is
    /// not released here (on Unix the keeper goes on stopping them and
    /// releases itself once they end).
    Survivors,
}

/// After the tree was told to stop: waits (at most `limit`) for its owner
/// to report that none is left; CMD's status when seen, and how the tree
/// ended.
fn settle(
    rx: &mpsc::Receiver<Notice>,
    tree: &mut CmdTree,
    mut status: Option<ExitStatus>,
    limit: Duration,
    last_signal: &mut Option<libc::c_int>,
) -> (Option<ExitStatus>, Ending) {
    let until = lease_clock() + limit;
    while let Some(left) = until.checked_sub(lease_clock()) {
        match rx.recv_timeout(left) {
            Ok(Notice::Tree(TreeReport::Exited { status: s, .. })) => status = s,
            Ok(Notice::Tree(TreeReport::Empty)) => return (status, Ending::Empty),
            Ok(Notice::Tree(TreeReport::Gone)) => {
                eprintln!("{}", CmdTree::TREE_GONE);
                return (status, Ending::TreeGone);
            }
            Ok(Notice::Signal(sig)) => {
                *last_signal = Some(sig);
                tree.signal(sig);
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    eprintln!("{}", CmdTree::SURVIVORS);
    (status, Ending::Survivors)
}

/// How CMD's tree came to its end, for `run`'s exit status.
struct TreeEnd {
    /// CMD's own status, when seen.
    status: Option<ExitStatus>,
    /// The lease was lost (or about to end unconfirmed).
    lost: bool,
    /// The last signal the tree was stopped with, when it was.
    stopped_with: Option<libc::c_int>,
    /// The last signal (console event) this wrapper took.
    last_signal: Option<libc::c_int>,
}

/// The exit status and signal `run` reports: CMD's code, or 128+the signal
/// that ended it; 128+the signal the tree was stopped with (SIGTERM when
/// none) when the lease was lost.
fn completion(end: &TreeEnd, renewals: u64, released: bool) -> Completion {
    let (code, signal) = end
        .status
        .map_or((None, None), |s| signals::ended(s, end.last_signal));
    let exit_status = match (end.lost, code, signal) {
        (true, _, Some(s)) | (false, None, Some(s)) => signals::exit_status(s),
        (true, _, None) => signals::exit_status(end.stopped_with.unwrap_or(signals::SIGTERM)),
        (false, Some(c), _) => c,
        (false, None, None) => 1,
    };
    Completion {
        exit_status,
        signal: signal.or(if end.lost { end.stopped_with } else { None }),
        lost: end.lost,
        renewals,
        released,
    }
}

/// Starts the thread that renews on request (one request, one attempt) and
/// posts each result with the moment it began. A request carries the end
/// of the lease confirmed when it was made: a request that the worker
/// comes to only after that end (the process was frozen past it) is not
/// sent, since it would revive a lease CMD may already have been told is
/// over (SPEC §2.7); [`Notice::TooLate`] says so.
fn renewal_worker<S: Store + Clone + Send + 'static>(
    store: &S,
    lease: &Lease,
    notices: mpsc::Sender<Notice>,
) -> mpsc::Sender<Duration> {
    let (tx, rx) = mpsc::channel::<Duration>();
    let (store, key, token, ttl) = (
        store.clone(),
        lease.key.clone(),
        lease.token.clone(),
        lease.ttl,
    );
    std::thread::spawn(move || {
        while let Ok(confirmed_end) = rx.recv() {
            let began = lease_clock();
            if began >= confirmed_end {
                if notices.send(Notice::TooLate).is_err() {
                    return;
                }
                continue;
            }
            let result = engine::renew(&store, &key, Some(&token), Some(ttl), &Context::here());
            if notices.send(Notice::Renewal { began, result }).is_err() {
                return;
            }
        }
    });
    tx
}
