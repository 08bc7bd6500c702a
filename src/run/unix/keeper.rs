//! The keeper process of `run` on Unix (SPEC §2.7): what it is for, and
//! each of its steps, is told once in [`crate::run`] (steps 2 to 7); the
//! lines it reads and writes are in `protocol.rs`.
//!
//! Invariant: **no process CMD started outlives the lease the wrapper last
//! confirmed, the keeper lives exactly as long as any of them does, and
//! the lock is released (by the wrapper, or by the keeper when the wrapper
//! died) only once none of them is left.**
//!
//! It is a fresh exec of this binary, not a fork of the multi-threaded
//! wrapper, so it is a single-threaded process of its own that may use the
//! standard library freely. This file holds its life: taking over the
//! pipes and the signals ([`main_if_keeper`]), starting CMD, and the
//! [`Tree`] it watches, stops, reaps, and releases the lock for when the
//! wrapper is gone.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use super::super::TreeReport;
use super::protocol::{
    CONTROL_FD, Control, KEEPER_ARG, REPORT_FD, ReleaseOrder, keeper_program, report_line,
};
use super::terminal::set_foreground;
use super::{lease_clock, send_group};
use crate::signals;

/// The signals a terminal or a group signal may send that the keeper must
/// survive: blocked (the forwarded ones, which `run` handles itself) or
/// ignored (the rest); CMD gets them back at their defaults.
const IGNORED: [libc::c_int; 4] = [libc::SIGQUIT, libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// How long the keeper, once the tree is gone, waits at most for the
/// wrapper to say it dealt with the lock before exiting without releasing
/// (a wrapper that is stopped, not dead: it releases itself once resumed).
/// Never much past the lease's end: while the keeper lives, the lock is
/// held on this machine even past `expires`.
const DONE_WAIT: Duration = Duration::from_secs(30);
/// How long the keeper's own `release` may take before it is killed.
const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// What the keeper's threads hand its main loop.
enum Msg {
    /// A line from the wrapper.
    Control(Control),
    /// The control pipe closed: the wrapper is gone.
    Gone,
    /// CMD (the keeper's first child) ended with this wait status.
    Exited(libc::c_int),
    /// The keeper has no child left.
    Empty,
}

/// When this process was started as a keeper ([`KEEPER_ARG`] first), runs
/// it to its end and returns its exit status; `None` otherwise. `Some(Err)`:
/// the argument was typed by hand (the caller prints the usual error object).
#[must_use]
pub(super) fn main_if_keeper() -> Option<crate::error::Result<ExitCode>> {
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
            if let Some(control) = Control::parse(&line)
                && control_tx.send(Msg::Control(control)).is_err()
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
            Ok(Msg::Control(Control::Go {
                fence,
                lend,
                others_since,
                token,
            })) => {
                tree.token = token;
                break (fence, lend, others_since);
            }
            Ok(Msg::Control(Control::Release(order))) => tree.release = Some(order),
            Ok(Msg::Control(Control::StopAt(at))) => tree.stop_at = Some(at),
            Ok(Msg::Control(Control::Quit) | Msg::Gone) | Err(_) => return Some(ExitCode::SUCCESS),
            Ok(_) => {}
        }
    };
    if let Err(e) = tree.spawn(&program, words, fence, others_since, lend) {
        tree.say(&TreeReport::Failed(format!(
            "cannot run {}: {e}; check the command name and PATH",
            program.display()
        )));
        return Some(ExitCode::SUCCESS);
    }
    tree.say(&TreeReport::Started(tree.cmd.unwrap_or(0)));
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
        if pid < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
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
            Ok(Msg::Control(Control::Done | Control::Quit))
            | Err(mpsc::RecvTimeoutError::Timeout) => return false,
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
    /// Sends `report` to the wrapper.
    fn say(&mut self, report: &TreeReport) {
        if let Some(line) = report_line(report) {
            let _ = self.report.write_all(line.as_bytes());
        }
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
        signals::restore_in_child(&mut command);
        // SAFETY: only async-signal-safe calls (getpgrp, tcsetpgrp,
        // pthread_sigmask, signal) between fork and exec; the group is set
        // before these run (the forwarded signals are unblocked before
        // them: `signals::restore_in_child`).
        unsafe {
            command.pre_exec(move || {
                if lend {
                    set_foreground(libc::getpgrp());
                }
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
            Msg::Control(Control::StopAt(at)) => self.stop_at = Some(at),
            Msg::Control(Control::Signal(sig)) => self.signal(sig),
            Msg::Control(Control::Stop) => self.begin_stop(),
            Msg::Gone => {
                self.orphaned = true;
                self.begin_stop();
            }
            Msg::Exited(status) => {
                let left = self.group_alive()
                    || crate::liveness::tree(self.me).is_none_or(|m| !m.is_empty());
                self.say(&TreeReport::Exited {
                    status: Some(ExitStatus::from_raw(status)),
                    leftovers: left,
                });
                self.cmd = None;
                // Whatever CMD left behind is stopped now (a no-op when
                // nothing is, and `Empty` follows at once).
                self.begin_stop();
            }
            Msg::Empty => self.childless = true,
            Msg::Control(
                Control::Release(_) | Control::Go { .. } | Control::Quit | Control::Done,
            ) => {}
        }
    }

    /// Once no process of the tree is left: says so, and releases the lock
    /// itself when the wrapper is gone (died before, or dies before it says
    /// it dealt with the lock); else exits and lets the wrapper release.
    fn finish(&mut self, rx: &mpsc::Receiver<Msg>) {
        if !self.orphaned {
            self.say(&TreeReport::Empty);
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

