//! `list` of the file store (SPEC §2.5): the names under `locks/`, each
//! mapped back to its key (a digest stem by the name kept beside its guard,
//! or by its record), sorted, then read and handed over one at a time.

use std::ffi::OsString;

use super::dir::Dir;
use super::read::{self, LOCK_SUFFIX, lock_name};
use crate::error::Result;
use crate::key::{LockKey, is_digest_stem};
use crate::store::{Current, Listed};

/// The key whose lock is `locks/<stem>.lock`: parsed from the stem, or,
/// for a digest stem, the name kept beside its guard (`keys/<stem>.name`)
/// or in its record; either is believed only when it maps to this stem.
fn key_of_stem(locks: &Dir, keys: Option<&Dir>, stem: &str) -> Option<LockKey> {
    if !is_digest_stem(stem) {
        return LockKey::from_name(stem).filter(|k| k.file_stem() == stem);
    }
    let kept = keys
        .and_then(|k| k.read_small(format!("{stem}.name")).ok().flatten())
        .and_then(|b| String::from_utf8(b).ok());
    let recorded = || match read::lock_dir(locks, &OsString::from(format!("{stem}{LOCK_SUFFIX}"))) {
        Ok(Current::Held(seen)) => {
            let h = &seen.record.holder;
            LockKey::new(&h.skill, &h.repo).ok().map(|k| k.name())
        }
        _ => None,
    };
    let this = |name: String| LockKey::from_name(name.trim()).filter(|k| k.file_stem() == stem);
    kept.and_then(this).or_else(|| recorded().and_then(this))
}

/// The locks of `locks` (in `run`), for [`crate::store::Store::visit_locks`]:
/// sorts the lock names first (each is its lowercase key), then reads each,
/// lets `check` refuse it, and hands it to `visit`, one at a time; the
/// number of tombstones left over.
pub(super) fn visit(
    run: &Dir,
    locks: &Dir,
    check: &mut dyn FnMut(&Current) -> Result<()>,
    visit: &mut dyn FnMut(Listed) -> Result<()>,
) -> Result<usize> {
    let keys_dir = run.dir("keys", false).ok().flatten();
    let mut keys: Vec<LockKey> = locks
        .names()?
        .iter()
        .filter_map(|n| n.to_str()?.strip_suffix(LOCK_SUFFIX))
        // A key parsed from a name has the repo in lowercase already.
        .filter_map(|stem| key_of_stem(locks, keys_dir.as_ref(), stem))
        .collect();
    keys.sort_unstable_by(|a, b| (a.skill(), a.repo()).cmp(&(b.skill(), b.repo())));
    for key in keys {
        let name = lock_name(&key);
        let current = read::lock_dir(locks, &name)?;
        check(&current)?;
        if current != Current::Free {
            visit(Listed::new(
                key,
                locks.join(&name).display().to_string(),
                current,
            ))?;
        }
    }
    Ok(match run.dir("tombs", false) {
        Ok(Some(t)) => t.names().map_or(0, |n| n.len()),
        _ => 0,
    })
}
