//! Unix: the forwarded signals blocked in every thread and taken with
//! `sigwait`.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus};

/// The signals `run` takes over and forwards to its command's tree.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn set() -> libc::sigset_t {
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

/// Unix's signals.
pub(super) struct Os;

impl super::Platform for Os {
    const SIGTERM: libc::c_int = libc::SIGTERM;

    /// Blocks the forwarded signals in this thread and every thread it
    /// starts later.
    fn block() {
        let set = set();
        // SAFETY: valid set; a null old-set pointer is allowed.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
        }
    }

    /// `sigwait` for one of the blocked signals.
    fn wait_one() -> Option<libc::c_int> {
        let set = set();
        let mut sig: libc::c_int = 0;
        // SAFETY: valid set and out-pointer.
        (unsafe { libc::sigwait(&raw const set, &raw mut sig) } == 0).then_some(sig)
    }

    fn name(sig: libc::c_int) -> &'static str {
        match sig {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            libc::SIGKILL => "SIGKILL",
            _ => "a signal",
        }
    }

    /// Unblocks the forwarded signals between fork and exec (a child must
    /// not inherit the wrapper's blocked mask).
    fn restore_in_child(cmd: &mut Command) {
        let set = set();
        // SAFETY: pthread_sigmask, with a set made before the fork, is
        // async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut());
                Ok(())
            });
        }
    }

    /// The code's low 8 bits, or the signal that ended the process.
    fn ended(
        status: ExitStatus,
        _last_signal: Option<libc::c_int>,
    ) -> (Option<u8>, Option<libc::c_int>) {
        let code = status.code().map(|c| u8::try_from(c & 0xff).unwrap_or(1));
        (code, status.signal())
    }
}
