//! File store (SPEC §5, §6, §7): locks as directories in the personal layer.
//!
//! Layout under `P/run/` (all directories 0700, files 0600):
//!
//! ```text
//! .gitignore                 "*": nothing under run/ is ever committed
//! locks/<name>.lock/owner.json   the lock and its complete record
//! keys/<name>.guard          flock guard of one lock; never deleted
//! keys/<name>.fence          the lock's fence counter; survives release
//! tmp/<name>/                a lock directory being built (under the guard)
//! tombs/<name>.<rand>/       a removed lock on its way out
//! history.jsonl, history.1.jsonl, history.lock   the event history
//! ```
//!
//! Invariants (argued in `docs/design.md`):
//! - every change of a lock happens while its guard is held with `flock`, and
//!   the guard file is never deleted or replaced, so two changes of one lock
//!   never overlap and a decision always acts on the state it read;
//! - a lock directory appears only by renaming a fully written directory into
//!   place, a record is replaced only by renaming a fully written file over
//!   it, and a lock disappears only by being renamed to a tombstone; readers
//!   therefore never see a partial state, and need no guard;
//! - the fence counter is written (by rename) before the lock that carries
//!   the new fence is published, so it never falls behind a published fence.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::history::{Event, FileHistory};
use crate::key::LockKey;
use crate::record::{OwnerRecord, random_suffix};
use crate::store::{Change, Committed, Current, Decision, Listed, Listing, Store};

const RECORD: &str = "owner.json";
const LOCK_SUFFIX: &str = ".lock";

/// The file store rooted at a personal layer (or at a `file:DIR`).
#[derive(Debug, Clone)]
pub struct FileStore {
    base: PathBuf,
    run: PathBuf,
    history: FileHistory,
}

fn is_not_found(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::NotFound
}

fn mkdir(path: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// Writes `bytes` to a new file `path` (0600), failing if it exists.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io("create", path, e))?;
    f.write_all(bytes).map_err(|e| Error::io("write", path, e))
}

/// Writes `bytes` to `tmp` (truncating a leftover) and renames it over `dest`.
fn replace_file(tmp: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(tmp)
        .map_err(|e| Error::io("create", tmp, e))?;
    f.write_all(bytes).map_err(|e| Error::io("write", tmp, e))?;
    drop(f);
    std::fs::rename(tmp, dest).map_err(|e| Error::io("rename", dest, e))
}

/// Renames `from` to `to`, failing if `to` exists (Linux: `renameat2`).
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let cstr = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_bytes())
                .map_err(|_| std::io::Error::from(ErrorKind::InvalidInput))
        };
        let (f, t) = (cstr(from)?, cstr(to)?);
        // SAFETY: both are valid NUL-terminated paths; AT_FDCWD with absolute
        // or cwd-relative paths.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if !matches!(err.raw_os_error(), Some(libc::ENOSYS | libc::EINVAL)) {
            return Err(err);
        }
    }
    // Fallback: rename(2) never replaces a non-empty directory, and every
    // caller holds the lock's guard, so no one else creates `to` meanwhile.
    if std::fs::symlink_metadata(to).is_ok() {
        return Err(ErrorKind::AlreadyExists.into());
    }
    std::fs::rename(from, to)
}

fn remove_tree(path: &Path) {
    // A tombstone or leftover is garbage; another sweeper may remove it first.
    let _ = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        _ => std::fs::remove_file(path),
    };
}

impl FileStore {
    /// A file store whose personal layer (or explicit directory) is `base`.
    #[must_use]
    pub fn new(base: &Path) -> Self {
        let run = base.join("run");
        Self {
            base: base.to_path_buf(),
            history: FileHistory::new(&run),
            run,
        }
    }

    /// The personal layer (or explicit directory) this store lives in.
    #[must_use]
    pub fn base(&self) -> &Path {
        &self.base
    }

    fn lock_dir(&self, key: &LockKey) -> PathBuf {
        self.run
            .join("locks")
            .join(format!("{}{LOCK_SUFFIX}", key.name()))
    }

    fn keys(&self, key: &LockKey, ext: &str) -> PathBuf {
        self.run.join("keys").join(format!("{}.{ext}", key.name()))
    }

