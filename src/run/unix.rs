//! `run` on Unix: CMD's tree owned by a keeper process (`unix/keeper.rs`),
//! which leads a process group of its own, outside the wrapper's, and on
//! Linux is a child subreaper; CMD's process group is lent the terminal.
//! [`CmdTree`] is the wrapper's side of it, with the same functions as on
//! Windows.

mod keeper;
mod terminal;

pub(crate) use keeper::main_if_keeper;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::Duration;

use super::{Reach, TreeReport, lease_clock};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::liveness;
use crate::signals::unix::send_group;
use keeper::{Keeper, ReleaseOrder};
use terminal::Terminal;

/// Said when CMD ended and left processes running.
pub(super) const LEFTOVERS: &str =
    "skill-lock run: stopping what the command left running (in its process group or not)";
/// Said when the keeper vanished before the tree was empty.
pub(super) const TREE_GONE: &str = "skill-lock run: the keeper of the command's processes is gone (killed?); stopping what is left of the command's process group; the lock is not released (a process the command started may still run) but left to its lease";
/// Said when processes survive the stop.
pub(super) const SURVIVORS: &str = "skill-lock run: processes the command started survive SIGKILL (uninterruptible sleep?); the keeper goes on stopping them and releases the lock once they end";

/// The wrapper's side of CMD's tree: the keeper that owns it, the terminal
/// lent to CMD's group, and that group once CMD started.
pub(super) struct CmdTree {
    keeper: Keeper,
    terminal: Option<Terminal>,
    group: Option<CmdGroup>,
}

impl CmdTree {
    /// Starts the keeper of `program` (with the words `cmd`); `grace` is
    /// the time between its SIGTERM and SIGKILL; `reach` is how it releases
    /// the lock on `key` should this wrapper die.
    pub(super) fn start(
        grace: Duration,
        program: &Path,
        cmd: &[OsString],
        key: &LockKey,
        reach: &Reach,
    ) -> Result<Self> {
        let order = ReleaseOrder {
            args: reach.release_args(key.skill(), key.repo()),
            store: reach.store.clone().map(OsString::from),
        };
        Ok(Self {
            keeper: Keeper::start(grace, program, cmd, &order)?,
            terminal: None,
            group: None,
        })
    }

    /// The `owner_pid` and `owner_pgid` of the record: no pid whose death
    /// would make the lock stale while a daemon of CMD's runs; the keeper's
    /// group, held while it lives (as long as any process of the tree).
    pub(super) fn owner(&self) -> (Option<u32>, Option<u32>) {
        (None, Some(self.keeper.pgid()))
    }

    /// Starts CMD under the lease, lending it the terminal when `run` is
    /// in its foreground.
    pub(super) fn go(&mut self, token: &str, fence: u64, others_since: Option<bool>) {
        self.terminal = Terminal::ours_in_foreground();
        let lend = self.terminal.is_some();
        self.keeper.go(token, fence, others_since, lend);
    }

    /// Hands every report to `tx` as `wrap(report)`.
    pub(super) fn reports<T: Send + 'static>(
        &mut self,
        tx: mpsc::Sender<T>,
        wrap: fn(TreeReport) -> T,
    ) {
        self.keeper.reports(tx, wrap);
    }

    /// CMD started with `pid`: its process group is CMD's own.
    pub(super) fn started(&mut self, pid: u32) {
        self.group = Some(CmdGroup::of_cmd(pid));
    }

    /// The tree is stopped at `stop_at` on the lease clock (by the keeper,
    /// even when this wrapper is stopped or starved).
    pub(super) fn arm(&mut self, stop_at: Duration) {
        self.keeper.arm(stop_at);
    }

    /// Forwards `sig` to every process of the tree.
    pub(super) fn signal(&mut self, sig: libc::c_int) {
        self.keeper.signal(sig);
    }

    /// Stops the tree now (SIGTERM, the grace, SIGKILL).
    pub(super) fn stop(&mut self) {
        self.keeper.stop();
    }

    /// Stops what is left of CMD's group where the keeper could not (it
    /// was killed); the last signal sent, if any.
    pub(super) fn stop_what_is_left(&mut self, grace: Duration) -> Option<libc::c_int> {
        self.group.and_then(|g| g.stop(grace))
    }

    /// Gives the terminal back to `run`'s own group.
    pub(super) fn take_back_terminal(&mut self) {
        self.terminal = None;
    }

    /// Before CMD started: lets the keeper exit.
    pub(super) fn quit(&mut self) {
        self.keeper.quit();
    }

    /// The wrapper dealt with the lock: the keeper exits without releasing.
    pub(super) fn done(&mut self) {
        self.keeper.done();
    }

    /// Waits for the keeper to exit.
    pub(super) fn reap(&mut self) {
        self.keeper.reap();
    }
}

/// CMD's code (its low 8 bits) or the signal that ended it.
pub(super) fn ended(
    status: ExitStatus,
    _last_signal: Option<libc::c_int>,
) -> (Option<u8>, Option<libc::c_int>) {
    let code = status.code().map(|c| u8::try_from(c & 0xff).unwrap_or(1));
    (code, status.signal())
}

/// Finds CMD's program as exec would (a name with a `/` as given, else the
/// first executable file of that name on PATH), so that a command that
/// cannot be started is an error before the lock is touched.
///
/// # Errors
/// [`Error::Usage`] when there is no command, or it is not found or not
/// executable.
pub(crate) fn resolve(cmd: &[OsString], path: Option<&std::ffi::OsStr>) -> Result<PathBuf> {
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
unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__errno_location() }
}

#[cfg(not(target_os = "linux"))]
unsafe fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__error() }
}

/// Signals and polls a process group until none of it is left: CMD's,
/// whose id is CMD's pid, with its leader's start time (a live process
/// with that pid and another start time is not of it).
#[derive(Debug, Clone, Copy)]
struct CmdGroup {
    pgid: u32,
    start: Option<u64>,
}

impl CmdGroup {
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
        send_group(self.pgid, libc::SIGTERM);
        // A stopped member acts on SIGTERM only once continued.
        send_group(self.pgid, libc::SIGCONT);
        if self.gone_within(grace) {
            return Some(libc::SIGTERM);
        }
        send_group(self.pgid, libc::SIGKILL);
        if !self.gone_within(Duration::from_secs(5)) {
            eprintln!(
                "skill-lock run: process group {} survives SIGKILL (a process in uninterruptible sleep?)",
                self.pgid
            );
        }
        Some(libc::SIGKILL)
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
