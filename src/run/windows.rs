//! `run` on Windows (SPEC §2.7, §10): CMD inside a Job Object.
//!
//! The owner of the lock is this wrapper (`owner_pid`, with its creation
//! time), and CMD with everything it starts lives in a Job Object that
//! kills every process in it when its last handle closes, which this
//! wrapper holds: **nothing outlives the wrapper**, even when it is killed
//! (Task Manager, `Stop-Process`, `taskkill /f`), so the lock's owner being
//! gone proves CMD's processes gone. No process can leave the job
//! (breakaway is not allowed), so what a daemonizing tool starts is in it
//! too.
//!
//! 1. CMD is resolved on PATH (with PATHEXT) before the lock is touched.
//! 2. After the acquire, CMD is created suspended, put into the job, and
//!    only then resumed: it runs no instruction outside the job.
//! 3. The [`Renewer`] keeps the end of the lease it last confirmed on the
//!    lease clock, as on Unix; when a renewal finds the lock lost, or the
//!    stop moment passes unconfirmed, the whole job is terminated (exit
//!    code 143, 128+SIGTERM) and `run` exits 143 with `"lost": true`.
//! 4. When CMD ends, what it left running in the job is terminated, and
//!    the lock is released once the job has no process left.
//! 5. Console events (Ctrl-C, Ctrl-Break, close) reach CMD from Windows
//!    itself (it shares the console); the wrapper survives them (see
//!    [`crate::signals`]) and reports a CMD ended by one as 128+number.
//!
//! What Unix needs a keeper for (SPEC §2.7, issue 27) holds here by the
//! job: Windows has no signal to a process group that could reach the
//! wrapper from CMD (`GenerateConsoleCtrlEvent` to group 0 is a console
//! event, which the wrapper survives; `taskkill /t` reaches only a
//! process's descendants), and a wrapper killed on purpose takes the whole
//! job with it, so its death proves CMD's processes gone and the lock is
//! `owner_dead` at once wherever the record's pid is judged (otherwise it
//! is left to its lease). CMD keeps the console's process
//! group: a group of its own (`CREATE_NEW_PROCESS_GROUP`) would stop
//! Ctrl-C from reaching it.

#[path = "reach.rs"]
mod reach;
#[path = "renewer.rs"]
mod renewer;

pub use reach::Reach;
pub use renewer::{Margins, Renewer};

use std::ffi::OsString;
use std::os::windows::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::Duration;

use crate::engine::{self, Acquire, AcquireRequest, Context, Renew};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::signals::{self, Signals};
use crate::store::Store;
use crate::wait::{self, Waited};
use crate::win::Job;

pub use crate::clock::lease_clock;

/// The exit code of a process ended by Ctrl-C or Ctrl-Break.
const STATUS_CONTROL_C_EXIT: u32 = 0xC000_013A;
/// The exit code the job's processes get when `run` stops them.
const STOPPED_CODE: u32 = 128 + 15;

#[path = "outcome.rs"]
mod outcome;
pub use outcome::{OTHERS_SINCE_VAR, Outcome, Ran, lease_env};

/// Installs the console event handler; call before any other thread starts.
pub fn prepare() {
    signals::block();
}

/// No keeper process on Windows (the Job Object does its work).
#[must_use]
pub fn main_if_keeper() -> Option<Result<std::process::ExitCode, crate::error::Error>> {
    None
}