    /// Creates `run/` and its parts, and `run/.gitignore`, where missing.
    fn ensure_layout(&self) -> Result<()> {
        for sub in ["locks", "keys", "tmp", "tombs"] {
            let d = self.run.join(sub);
            mkdir(&d).map_err(|e| Error::io("create", &d, e))?;
        }
        let ignore = self.run.join(".gitignore");
        match write_new(&ignore, b"*\n") {
            Ok(()) => Ok(()),
            Err(Error::Io { source, .. }) if source.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn open_guard(&self, key: &LockKey) -> Result<File> {
        let path = self.keys(key, "guard");
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
        };
        let file = match open() {
            Ok(f) => f,
            Err(e) if is_not_found(&e) => {
                self.ensure_layout()?;
                open().map_err(|e| Error::io("create", &path, e))?
            }
            Err(e) => return Err(Error::io("create", &path, e)),
        };
        file.lock().map_err(|e| Error::io("lock", &path, e))?;
        Ok(file)
    }

    fn read_fence(&self, key: &LockKey) -> Result<u64> {
        let path = self.keys(key, "fence");
        match std::fs::read_to_string(&path) {
            Ok(t) => Ok(t.trim().parse().unwrap_or(0)),
            Err(e) if is_not_found(&e) => Ok(0),
            Err(e) => Err(Error::io("read", path, e)),
        }
    }

    /// Builds a complete lock directory in `tmp/` and returns its path.
    fn build(&self, key: &LockKey, rec: &OwnerRecord) -> Result<PathBuf> {
        let tmp = self.run.join("tmp").join(key.name());
        let mk = || DirBuilder::new().mode(0o700).create(&tmp);
        match mk() {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                // A leftover of a run killed while building; we hold the guard.
                remove_tree(&tmp);
                mk().map_err(|e| Error::io("create", &tmp, e))?;
            }
            Err(e) => return Err(Error::io("create", &tmp, e)),
        }
        write_new(&tmp.join(RECORD), &rec.to_bytes()?)?;
        Ok(tmp)
    }

    fn tombstone(&self, key: &LockKey) -> PathBuf {
        self.run.join("tombs").join(format!(
            "{}.{}.{}",
            key.name(),
            std::process::id(),
            random_suffix()
        ))
    }

