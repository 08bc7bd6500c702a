//! The keeper: the process that owns everything CMD starts (SPEC §2.7).
//!
//! Invariant: **no process CMD started outlives the lease the wrapper last
//! confirmed, the keeper lives exactly as long as any of them does, and
//! the lock is released (by the wrapper, or by the keeper when the wrapper
//! died) only once none of them is left.**
//!
//! The wrapper starts the keeper before it takes the lock, as a fresh exec
//! of this same binary (`/proc/self/exe` on Linux) with [`KEEPER_ARG`], so
//! the keeper is a single-threaded process of its own that may use the
//! standard library freely (a plain fork of the multi-threaded wrapper may
//! not). The keeper
//!
//! - leads a process group of its own, in the wrapper's session but never
//!   in the wrapper's group: a signal to the wrapper's group (a CI cancel,
//!   job control, `timeout -s KILL`) does not reach it, while CMD keeps the
//!   wrapper's controlling terminal (job control, `/dev/tty` prompts);
//! - blocks or ignores every signal a terminal or a group signal sends
//!   (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU);
//! - is a child subreaper on Linux (`PR_SET_CHILD_SUBREAPER`), so a process
//!   of CMD's that `setsid()`s, changes its group or double-forks is
//!   re-parented to the keeper, never to init: it stays in the tree the
//!   keeper walks ([`crate::liveness::tree`]) and reaps;
//! - starts CMD as its child in a **process group of CMD's own** (made the
//!   terminal's foreground when `run` was), never the keeper's: what CMD
//!   signals to its group (`kill 0`, `kill -9 -PGID`) cannot reach the
//!   keeper. The keeper's group (itself alone) is named in the lock's
//!   record as `owner_pgid`, so the lock is held while the keeper lives;
//! - stops the whole tree (SIGTERM and SIGCONT, the grace, then SIGKILL
//!   until none is left) when the wrapper says so, when the stop moment
//!   the wrapper last sent passes (the wrapper is frozen or starved), when
//!   the wrapper's pipe closes (the wrapper died, however), and when CMD
//!   exits leaving processes behind;
//! - reaps every process re-parented to it and ends its watch only once it
//!   has no child left and nothing of CMD's group is left either (where
//!   there is no subreaper, members of that group may have another parent);
//! - then reports `empty` and waits for the wrapper's `done`; when the
//!   wrapper's pipe closes without it (the wrapper died, before or after
//!   the tree ended), it runs this binary's `release` with the token in
//!   `SKILL_LOCK_TOKEN` (never another run's lock) and the store's URL, when
//!   one was named, in `SKILL_LOCK_STORE` ([`ReleaseOrder`]), then exits.
//!
//! Control messages (wrapper to keeper, fd 3 of the keeper) and reports
//! (keeper to wrapper, fd 4) are text lines; the only writer of each pipe
//! is one process, and every line but the first (the release order, sent
//! while the pipe is still empty) is one `write` shorter than `PIPE_BUF`.
//! The token and the store's URL travel only over the pipe, never in the
//! keeper's arguments.
//!
//! What escapes where the platform has no subreaper (macOS, other Unix):
//! a process that leaves CMD's process group (`setsid`, `setpgid`) and
//! whose parent then exits is re-parented to init (launchd) and no longer
//! found; everything that stays in the group is found and stopped.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use super::super::TreeReport;
use super::terminal::set_foreground;
use super::{errno, lease_clock};
use crate::error::{Error, Result};
use crate::signals::{self, unix::send_group, unix::unblock_in_child};

/// The first argument that makes this binary the keeper of a `run`.
pub(super) const KEEPER_ARG: &str = "__skill-lock-run-keeper";

/// The keeper's end of the control pipe.
const CONTROL_FD: RawFd = 3;
/// The keeper's end of the report pipe.
const REPORT_FD: RawFd = 4;

