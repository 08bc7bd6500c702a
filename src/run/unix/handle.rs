//! The wrapper's handle on its keeper (SPEC §2.7): starts the keeper with
//! its two pipes, sends it control lines, reads its reports on a thread,
//! and reaps it. What the keeper is for is told in [`crate::run`]; the
//! lines themselves are in `protocol.rs`.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::Duration;

use super::super::TreeReport;
use super::protocol::{
    CONTROL_FD, Control, KEEPER_ARG, REPORT_FD, ReleaseOrder, keeper_program, parse_report,
};
use crate::error::{Error, Result};

/// The wrapper's handle on its keeper.
#[derive(Debug)]
pub(super) struct Keeper {
    child: Child,
    control: Option<std::io::PipeWriter>,
    reports: Option<std::io::PipeReader>,
    started: bool,
    reaped: bool,
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
        release: ReleaseOrder,
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
        let _ = control_w.write_all(Control::Release(release).line().as_bytes());
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
    fn send(&mut self, control: &Control) {
        if let Some(pipe) = &mut self.control {
            let _ = pipe.write_all(control.line().as_bytes());
        }
    }

    /// Starts CMD under the lease with `token`, `fence` and `--since`'s
    /// answer ([`crate::run::lease_env`]); with `lend`, CMD's group is made the
    /// terminal's foreground.
    pub(super) fn go(&mut self, token: &str, fence: u64, others_since: Option<bool>, lend: bool) {
        self.started = true;
        self.send(&Control::Go {
            fence,
            lend,
            others_since,
            token: token.to_owned(),
        });
    }

    /// Tells the keeper to stop the tree itself at `stop_at` on the lease
    /// clock unless a later moment comes first.
    pub(super) fn arm(&mut self, stop_at: Duration) {
        self.send(&Control::StopAt(stop_at));
    }

    /// Tells the keeper that this wrapper has dealt with the lock (released
    /// it, or found it lost): it exits without releasing.
    pub(super) fn done(&mut self) {
        self.send(&Control::Done);
        self.control = None;
    }

    /// Forwards `sig` to every process of the tree.
    pub(super) fn signal(&mut self, sig: libc::c_int) {
        self.send(&Control::Signal(sig));
    }

    /// Stops the tree now (SIGTERM, the grace, SIGKILL).
    pub(super) fn stop(&mut self) {
        self.send(&Control::Stop);
    }

    /// Hands every report to `tx` as `wrap(report)`, from a thread of its
    /// own; the last is [`TreeReport::Empty`] or [`TreeReport::Gone`].
    pub(super) fn reports<T: Send + 'static>(
        &mut self,
        tx: mpsc::Sender<T>,
        wrap: fn(TreeReport) -> T,
    ) {
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
        self.send(&Control::Quit);
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
