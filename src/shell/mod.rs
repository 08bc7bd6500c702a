//! Quoting for the user's shell (POSIX sh; PowerShell and cmd on Windows):
//! every command line this tool prints (a hint, the fix an error message
//! names) pastes back as the same words.
//! A leaf module, so that the stores' messages need nothing of the hints.
//!
//! The quoting itself is per OS, the [`Platform`] trait: `unix.rs` (POSIX
//! sh, any bytes back through `printf`) and `windows.rs` (PowerShell and
//! cmd).

use std::ffi::OsStr;

per_os!();

use sys::Os;

/// What each platform's quoting provides, checked by the compiler on both.
trait Platform {
    /// Quotes `s` (left bare when it only has safe characters).
    fn quote(s: &str) -> String;
    /// Quotes `s`, whatever its bytes, as one word on one line.
    fn quote_os(s: &OsStr) -> String;
}

/// Quotes `s` for the user's shell (left bare when it only has safe
/// characters).
#[must_use]
pub(crate) fn quote(s: &str) -> String {
    Os::quote(s)
}

/// Quotes `s`, whatever its bytes, for the user's shell, as one word on
/// one line of text that a terminal only displays.
#[must_use]
pub(crate) fn quote_os(s: &OsStr) -> String {
    Os::quote_os(s)
}