/// The signals a terminal or a group signal may send that the keeper must
/// survive: blocked (the forwarded ones, which `run` handles itself) or
/// ignored (the rest); CMD gets them back at their defaults.
const IGNORED: [libc::c_int; 4] = [libc::SIGQUIT, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// One report line of the keeper: `started PID`, `failed REASON`,
/// `exited STATUS LEFTOVERS`, `empty`.
fn parse_report(line: &str) -> Option<TreeReport> {
    let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
    Some(match word {
        "started" => TreeReport::Started(rest.parse().ok()?),
        "failed" => TreeReport::Failed(rest.to_owned()),
        "exited" => {
            let (raw, left) = rest.split_once(' ')?;
            TreeReport::Exited {
                status: Some(ExitStatus::from_raw(raw.parse().ok()?)),
                leftovers: left == "1",
            }
        }
        "empty" => TreeReport::Empty,
        _ => return None,
    })
}

/// The wrapper's handle on its keeper.
#[derive(Debug)]
pub(super) struct Keeper {
    child: Child,
    control: Option<std::io::PipeWriter>,
    reports: Option<std::io::PipeReader>,
    started: bool,
    reaped: bool,
}

/// The program to exec as the keeper: this very binary.
fn keeper_program() -> Result<PathBuf> {
    if cfg!(target_os = "linux") {
        return Ok(PathBuf::from("/proc/self/exe"));
    }
    #[allow(
        clippy::disallowed_methods,
        reason = "the keeper is this binary run again; not configuration"
    )]
    std::env::current_exe().map_err(|e| {
        Error::Internal(format!(
            "cannot find this program to start run's keeper: {e}"
        ))
    })
}

