//! The signals `run` handles (SPEC §2.7): SIGINT, SIGTERM and SIGHUP on
//! Unix, the console control events standing for them on Windows.
//!
//! [`block`] takes them over before any other thread starts (Unix: blocks
//! them, so every later thread inherits the mask and no handler ever runs;
//! Windows: installs the console handler that queues them);
//! [`Signals::listen`] starts the one thread that takes them one by one and
//! hands them over a channel, so the `--wait` loop and the supervisor wait
//! for "a signal, or this much time" with `recv_timeout` (portable: macOS
//! has no `sigtimedwait`). What differs by platform, taking one signal and
//! naming it, is in `unix.rs` and `windows.rs`; Unix alone also signals a
//! process group and unblocks the set in a child before exec (for the
//! keeper: `unix::send_group`, `unix::unblock_in_child`), and Windows names
//! its console events (`windows::SIGINT`, `SIGBREAK`, `SIGHUP`).

use std::sync::mpsc;
use std::time::Duration;

per_os!(pub(crate));

pub(crate) use sys::{SIGTERM, block, name};

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
            while let Some(sig) = sys::wait_one() {
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
