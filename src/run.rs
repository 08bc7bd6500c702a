//! `run` (SPEC §2.7): the command-wrapper mode of flock(1) for callers with a
//! stable pid.
//!
//! The owner of the lock is CMD's whole **process group**, not this wrapper:
//!
//! 1. CMD is resolved on PATH before the lock is touched ([`resolve`]).
//! 2. A [`Keeper`] is forked first: a tiny process that leads a new process
//!    group and does nothing but wait on a pipe. Its pid is the group id, so
//!    the group exists, and is named in the record (`owner_pgid`), before
//!    the lock is taken; liveness holds the lock while any member of the
//!    group lives (`liveness::group_alive`).
//! 3. CMD is started in that group (with `SKILL_LOCK_TOKEN` and
//!    `SKILL_LOCK_FENCE`), and every process it starts is in it too.
//!    Forwarded signals go to the whole group.
//! 4. A [`Renewer`] keeps the end of the lease it last confirmed on a clock
//!    that never steps and counts suspend, renews every ttl/3, retries a
//!    failed renewal quickly, and names the moment to stop: a margin before
//!    that end. At that moment (or as soon as a renewal finds the lock lost)
//!    the group is stopped, SIGTERM then SIGKILL after a grace, all before
//!    the confirmed end, and `run` exits 128+signal with `"lost": true`.
//! 5. When CMD ends, processes it left in the group are stopped the same way
//!    before the lock is released: nothing of the group outlives the lock.
//! 6. Once CMD is in the group the keeper is moved out of it (the group is
//!    then exactly CMD's processes) but stays armed until the lock is
//!    released: if this wrapper is SIGKILLed at any point, the keeper sees
//!    its pipe close and stops the group (SIGTERM, grace, SIGKILL). Until the
//!    group is gone the lock stays held on this machine, so no second writer
//!    starts meanwhile. The wrapper also sends it each moment to stop at
//!    (step 4), so a wrapper that is stopped or starved, not dead, still has
//!    its group stopped before the confirmed lease ends.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use crate::engine::{self, Acquire, AcquireRequest, Context, Renew};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::liveness;
use crate::signals::{self, Signals};
use crate::store::Store;
use crate::wait::{self, Waited};

/// How a wrapped command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// The status `run` exits with: CMD's code, or 128+signal.
    pub exit_status: u8,
    /// The signal that ended CMD, if any.
    pub signal: Option<i32>,
    /// The lease was lost or about to run out unconfirmed: the group was stopped.
    pub lost: bool,
    /// Successful renewals.
    pub renewals: u64,
    /// The lock was released at the end (false when it had been lost).
    pub released: bool,
}

/// What a `run` invocation came to.
// One value per command: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Outcome {
    /// The lock was not acquired (`already_running`): CMD did not run.
    NotAcquired(Acquire),
    /// A signal came before CMD started: nothing acquired (or what was
    /// acquired is released again), nothing run.
    Interrupted(libc::c_int),
    /// CMD ran under the lock with this fence.
    Ran {
        /// Fencing number of the acquisition.
        fence: u64,
        /// How it ended.
        ran: Ran,
    },
}

/// Prepares signal handling; call before any other thread is started.
pub fn prepare() {
    signals::block();
}

