//! `run` on Windows (the steps are told in [`crate::run`]): [`CmdTree`],
//! CMD inside a Job Object, and `CreateProcess`'s rules for finding CMD
//! ([`Exec`]).
//!
//! Why a job is enough where Unix needs a keeper (SPEC §2.7, §10, issue
//! 27): the job kills every process in it when its last handle closes,
//! which this wrapper holds, so **nothing outlives the wrapper**, even when
//! it is killed (Task Manager, `Stop-Process`, `taskkill /f`), and no
//! process can leave the job (breakaway is not allowed), so what a
//! daemonizing tool starts is in it too. Windows has no signal to a
//! process group that could reach the wrapper from CMD
//! (`GenerateConsoleCtrlEvent` to group 0 is a console event, which the
//! wrapper survives; `taskkill /t` reaches only a process's descendants),
//! and a wrapper killed on purpose takes the whole job with it, so its
//! death proves CMD's processes gone and the lock is `owner_dead` at once
//! wherever the record's pid is judged (otherwise it is left to its
//! lease). CMD keeps the console's process group: a group of its own
//! (`CREATE_NEW_PROCESS_GROUP`) would stop Ctrl-C from reaching it.

use std::ffi::OsString;
use std::os::windows::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::resolve::Rules;
use super::{Reach, TreeOwner, TreeReport, lease_clock, lease_env};
use crate::error::Result;
use crate::group::windows::Job;
use crate::key::LockKey;
use crate::signals;

/// The exit code the job's processes get when `run` stops them.
const STOPPED_CODE: u32 = 128 + 15;

/// The wrapper's side of CMD's tree: the Job Object it runs in, once
/// started (or why it could not be), and CMD itself until it is watched.
pub(super) struct CmdTree {
    program: PathBuf,
    cmd: Vec<OsString>,
    job: Option<Arc<Job>>,
    started: Option<std::result::Result<Child, String>>,
}

impl TreeOwner for CmdTree {
    const LEFTOVERS: &'static str =
        "skill-lock run: stopping what the command left running (in its Job Object)";
    /// Never said: the job cannot vanish while this wrapper holds it.
    const TREE_GONE: &'static str = "skill-lock run: the command's Job Object is gone";
    const SURVIVORS: &'static str = "skill-lock run: processes of the command's Job Object survive termination; the lock stays held until they end";

    /// No keeper process on Windows (the Job Object does its work).
    fn main_if_keeper() -> Option<Result<ExitCode>> {
        None
    }

    /// Nothing to start before the acquire: the job is made with CMD.
    fn start(
        _grace: Duration,
        program: &Path,
        cmd: &[OsString],
        _key: &LockKey,
        _reach: &Reach,
    ) -> Result<Self> {
        Ok(Self {
            program: program.to_path_buf(),
            cmd: cmd.to_vec(),
            job: None,
            started: None,
        })
    }

    /// This wrapper, whose death takes the whole job with it.
    fn owner(&self) -> (Option<u32>, Option<u32>) {
        (Some(std::process::id()), None)
    }

    /// Creates CMD suspended, puts it into a new job, then resumes it.
    fn go(&mut self, token: &str, fence: u64, others_since: Option<bool>) {
        let started = match Job::new() {
            Ok(job) => {
                let job = Arc::new(job);
                self.job = Some(Arc::clone(&job));
                self.spawn_in(&job, token, fence, others_since)
            }
            Err(e) => Err(format!(
                "cannot create the Job Object for the command ({e})"
            )),
        };
        self.started = Some(started);
    }

    /// From a thread that waits for CMD, then terminates what it left in
    /// the job and waits until none of it is left.
    fn reports<T: Send + 'static>(&mut self, tx: mpsc::Sender<T>, wrap: fn(TreeReport) -> T) {
        let mut child = match self.started.take() {
            Some(Ok(child)) => child,
            Some(Err(message)) => {
                let _ = tx.send(wrap(TreeReport::Failed(message)));
                return;
            }
            None => return,
        };
        let Some(job) = self.job.clone() else {
            return;
        };
        std::thread::spawn(move || {
            if tx.send(wrap(TreeReport::Started(child.id()))).is_err() {
                return;
            }
            let status = child.wait().ok();
            let leftovers = job.active().is_some_and(|n| n > 0);
            if tx
                .send(wrap(TreeReport::Exited { status, leftovers }))
                .is_err()
            {
                return;
            }
            empty_job(&job);
            let _ = tx.send(wrap(TreeReport::Empty));
        });
    }

    /// Nothing to note: the job holds every process of the tree.
    fn started(&mut self, _pid: u32) {}

    /// Nothing to arm: nothing of the job outlives this wrapper.
    fn arm(&mut self, _stop_at: Duration) {}

    /// Nothing to forward: CMD shares the console, and Windows gives it
    /// the same event.
    fn signal(&mut self, _sig: libc::c_int) {}

    /// Terminates every process of the job now.
    fn stop(&mut self) {
        if let Some(job) = &self.job {
            job.terminate(STOPPED_CODE);
        }
    }

    /// Nothing is left outside the job.
    fn stop_what_is_left(&mut self, _grace: Duration) -> Option<libc::c_int> {
        None
    }

    /// No terminal is lent on Windows.
    fn take_back_terminal(&mut self) {}

    /// Nothing was started yet.
    fn quit(&mut self) {}

    /// No keeper to tell.
    fn done(&mut self) {}

    /// No keeper to wait for.
    fn reap(&mut self) {}
}