impl Keeper {
    /// Starts the keeper of `program` (with the words `cmd`, the first of
    /// which is its `argv[0]`); `grace` is the time between its SIGTERM and
    /// SIGKILL; `release` is how it releases the lock should this wrapper
    /// die. Its pid is the id of the group it leads (CMD gets one of its own).
    ///
    /// # Errors
    /// [`Error::Internal`] when no pipe or process can be made.
    pub(super) fn start(
        grace: Duration,
        program: &Path,
        cmd: &[OsString],
        release: &ReleaseOrder,
    ) -> Result<Self> {
        let pipe = || {
            std::io::pipe().map_err(|e| Error::Internal(format!("cannot make a pipe for run: {e}")))
        };
        let (control_r, control_w) = pipe()?;
        let (report_r, report_w) = pipe()?;
        let (cr, rw) = (control_r.as_raw_fd(), report_w.as_raw_fd());
        let mut command = Command::new(keeper_program()?);
        command
            .arg0("skill-lock-keeper")
            .arg(KEEPER_ARG)
            .arg(grace.as_millis().to_string())
            .arg(program)
            .args(cmd)
            .process_group(0);
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork
        // and exec. Both ends are first moved above the target numbers
        // (close-on-exec copies), so neither dup2 overwrites the other.
        unsafe {
            command.pre_exec(move || {
                let a = libc::fcntl(cr, libc::F_DUPFD_CLOEXEC, 10);
                let b = libc::fcntl(rw, libc::F_DUPFD_CLOEXEC, 10);
                if a < 0 || b < 0 || libc::dup2(a, CONTROL_FD) < 0 || libc::dup2(b, REPORT_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| {
            Error::Internal(format!(
                "cannot start run's keeper process: {e}; check that this program can run itself again"
            ))
        })?;
        drop((control_r, report_w));
        let mut control_w = control_w;
        // Written while the pipe is empty and still blocking (it may be
        // longer than `PIPE_BUF`: only this wrapper writes to it); a keeper
        // that died already makes it fail, and then the reports say so.
        let _ = control_w.write_all(release.line().as_bytes());
        // SAFETY: fcntl on our own descriptor: a keeper that stopped reading
        // (itself stopped) must never block the wrapper on a full pipe.
        unsafe {
            let flags = libc::fcntl(control_w.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(
                control_w.as_raw_fd(),
                libc::F_SETFL,
                flags | libc::O_NONBLOCK,
            );
        }
        Ok(Self {
            child,
            control: Some(control_w),
            reports: Some(report_r),
            started: false,
            reaped: false,
        })
    }

    /// The keeper's pid: the id of the process group it leads (itself and
    /// the `release` it may run; never CMD).
    #[must_use]
    pub(super) fn pgid(&self) -> u32 {
        self.child.id()
    }

    /// One control line; lost only when the keeper has gone or stopped reading.
    fn send(&mut self, line: &str) {
        if let Some(pipe) = &mut self.control {
            let _ = pipe.write_all(line.as_bytes());
        }
    }

    /// Starts CMD under the lease with `token`, `fence` and `--since`'s
    /// answer ([`crate::run::lease_env`]); with `lend`, CMD's group is made the
    /// terminal's foreground.
    pub(super) fn go(&mut self, token: &str, fence: u64, others_since: Option<bool>, lend: bool) {
        self.started = true;
        let since = match others_since {
            None => "-",
            Some(true) => "1",
            Some(false) => "0",
        };
        self.send(&format!("go {fence} {} {since} {token}\n", u8::from(lend)));
    }

    /// Tells the keeper to stop the tree itself at `stop_at` on the lease
    /// clock unless a later moment comes first.
    pub(super) fn arm(&mut self, stop_at: Duration) {
        self.send(&format!("stop-at {}\n", stop_at.as_millis()));
    }

    /// Tells the keeper that this wrapper has dealt with the lock (released
    /// it, or found it lost): it exits without releasing.
    pub(super) fn done(&mut self) {
        self.send("done\n");
        self.control = None;
    }

    /// Forwards `sig` to every process of the tree.
    pub(super) fn signal(&mut self, sig: libc::c_int) {
        self.send(&format!("signal {sig}\n"));
    }

    /// Stops the tree now (SIGTERM, the grace, SIGKILL).
    pub(super) fn stop(&mut self) {
        self.send("stop\n");
    }

    /// Hands every report to `tx` as `wrap(report)`, from a thread of its
    /// own; the last is [`TreeReport::Empty`] or [`TreeReport::Gone`].
    pub(super) fn reports<T: Send + 'static>(&mut self, tx: mpsc::Sender<T>, wrap: fn(TreeReport) -> T) {
        let Some(pipe) = self.reports.take() else {
            return;
        };
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let Some(report) = parse_report(&line) else {
                    continue;
                };
                let last = report == TreeReport::Empty;
                if tx.send(wrap(report)).is_err() || last {
                    return;
                }
            }
            let _ = tx.send(wrap(TreeReport::Gone));
        });
    }

    /// Before CMD started: lets the keeper exit and reaps it.
    pub(super) fn quit(&mut self) {
        self.send("quit\n");
        self.control = None;
        self.reap();
    }

    /// Waits for the keeper to exit (it does once no process of the tree
    /// is left, or at once before CMD started).
    pub(super) fn reap(&mut self) {
        if !self.reaped {
            self.reaped = true;
            let _ = self.child.wait();
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if self.started {
            // Closing the pipe makes the keeper stop whatever is left; it
            // exits on its own once nothing is.
            self.control = None;
            let _ = self.child.try_wait();
        } else {
            self.quit();
        }
    }
}

// ------------------------------------------------------------ the keeper

/// How long the keeper, once the tree is gone, waits at most for the
/// wrapper to say it dealt with the lock before exiting without releasing
/// (a wrapper that is stopped, not dead: it releases itself once resumed).
/// Never much past the lease's end: while the keeper lives, the lock is
/// held on this machine even past `expires`.
const DONE_WAIT: Duration = Duration::from_secs(30);
/// How long the keeper's own `release` may take before it is killed.
const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// What the keeper runs to release the lock when the wrapper died: this
/// binary's `release` with `args`, the token in `SKILL_LOCK_TOKEN` (a token
/// release: it never removes another run's lock) and the store's URL, when
/// one was named, in `SKILL_LOCK_STORE`: never in an argument, since it may
/// carry credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ReleaseOrder {
    /// The words after the program name (`release SKILL --repo=REPO ...`).
    pub args: Vec<OsString>,
    /// The store's URL, for the release's environment.
    pub store: Option<OsString>,
}

