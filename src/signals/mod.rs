//! The signals `run` handles (SPEC §2.7): SIGINT, SIGTERM and SIGHUP on
//! Unix, the console control events standing for them on Windows.
//!
//! [`block`] takes them over before any other thread starts (Unix: blocks
//! them, so every later thread inherits the mask and no handler ever runs;
//! Windows: installs the console handler that queues them);
//! [`Signals::listen`] starts the one thread that takes them one by one and
//! hands them over a channel, so the `--wait` loop and the supervisor wait
//! for "a signal, or this much time" with `recv_timeout` (portable: macOS
//! has no `sigtimedwait`). [`restore_in_child`] gives them back to CMD at
//! their defaults, and [`ended`] reads a process's end as a code or a
//! signal. What differs by platform is the [`Platform`] trait, implemented
//! in `unix.rs` and `windows.rs`: callers reach it only through the
//! functions here.

use std::process::{Command, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

per_os!();

use sys::Os;

/// What each platform provides, checked by the compiler on both.
trait Platform {
    /// What a lost lease stops the command with.
    const SIGTERM: libc::c_int;
    /// Takes the signals over in this thread and every later one.
    fn block();
    /// Waits for one signal taken over (blocking the calling thread).
    fn wait_one() -> Option<libc::c_int>;
    /// The name of a signal taken over, for messages.
    fn name(sig: libc::c_int) -> &'static str;
    /// Readies `cmd` so that the child gets the signals back at their
    /// defaults.
    fn restore_in_child(cmd: &mut Command);
    /// A process's code (one byte, never a success where it failed), or
    /// the signal that ended it; `last_signal` is the last one `run` took.
    fn ended(
        status: ExitStatus,
        last_signal: Option<libc::c_int>,
    ) -> (Option<u8>, Option<libc::c_int>);
}

/// Terminate; what a lost lease stops the command with.
pub(crate) const SIGTERM: libc::c_int = Os::SIGTERM;

/// Takes the signals over: call before any other thread exists.
pub(crate) fn block() {
    Os::block();
}

/// The name of a signal (console event), for messages.
#[must_use]
pub(crate) fn name(sig: libc::c_int) -> &'static str {
    Os::name(sig)
}

/// Readies `cmd` so that the process it starts gets the signals back at
/// their defaults (Unix: unblocked between fork and exec, since a child
/// inherits the blocked mask; Windows: a console handler is not inherited).
pub(crate) fn restore_in_child(cmd: &mut Command) {
    Os::restore_in_child(cmd);
}

/// CMD's exit code, or the signal (console event) that ended it; what a
/// process's end means for `run`'s exit status.
#[must_use]
pub(crate) fn ended(
    status: ExitStatus,
    last_signal: Option<libc::c_int>,
) -> (Option<u8>, Option<libc::c_int>) {
    Os::ended(status, last_signal)
}

/// The receiving end of the signals taken by the listening thread.
#[derive(Debug)]
pub(crate) struct Signals {
    rx: mpsc::Receiver<libc::c_int>,
}

impl Signals {
    /// Starts the thread that takes the signals over ([`block`] first).
    #[must_use]
    pub(crate) fn listen() -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            while let Some(sig) = Os::wait_one() {
                if tx.send(sig).is_err() {
                    return;
                }
            }
        });
        Self { rx }
    }

    /// Waits up to `timeout` for a signal; `None` when none came.
    #[must_use]
    pub(crate) fn next(&self, timeout: Duration) -> Option<libc::c_int> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Hands every later signal to `tx` as `wrap(signal)`, from a thread of
    /// its own (so one channel carries signals and other events alike).
    pub(crate) fn forward<T: Send + 'static>(
        self,
        tx: mpsc::Sender<T>,
        wrap: fn(libc::c_int) -> T,
    ) {
        std::thread::spawn(move || {
            while let Ok(sig) = self.rx.recv() {
                if tx.send(wrap(sig)).is_err() {
                    return;
                }
            }
        });
    }
}

/// The exit status of a process a signal (console event) ended, or of
/// `run` that one interrupted: 128 + the signal's number, the shell's
/// convention. The one place it is computed.
#[must_use]
pub(crate) fn exit_status(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig.clamp(0, 127)).unwrap_or(u8::MAX)
}
