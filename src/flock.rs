//! Bounded `flock` waits (SPEC §7 "Bounded waits"): no command waits more
//! than [`GUARD_WAIT`] for another process's critical section; it then
//! answers `store_unavailable` naming the process it waited for.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{Error, Result};

/// The longest wait for another process's critical section (SPEC §7).
const GUARD_WAIT: Duration = Duration::from_secs(10);

/// Takes an exclusive `flock` on `file`, waiting at most [`GUARD_WAIT`].
///
/// A process stopped inside its critical section costs others 10 s, never
/// forever. (A thread left blocked after a timeout lets go of the lock as
/// soon as it gets it.)
///
/// # Errors
/// [`Error::StoreUnavailable`] naming the process that holds it, after 10 s;
/// [`Error::Io`] when `flock` itself fails.
pub(crate) fn lock_bounded(file: &File, path: &Path) -> Result<()> {
    lock_bounded_as(file, path, false)
}

/// [`lock_bounded`], for a shared lock when `shared`.
///
/// # Errors
/// As [`lock_bounded`].
pub(crate) fn lock_bounded_as(file: &File, path: &Path, shared: bool) -> Result<()> {
    let attempt = |f: &File| {
        if shared {
            f.try_lock_shared()
        } else {
            f.try_lock()
        }
    };
    match attempt(file) {
        Ok(()) => return Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io("lock", path, e)),
    }
    // Busy: a helper thread blocks in flock on a second descriptor of the
    // same open file (so the kernel wakes it in turn, and the lock it takes
    // is ours), while we wait at most GUARD_WAIT for it. On timeout the
    // helper is told to let go: when its flock ever returns it closes its
    // descriptor, and once ours is closed too nothing holds the lock.
    let helper = file.try_clone().map_err(|e| Error::io("lock", path, e))?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    let told = Arc::clone(&cancelled);
    std::thread::Builder::new()
        .name("skill-lock-guard-wait".to_owned())
        .spawn(move || {
            let got = if shared {
                helper.lock_shared()
            } else {
                helper.lock()
            };
            if !told.load(Ordering::SeqCst) {
                let _ = tx.send(got);
            }
            drop(helper);
        })
        .map_err(|e| Error::io("lock", path, e))?;
    match rx.recv_timeout(GUARD_WAIT) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(Error::io("lock", path, e)),
        Err(_) => {
            cancelled.store(true, Ordering::SeqCst);
            Err(held_too_long(file, path))
        }
    }
}

fn held_too_long(file: &File, path: &Path) -> Error {
    let (who, what) = match sys::flock_holder(file) {
        Some(pid) => (
            format!("process {pid}{}", sys::process_name(pid)),
            format!("resume or end it (kill -CONT {pid}, or kill {pid})"),
        ),
        None => (
            "another process (its pid could not be found)".to_owned(),
            format!("find it (fuser -v {}) and resume or end it", path.display()),
        ),
    };
    Error::StoreUnavailable(format!(
        "{who} has held {} for more than {} s without finishing (stopped or hung?); \
         {what}, then try again",
        path.display(),
        GUARD_WAIT.as_secs()
    ))
}

/// Who holds a `flock`: Linux shows it in `/proc/locks` (in our pid
/// namespace); elsewhere it is unknown.
#[cfg(target_os = "linux")]
mod sys {
    use std::fs::File;

    /// The name of process `pid`, for messages (` (name)`, or nothing).
    pub(super) fn process_name(pid: u32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|n| format!(" ({})", n.trim()))
            .unwrap_or_default()
    }

    /// The pid holding a `flock` on `file`, from `/proc/locks`.
    pub(super) fn flock_holder(file: &File) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata().ok()?;
        let dev = meta.dev();
        // The kernel's (glibc's) encoding of a device number.
        let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
        let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
        let want = format!("{major:02x}:{minor:02x}:{}", meta.ino());
        let table = std::fs::read_to_string("/proc/locks").ok()?;
        table.lines().find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters have "->".
            (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
                .then(|| f.get(4)?.parse().ok())
                .flatten()
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::fs::File;

    /// Never asked: no holder is ever known here.
    pub(super) fn process_name(_pid: u32) -> String {
        String::new()
    }

    /// Unknown.
    pub(super) fn flock_holder(_file: &File) -> Option<u32> {
        None
    }
}