impl ReleaseOrder {
    /// One control line: `release STORE ARG...`, each word `x` and its
    /// bytes in hex (`-`: no store), so any bytes survive a text line.
    fn line(&self) -> String {
        let mut line = String::from("release ");
        match &self.store {
            Some(url) => line.push_str(&hex(url)),
            None => line.push('-'),
        }
        for arg in &self.args {
            line.push(' ');
            line.push_str(&hex(arg));
        }
        line.push('\n');
        line
    }

    fn parse(rest: &str) -> Option<Self> {
        let mut words = rest.split(' ');
        let store = match words.next()? {
            "-" => None,
            word => Some(unhex(word)?),
        };
        let args = words.map(unhex).collect::<Option<Vec<_>>>()?;
        Some(Self { args, store })
    }
}

fn hex(word: &std::ffi::OsStr) -> String {
    use std::fmt::Write as _;
    word.as_encoded_bytes()
        .iter()
        .fold(String::from("x"), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

fn unhex(word: &str) -> Option<OsString> {
    use std::os::unix::ffi::OsStringExt;
    let digits = word.strip_prefix('x')?.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let bytes = digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(OsString::from_vec(bytes))
}

/// What the keeper's threads hand its main loop.
enum Msg {
    Release(ReleaseOrder),
    Go {
        fence: u64,
        lend: bool,
        others_since: Option<bool>,
        token: String,
    },
    StopAt(Duration),
    Signal(libc::c_int),
    Stop,
    Quit,
    /// The wrapper dealt with the lock: exit without releasing.
    Done,
    /// The control pipe closed: the wrapper is gone.
    Gone,
    /// CMD (the keeper's first child) ended with this wait status.
    Exited(libc::c_int),
    /// The keeper has no child left.
    Empty,
}

impl Msg {
    fn parse(line: &str) -> Option<Self> {
        if let Some(rest) = line.strip_prefix("release ") {
            return ReleaseOrder::parse(rest).map(Self::Release);
        }
        let mut words = line.splitn(5, ' ');
        Some(match words.next()? {
            "go" => Self::Go {
                fence: words.next()?.parse().ok()?,
                lend: words.next()? == "1",
                others_since: match words.next()? {
                    "-" => None,
                    "1" => Some(true),
                    "0" => Some(false),
                    _ => return None,
                },
                token: words.next()?.to_owned(),
            },
            "stop-at" => Self::StopAt(Duration::from_millis(words.next()?.parse().ok()?)),
            "signal" => Self::Signal(words.next()?.parse().ok()?),
            "stop" => Self::Stop,
            "quit" => Self::Quit,
            "done" => Self::Done,
            _ => return None,
        })
    }
}

/// When this process was started as a keeper ([`KEEPER_ARG`] first), runs
/// it to its end and returns its exit status; `None` otherwise. `Some(Err)`:
/// the argument was typed by hand (the caller prints the usual error object).
#[must_use]
pub(crate) fn main_if_keeper() -> Option<Result<ExitCode, crate::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    if args.next()? != KEEPER_ARG {
        return None;
    }
    let args: Vec<OsString> = args.collect();
    Some(keeper_main(&args).ok_or_else(|| {
        crate::error::Error::Usage(format!(
            "{KEEPER_ARG} is the keeper of `skill-lock run` and is started only by it; use `skill-lock run`"
        ))
    }))
}

fn is_fifo(fd: RawFd) -> bool {
    // SAFETY: fstat into a zeroed stat of a descriptor number; a closed one
    // only makes it fail.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &raw mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
    }
}

