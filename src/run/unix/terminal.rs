//! The terminal lent to CMD while it runs: when `run` is the foreground of
//! the terminal on its stdin, CMD's process group is made the foreground
//! instead (as a shell does for a job), and `run`'s own group gets it back
//! once CMD's processes are gone. Invariant: CMD never reads the terminal
//! from the background (so it is never stopped by SIGTTIN), and the
//! terminal is handed back however `run` ends short of SIGKILL.

/// The terminal lent to CMD's group while it runs: when `run` is in the
/// foreground of the terminal on its stdin, CMD's group is made the
/// foreground instead (as a shell does for a job, in the child before exec
/// so CMD never reads from the background), so CMD can read the terminal
/// and Ctrl-C reaches the group directly. Given back on drop.
pub(crate) struct Terminal(libc::pid_t);

impl Terminal {
    /// Our group, when it is the foreground of the terminal on stdin.
    pub(crate) fn ours_in_foreground() -> Option<Self> {
        // SAFETY: plain calls on fd 0, which may or may not be a terminal.
        unsafe {
            let ours = libc::getpgrp();
            (libc::isatty(0) == 1 && libc::tcgetpgrp(0) == ours).then_some(Self(ours))
        }
    }
}

/// Makes `pgid` the foreground of the terminal on fd 0 with SIGTTOU
/// blocked meanwhile (a background group may then do it); async-signal-safe.
pub(crate) fn set_foreground(pgid: libc::pid_t) {
    // SAFETY: a valid signal set; sigemptyset, sigaddset, pthread_sigmask
    // and tcsetpgrp are async-signal-safe.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, &raw mut old);
        libc::tcsetpgrp(0, pgid);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, std::ptr::null_mut());
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        set_foreground(self.0);
    }
}