/// The clock leases are kept on: never steps, and counts time suspended
/// (Linux `CLOCK_BOOTTIME`; elsewhere `CLOCK_MONOTONIC`, which on macOS
/// counts sleep too), as time since an arbitrary origin.
#[must_use]
pub fn lease_clock() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    if unsafe { libc::clock_gettime(LEASE_CLOCK, &raw mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// The id of [`lease_clock`]'s clock (the keeper reads it too).
#[cfg(target_os = "linux")]
const LEASE_CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
#[cfg(not(target_os = "linux"))]
const LEASE_CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;

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

/// How long before the confirmed lease end `run` starts stopping the
/// group, and the grace between its SIGTERM and SIGKILL: a quarter of the
/// ttl, at most 10 s; the grace is half of it, so the SIGKILL is sent half
/// the margin before the end (125 ms for ttl 1, 5 s from ttl 40 up), which
/// leaves that long for it to land and for the wrapper to see the group gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Margins {
    /// Stop this long before the confirmed end.
    pub stop: Duration,
    /// SIGTERM, then SIGKILL this much later.
    pub grace: Duration,
}

impl Margins {
    /// The margins of a lease of `ttl` seconds.
    #[must_use]
    pub fn of(ttl: u64) -> Self {
        let stop = (Duration::from_secs(ttl) / 4).min(Duration::from_secs(10));
        Self {
            stop,
            grace: stop / 2,
        }
    }
}

/// The renewal policy and the lease end last confirmed, on [`lease_clock`].
///
/// A renewal that began at `t` and succeeded confirms the lease until
/// `t + ttl` (the store's new expiry is at least that: it reads its clock
/// later and rounds up). Renewals are due every ttl/3; a failed one is
/// retried after a tenth of the ttl (50 ms to 1 s), not another ttl/3.
#[derive(Debug, Clone)]
pub struct Renewer {
    ttl: Duration,
    margins: Margins,
    confirmed_end: Duration,
    next: Duration,
    in_flight: bool,
}

impl Renewer {
    /// A lease of `ttl` seconds whose acquire began at `began`.
    #[must_use]
    pub fn new(ttl: u64, began: Duration) -> Self {
        let ttl_d = Duration::from_secs(ttl);
        Self {
            ttl: ttl_d,
            margins: Margins::of(ttl),
            confirmed_end: began + ttl_d,
            next: began + Self::every(ttl_d),
            in_flight: false,
        }
    }

    fn every(ttl: Duration) -> Duration {
        (ttl / 3).max(Duration::from_millis(100))
    }

    /// The margins in use.
    #[must_use]
    pub fn margins(&self) -> Margins {
        self.margins
    }

    /// The end of the lease last confirmed.
    #[must_use]
    pub fn confirmed_end(&self) -> Duration {
        self.confirmed_end
    }

    /// When the group must start being stopped unless a renewal confirms more.
    #[must_use]
    pub fn stop_at(&self) -> Duration {
        self.confirmed_end.saturating_sub(self.margins.stop)
    }

    /// Should a renewal be sent now?
    #[must_use]
    pub fn due(&self, now: Duration) -> bool {
        !self.in_flight && now >= self.next
    }

    /// A renewal was sent.
    pub fn sent(&mut self) {
        self.in_flight = true;
    }

    /// The renewal that began at `began` succeeded.
    pub fn confirmed(&mut self, began: Duration) {
        self.in_flight = false;
        self.confirmed_end = self.confirmed_end.max(began + self.ttl);
        self.next = began + Self::every(self.ttl);
    }

    /// The renewal failed at `now`: retry soon.
    pub fn failed(&mut self, now: Duration) {
        self.in_flight = false;
        let retry = (self.ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
        self.next = now + retry;
    }

    /// How long to sleep from `now` before something is due (at most
    /// 200 ms, so a resume from suspend is noticed on the lease clock).
    #[must_use]
    pub fn sleep(&self, now: Duration) -> Duration {
        let wake = if self.in_flight {
            self.stop_at()
        } else {
            self.next.min(self.stop_at())
        };
        wake.saturating_sub(now).min(Duration::from_millis(200))
    }
}

/// The first leader of `run`'s process group and the group's dead man's
/// switch: forked before the lock is taken, it waits on a pipe. Once CMD
/// has joined the group, the wrapper moves it back to its own group (so the
/// group is exactly CMD and what CMD starts, and its id stays reserved by
/// the keeper's pid). The wrapper sends it the moment to stop at (the last
/// confirmed lease end less the margin) after the acquire and after every
/// confirmed renewal, and a quit message once the lock is released. The
/// pipe closing without a quit (the wrapper died, however), or the stop
/// moment passing with no newer one (the wrapper stopped, frozen or
/// starved), makes it stop the group: SIGTERM and SIGCONT, the grace, then
/// SIGKILL.
#[derive(Debug)]
pub struct Keeper {
    pid: libc::pid_t,
    pipe: Option<std::io::PipeWriter>,
}

impl Keeper {
    /// Forks the keeper; its pid is the new group's id.
    ///
    /// # Errors
    /// [`Error::Internal`] when no pipe or process can be made.
    pub fn start(grace: Duration) -> Result<Self> {
        let (reader, writer) = std::io::pipe()
            .map_err(|e| Error::Internal(format!("cannot make a pipe for run: {e}")))?;
        let (rfd, wfd) = (reader.as_raw_fd(), writer.as_raw_fd());
        let grace = libc::timespec {
            tv_sec: libc::time_t::try_from(grace.as_secs()).unwrap_or(10),
            tv_nsec: libc::c_long::from(grace.subsec_nanos()),
        };
        // SAFETY: the child calls only async-signal-safe functions (setpgid,
        // getpid, close, read, kill, nanosleep, _exit) and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: see above.
            unsafe { keeper_child(rfd, wfd, grace) }
        }
        if pid < 0 {
            return Err(Error::Internal(format!(
                "cannot start a process for run: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: setpgid on our own child; both sides set it, so the group
        // exists once this returns, whichever ran first. fcntl on our own
        // descriptor: a keeper that stopped reading (itself stopped) must
        // never block the wrapper's watch on a full pipe.
        unsafe {
            libc::setpgid(pid, pid);
            let flags = libc::fcntl(wfd, libc::F_GETFL);
            libc::fcntl(wfd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        drop(reader);
        Ok(Self {
            pid,
            pipe: Some(writer),
        })
    }

    /// The process group id (the keeper's pid).
    #[must_use]
    pub fn pgid(&self) -> u32 {
        u32::try_from(self.pid).unwrap_or(0)
    }

    /// Takes the keeper out of the group, which CMD has joined, into the
    /// wrapper's own (a parent may move a child that has not exec'd).
    pub fn leave(&self) {
        // SAFETY: plain setpgid/getpgrp on our own child.
        unsafe { libc::setpgid(self.pid, libc::getpgrp()) };
    }

    /// Tells the keeper to stop the group itself at `stop_at` on the lease
    /// clock unless a later moment comes first.
    pub fn arm(&mut self, stop_at: Duration) {
        let ms = u64::try_from(stop_at.as_millis()).unwrap_or(u64::MAX);
        self.send(KEEPER_STOP_AT, ms);
    }

    /// One message (a single write below `PIPE_BUF`, so never torn); lost
    /// only when the keeper has gone or stopped reading.
    fn send(&mut self, kind: u8, value: u64) {
        if let Some(pipe) = &mut self.pipe {
            let mut msg = [kind; KEEPER_MSG];
            if let Some(rest) = msg.get_mut(1..) {
                rest.copy_from_slice(&value.to_le_bytes());
            }
            let _ = pipe.write_all(&msg);
        }
    }

    /// Lets the keeper exit quietly and reaps it.
    pub fn quit(&mut self) {
        self.send(KEEPER_QUIT, 0);
        if let Some(pipe) = self.pipe.take() {
            drop(pipe);
            let mut status = 0;
            // SAFETY: waitpid on our own child.
            unsafe { libc::waitpid(self.pid, &raw mut status, 0) };
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.quit();
    }
}

/// A keeper message: one kind byte, then a little-endian u64.
const KEEPER_MSG: usize = 9;
/// "Exit quietly": the lock is released.
const KEEPER_QUIT: u8 = b'q';
/// "Stop the group at this millisecond of the lease clock".
const KEEPER_STOP_AT: u8 = b'd';

/// Milliseconds of the lease clock (async-signal-safe).
///
/// # Safety
/// Callable in a forked child.
unsafe fn keeper_clock_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    unsafe { libc::clock_gettime(LEASE_CLOCK, &raw mut ts) };
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let millis = u64::try_from(ts.tv_nsec / 1_000_000).unwrap_or(0);
    secs.saturating_mul(1000).saturating_add(millis)
}

/// The keeper's life after fork: read messages until a quit (exit), the
/// end of the pipe or the stop moment (stop the group).
///
/// # Safety
/// Only in the child of `fork`, with `rfd`/`wfd` the two ends of its pipe.
unsafe fn keeper_child(rfd: libc::c_int, wfd: libc::c_int, grace: libc::timespec) -> ! {
    // SAFETY: async-signal-safe calls (poll, read, clock_gettime, kill,
    // nanosleep, _exit) on valid descriptors; no allocation, no panic.
    unsafe {
        libc::setpgid(0, 0);
        let group = libc::getpid();
        libc::close(wfd);
        // Hold no one's terminal or pipe open: the keeper writes nothing.
        for fd in 0..3 {
            libc::close(fd);
        }
        let mut buf = [0u8; KEEPER_MSG * 16];
        let mut len = 0usize;
        let mut stop_at: Option<u64> = None;
        loop {
            let timeout = match stop_at {
                None => -1,
                Some(at) => {
                    let now = keeper_clock_ms();
                    if now >= at {
                        break; // the wrapper confirmed nothing newer in time
                    }
                    libc::c_int::try_from(at - now).unwrap_or(libc::c_int::MAX)
                }
            };
            let mut pfd = libc::pollfd {
                fd: rfd,
                events: libc::POLLIN,
                revents: 0,
            };
            let ready = libc::poll(&raw mut pfd, 1, timeout);
            if ready == 0 || (ready < 0 && *errno() == libc::EINTR) {
                continue;
            }
            let free = buf.len().saturating_sub(len);
            let n = if ready < 0 {
                -1
            } else {
                libc::read(rfd, buf.as_mut_ptr().add(len).cast(), free)
            };
            if n < 0 && *errno() == libc::EINTR {
                continue;
            }
            let Ok(n @ 1..) = usize::try_from(n) else {
                break; // the wrapper is gone: nothing renews the lease any more
            };
            len += n;
            let mut at = 0;
            while len - at >= KEEPER_MSG {
                let mut value = [0u8; 8];
                for (i, v) in value.iter_mut().enumerate() {
                    *v = buf.get(at + 1 + i).copied().unwrap_or(0);
                }
                match buf.get(at).copied() {
                    Some(KEEPER_QUIT) => libc::_exit(0),
                    Some(KEEPER_STOP_AT) => stop_at = Some(u64::from_le_bytes(value)),
                    _ => {}
                }
                at += KEEPER_MSG;
            }
            buf.copy_within(at..len, 0);
            len -= at;
        }
        libc::kill(-group, libc::SIGTERM);
        libc::kill(-group, libc::SIGCONT);
        let mut left = grace;
        while libc::nanosleep(&raw const left, &raw mut left) != 0 && *errno() == libc::EINTR {}
        libc::kill(-group, libc::SIGKILL);
        libc::_exit(0)
    }
}

#[cfg(target_os = "linux")]
unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__errno_location() }
}

#[cfg(not(target_os = "linux"))]
unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__error() }
}

/// Signals and polls a process group until none of it is left.
#[derive(Debug, Clone, Copy)]
struct Group(u32);

impl Group {
    fn alive(self) -> bool {
        liveness::group_alive(self.0, None) != Some(false)
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
        signals::send_group(self.0, libc::SIGTERM);
        // A stopped member acts on SIGTERM only once continued.
        signals::send_group(self.0, libc::SIGCONT);
        if self.gone_within(grace) {
            return Some(libc::SIGTERM);
        }
        signals::send_group(self.0, libc::SIGKILL);
        if !self.gone_within(Duration::from_secs(5)) {
            eprintln!(
                "skill-lock run: process group {} survives SIGKILL (a process in uninterruptible sleep?)",
                self.0
            );
        }
        Some(libc::SIGKILL)
    }
}

/// The terminal lent to CMD's group while it runs: when `run` is in the
/// foreground of the terminal on its stdin, CMD's group is made the
/// foreground instead (as a shell does for a job, in the child before exec
/// so CMD never reads from the background), so CMD can read the terminal
/// and Ctrl-C reaches the group directly. Given back on drop.
struct Terminal(libc::pid_t);

impl Terminal {
    /// Our group, when it is the foreground of the terminal on stdin.
    fn ours_in_foreground() -> Option<Self> {
        // SAFETY: plain calls on fd 0, which may or may not be a terminal.
        unsafe {
            let ours = libc::getpgrp();
            (libc::isatty(0) == 1 && libc::tcgetpgrp(0) == ours).then_some(Self(ours))
        }
    }
}

/// Makes `pgid` the foreground of the terminal on fd 0 with SIGTTOU
/// blocked meanwhile (a background group may then do it); async-signal-safe.
fn set_foreground(pgid: libc::pid_t) {
    // SAFETY: a valid signal set; sigemptyset, sigaddset, pthread_sigmask
    // and tcsetpgrp are async-signal-safe.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, &raw mut old);
        libc::tcsetpgrp(0, pgid);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, std::ptr::null_mut());
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        set_foreground(self.0);
    }
}

/// What the supervisor waits for.
// A handful per ttl/3: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Event {
    Signal(libc::c_int),
    Exited(std::io::Result<ExitStatus>),
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
    ttl: u64,
    began: Duration,
}

