//! The exact reader of a file lock (SPEC §7 "Atomic records", "Honest
//! readers"): it takes no guard, yet never reports a healthy lock corrupt
//! and never sees a lock free while it passes from one holder to the next.
//!
//! The lock directory is opened first (through the `locks/` handle, no link
//! followed) and its record relative to that handle, so both looks see the
//! same directory. A directory with no record is believed only while that
//! very directory is still the lock (a published lock always has its
//! record); when it was moved away in between (a release or takeover), the
//! reader looks again. Anything that is not a directory holding a regular
//! file is `corrupt`, never followed and never waited on.

use std::ffi::{OsStr, OsString};
use std::fs::File;

use super::dir::{Dir, Misfit, Open, read_bounded};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::record::{MAX_RECORD_BYTES, OwnerRecord};
use crate::store::{Current, Seen};

/// The record's name inside a lock directory.
pub(super) const RECORD: &str = "owner.json";
/// What ends the name of a lock directory, `locks/<stem>.lock`.
pub(super) const LOCK_SUFFIX: &str = ".lock";
/// How often a reader looks again when the lock changed under it.
const MAX_LOOKS: u32 = 1000;

/// The name of `key`'s lock directory in `locks/`.
pub(super) fn lock_name(key: &LockKey) -> OsString {
    OsString::from(format!("{}{LOCK_SUFFIX}", key.file_stem()))
}

fn not_a(dir: &Dir, name: &OsStr, what: &str) -> Current {
    Current::Corrupt(format!("{} is not a {what}", dir.join(name).display()))
}

/// Reads lock directory `name` in `locks`, exactly.
///
/// # Errors
/// [`Error::Io`] when the layer cannot be read.
///
/// The common case, a lock directory holding its record, is one `openat2`
/// lookup (no link on the way, nothing outside `locks/`): the file found is
/// the complete record of a lock that was at that path during the lookup,
/// which is all a reader needs. Anything else is looked at step by step.
pub(super) fn lock_dir(locks: &Dir, name: &OsStr) -> Result<Current> {
    if let Some(rel) = name.to_str().map(|n| format!("{n}/{RECORD}"))
        && let Some((file, len)) = locks.file_beneath(&rel)
    {
        return record(file, len, &locks.join(&rel));
    }
    lock_dir_with(locks, name, &mut || {})
}

/// [`lock_dir`], running `between` after the directory is opened and before
/// its record is (tests put a release or takeover there).
pub(super) fn lock_dir_with(
    locks: &Dir,
    name: &OsStr,
    between: &mut dyn FnMut(),
) -> Result<Current> {
    for _ in 0..MAX_LOOKS {
        let dir = match locks.dir_plain(name) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(Current::Free),
            // A file, a link or a special file where the lock belongs; gone
            // meanwhile (a release): look again.
            Err(Misfit::NotADirectory | Misfit::NotAFile(_)) => {
                if locks.stat_at(name)?.is_none() {
                    continue;
                }
                return Ok(not_a(locks, name, "directory"));
            }
            Err(Misfit::Io(e)) => return Err(Error::io("read", locks.join(name), e)),
        };
        between();
        let file = match dir.file_plain(OsStr::new(RECORD), Open::Read) {
            Ok(Some(f)) => f,
            Ok(None) => {
                if locks.still_is(name, &dir)? {
                    return Ok(Current::Corrupt(
                        "the lock directory holds no record".to_owned(),
                    ));
                }
                continue;
            }
            Err(Misfit::NotAFile(_) | Misfit::NotADirectory) => {
                return Ok(not_a(&dir, OsStr::new(RECORD), "file"));
            }
            Err(Misfit::Io(e)) => return Err(Error::io("read", dir.join(RECORD), e)),
        };
        let (file, len) = file;
        return record(file, len, &dir.join(RECORD));
    }
    Err(Error::io(
        "read",
        locks.join(name),
        std::io::Error::other(format!(
            "the lock changed {MAX_LOOKS} times while it was being read; try again"
        )),
    ))
}

/// Reads the open record file `file` (at `path`, named in messages): at
/// most one byte past the largest record, so a huge one shows too big.
///
/// # Errors
/// [`Error::Io`] when it cannot be read.
fn record(file: File, len: u64, path: &std::path::Path) -> Result<Current> {
    let bytes =
        read_bounded(file, len, MAX_RECORD_BYTES + 1).map_err(|e| Error::io("read", path, e))?;
    Ok(match OwnerRecord::parse(&bytes) {
        Ok(r) => Current::Held(Seen::recorded(r)),
        Err(why) => Current::Corrupt(why),
    })
}
