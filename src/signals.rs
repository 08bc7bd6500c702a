//! The signals `run` handles (SPEC §2.7): SIGINT, SIGTERM and SIGHUP.
//!
//! [`block`] blocks them in the calling thread before any other thread
//! starts, so every later thread inherits the mask and no handler ever runs;
//! [`Signals::listen`] starts the one thread that takes them with `sigwait`
//! and hands them over a channel, so the `--wait` loop and the supervisor
//! wait for "a signal, or this much time" with `recv_timeout` (portable:
//! macOS has no `sigtimedwait`). [`send_group`] delivers a signal to a
//! whole process group. A child started by `run` unblocks the set again in
//! [`unblock_in_child`] before exec.

use std::sync::mpsc;
use std::time::Duration;

/// The signals `run` takes over and forwards to its command's group.
pub const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

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
pub fn block() {
    let set = set();
    // SAFETY: valid set; a null old-set pointer is allowed.
    unsafe {
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
    }
}

/// Unblocks the forwarded signals; async-signal-safe, for use between fork
/// and exec (a child must not inherit the wrapper's blocked mask).
pub fn unblock_in_child() {
    let set = set();
    // SAFETY: valid set; pthread_sigmask is async-signal-safe.
    unsafe {
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &raw const set, std::ptr::null_mut());
    }
}

/// Waits for one of the blocked signals (blocking the calling thread).
fn wait_one() -> Option<libc::c_int> {
    let set = set();
    let mut sig: libc::c_int = 0;
    // SAFETY: valid set and out-pointer.
    (unsafe { libc::sigwait(&raw const set, &raw mut sig) } == 0).then_some(sig)
}

/// The receiving end of the signals taken by the listening thread.
#[derive(Debug)]
pub struct Signals {
    rx: mpsc::Receiver<libc::c_int>,
}

impl Signals {
    /// Starts the thread that takes the blocked signals ([`block`] first).
    #[must_use]
    pub fn listen() -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            while let Some(sig) = wait_one() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
        Self { rx }
    }

    /// Waits up to `timeout` for a signal; `None` when none came.
    #[must_use]
    pub fn next(&self, timeout: Duration) -> Option<libc::c_int> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Hands every later signal to `tx` as `wrap(signal)`, from a thread of
    /// its own (so one channel carries signals and other events alike).
    pub fn forward<T: Send + 'static>(self, tx: mpsc::Sender<T>, wrap: fn(libc::c_int) -> T) {
        std::thread::spawn(move || {
            while let Ok(sig) = self.rx.recv() {
                if tx.send(wrap(sig)).is_err() {
                    return;
                }
            }
        });
    }
}

/// Sends `sig` to every process of group `pgid`; false when none is left.
#[allow(
    clippy::must_use_candidate,
    reason = "most callers signal a group that may be gone already"
)]
pub fn send_group(pgid: u32, sig: libc::c_int) -> bool {
    match libc::pid_t::try_from(pgid) {
        // SAFETY: kill(2) of a process group this process started.
        Ok(raw) if raw > 1 => unsafe { libc::kill(-raw, sig) == 0 },
        _ => false,
    }
}

/// The exit status of a process a signal ended (or of `run` that such a
/// signal interrupted): 128 + the signal's number, the shell's convention.
/// The one place it is computed.
#[must_use]
pub fn exit_status(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// The name of a forwarded signal, for messages.
#[must_use]
pub fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGKILL => "SIGKILL",
        _ => "a signal",
    }
}
