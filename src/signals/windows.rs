//! Windows: the console control events, in the place of SIGINT, SIGTERM
//! and SIGHUP (SPEC §2.7, §10).
//!
//! [`block`] installs one `SetConsoleCtrlHandler` routine that queues each
//! event as the signal number it stands for and tells Windows it was
//! handled (so the wrapper lives on to stop its command and release). The
//! mapping, reported as 128+number like a Unix signal:
//!
//! - Ctrl-C (`CTRL_C_EVENT`) is SIGINT, 2 (exit 130);
//! - Ctrl-Break (`CTRL_BREAK_EVENT`) is SIGBREAK, 21, the number the C
//!   runtime of Windows gives it (exit 149);
//! - closing the console, logoff and shutdown (`CTRL_CLOSE_EVENT`,
//!   `CTRL_LOGOFF_EVENT`, `CTRL_SHUTDOWN_EVENT`) are SIGHUP, 1 (exit 129),
//!   as a hang-up of the terminal is on Unix.
//!
//! The command shares the console, so it gets the same event itself from
//! Windows; nothing needs forwarding.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

use windows_sys::Win32::System::Console::{
    CTRL_BREAK_EVENT, CTRL_C_EVENT, CTRL_CLOSE_EVENT, CTRL_LOGOFF_EVENT, CTRL_SHUTDOWN_EVENT,
    SetConsoleCtrlHandler,
};

/// Ctrl-C.
pub(crate) const SIGINT: libc::c_int = 2;
/// Ctrl-Break (the C runtime's SIGBREAK).
pub(crate) const SIGBREAK: libc::c_int = 21;
/// The console closed, logoff, shutdown.
pub(crate) const SIGHUP: libc::c_int = 1;
/// What a lost lease stops the command with (reported as 128+15).
pub(crate) const SIGTERM: libc::c_int = 15;

static QUEUE: Mutex<VecDeque<libc::c_int>> = Mutex::new(VecDeque::new());
static ARRIVED: Condvar = Condvar::new();

unsafe extern "system" fn on_event(event: u32) -> windows_sys::core::BOOL {
    let sig = match event {
        CTRL_C_EVENT => SIGINT,
        CTRL_BREAK_EVENT => SIGBREAK,
        CTRL_CLOSE_EVENT | CTRL_LOGOFF_EVENT | CTRL_SHUTDOWN_EVENT => SIGHUP,
        _ => return 0,
    };
    if let Ok(mut q) = QUEUE.lock() {
        q.push_back(sig);
        ARRIVED.notify_all();
    }
    1
}

/// Installs the handler: from now on the events are queued, not fatal.
pub(crate) fn block() {
    // SAFETY: a valid handler routine for the life of the process.
    unsafe {
        SetConsoleCtrlHandler(Some(on_event), 1);
    }
}

/// Waits for one queued event (blocking the calling thread).
pub(super) fn wait_one() -> Option<libc::c_int> {
    let mut q = QUEUE.lock().ok()?;
    loop {
        if let Some(sig) = q.pop_front() {
            return Some(sig);
        }
        q = ARRIVED.wait(q).ok()?;
    }
}

/// The name of an event's signal, for messages.
#[must_use]
pub(crate) fn name(sig: libc::c_int) -> &'static str {
    match sig {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGBREAK => "SIGBREAK (Ctrl-Break)",
        SIGHUP => "SIGHUP (console closed)",
        SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