/// Acquires (waiting as asked, ended by a signal), runs CMD (`program`,
/// found by [`resolve`] before anything touched the lock, with the words
/// `cmd`) in its own process group, supervises it, and releases (SPEC §2.7).
///
/// # Errors
/// Store failures of the acquire; CMD failing to start.
pub fn execute<S: Store + Clone + Send + 'static>(
    store: &S,
    key: &LockKey,
    mut req: AcquireRequest,
    wait: Option<Duration>,
    program: &Path,
    cmd: &[OsString],
    clock: &crate::engine::Clock,
) -> Result<Outcome> {
    let signals = Signals::listen();
    let mut keeper = Keeper::start(Margins::of(req.ttl).grace)?;
    req.owner_pgid = Some(keeper.pgid());
    let ttl = req.ttl;
    let waited =
        wait::acquire_interruptible(store, key, &req, wait, clock, &mut |d| signals.next(d));
    let (token, fence, began) = match waited? {
        Waited::Interrupted(sig) => return Ok(Outcome::Interrupted(sig)),
        Waited::Done {
            outcome: Acquire::Acquired { token, holder, .. },
            began,
        } => (token, holder.fence, began),
        Waited::Done { outcome, .. } => return Ok(Outcome::NotAcquired(outcome)),
    };
    let lease = Lease {
        key,
        token,
        fence,
        ttl,
        began,
    };
    if let Some(sig) = signals.next(Duration::ZERO) {
        keeper.quit();
        let _ = engine::release(store, key, Some(&lease.token), false, &Context::here());
        return Ok(Outcome::Interrupted(sig));
    }
    let ran = supervise(store, &lease, program, cmd, keeper, signals)?;
    Ok(Outcome::Ran { fence, ran })
}

