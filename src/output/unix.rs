//! Whether standard output was closed at start, on Unix.

use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// Was standard output closed when the process started? Rust's runtime
/// puts `/dev/null`, opened read-write, on a standard stream that was
/// closed (so that no file the process opens lands there, and writes
/// "succeed"); a shell's `>/dev/null` opens it write-only. So `/dev/null`
/// open read-write on fd 1 means "closed", and a result written there
/// reaches nobody.
pub(super) fn stdout_closed() -> bool {
    // SAFETY: fd 1 stays open for the whole process (the runtime made
    // sure of that); it is only borrowed for the two calls below.
    let fd = unsafe { BorrowedFd::borrow_raw(1) };
    let Ok(flags) = rustix::fs::fcntl_getfl(fd) else {
        return true; // no fd 1 at all
    };
    if flags & rustix::fs::OFlags::RWMODE != rustix::fs::OFlags::RDWR {
        return false;
    }
    let Ok(out) = fd.try_clone_to_owned().map(std::fs::File::from) else {
        return false;
    };
    let (Ok(out), Ok(null)) = (out.metadata(), std::fs::metadata("/dev/null")) else {
        return false;
    };
    out.file_type().is_char_device()
        && null.file_type().is_char_device()
        && out.rdev() == null.rdev()
}
