//! Windows: the console control events, in the place of SIGINT, SIGTERM
//! and SIGHUP (SPEC §2.7, §10).
//!
//! [`super::block`] installs one `SetConsoleCtrlHandler` routine that queues each
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
use std::process::{Command, ExitStatus};
use std::sync::{Condvar, Mutex};

use windows_sys::Win32::System::Console::{
    CTRL_BREAK_EVENT, CTRL_C_EVENT, CTRL_CLOSE_EVENT, CTRL_LOGOFF_EVENT, CTRL_SHUTDOWN_EVENT,
    SetConsoleCtrlHandler,
};

/// Ctrl-C.
const SIGINT: libc::c_int = 2;
/// Ctrl-Break (the C runtime's SIGBREAK).
const SIGBREAK: libc::c_int = 21;
/// The console closed, logoff, shutdown.
const SIGHUP: libc::c_int = 1;

/// The exit code of a process ended by Ctrl-C or Ctrl-Break.
const STATUS_CONTROL_C_EXIT: u32 = 0xC000_013A;

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

/// Windows's console events.
pub(super) struct Os;

impl super::Platform for Os {
    /// Reported as 128+15, as on Unix.
    const SIGTERM: libc::c_int = 15;

    /// Installs the handler: from now on the events are queued, not fatal.
    fn block() {
        // SAFETY: a valid handler routine for the life of the process.
        unsafe {
            SetConsoleCtrlHandler(Some(on_event), 1);
        }
    }

    /// Waits for one queued event.
    fn wait_one() -> Option<libc::c_int> {
        let mut q = QUEUE.lock().ok()?;
        loop {
            if let Some(sig) = q.pop_front() {
                return Some(sig);
            }
            q = ARRIVED.wait(q).ok()?;
        }
    }

    fn name(sig: libc::c_int) -> &'static str {
        match sig {
            SIGINT => "SIGINT (Ctrl-C)",
            SIGBREAK => "SIGBREAK (Ctrl-Break)",
            SIGHUP => "SIGHUP (console closed)",
            Self::SIGTERM => "SIGTERM",
            _ => "a signal",
        }
    }

    /// Nothing to restore: a console handler is not inherited, and the
    /// child shares the console (it gets every event from Windows itself).
    fn restore_in_child(_cmd: &mut Command) {}

    /// The code (one above 255 is reported as 1, never as a success
    /// modulo 256), or the console event that ended the process (the last
    /// one `run` saw; Ctrl-C when it saw none).
    fn ended(
        status: ExitStatus,
        last_signal: Option<libc::c_int>,
    ) -> (Option<u8>, Option<libc::c_int>) {
        let code = status.code().map(|c| u32::from_ne_bytes(c.to_ne_bytes()));
        match code {
            Some(STATUS_CONTROL_C_EXIT) => (None, Some(last_signal.unwrap_or(SIGINT))),
            Some(c) => (Some(u8::try_from(c).unwrap_or(1)), None),
            None => (None, None),
        }
    }
}
