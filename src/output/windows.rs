//! Whether standard output was closed at start, on Windows.

use windows_sys::Win32::Foundation::INVALID_HANDLE_VALUE;
use windows_sys::Win32::System::Console::{GetStdHandle, STD_OUTPUT_HANDLE};

/// Was the process started without a standard output handle? (Rust's
/// runtime then drops what is written there, as if it were written.)
pub(super) fn stdout_closed() -> bool {
    // SAFETY: GetStdHandle has no preconditions.
    let h = unsafe { GetStdHandle(STD_OUTPUT_HANDLE) };
    h.is_null() || h == INVALID_HANDLE_VALUE
}
