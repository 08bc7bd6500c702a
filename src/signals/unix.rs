//! Unix: the forwarded signals blocked in every thread and taken with
//! `sigwait`.

/// Terminate; what a lost lease stops the command with.
pub(crate) const SIGTERM: libc::c_int = libc::SIGTERM;

/// The signals `run` takes over and forwards to its command's group.
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

/// Blocks the forwarded signals in this thread and every thread it starts
/// later. Call before any other thread exists.
pub(crate) fn block() {
    let set = set();
    // SAFETY: valid set; a null old-set pointer is allowed.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
    }
}

/// Unblocks the forwarded signals; async-signal-safe, for use between fork
/// and exec (a child must not inherit the wrapper's blocked mask).
pub(crate) fn unblock_in_child() {
    let set = set();
    // SAFETY: valid set; pthread_sigmask is async-signal-safe.
    unsafe {
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut());
    }
}

/// Waits for one of the blocked signals (blocking the calling thread).
pub(super) fn wait_one() -> Option<libc::c_int> {
    let set = set();
    let mut sig: libc::c_int = 0;
    // SAFETY: valid set and out-pointer.
    (unsafe { libc::sigwait(&raw const set, &raw mut sig) } == 0).then_some(sig)
}

/// Sends `sig` to every process of group `pgid`; false when none is left.
#[allow(
    clippy::must_use_candidate,
    reason = "most callers signal a group that may be gone already"
)]
pub(crate) fn send_group(pgid: u32, sig: libc::c_int) -> bool {
    match libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) of a process group this process started.
        Ok(raw) if raw > 1 => unsafe { libc::kill(-raw, sig) == 0 },
        _ => false,
    }
}

/// The name of a forwarded signal, for messages.
#[must_use]
pub(crate) fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGKILL => "SIGKILL",
        _ => "a signal",
    }
}