/// Finds CMD's program as `CreateProcess` would: a name with a path
/// separator as given, else the first file of that name on PATH, trying
/// each PATHEXT extension when it has none, so that a command that cannot
/// be started is an error before the lock is touched.
///
/// # Errors
/// [`Error::Usage`] when there is no command, or it is not found.
#[allow(
    clippy::disallowed_methods,
    reason = "PATHEXT is how Windows itself names what it runs; PATH comes from the settings"
)]
pub fn resolve(cmd: &[OsString], path: Option<&std::ffi::OsStr>) -> Result<PathBuf> {
    let Some(program) = cmd.first() else {
        return Err(Error::Usage("run needs a command after --".into()));
    };
    let name = Path::new(program);
    let exts: Vec<String> = std::env::var_os("PATHEXT")
        .and_then(|p| p.into_string().ok())
        .unwrap_or_else(|| ".COM;.EXE;.BAT;.CMD".into())
        .split(';')
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    let try_in = |candidate: PathBuf| -> Option<PathBuf> {
        if candidate.extension().is_some() && candidate.is_file() {
            return Some(candidate);
        }
        exts.iter().find_map(|e| {
            let mut with = candidate.clone().into_os_string();
            with.push(e);
            let with = PathBuf::from(with);
            with.is_file().then_some(with)
        })
    };
    let bytes = program.as_encoded_bytes();
    let found = if program.is_empty() {
        None
    } else if bytes.iter().any(|b| b"/\\:".contains(b)) {
        try_in(name.to_path_buf())
    } else {
        let path = path.unwrap_or_else(|| std::ffi::OsStr::new(r"C:\Windows\System32"));
        std::env::split_paths(path)
            .filter(|dir| !dir.as_os_str().is_empty())
            .find_map(|dir| try_in(dir.join(name)))
    };
    found.ok_or_else(|| {
        Error::Usage(format!(
            "cannot run {:?}: no file of that name{}; check the command name and PATH (nothing was locked)",
            program.to_string_lossy(),
            if name.components().count() > 1 { "" } else { " on PATH (with PATHEXT)" },
        ))
    })
}

/// What the supervisor waits for.
#[allow(clippy::large_enum_variant)]
enum Event {
    Signal(libc::c_int),
    Exited(std::io::Result<ExitStatus>),
    Renewal {
        began: Duration,
        result: Result<Renew>,
    },
}

/// Acquires (waiting as asked, ended by a console event), runs CMD in a
/// Job Object under the lease, and releases once no process of the job is
/// left (SPEC §2.7). `reach` is not needed here: this wrapper is the
/// lock's recorded owner, and nothing of the job outlives it.
///
/// # Errors
/// Store failures of the acquire; CMD or the job failing to start.
#[allow(clippy::too_many_arguments)]
pub fn execute<S: Store + Clone + Send + 'static>(
    store: &S,
    key: &LockKey,
    mut req: AcquireRequest,
    wait: Option<Duration>,
    program: &Path,
    cmd: &[OsString],
    _reach: &Reach,
    clock: &crate::engine::Clock,
) -> Result<Outcome> {
    let signals = Signals::listen();
    req.owner_pid = Some(std::process::id());
    req.owner_pgid = None;
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
    let release = || {
        let _ = engine::release(store, key, Some(&token), false, &Context::here());
    };
    if let Some(sig) = signals.next(Duration::ZERO) {
        release();
        return Ok(Outcome::Interrupted(sig));
    }
    let started = start(program, cmd, &token, fence, others_since);
    let (job, child) = match started {
        Ok(s) => s,
        Err(e) => {
            release();
            return Err(e);
        }
    };
    let ran = supervise(store, key, &token, ttl, began, &job, child, signals);
    Ok(Outcome::Ran {
        fence,
        others_since,
        ran,
    })
}

