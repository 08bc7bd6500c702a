//! `run` (SPEC §2.7): the command-wrapper mode of flock(1) for callers with a
//! stable pid.
//!
//! Acquires with this process's pid as owner pid, runs CMD with inherited
//! stdio (and `SKILL_LOCK_TOKEN`/`SKILL_LOCK_FENCE` in its environment, so it
//! can `check` and fence its writes), renews with the token every ttl/3,
//! forwards SIGINT/SIGTERM/SIGHUP, releases when CMD ends, and exits with
//! CMD's status (128+signal when a signal ended it). If a renewal finds the
//! lease lost, it says so on stderr and sends SIGTERM to CMD. If this process
//! is SIGKILLed, its pid is dead, so the lock is stale at once for the next
//! acquirer on this host; on Linux CMD also gets SIGTERM then (parent-death
//! signal), so it never goes on writing unprotected.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::engine::{self, Context, Renew};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::store::Store;

/// The signals `run` forwards to CMD.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// How a wrapped command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// The status `run` exits with: CMD's code, or 128+signal.
    pub exit_status: u8,
    /// The signal that ended CMD, if any.
    pub signal: Option<i32>,
    /// A renewal found the lease lost (CMD was sent SIGTERM).
    pub lost: bool,
    /// Successful renewals.
    pub renewals: u64,
    /// The lock was released at the end (false when it had been lost).
    pub released: bool,
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut set);
        for s in FORWARDED {
            libc::sigaddset(&raw mut set, s);
        }
        set
    }
}

/// Blocks the forwarded signals in this thread (and every thread it starts
/// later), so that only the forwarding thread receives them. The child
/// unblocks them again before exec.
fn block_signals() {
    let set = signal_set();
    // SAFETY: valid set; null old-set pointer is allowed.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
    }
}

/// Waits for a forwarded signal; returns it and whether a process sent it
/// (a terminal's signal already reached CMD, which shares our process group).
fn wait_signal() -> Option<(libc::c_int, bool)> {
    let set = signal_set();
    #[cfg(target_os = "linux")]
    {
        // SAFETY: siginfo_t is plain data, filled in by sigwaitinfo.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid set and out-pointer.
        let sig = unsafe { libc::sigwaitinfo(&raw const set, &raw mut info) };
        if sig < 0 {
            return None;
        }
        Some((sig, info.si_code <= 0))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut sig: libc::c_int = 0;
        // SAFETY: valid set and out-pointer.
        if unsafe { libc::sigwait(&raw const set, &raw mut sig) } != 0 {
            return None;
        }
        Some((sig, true))
    }
}

fn send(pid: i32, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: plain kill(2) on our own child.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Prepares signal handling; call before any other thread is started.
pub fn prepare() {
    block_signals();
}

/// Runs `cmd` while holding the lock acquired with `token` (SPEC §2.7).
///
/// # Errors
/// [`Error::Usage`] when CMD cannot be started (the lock is released first).
pub fn supervise<S: Store + Clone + Send + 'static>(
    store: &S,
    key: &LockKey,
    token: &str,
    fence: u64,
    ttl: u64,
    cmd: &[OsString],
) -> Result<Ran> {
    let child_pid = Arc::new(AtomicI32::new(0));
    let pending = Arc::new(AtomicI32::new(0));
    {
        let (child_pid, pending) = (Arc::clone(&child_pid), Arc::clone(&pending));
        std::thread::spawn(move || {
            while let Some((sig, from_process)) = wait_signal() {
                let pid = child_pid.load(Ordering::SeqCst);
                if pid == 0 {
                    pending.store(sig, Ordering::SeqCst);
                } else if from_process {
                    send(pid, sig);
                }
            }
        });
    }
    let Some((program, args)) = cmd.split_first() else {
        return Err(Error::Usage("run needs a command after --".into()));
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env("SKILL_LOCK_TOKEN", token)
        .env("SKILL_LOCK_FENCE", fence.to_string());
    let set = signal_set();
    // SAFETY: only async-signal-safe calls between fork and exec: restore
    // the signal mask we blocked, and (Linux) ask for SIGTERM when this
    // process dies.
    unsafe {
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut());
            #[cfg(target_os = "linux")]
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0);
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = engine::release(store, key, Some(token), false, &Context::here());
            return Err(Error::Usage(format!(
                "cannot run {}: {e}; check the command name and PATH",
                program.to_string_lossy()
            )));
        }
    };
    let pid = i32::try_from(child.id()).unwrap_or(0);
    child_pid.store(pid, Ordering::SeqCst);
    let early = pending.swap(0, Ordering::SeqCst);
    if early != 0 {
        send(pid, early);
    }

    // Renewal every ttl/3 until CMD ends.
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let renewer = {
        let (store, key, token) = (store.clone(), key.clone(), token.to_owned());
        std::thread::spawn(move || {
            let every = Duration::from_millis((ttl * 1000 / 3).max(100));
            let mut renewals = 0u64;
            loop {
                match stop_rx.recv_timeout(every) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return (renewals, false),
                }
                match engine::renew(&store, &key, Some(&token), Some(ttl), &Context::here()) {
                    Ok(Renew::Renewed { .. }) => renewals += 1,
                    Ok(Renew::NotOwner { holder }) => {
                        eprintln!(
                            "skill-lock run: the lease was lost (now held by {} pid {:?}, fence {}); stopping the command",
                            holder.host, holder.owner_pid, holder.fence
                        );
                        send(pid, libc::SIGTERM);
                        return (renewals, true);
                    }
                    Ok(Renew::NotHeld { .. }) => {
                        eprintln!(
                            "skill-lock run: the lock was released by someone else; stopping the command"
                        );
                        send(pid, libc::SIGTERM);
                        return (renewals, true);
                    }
                    Err(e) => eprintln!("skill-lock run: renewal failed ({e}); will retry"),
                }
            }
        })
    };
    let status = child.wait();
    let _ = stop_tx.send(());
    let (renewals, lost) = renewer.join().unwrap_or((0, false));
    let status =
        status.map_err(|e| Error::Internal(format!("waiting for the command failed: {e}")))?;
    let released = matches!(
        engine::release(store, key, Some(token), false, &Context::here()),
        Ok(engine::Release::Released { .. })
    );
    let signal = status.signal();
    let exit_status = match (status.code(), signal) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(s)) => u8::try_from((128 + s) & 0xff).unwrap_or(1),
        (None, None) => 1,
    };
    Ok(Ran {
        exit_status,
        signal,
        lost,
        renewals,
        released,
    })
}