/// Blocks the forwarded signals and ignores the terminal's others, in this
/// (still the only) thread, so that every thread started later inherits it.
fn guard_signals() {
    signals::block();
    for sig in IGNORED {
        // SAFETY: setting a signal's disposition to ignore.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// Takes over the two pipes the wrapper handed over, becomes a child
/// subreaper (Linux), and starts the thread that reads control lines.
fn take_pipes() -> (mpsc::Sender<Msg>, mpsc::Receiver<Msg>, std::fs::File) {
    // SAFETY: fcntl and prctl on this process; the two descriptors were
    // checked to be pipes, handed over by the wrapper, owned by no one
    // else here.
    let (control, report) = unsafe {
        libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(REPORT_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        (
            std::fs::File::from_raw_fd(CONTROL_FD),
            std::fs::File::from_raw_fd(REPORT_FD),
        )
    };
    let (tx, rx) = mpsc::channel();
    let control_tx = tx.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(control).lines() {
            let Ok(line) = line else { break };
            if let Some(msg) = Msg::parse(&line)
                && control_tx.send(msg).is_err()
            {
                return;
            }
        }
        let _ = control_tx.send(Msg::Gone);
    });
    (tx, rx, report)
}

/// The keeper's life; `None` when it was not started by `run` (no pipes).
fn keeper_main(args: &[OsString]) -> Option<ExitCode> {
    let grace = Duration::from_millis(args.first()?.to_str()?.parse().ok()?);
    let program = PathBuf::from(args.get(1)?);
    let words = args.get(2..).filter(|a| !a.is_empty())?;
    if !is_fifo(CONTROL_FD) || !is_fifo(REPORT_FD) {
        return None;
    }
    guard_signals();
    let (tx, rx, report) = take_pipes();
    let mut tree = Tree {
        me: std::process::id(),
        cmd: None,
        group: None,
        report,
        grace,
        stop_at: None,
        kill_at: None,
        release: None,
        token: String::new(),
        orphaned: false,
        childless: false,
    };
    let (fence, lend, others_since) = loop {
        match rx.recv() {
            Ok(Msg::Go {
                fence,
                lend,
                others_since,
                token,
            }) => {
                tree.token = token;
                break (fence, lend, others_since);
            }
            Ok(Msg::Release(order)) => tree.release = Some(order),
            Ok(Msg::StopAt(at)) => tree.stop_at = Some(at),
            Ok(Msg::Quit | Msg::Gone) | Err(_) => return Some(ExitCode::SUCCESS),
            Ok(_) => {}
        }
    };
    if let Err(e) = tree.spawn(&program, words, fence, others_since, lend) {
        tree.say(&format!(
            "failed cannot run {}: {e}; check the command name and PATH",
            program.display()
        ));
        return Some(ExitCode::SUCCESS);
    }
    let started = format!("started {}", tree.cmd.unwrap_or(0));
    tree.say(&started);
    release_stdio();
    let cmd = tree.cmd;
    std::thread::spawn(move || reap_all(cmd, &tx));
    tree.supervise(&rx);
    tree.finish(&rx);
    Some(ExitCode::SUCCESS)
}

/// Points the keeper's standard streams at `/dev/null`: CMD has its own
/// copies, and the keeper must not hold a terminal or a pipe open.
fn release_stdio() {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    for fd in 0..3 {
        // SAFETY: dup2 onto (or close of) our own standard descriptors.
        unsafe {
            match &null {
                Ok(null) => libc::dup2(null.as_raw_fd(), fd),
                Err(_) => libc::close(fd),
            };
        }
    }
}

/// Reaps every child (CMD, and whatever is re-parented to the keeper),
/// posting CMD's status, and [`Msg::Empty`] once none is left.
fn reap_all(cmd: Option<u32>, tx: &mpsc::Sender<Msg>) {
    let cmd = cmd.and_then(|c| libc::pid_t::try_from(c).ok());
    loop {
        let mut status = 0;
        // SAFETY: waitpid for any child of this process.
        let pid = unsafe { libc::waitpid(-1, &raw mut status, 0) };
        if pid > 0 {
            if Some(pid) == cmd && tx.send(Msg::Exited(status)).is_err() {
                return;
            }
            continue;
        }
        // SAFETY: errno of this thread.
        if pid < 0 && unsafe { *errno() } == libc::EINTR {
            continue;
        }
        let _ = tx.send(Msg::Empty);
        return;
    }
}

/// After `empty`: true when the wrapper's pipe closes before it says
/// `done` (it died before it dealt with the lock), false once it says so or
/// `until` passed (a wrapper stopped there releases once resumed).
fn wrapper_dies_first(rx: &mpsc::Receiver<Msg>, until: Duration) -> bool {
    while let Some(left) = until.checked_sub(lease_clock()) {
        match rx.recv_timeout(left) {
            Ok(Msg::Done | Msg::Quit) | Err(mpsc::RecvTimeoutError::Timeout) => return false,
            Ok(Msg::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => return true,
            Ok(_) => {}
        }
    }
    false
}

/// What the keeper owns, and its deadlines on the lease clock.
struct Tree {
    me: u32,
    /// CMD's pid while it runs.
    cmd: Option<u32>,
    /// CMD's process group (its pid) and its leader's start time.
    group: Option<(u32, Option<u64>)>,
    report: std::fs::File,
    grace: Duration,
    /// Stop the tree at this moment unless a later one is sent.
    stop_at: Option<Duration>,
    /// Stopping: SIGKILL what is left at this moment (again every 100 ms).
    kill_at: Option<Duration>,
    /// How to release the lock should the wrapper die.
    release: Option<ReleaseOrder>,
    token: String,
    /// The wrapper's pipe closed before it said `done`: it died.
    orphaned: bool,
    /// The keeper has no child left (CMD's group may still have members
    /// where there is no subreaper).
    childless: bool,
}

impl Tree {
    fn say(&mut self, line: &str) {
        let _ = self.report.write_all(format!("{line}\n").as_bytes());
    }

    /// Starts CMD in a process group of its own (so that what it signals
    /// to its group, `kill 0` or `kill -9 -PGID`, never reaches the keeper),
    /// that group made the terminal's foreground with `lend`.
    fn spawn(
        &mut self,
        program: &Path,
        argv: &[OsString],
        fence: u64,
        others_since: Option<bool>,
        lend: bool,
    ) -> std::io::Result<()> {
        let mut command = Command::new(program);
        if let Some(arg0) = argv.first() {
            command.arg0(arg0);
        }
        command.args(argv.iter().skip(1)).process_group(0);
        crate::run::lease_env(&mut command, &self.token, fence, others_since);
        // SAFETY: only async-signal-safe calls (getpgrp, tcsetpgrp,
        // pthread_sigmask, signal) between fork and exec; the group is set
        // before these run.
        unsafe {
            command.pre_exec(move || {
                if lend {
                    set_foreground(libc::getpgrp());
                }
                unblock_in_child();
                for sig in IGNORED {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        let pid = child.id();
        self.cmd = Some(pid);
        self.group = Some((pid, crate::liveness::process_start(pid)));
        // Reaped by `reap_all`, with everything else.
        drop(child);
        Ok(())
    }

    /// Is anything of CMD's process group left? (Where there is a
    /// subreaper, nothing once the keeper has no child.)
    fn group_alive(&self) -> bool {
        self.group
            .is_some_and(|(pgid, start)| crate::liveness::group_alive(pgid, start) != Some(false))
    }

    /// Sends `sig` to every process of the tree but the keeper. Where the
    /// platform cannot list them, to CMD and to CMD's process group.
    fn signal(&self, sig: libc::c_int) {
        if let Some(members) = crate::liveness::tree(self.me) {
            for pid in members {
                if let Ok(pid) = libc::pid_t::try_from(pid) {
                    // SAFETY: kill(2) of a process of the tree this keeper owns.
                    unsafe { libc::kill(pid, sig) };
                }
            }
            return;
        }
        if let Some(cmd) = self.cmd.and_then(|c| libc::pid_t::try_from(c).ok()) {
            // SAFETY: kill(2) of CMD, this keeper's child (not reaped yet,
            // or the call fails harmlessly).
            unsafe { libc::kill(cmd, sig) };
        }
        if self.group_alive()
            && let Some((pgid, _)) = self.group
        {
            let _ = send_group(pgid, sig);
        }
    }

    fn begin_stop(&mut self) {
        if self.kill_at.is_none() {
            self.signal(libc::SIGTERM);
            // A stopped process acts on SIGTERM only once continued.
            self.signal(libc::SIGCONT);
            self.kill_at = Some(lease_clock() + self.grace);
        }
    }

    /// The main loop once CMD runs: ends when no process of the tree is left.
    fn supervise(&mut self, rx: &mpsc::Receiver<Msg>) {
        loop {
            if self.childless {
                if !self.group_alive() {
                    return;
                }
                // Members of CMD's group that the keeper does not parent
                // (no subreaper here): stopped like the rest.
                self.begin_stop();
            }
            let now = lease_clock();
            if self.kill_at.is_none() && self.stop_at.is_some_and(|at| now >= at) {
                self.begin_stop();
            }
            if let Some(at) = self.kill_at
                && now >= at
            {
                self.signal(libc::SIGKILL);
                self.kill_at = Some(now + Duration::from_millis(100));
            }
            let wake = match self.kill_at {
                Some(at) => at,
                None => self.stop_at.unwrap_or(now + Duration::from_secs(1)),
            };
            // At most 200 ms: a resume from suspend is noticed on the clock.
            let timeout = wake.saturating_sub(now).min(Duration::from_millis(200));
            let timeout = if self.childless {
                timeout.min(Duration::from_millis(20))
            } else {
                timeout
            };
            match rx.recv_timeout(timeout) {
                Ok(msg) => self.on(&msg),
                Err(mpsc::RecvTimeoutError::Disconnected) => self.childless = true,
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// One message while CMD's tree runs.
    fn on(&mut self, msg: &Msg) {
        match *msg {
            Msg::StopAt(at) => self.stop_at = Some(at),
            Msg::Signal(sig) => self.signal(sig),
            Msg::Stop => self.begin_stop(),
            Msg::Gone => {
                self.orphaned = true;
                self.begin_stop();
            }
            Msg::Exited(status) => {
                let left = self.group_alive()
                    || crate::liveness::tree(self.me).is_none_or(|m| !m.is_empty());
                self.say(&format!("exited {status} {}", u8::from(left)));
                self.cmd = None;
                // Whatever CMD left behind is stopped now (a no-op when
                // nothing is, and `Empty` follows at once).
                self.begin_stop();
            }
            Msg::Empty => self.childless = true,
            Msg::Release(_) | Msg::Go { .. } | Msg::Quit | Msg::Done => {}
        }
    }

    /// Once no process of the tree is left: says so, and releases the lock
    /// itself when the wrapper is gone (died before, or dies before it says
    /// it dealt with the lock); else exits and lets the wrapper release.
    fn finish(&mut self, rx: &mpsc::Receiver<Msg>) {
        if !self.orphaned {
            self.say("empty");
            // The lease the wrapper last confirmed ends a margin (twice
            // the grace) after the stop moment it sent.
            let now = lease_clock();
            let lease_end = self.stop_at.map_or(now, |at| at + 2 * self.grace);
            let until = (lease_end.max(now) + Duration::from_secs(1)).min(now + DONE_WAIT);
            if !wrapper_dies_first(rx, until) {
                return;
            }
        }
        self.release_lock();
    }

    /// Runs this binary's `release` with the token (never another run's
    /// lock), waiting for it at most [`RELEASE_WAIT`].
    fn release_lock(&self) {
        let (Some(order), Ok(program)) = (&self.release, keeper_program()) else {
            return;
        };
        let mut command = Command::new(program);
        command
            .arg0("skill-lock")
            .args(&order.args)
            .env("SKILL_LOCK_TOKEN", &self.token)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        match &order.store {
            Some(url) => command.env("SKILL_LOCK_STORE", url),
            None => command.env_remove("SKILL_LOCK_STORE"),
        };
        let Ok(mut child) = command.spawn() else {
            return;
        };
        let until = lease_clock() + RELEASE_WAIT;
        while matches!(child.try_wait(), Ok(None)) {
            if lease_clock() >= until {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_and_messages_parse_and_refuse_garbage() {
        assert_eq!(parse_report("started 42"), Some(TreeReport::Started(42)));
        assert_eq!(
            parse_report("exited 256 1"),
            Some(TreeReport::Exited {
                status: Some(ExitStatus::from_raw(256)),
                leftovers: true
            })
        );
        assert_eq!(parse_report("empty"), Some(TreeReport::Empty));
        assert_eq!(parse_report("exited x 1"), None);
        assert_eq!(parse_report("what"), None);
        assert!(matches!(
            Msg::parse("go 7 1 - abc"),
            Some(Msg::Go { fence: 7, lend: true, others_since: None, ref token }) if token == "abc"
        ));
        assert!(matches!(
            Msg::parse("go 7 0 1 abc"),
            Some(Msg::Go {
                lend: false,
                others_since: Some(true),
                ..
            })
        ));
        assert!(matches!(
            Msg::parse("go 7 0 0 abc"),
            Some(Msg::Go {
                others_since: Some(false),
                ..
            })
        ));
        assert!(Msg::parse("go 7 1 abc").is_none(), "no answer to --since");
        assert!(
            matches!(Msg::parse("stop-at 1500"), Some(Msg::StopAt(d)) if d.as_millis() == 1500)
        );
        assert!(matches!(Msg::parse("signal 2"), Some(Msg::Signal(2))));
        assert!(Msg::parse("go x 1 - t").is_none());
        assert!(Msg::parse("").is_none());
        assert!(matches!(Msg::parse("done"), Some(Msg::Done)));
    }

    #[test]
    fn a_release_order_survives_its_line_whatever_its_bytes() {
        use std::os::unix::ffi::OsStringExt;
        let order = ReleaseOrder {
            args: vec![
                "release".into(),
                "s".into(),
                "--repo=o/r".into(),
                OsString::from_vec(b"--root=/a b/\xff\n\x00 x".to_vec()),
            ],
            store: Some("etcd://user:pa ss@host:2379/p".into()),
        };
        let line = order.line();
        assert!(
            line.ends_with('\n') && !line.trim_end().contains('\n'),
            "{line}"
        );
        assert!(!line.contains("pa ss") && !line.contains("user"), "{line}");
        match Msg::parse(line.trim_end()) {
            Some(Msg::Release(back)) => assert_eq!(back, order),
            _ => panic!("{line}"),
        }
        let none = ReleaseOrder {
            args: vec!["release".into()],
            store: None,
        };
        assert!(
            matches!(Msg::parse(none.line().trim_end()), Some(Msg::Release(back)) if back == none)
        );
        assert!(Msg::parse("release - x6").is_none(), "odd hex");
        assert!(Msg::parse("release - 61").is_none(), "no x");
    }
}
