//! Bounded reads (SPEC §5 "Trust", §7 "Hostile layers"): every file the
//! tool reads whole is read with a limit, so a planted endless or huge file
//! costs one bounded read, and a FIFO or a device is refused, never waited on.
//! A leaf: the personal layer, the file store and the etcd store's TLS files
//! all read through it.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// Reads at most `limit` bytes of the regular file `file` of size `size`
/// (from the `fstat` that checked it): exactly its size when that is smaller (one read, no read for the end of file: a file of
/// the layer is replaced by rename, never written in place, so its size is
/// final), else `limit` bytes.
///
/// # Errors
/// The OS error.
pub(crate) fn read_bounded(mut file: File, size: u64, limit: usize) -> std::io::Result<Vec<u8>> {
    let want = usize::try_from(size).unwrap_or(usize::MAX).min(limit);
    let mut bytes = vec![0u8; want];
    let mut got = 0;
    while let Some(rest) = bytes.get_mut(got..).filter(|r| !r.is_empty()) {
        match file.read(rest) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    bytes.truncate(got);
    Ok(bytes)
}

/// Reads a file that must be a regular file of at most `limit` bytes, named
/// by the user or by git (a worktree's `.git`, a TLS certificate): never
/// blocking (a FIFO or a device is refused at once, never waited on) and
/// never reading more than `limit` (an endless file is refused).
///
/// # Errors
/// [`Error::Io`] naming the file when it cannot be opened, is not a regular
/// file, or is larger than `limit`.
pub(crate) fn read_regular(path: &Path, limit: usize) -> Result<Vec<u8>> {
    let mut open = std::fs::OpenOptions::new();
    open.read(true);
    sys::never_block(&mut open);
    let file = open.open(path).map_err(|e| Error::io("read", path, e))?;
    let meta = file.metadata().map_err(|e| Error::io("read", path, e))?;
    let refuse = |why: String| Error::io("read", path, std::io::Error::other(why));
    if !meta.is_file() {
        return Err(refuse("it is not a regular file".into()));
    }
    let bytes = read_bounded(file, meta.len(), limit.saturating_add(1))
        .map_err(|e| Error::io("read", path, e))?;
    if bytes.len() > limit {
        return Err(refuse(format!("it is larger than {limit} bytes")));
    }
    Ok(bytes)
}

/// How a file named by the user is opened so that it never blocks.
#[cfg(unix)]
mod sys {
    /// Non-blocking: a FIFO or a device never holds the open.
    pub(super) fn never_block(open: &mut std::fs::OpenOptions) {
        std::os::unix::fs::OpenOptionsExt::custom_flags(open, libc::O_NONBLOCK);
    }
}

/// How a file named by the user is opened so that it never blocks.
#[cfg(windows)]
mod sys {
    /// Nothing to set: a named pipe is not reachable by a plain path, and
    /// the type is checked before anything is read.
    pub(super) fn never_block(_open: &mut std::fs::OpenOptions) {}
}
