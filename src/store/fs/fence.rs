//! The file store's fences (SPEC §7 "Fences never repeat"): the next fence
//! of an acquisition, above the counter (`keys/<stem>.fence`), the record in
//! place and the newest fence the lock's history names, written to the
//! counter before the lock that carries it is published; and the latest
//! fence of a lock, read under its guard taken shared, for `status`.

use std::path::PathBuf;

use super::dir::{Dir, Location, Open};
use super::history;
use super::read::{RECORD, lock_name};
use crate::error::{Error, Result};
use crate::flock::lock_bounded_as;
use crate::key::{LockKey, is_digest_stem};

/// The fences the store knows of for `key` apart from its record: the
/// counter (`keys/<name>.fence`) and the newest fence its history names
/// (with the history file that names it). Read under the lock's guard, so
/// no acquisition is half-way between writing the counter and publishing
/// its lock.
struct Known {
    /// The counter (0: absent or damaged).
    counter: u64,
    /// The newest fence of the lock's history (0: none, or unreadable).
    history: u64,
    /// The history file that names it.
    history_file: Option<PathBuf>,
}

impl Known {
    /// A damaged counter (a power cut, a hand edit, something planted)
    /// counts as none, and is reported when `warn` (it is about to be
    /// rebuilt); the history is read best-effort.
    fn read(keys: &Dir, run: &Dir, key: &LockKey, warn: bool) -> Result<Self> {
        let name = format!("{}.fence", key.file_stem());
        let counter = match keys.read_small(&name) {
            Ok(Some(t)) => {
                let parsed = std::str::from_utf8(&t)
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok());
                if parsed.is_none() && warn {
                    eprintln!(
                        "skill-lock: warning: the fence counter {} was damaged ({:?}); \
                         rebuilt from the lock and its history",
                        keys.join(&name).display(),
                        String::from_utf8_lossy(&t[..t.len().min(40)])
                    );
                }
                parsed.unwrap_or(0)
            }
            Ok(None) => 0,
            Err(e @ Error::Untrusted { .. }) => {
                if warn {
                    eprintln!("skill-lock: warning: {e}; the fence counter is rebuilt");
                }
                0
            }
            Err(e) => return Err(e),
        };
        let (history, history_file) = history::newest_fence(run, &key.name()).unwrap_or_else(|e| {
            if warn {
                eprintln!("skill-lock: warning: the history could not be read for the fence ({e})");
            }
            (0, None)
        });
        Ok(Self {
            counter,
            history,
            history_file,
        })
    }

    /// The newest of them.
    fn newest(&self) -> u64 {
        self.counter.max(self.history)
    }
}

/// The newest fence the store knows of for `key` apart from its record.
fn known_fence(keys: &Dir, run: &Dir, key: &LockKey, warn: bool) -> Result<u64> {
    Known::read(keys, run, key, warn).map(|k| k.newest())
}

/// The parts of `P/run/` the fences of one change live in, open under
/// the lock's guard.
pub(super) struct Fences<'a> {
    /// `run/`, where the history is.
    pub(super) run: &'a Dir,
    /// `run/locks/`.
    pub(super) locks: &'a Dir,
    /// `run/keys/`, where the counters are.
    pub(super) keys: &'a Dir,
}

impl Fences<'_> {
    /// The fence of the lock's latest acquisition as far as the store still
    /// knows (the counter, the record in place, `seen_fence`, and the newest
    /// fence of its history), and the next fence: one more (SPEC §7 "Fences
    /// never repeat"). A counter set back by hand is overtaken by the
    /// record or the history. A fence at `u64::MAX` (counter, record or
    /// history, which a repository can plant under rule 3) refuses rather
    /// than wrap, naming each file that holds it and how to clear it (SPEC
    /// §5: planted state never leaves a lock with no way out).
    fn next_fence(&self, key: &LockKey, seen_fence: u64) -> Result<(u64, u64)> {
        let known = Known::read(self.keys, self.run, key, true)?;
        let base = known.newest().max(seen_fence);
        let next = base
            .checked_add(1)
            .ok_or_else(|| self.at_max(key, &known, seen_fence))?;
        Ok((base, next))
    }

    /// The error for a fence at `u64::MAX`: no run reaches it, so the file
    /// that holds it was planted or damaged. Names every such file, and how
    /// to go on.
    fn at_max(&self, key: &LockKey, known: &Known, seen_fence: u64) -> Error {
        let counter = self.keys.join(format!("{}.fence", key.file_stem()));
        let record = self.locks.join(lock_name(key)).join(RECORD);
        let at_max: Vec<PathBuf> = [
            (known.counter, Some(counter.clone())),
            (seen_fence, Some(record)),
            (known.history, known.history_file.clone()),
        ]
        .into_iter()
        .filter(|(fence, _)| *fence == u64::MAX)
        .filter_map(|(_, file)| file)
        .collect();
        let names = at_max
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ");
        Error::Untrusted {
            path: at_max.first().cloned().unwrap_or(counter),
            why: format!(
                "the lock's fence is at 18446744073709551615 in {names}, a value no real \
                 run reaches (planted or damaged), so no later fence exists"
            ),
            fix: format!("delete {names}; fences then go on above every fence that remains"),
        }
    }

    /// Takes the lock's next fence, written to the counter first, so the
    /// counter never falls behind a published fence: that fence, with the
    /// one it follows (`None`: the store knew of no acquisition).
    pub(super) fn take_next(&self, key: &LockKey, seen_fence: u64) -> Result<(u64, Option<u64>)> {
        let (prior, fence) = self.next_fence(key, seen_fence)?;
        let stem = key.file_stem();
        self.keys.replace(
            &format!("{stem}.fence.tmp"),
            format!("{stem}.fence"),
            format!("{fence}\n").as_bytes(),
        )?;
        if is_digest_stem(&stem) {
            // What `list` names the lock by: a digest does not say.
            self.keys.replace(
                &format!("{stem}.name.tmp"),
                format!("{stem}.name"),
                key.name().as_bytes(),
            )?;
        }
        Ok((fence, Some(prior).filter(|p| *p > 0)))
    }
}

/// The fence of the lock's latest acquisition, held or not (`None`: the
/// store knows of none), for [`crate::store::Store::last_fence`].
///
/// Read under the lock's guard (shared), where an acquisition writes the
/// counter and then publishes its lock: a fence read here is never one
/// whose lock is not published yet. Creates nothing: with no guard file
/// (the lock was never changed in this layer, or `keys/` was removed by
/// hand) the history alone tells.
pub(super) fn latest(layer: &Location, key: &LockKey) -> Result<Option<u64>> {
    let Some(opened) = layer.open(false)? else {
        return Ok(None);
    };
    let guard_name = format!("{}.guard", key.file_stem());
    let keys = opened.run.dir("keys", false)?;
    let guard = match &keys {
        Some(keys) => keys.file(&guard_name, Open::Read)?,
        None => None,
    };
    let known = match (&keys, guard) {
        (Some(keys), Some(guard)) => {
            lock_bounded_as(&guard, &keys.join(&guard_name), true)?;
            known_fence(keys, &opened.run, key, false)?
        }
        _ => history::newest_fence(&opened.run, &key.name()).map_or(0, |(f, _)| f),
    };
    Ok(Some(known).filter(|f| *f > 0))
}
