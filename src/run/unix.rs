//! `run` on Unix (the steps are told in [`crate::run`]): [`CmdTree`], the
//! wrapper's side of the keeper process that owns CMD's tree, with the
//! terminal lent to CMD's group and that group itself once CMD started;
//! and exec's rules for finding CMD ([`Exec`]). The keeper is in
//! `unix/keeper.rs`, the wrapper's handle on it in `unix/handle.rs`, the
//! lines between them in `unix/protocol.rs`.

mod handle;
mod keeper;
mod protocol;
mod terminal;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

use super::resolve::Rules;
use super::{Reach, TreeOwner, TreeReport, lease_clock};
use crate::error::Result;
use crate::key::LockKey;
use crate::liveness;
use handle::Keeper;
use protocol::ReleaseOrder;
use terminal::Terminal;

/// The wrapper's side of CMD's tree: the keeper that owns it, the terminal
/// lent to CMD's group, and that group once CMD started.
pub(super) struct CmdTree {
    keeper: Keeper,
    terminal: Option<Terminal>,
    group: Option<CmdGroup>,
}

impl TreeOwner for CmdTree {
    const LEFTOVERS: &'static str =
        "skill-lock run: stopping what the command left running (in its process group or not)";
    const TREE_GONE: &'static str = "skill-lock run: the keeper of the command's processes is gone (killed?); stopping what is left of the command's process group; the lock is not released (a process the command started may still run) but left to its lease";
    const SURVIVORS: &'static str = "skill-lock run: processes the command started survive SIGKILL (uninterruptible sleep?); the keeper goes on stopping them and releases the lock once they end";

    fn main_if_keeper() -> Option<Result<ExitCode>> {
        keeper::main_if_keeper()
    }

    /// Starts the keeper (a process group of its own) and hands it the
    /// release order.
    // mirror: the signature `TreeOwner` declares.
    fn start(
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
            keeper: Keeper::start(grace, program, cmd, order)?,
            terminal: None,
            group: None,
        })
    }

    /// No pid whose death would make the lock stale while a daemon of
    /// CMD's runs; the keeper's group, held while it lives (as long as any
    /// process of the tree).
    fn owner(&self) -> (Option<u32>, Option<u32>) {
        (None, Some(self.keeper.pgid()))
    }

    /// Lends CMD the terminal when `run` is in its foreground.
    fn go(&mut self, token: &str, fence: u64, others_since: Option<bool>) {
        self.terminal = Terminal::ours_in_foreground();
        let lend = self.terminal.is_some();
        self.keeper.go(token, fence, others_since, lend);
    }

    fn reports<T: Send + 'static>(&mut self, tx: mpsc::Sender<T>, wrap: fn(TreeReport) -> T) {
        self.keeper.reports(tx, wrap);
    }

    /// CMD's process group is CMD's own.
    fn started(&mut self, pid: u32) {
        self.group = Some(CmdGroup::of_cmd(pid));
    }

    /// Sent to the keeper, which stops the tree then by itself.
    fn arm(&mut self, stop_at: Duration) {
        self.keeper.arm(stop_at);
    }

    fn signal(&mut self, sig: libc::c_int) {
        self.keeper.signal(sig);
    }

    /// SIGTERM, the grace, SIGKILL: by the keeper.
    fn stop(&mut self) {
        self.keeper.stop();
    }

    /// What is left of CMD's group (the keeper was killed).
    fn stop_what_is_left(&mut self, grace: Duration) -> Option<libc::c_int> {
        self.group.and_then(|g| g.stop(grace))
    }

    /// Back to `run`'s own group.
    fn take_back_terminal(&mut self) {
        self.terminal = None;
    }

    /// The keeper exits.
    fn quit(&mut self) {
        self.keeper.quit();
    }

    /// The keeper exits without releasing.
    fn done(&mut self) {
        self.keeper.done();
    }

    fn reap(&mut self) {
        self.keeper.reap();
    }
}

/// exec's rules: a name with a `/` as given, else the first executable
/// file of that name on PATH, where an empty entry is the current
/// directory.
pub(super) struct Exec;

impl Rules for Exec {
    const SEPARATORS: &'static [u8] = b"/";
    const DEFAULT_PATH: &'static str = "/usr/bin:/bin";
    const EMPTY_ENTRY: Option<&'static str> = Some(".");
    const NOT_FOUND: &'static str = "no executable file of that name";
    const ON_PATH: &'static str = " on PATH";
    const CHECK: &'static str = "check the command name, its permissions and PATH";

    /// A file this process may execute.
    fn runnable(candidate: PathBuf) -> Option<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        let meta = std::fs::metadata(&candidate).ok()?;
        let c_path = std::ffi::CString::new(candidate.as_os_str().as_bytes()).ok()?;
        // SAFETY: a valid NUL-terminated path.
        let executable = meta.is_file() && unsafe { libc::access(c_path.as_ptr(), libc::X_OK) } == 0;
        executable.then_some(candidate)
    }
}

/// Sends `sig` to every process of group `pgid`; false when none is left.
fn send_group(pgid: u32, sig: libc::c_int) -> bool {
    match libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) of a process group this process started.
        Ok(raw) if raw > 1 => unsafe { libc::kill(-raw, sig) == 0 },
        _ => false,
    }
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