/// Creates CMD suspended, puts it into a new job, then resumes it.
fn start(
    program: &Path,
    cmd: &[OsString],
    token: &str,
    fence: u64,
    others_since: Option<bool>,
) -> Result<(Job, std::process::Child)> {
    use windows_sys::Win32::System::Threading::CREATE_SUSPENDED;
    let job = Job::new().map_err(|e| {
        Error::Usage(format!(
            "cannot create the Job Object for the command ({e})"
        ))
    })?;
    let mut command = std::process::Command::new(program);
    command.args(cmd.iter().skip(1));
    lease_env(&mut command, token, fence, others_since);
    let mut child = command
        .creation_flags(CREATE_SUSPENDED)
        .spawn()
        .map_err(|e| {
            Error::Usage(format!(
                "cannot run {}: {e}; check the command (the lock was released)",
                program.display()
            ))
        })?;
    let fail = |child: &mut std::process::Child, what: String| {
        let _ = child.kill();
        let _ = child.wait();
        Error::Usage(format!(
            "{what}; the command was not run (the lock was released)"
        ))
    };
    if let Err(e) = job.assign(child.id()) {
        return Err(fail(
            &mut child,
            format!("cannot put the command into its Job Object ({e})"),
        ));
    }
    if let Err(e) = resume(child.id()) {
        return Err(fail(&mut child, format!("cannot resume the command ({e})")));
    }
    Ok((job, child))
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

/// Waits (at most `limit`) until the job has no process left.
fn job_empty_within(job: &Job, limit: Duration) -> bool {
    let until = lease_clock() + limit;
    loop {
        if job.active() == Some(0) {
            return true;
        }
        if lease_clock() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Takes in one renewal's answer; `true` when the lease is lost (another
/// holder, or released by someone else) and the job must be stopped.
fn renewal_lost(
    renewer: &mut Renewer,
    renewals: &mut u64,
    began: Duration,
    result: Result<Renew>,
) -> bool {
    match result {
        Ok(Renew::Renewed { .. }) => {
            renewer.confirmed(began);
            *renewals += 1;
            false
        }
        Ok(Renew::NotOwner { holder, .. }) => {
            Renewer::report_lost(&holder);
            true
        }
        Ok(Renew::NotHeld { .. }) => {
            eprintln!(
                "skill-lock run: the lock was released by someone else; stopping the command and everything it started"
            );
            true
        }
        Err(e) => {
            renewer.report_failure(&e);
            false
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn supervise<S: Store + Clone + Send + 'static>(
    store: &S,
    key: &LockKey,
    token: &str,
    ttl: u64,
    began: Duration,
    job: &Job,
    mut child: std::process::Child,
    signals: Signals,
) -> Ran {
    let mut renewer = Renewer::new(ttl, began);
    let (tx, rx) = mpsc::channel();
    signals.forward(tx.clone(), Event::Signal);
    let waiter = tx.clone();
    std::thread::spawn(move || {
        let _ = waiter.send(Event::Exited(child.wait()));
    });
    let renew = renewal_worker(store, key, token, ttl, tx);
    let mut renewals = 0;
    let mut last_event = None;
    let (status, lost) = loop {
        let now = lease_clock();
        if now >= renewer.stop_at() {
            eprintln!(
                "skill-lock run: no renewal confirmed the lease, which ends in {} ms; stopping the command and everything it started",
                renewer.confirmed_end().saturating_sub(now).as_millis()
            );
            break (None, true);
        }
        if renewer.due(now) && renew.send(()).is_ok() {
            renewer.sent();
        }
        match rx.recv_timeout(renewer.sleep(now)) {
            Ok(Event::Signal(sig)) => last_event = Some(sig),
            Ok(Event::Exited(status)) => break (status.ok(), false),
            Ok(Event::Renewal { began, result }) => {
                if renewal_lost(&mut renewer, &mut renewals, began, result) {
                    break (None, true);
                }
            }
            Err(_) => {}
        }
    };
    drop(renew);
    if !lost && job.active().is_some_and(|n| n > 0) {
        eprintln!("skill-lock run: stopping what the command left running (in its Job Object)");
    }
    job.terminate(STOPPED_CODE);
    let settled = job_empty_within(job, Duration::from_secs(5));
    if !settled {
        eprintln!(
            "skill-lock run: processes of the command's Job Object survive termination; the lock stays held until they end"
        );
    }
    let released = settled
        && !lost
        && matches!(
            engine::release(store, key, Some(token), false, &Context::here()),
            Ok(engine::Release::Released { .. })
        );
    ran(status, lost, last_event, renewals, released)
}

/// The exit status and signal `run` reports: CMD's code (a code above 255
/// is reported as 1, never as a success modulo 256); 128+signal for a CMD
/// ended by a console event (the last one the wrapper saw; Ctrl-C when it
/// saw none) or stopped for a lost lease (SIGTERM).
fn ran(
    status: Option<ExitStatus>,
    lost: bool,
    last_event: Option<libc::c_int>,
    renewals: u64,
    released: bool,
) -> Ran {
    let code = status
        .and_then(|s| s.code())
        .map(|c| u32::from_ne_bytes(c.to_ne_bytes()));
    let signal = if lost {
        Some(signals::SIGTERM)
    } else if code == Some(STATUS_CONTROL_C_EXIT) {
        Some(last_event.unwrap_or(signals::SIGINT))
    } else {
        None
    };
    let exit_status = match (signal, code) {
        (Some(s), _) => signals::exit_status(s),
        (None, Some(c)) => u8::try_from(c).unwrap_or(1),
        (None, None) => 1,
    };
    Ran {
        exit_status,
        signal,
        lost,
        renewals,
        released,
    }
}

/// Starts the thread that renews on request (one request, one attempt) and
/// posts each result with the moment it began.
fn renewal_worker<S: Store + Clone + Send + 'static>(
    store: &S,
    key: &LockKey,
    token: &str,
    ttl: u64,
    events: mpsc::Sender<Event>,
) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
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
