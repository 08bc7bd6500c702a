//! Quoting for the user's shell (POSIX sh; PowerShell and cmd on Windows):
//! every command line this tool prints (a hint, the fix an error message
//! names) pastes back as the same words.
//! A leaf module, so that the stores' messages need nothing of the hints.
//!
//! The quoting itself is per OS, with the same two functions on both:
//! `unix.rs` (POSIX sh, any bytes back through `printf`) and `windows.rs`
//! (PowerShell and cmd).

per_os!();

pub(crate) use sys::{quote, quote_os};