fn spawn(
    program: &Path,
    cmd: &[OsString],
    lease: &Lease,
    pgid: u32,
    terminal: Option<&Terminal>,
) -> Result<Child> {
    let pgid = libc::pid_t::try_from(pgid).unwrap_or(0);
    let lend = terminal.is_some();
    let mut command = Command::new(program);
    if let Some(arg0) = cmd.first() {
        command.arg0(arg0);
    }
    command
        .args(cmd.iter().skip(1))
        .env("SKILL_LOCK_TOKEN", &lease.token)
        .env("SKILL_LOCK_FENCE", lease.fence.to_string())
        .process_group(pgid);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if lend {
                set_foreground(pgid);
            }
            signals::unblock_in_child();
            Ok(())
        });
    }
    command.spawn().map_err(|e| {
        Error::Usage(format!(
            "cannot run {}: {e}; check the command name and PATH",
            program.display()
        ))
    })
}

/// Runs CMD under `lease` until it ends or the lease is lost.
fn supervise<S: Store + Clone + Send + 'static>(
    store: &S,
    lease: &Lease,
    program: &Path,
    cmd: &[OsString],
    mut keeper: Keeper,
    signals: Signals,
) -> Result<Ran> {
    let ctx = Context::here;
    let group = Group(keeper.pgid());
    let mut renewer = Renewer::new(lease.ttl, lease.began);
    keeper.arm(renewer.stop_at());
    let terminal = Terminal::ours_in_foreground();
    let mut child = match spawn(program, cmd, lease, group.0, terminal.as_ref()) {
        Ok(child) => child,
        Err(e) => {
            keeper.quit();
            let _ = engine::release(store, lease.key, Some(&lease.token), false, &ctx());
            return Err(e);
        }
    };
    keeper.leave();
    let (tx, rx) = mpsc::channel();
    signals.forward(tx.clone(), Event::Signal);
    let exited = tx.clone();
    std::thread::spawn(move || {
        let _ = exited.send(Event::Exited(child.wait()));
    });
    let renew = renewal_worker(store, lease, tx);
    let (end, renewals) = watch(&rx, &renew, &mut renewer, &mut keeper, group);
    drop(renew);
    // The keeper stays armed until the group is gone and the lock released:
    // were this wrapper killed meanwhile, it would still stop the group.
    let grace = renewer.margins().grace;
    let (status, lost, stopped_with) = match end {
        End::Exited(status) => {
            if group.alive() {
                eprintln!(
                    "skill-lock run: stopping what the command left running in its process group"
                );
            }
            (Some(status), false, group.stop(grace))
        }
        End::Lost(exited) => {
            let sig = group.stop(grace);
            let status = exited.or_else(|| wait_exit(&rx));
            (status, true, sig.or(Some(libc::SIGTERM)))
        }
    };
    drop(terminal);
    let released = matches!(
        engine::release(store, lease.key, Some(&lease.token), false, &ctx()),
        Ok(engine::Release::Released { .. })
    );
    keeper.quit();
    let status = status
        .transpose()
        .map_err(|e| Error::Internal(format!("waiting for the command failed: {e}")))?;
    Ok(ran(status, lost, stopped_with, renewals, released))
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
        (true, _, Some(s)) | (false, None, Some(s)) => 128 + s,
        (true, _, None) => 128 + stopped_with.unwrap_or(libc::SIGTERM),
        (false, Some(c), _) => c & 0xff,
        (false, None, None) => 1,
    };
    Ran {
        exit_status: u8::try_from(exit_status & 0xff).unwrap_or(1),
        signal: signal.or(if lost { stopped_with } else { None }),
        lost,
        renewals,
        released,
    }
}