impl CmdTree {
    fn spawn_in(
        &self,
        job: &Job,
        token: &str,
        fence: u64,
        others_since: Option<bool>,
    ) -> std::result::Result<Child, String> {
        use windows_sys::Win32::System::Threading::CREATE_SUSPENDED;
        let mut command = std::process::Command::new(&self.program);
        command.args(self.cmd.iter().skip(1));
        lease_env(&mut command, token, fence, others_since);
        signals::restore_in_child(&mut command);
        let mut child = command
            .creation_flags(CREATE_SUSPENDED)
            .spawn()
            .map_err(|e| {
                format!(
                    "cannot run {}: {e}; check the command (the lock was released)",
                    self.program.display()
                )
            })?;
        let fail = |child: &mut Child, what: String| {
            let _ = child.kill();
            let _ = child.wait();
            format!("{what}; the command was not run (the lock was released)")
        };
        if let Err(e) = job.assign(&child) {
            return Err(fail(
                &mut child,
                format!("cannot put the command into its Job Object ({e})"),
            ));
        }
        if let Err(e) = resume(child.id()) {
            return Err(fail(&mut child, format!("cannot resume the command ({e})")));
        }
        Ok(child)
    }
}

/// `CreateProcess`'s rules: a name with a path separator as given, else
/// the first file of that name on PATH (empty entries skipped), trying
/// each PATHEXT extension when it has none.
pub(super) struct Exec;

impl Rules for Exec {
    const SEPARATORS: &'static [u8] = b"/\\:";
    const DEFAULT_PATH: &'static str = r"C:\Windows\System32";
    const EMPTY_ENTRY: Option<&'static str> = None;
    const NOT_FOUND: &'static str = "no file of that name";
    const ON_PATH: &'static str = " on PATH (with PATHEXT)";
    const CHECK: &'static str = "check the command name and PATH";

    /// `candidate` when it has an extension and is a file, else the first
    /// file of its name with a PATHEXT extension added.
    #[allow(
        clippy::disallowed_methods,
        reason = "PATHEXT is how Windows itself names what it runs; PATH comes from the settings"
    )]
    fn runnable(candidate: PathBuf) -> Option<PathBuf> {
        if candidate.extension().is_some() && candidate.is_file() {
            return Some(candidate);
        }
        std::env::var_os("PATHEXT")
            .and_then(|p| p.into_string().ok())
            .unwrap_or_else(|| ".COM;.EXE;.BAT;.CMD".into())
            .split(';')
            .filter(|e| !e.is_empty())
            .find_map(|e| {
                let mut with = candidate.clone().into_os_string();
                with.push(e);
                let with = PathBuf::from(with);
                with.is_file().then_some(with)
            })
    }
}

/// Terminates what is left in the job until none of it is (again every
/// 100 ms).
fn empty_job(job: &Job) {
    let mut kill_at = lease_clock();
    loop {
        let now = lease_clock();
        if now >= kill_at {
            job.terminate(STOPPED_CODE);
            kill_at = now + Duration::from_millis(100);
        }
        if job.active() == Some(0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Resumes the threads of the suspended process `pid` (its one main thread).
fn resume(pid: u32) -> std::io::Result<()> {
    use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
    use windows_sys::Win32::System::Diagnostics::ToolHelp::{
        CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
    };
    use windows_sys::Win32::System::Threading::{OpenThread, ResumeThread, THREAD_SUSPEND_RESUME};
    // SAFETY: a snapshot of all threads; the handle is owned below.
    let snap = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) };
    if snap.is_null() || snap as isize == -1 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a handle the call just returned.
    let snap = unsafe { OwnedHandle::from_raw_handle(snap) };
    // SAFETY: zeroed plain data; dwSize set as the API asks.
    let mut entry: THREADENTRY32 = unsafe { std::mem::zeroed() };
    entry.dwSize = u32::try_from(std::mem::size_of::<THREADENTRY32>()).unwrap_or(28);
    let mut resumed = 0;
    // SAFETY: a valid snapshot and entry.
    let mut more = unsafe { Thread32First(snap.as_raw_handle(), &raw mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == pid {
            // SAFETY: plain call; the handle is owned below.
            let t = unsafe { OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID) };
            if !t.is_null() {
                // SAFETY: a handle OpenThread just returned.
                let t = unsafe { OwnedHandle::from_raw_handle(t) };
                // SAFETY: a valid thread handle.
                if unsafe { ResumeThread(t.as_raw_handle()) } != u32::MAX {
                    resumed += 1;
                }
            }
        }
        // SAFETY: a valid snapshot and entry.
        more = unsafe { Thread32Next(snap.as_raw_handle(), &raw mut entry) } != 0;
    }
    if resumed == 0 {
        return Err(std::io::Error::other("no thread of it was found"));
    }
    Ok(())
}