    /// Renames the lock to a unique tombstone; returns it (None: nothing there).
    fn bury(&self, key: &LockKey) -> Result<Option<PathBuf>> {
        let lock = self.lock_dir(key);
        let tomb = self.tombstone(key);
        match std::fs::rename(&lock, &tomb) {
            Ok(()) => Ok(Some(tomb)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(Error::io("rename", &lock, e)),
        }
    }

    /// Removes every tombstone (ours and leftovers of killed runs).
    fn sweep_tombs(&self) {
        if let Ok(dir) = std::fs::read_dir(self.run.join("tombs")) {
            for entry in dir.flatten() {
                remove_tree(&entry.path());
            }
        }
    }

    /// Publishes a new record for `key`: fence, build, (bury), rename into place.
    fn publish(
        &self,
        key: &LockKey,
        mut rec: OwnerRecord,
        takeover: bool,
        seen_fence: u64,
    ) -> Result<OwnerRecord> {
        let fence = self.read_fence(key)?.max(seen_fence) + 1;
        rec.holder.fence = fence;
        replace_file(
            &self.keys(key, "fence.tmp"),
            &self.keys(key, "fence"),
            format!("{fence}\n").as_bytes(),
        )?;
        let built = self.build(key, &rec)?;
        let tomb = if takeover { self.bury(key)? } else { None };
        let lock = self.lock_dir(key);
        rename_noreplace(&built, &lock).map_err(|e| Error::io("publish", &lock, e))?;
        if tomb.is_some() {
            self.sweep_tombs();
        }
        Ok(rec)
    }

    fn apply(
        &self,
        key: &LockKey,
        current: &Current,
        change: Change,
    ) -> Result<Option<OwnerRecord>> {
        let seen_fence = match current {
            Current::Held(r) => r.holder.fence,
            _ => 0,
        };
        match change {
            Change::Keep => Ok(None),
            Change::Create(rec) => self.publish(key, rec, false, seen_fence).map(Some),
            Change::Takeover(rec) => self.publish(key, rec, true, seen_fence).map(Some),
            Change::Rewrite(rec) => {
                let dir = self.lock_dir(key);
                replace_file(
                    &dir.join("owner.json.tmp"),
                    &dir.join(RECORD),
                    &rec.to_bytes()?,
                )?;
                Ok(Some(rec))
            }
            Change::Delete => {
                if self.bury(key)?.is_some() {
                    self.sweep_tombs();
                }
                Ok(None)
            }
        }
    }
}

/// Reads a lock without its guard.
///
/// A takeover or release moves the directory away while we look, so "the
/// directory is there but its record is not" is only believed when it holds
/// on several looks in a row: a published directory always has its record.
fn read_lock_dir(dir: &Path) -> Result<Current> {
    const LOOKS: u32 = 5;
    for look in 0..LOOKS {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Ok(Current::Corrupt(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
            Err(e) if is_not_found(&e) => return Ok(Current::Free),
            Err(e) => return Err(Error::io("read", dir, e)),
        }
        let path = dir.join(RECORD);
        match std::fs::read(&path) {
            Ok(bytes) => {
                return Ok(match OwnerRecord::parse(&bytes) {
                    Ok(r) => Current::Held(r),
                    Err(why) => Current::Corrupt(why),
                });
            }
            Err(e) if is_not_found(&e) => {
                // Changed under us (or truly empty): look again.
                if look > 1 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            Err(e)
                if e.kind() == ErrorKind::InvalidData || e.raw_os_error() == Some(libc::EISDIR) =>
            {
                return Ok(Current::Corrupt(format!(
                    "{} is not a file",
                    path.display()
                )));
            }
            Err(e) => return Err(Error::io("read", path, e)),
        }
    }
    Ok(Current::Corrupt(
        "the lock directory holds no record".to_owned(),
    ))
}

impl Store for FileStore {
    fn describe(&self) -> String {
        self.run.join("locks").display().to_string()
    }

    fn location(&self, key: &LockKey) -> String {
        self.lock_dir(key).display().to_string()
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        read_lock_dir(&self.lock_dir(key))
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        let guard = self.open_guard(key)?;
        let current = self.read(key)?;
        let Decision {
            change,
            mut events,
            value,
        } = decide(&current)?;
        let written = self.apply(key, &current, change)?;
        if let Some(rec) = &written {
            for ev in events.iter_mut().filter(|e| e.fence.is_none()) {
                ev.fence = Some(rec.holder.fence);
            }
        }
        if let Err(e) = self.history.append(&events) {
            eprintln!(
                "skill-lock: warning: the history was not written ({e}); the lock operation itself succeeded"
            );
        }
        drop(guard);
        Ok(Committed { value, written })
    }

    fn list(&self) -> Result<Listing> {
        let locks_dir = self.run.join("locks");
        let mut locks = Vec::new();
        match std::fs::read_dir(&locks_dir) {
            Ok(dir) => {
                for entry in dir {
                    let entry = entry.map_err(|e| Error::io("read", &locks_dir, e))?;
                    let file_name = entry.file_name();
                    let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(LOCK_SUFFIX))
                    else {
                        continue;
                    };
                    let Some(key) = LockKey::from_name(name) else {
                        continue;
                    };
                    let path = entry.path();
                    let current = read_lock_dir(&path)?;
                    if current == Current::Free {
                        continue;
                    }
                    locks.push(Listed::new(key, path.display().to_string(), current));
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::io("read", locks_dir, e)),
        }
        let tombstones = match std::fs::read_dir(self.run.join("tombs")) {
            Ok(d) => d.count(),
            Err(_) => 0,
        };
        Ok(Listing { locks, tombstones })
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        self.history.read(key, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{self, Acquire, AcquireRequest, Context};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Every valid name round-trips through `list`, spelled as given.
        #[test]
        fn valid_names_round_trip_through_list(
            skill in "[A-Za-z0-9][A-Za-z0-9._-]{0,63}",
            owner in "[A-Za-z0-9.-][A-Za-z0-9._-]{0,20}[A-Za-z0-9.-]",
            name in "[A-Za-z0-9._-]{1,100}",
        ) {
            let repo = format!("{owner}/{name}");
            let Ok(key) = LockKey::new(&skill, &repo) else {
                return Ok(());
            };
            let dir = tempfile::tempdir().unwrap();
            let store = FileStore::new(dir.path());
            let req = AcquireRequest { ttl: 60, note: None, owner_pid: None, owner_pgid: None };
            let got = engine::acquire(&store, &key, &req, &Context::here()).unwrap();
            let acquired = matches!(got, Acquire::Acquired { .. });
            prop_assert!(acquired);
            let listing = store.list().unwrap();
            prop_assert_eq!(listing.locks.len(), 1);
            prop_assert_eq!(listing.locks[0].key.skill(), skill.as_str());
            prop_assert_eq!(listing.locks[0].key.repo(), repo.as_str());
        }
    }
}