/// Waits (bounded) for CMD's exit after its group was stopped.
fn wait_exit(rx: &mpsc::Receiver<Event>) -> Option<std::io::Result<ExitStatus>> {
    let until = lease_clock() + Duration::from_secs(5);
    while let Some(left) = until.checked_sub(lease_clock()) {
        match rx.recv_timeout(left) {
            Ok(Event::Exited(status)) => return Some(status),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
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
    Exited(std::io::Result<ExitStatus>),
    /// The lease was lost or ends unconfirmed; CMD's exit, when already seen.
    Lost(Option<std::io::Result<ExitStatus>>),
}

/// The supervisor's loop: forwards signals, schedules renewals, and ends
/// when CMD exits or the lease is lost or about to end unconfirmed.
fn watch(
    rx: &mpsc::Receiver<Event>,
    renew: &mpsc::Sender<()>,
    renewer: &mut Renewer,
    keeper: &mut Keeper,
    group: Group,
) -> (End, u64) {
    let mut renewals = 0;
    loop {
        let now = lease_clock();
        if now >= renewer.stop_at() {
            eprintln!(
                "skill-lock run: no renewal confirmed the lease, which ends in {} ms; stopping the command's process group",
                renewer.confirmed_end().saturating_sub(now).as_millis()
            );
            return (End::Lost(None), renewals);
        }
        if renewer.due(now) && renew.send(()).is_ok() {
            renewer.sent();
        }
        match rx.recv_timeout(renewer.sleep(now)) {
            Ok(Event::Signal(sig)) => {
                signals::send_group(group.0, sig);
            }
            Ok(Event::Exited(status)) if lease_clock() >= renewer.stop_at() => {
                // This wrapper was stopped or starved past the stop moment,
                // and the keeper stopped the group in its place.
                eprintln!(
                    "skill-lock run: no renewal confirmed the lease in time; the command's process group was stopped"
                );
                return (End::Lost(Some(status)), renewals);
            }
            Ok(Event::Exited(status)) => return (End::Exited(status), renewals),
            Ok(Event::Renewal { began, result }) => match result {
                Ok(Renew::Renewed { .. }) => {
                    renewer.confirmed(began);
                    keeper.arm(renewer.stop_at());
                    renewals += 1;
                }
                Ok(Renew::NotOwner { holder }) => {
                    eprintln!(
                        "skill-lock run: the lease was lost (now held by {} pid {:?}, fence {}); stopping the command's process group",
                        holder.host, holder.owner_pid, holder.fence
                    );
                    return (End::Lost(None), renewals);
                }
                Ok(Renew::NotHeld { .. }) => {
                    eprintln!(
                        "skill-lock run: the lock was released by someone else; stopping the command's process group"
                    );
                    return (End::Lost(None), renewals);
                }
                Err(e) => {
                    let left = renewer.confirmed_end().saturating_sub(lease_clock());
                    eprintln!(
                        "skill-lock run: renewal failed ({e}); retrying; the lease ends in {} ms",
                        left.as_millis()
                    );
                    renewer.failed(lease_clock());
                }
            },
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn margins_leave_room_before_the_end() {
        let m = Margins::of(1);
        assert_eq!((m.stop, m.grace), (S / 4, S / 8));
        let m = Margins::of(7200);
        assert_eq!((m.stop, m.grace), (10 * S, 5 * S));
        for ttl in [1, 2, 3, 10, 60, 7200] {
            let m = Margins::of(ttl);
            assert!(
                m.grace < m.stop && m.stop < Duration::from_secs(ttl),
                "{ttl}"
            );
        }
    }

    #[test]
    fn renewer_confirms_retries_quickly_and_names_the_stop() {
        let t0 = 100 * S;
        let mut r = Renewer::new(3, t0);
        assert_eq!(r.confirmed_end(), t0 + 3 * S);
        assert_eq!(
            Some(r.stop_at()),
            (t0 + 3 * S).checked_sub(Margins::of(3).stop)
        );
        assert!(!r.due(t0) && r.due(t0 + S));
        r.sent();
        assert!(!r.due(t0 + 2 * S), "one renewal at a time");
        r.failed(t0 + S);
        assert!(
            r.due(t0 + S + S * 3 / 10),
            "a failure is retried after ttl/10"
        );
        assert_eq!(r.confirmed_end(), t0 + 3 * S, "a failure confirms nothing");
        r.sent();
        r.confirmed(t0 + 2 * S);
        assert_eq!(r.confirmed_end(), t0 + 5 * S);
        assert!(!r.due(t0 + 2 * S) && r.due(t0 + 3 * S));
        // An older renewal that finishes late never moves the end back.
        r.confirmed(t0);
        assert_eq!(r.confirmed_end(), t0 + 5 * S);
        assert!(r.sleep(t0) <= Duration::from_millis(200));
    }

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
