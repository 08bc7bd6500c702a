//! File store (SPEC §5, §6, §7): locks as directories in the personal layer.
//!
//! Layout under `P/run/` (all directories 0700, files 0600):
//!
//! ```text
//! .gitignore                 "*": nothing under run/ is ever committed
//! locks/<stem>.lock/owner.json   the lock and its complete record
//! keys/<stem>.guard          flock guard of one lock; never deleted
//! keys/<stem>.fence          the lock's fence counter; survives release
//! keys/<stem>.name           a digest stem's lock name (long names only)
//! tmp/<stem>/                a lock directory being built (under the guard)
//! tombs/<stem>.<pid>.<rand>/ a removed lock on its way out (stem cut short
//!                            so that the whole fits in 255 bytes)
//! history.jsonl, history.1.jsonl, history.lock   the event history
//! ```
//!
//! `<stem>` is the lock's name `<skill>@<owner>__<name>` in lowercase, or,
//! for a name too long for a path component with its suffixes, its digest
//! form ([`LockKey::file_stem`]); no component is over 255 bytes.
//!
//! Invariants (argued in `docs/safety.md`):
//! - nothing in the layer is trusted: every file operation goes through the
//!   directory handle (`dir/`), which follows no link, opens only regular
//!   files and directories of the invoking user, bounds every read, and
//!   touches nothing outside `P/run/`;
//! - every change of a lock happens while its guard is held with `flock`, and
//!   the guard file is never deleted or replaced, so two changes of one lock
//!   never overlap and a decision always acts on the state it read; a guard
//!   held for more than 10 s (a stopped process) is reported, never waited
//!   for without end;
//! - under the guard, every part of the layout is re-created where missing,
//!   and "no lock" is never confused with "no directory";
//! - a reader is exact (`read.rs`): it never reports a healthy lock corrupt;
//! - a lock directory appears only by renaming a fully written directory into
//!   place, a record is replaced (renew, takeover) only by renaming a fully
//!   written file over it, and a lock disappears only by being renamed to a
//!   tombstone (release), which is then removed through the handle; readers
//!   therefore never see a partial state, and never see a lock free while it
//!   passes from one holder to the next;
//! - the next fence is above the counter, the record in place and the
//!   newest fence the lock's history names, and the counter is written (by
//!   rename) before the lock that carries the new fence is published, so a
//!   fence never repeats, even after the counter was set back or removed;
//! - the latest fence of a lock that holds no record ([`Store::last_fence`],
//!   for `status`) is the same maximum without a record, read under the
//!   guard taken shared, so it never names a fence whose lock is not
//!   published yet; a read creates nothing, not even the guard;
//! - on a network file system, a record written by another machine is
//!   refused (`store_unavailable`), since there `flock` is not coherent.
//!
//! The files, none of which calls back up into this one: this one holds
//! [`FileStore`] and its [`Store`] methods, a change being one decision
//! applied under the lock's guard; `fence.rs` the fences (the next one, the
//! latest one); `list.rs` the walk of `list`; `history.rs` the event
//! history; `read.rs` the exact reader and the names of a lock's files;
//! `netfs.rs` the refusal on a network file system; `dir/` the directory
//! handle, which all of them touch the layer through.

mod dir;
mod fence;
mod history;
mod list;
mod netfs;
mod read;

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};
use crate::flock::lock_bounded;
use crate::history::Event;
use crate::key::{COMPONENT_MAX, LockKey};
use crate::liveness::{self, Origin};
use crate::record::{OwnerRecord, random_suffix};
use crate::store::{Acquisition, Committed, Current, Decision, Listed, Place, Store};
use dir::{Dir, Open};
use fence::Fences;
use netfs::refuse_foreign;
use read::{RECORD, lock_name};

pub(crate) use dir::Location;

/// The file store rooted at a personal layer (or at a `file:DIR`).
#[derive(Debug, Clone)]
pub struct FileStore {
    layer: Location,
    /// The network file system the layer is on, if any (looked up once).
    network: OnceLock<Option<&'static str>>,
}

/// The parts of `P/run/` one change works in, each an open handle.
struct Parts {
    run: Dir,
    locks: Dir,
    keys: Dir,
    tmp: Dir,
    tombs: Dir,
}

impl FileStore {
    /// A file store whose personal layer (or explicit directory) is `base`,
    /// a directory the user named (links on the way to it are followed).
    #[must_use]
    pub fn new(base: &Path) -> Self {
        Self::at(Location::new(base, &[]))
    }

    /// The file store of a personal layer found by the rules of SPEC §5.
    #[must_use]
    pub(crate) fn at(layer: Location) -> Self {
        Self {
            layer,
            network: OnceLock::new(),
        }
    }

    /// The personal layer (or explicit directory) this store lives in.
    #[must_use]
    pub fn base(&self) -> PathBuf {
        self.layer.dir()
    }

    fn run_path(&self) -> PathBuf {
        self.layer.dir().join("run")
    }

    fn lock_path(&self, key: &LockKey) -> PathBuf {
        self.run_path().join("locks").join(lock_name(key))
    }

    /// Refuses a record from another machine on a network file system.
    fn check_coherent(&self, p: &Dir, current: &Current) -> Result<()> {
        let network = *self.network.get_or_init(|| netfs::network_fs_of(p.fd()));
        if network.is_none() {
            return Ok(()); // the common case: no hostname to look up per lock
        }
        if let Some(rec) = current.record()
            && let Some(why) = refuse_foreign(
                network,
                &rec.holder,
                Origin::here(),
                &liveness::hostname(),
                p.path(),
            )
        {
            return Err(Error::StoreUnavailable(why));
        }
        Ok(())
    }

    /// Opens `P/run/locks/` for a reader: `None` when the layer has no locks yet.
    fn open_locks(&self) -> Result<Option<(Dir, Dir, Dir)>> {
        let Some(opened) = self.layer.open(false)? else {
            return Ok(None);
        };
        Ok(opened
            .run
            .dir("locks", false)?
            .map(|locks| (opened.p, opened.run, locks)))
    }

    /// Opens (creating where missing) P, `run/` and its parts, and
    /// `run/.gitignore`. Runs under a lock's guard on every change (a few
    /// `openat` that find the directories there), so a layout cut short by
    /// a crash while it was first made, or removed by hand, is whole again
    /// before anything uses it.
    fn open_parts(&self) -> Result<(Dir, Parts)> {
        let Some(opened) = self.layer.open(true)? else {
            return Err(Error::Internal("the layer was not created".into()));
        };
        let run = opened.run;
        let sub = |name: &str| {
            run.dir(name, true)?
                .ok_or_else(|| Error::Internal(format!("run/{name} was not created")))
        };
        // `keys` first: the guard lives there and is taken before the rest.
        let keys = sub("keys")?;
        let (locks, tmp, tombs) = (sub("locks")?, sub("tmp")?, sub("tombs")?);
        run.create_new(".gitignore", b"*\n")?;
        Ok((
            opened.p,
            Parts {
                run,
                locks,
                keys,
                tmp,
                tombs,
            },
        ))
    }

    fn open_guard(keys: &Dir, key: &LockKey) -> Result<File> {
        let name = format!("{}.guard", key.file_stem());
        let Some(file) = keys.file(&name, Open::ReadWriteCreate)? else {
            return Err(Error::Internal(format!("{name} was not created")));
        };
        lock_bounded(&file, &keys.join(&name))?;
        Ok(file)
    }
}

impl Parts {
    /// Builds a complete lock directory `tmp/<name>` for `rec`.
    fn build(&self, key: &LockKey, rec: &OwnerRecord) -> Result<()> {
        let name = OsString::from(key.file_stem());
        // A leftover of a run killed while building; we hold the guard.
        self.tmp.remove_tree(&name);
        let Some(built) = self.tmp.dir(&name, true)? else {
            return Err(Error::Internal("tmp directory not created".into()));
        };
        if !built.create_new(RECORD, &rec.to_bytes()?)? {
            return Err(Error::io(
                "create",
                built.join(RECORD),
                std::io::Error::other("a file appeared in a directory just created"),
            ));
        }
        Ok(())
    }

    /// Renames the lock to a unique tombstone and removes that tombstone,
    /// and only it, through the handle (`false`: nothing was there).
    fn bury(&self, key: &LockKey) -> Result<bool> {
        let lock = lock_name(key);
        // Unique by pid and random suffix; the stem only helps a reader, so
        // it is cut short where the whole would pass 255 bytes.
        let suffix = format!(".{}.{}", std::process::id(), random_suffix());
        let stem = key.file_stem();
        let keep = COMPONENT_MAX.saturating_sub(suffix.len()).min(stem.len());
        let tomb = OsString::from(format!("{}{suffix}", stem.get(..keep).unwrap_or("")));
        let from = lock.to_str().unwrap_or_default();
        match self.locks.rename(from, &self.tombs, &tomb, true) {
            Ok(()) => {
                self.tombs.remove_tree(&tomb);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("rename", self.locks.join(&lock), e)),
        }
    }

    /// Replaces the record inside the lock directory (one rename of a fully
    /// written file over it): the lock is the old record or the new one to
    /// every reader, never absent.
    fn replace_record(&self, key: &LockKey, rec: &OwnerRecord) -> Result<()> {
        let name = lock_name(key);
        let dir = match self.locks.dir_plain(&name) {
            Ok(Some(d)) => d,
            Ok(None) => {
                return Err(Error::io(
                    "replace the record in",
                    self.locks.join(&name),
                    std::io::ErrorKind::NotFound.into(),
                ));
            }
            Err(_) => {
                return Err(Error::io(
                    "replace the record in",
                    self.locks.join(&name),
                    std::io::Error::other("it is not a directory"),
                ));
            }
        };
        dir.replace("owner.json.tmp", RECORD, &rec.to_bytes()?)
    }

    /// Publishes `rec` for `key` where there is no lock directory with a
    /// record: build, (bury what is there), rename into place. Sets
    /// `buried` once the old state is gone, so a failure after that point
    /// is reported for what it did.
    fn publish(
        &self,
        key: &LockKey,
        rec: &OwnerRecord,
        bury_first: bool,
        buried: &mut bool,
    ) -> Result<()> {
        self.build(key, rec)?;
        *buried = bury_first && self.bury(key)?;
        let lock = lock_name(key);
        self.tmp
            .rename(&key.file_stem(), &self.locks, &lock, true)
            .map_err(|e| Error::io("publish", self.locks.join(&lock), e))
    }

    fn append_history(&self, events: &[Event]) {
        if let Err(e) = history::append(&self.run, events) {
            eprintln!("skill-lock: warning: the history was not written ({e})");
        }
    }

    /// Writes a new acquisition on `current`. A stale lock with a record is
    /// taken over in place, as a renew rewrites it: the lock never passes
    /// through "free" on the way from its old holder to its new one, so a
    /// reader without the guard (status, check, a release's first look)
    /// never sees it free. Only a damaged lock (no directory with a record
    /// file) is buried first; it was held by no one. The fence it wrote,
    /// with the one it follows.
    fn acquire<W>(
        &self,
        key: &LockKey,
        current: &Current,
        acq: &Acquisition<W>,
        buried: &mut bool,
    ) -> Result<(u64, Option<u64>)> {
        let seen_fence = current.record().map_or(0, |r| r.holder.fence);
        let fences = Fences {
            run: &self.run,
            locks: &self.locks,
            keys: &self.keys,
        };
        let (fence, prior) = fences.take_next(key, seen_fence)?;
        let record = acq.record.clone().fenced(fence);
        match current {
            Current::Held(_) if acq.takes_over() => self.replace_record(key, &record)?,
            _ => self.publish(key, &record, acq.takes_over(), buried)?,
        }
        Ok((fence, prior))
    }

    /// Applies `decision`, made on `current`, and appends its history.
    fn apply<K, W>(
        &self,
        key: &LockKey,
        current: &Current,
        decision: Decision<K, W>,
    ) -> Result<Committed<K, W>> {
        let (committed, events) = match decision {
            Decision::Keep(outcome, events) => (Committed::Done(outcome), events),
            Decision::Delete(outcome, event) => {
                self.bury(key)?;
                (Committed::Done(outcome), vec![event])
            }
            Decision::Acquire(acq) => {
                let mut buried = false;
                match self.acquire(key, current, &acq, &mut buried) {
                    Ok((fence, prior)) => acq.finish(fence, prior).committed(),
                    Err(e) => {
                        if buried {
                            self.append_history(&acq.interrupted(&e.to_string()));
                        }
                        return Err(e);
                    }
                }
            }
            Decision::Renew(renewal) => {
                self.replace_record(key, renewal.record())?;
                renewal.finish().committed()
            }
        };
        self.append_history(&events);
        Ok(committed)
    }
}

impl Store for FileStore {
    fn describe(&self) -> String {
        self.run_path().join("locks").display().to_string()
    }

    fn location(&self, key: &LockKey) -> Place {
        Place::at(self.lock_path(key).display().to_string())
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let Some((p, _run, locks)) = self.open_locks()? else {
            return Ok(Current::Free);
        };
        let current = read::lock_dir(&locks, &lock_name(key))?;
        self.check_coherent(&p, &current)?;
        Ok(current)
    }

    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        fence::latest(&self.layer, key)
    }

    fn update<K, W>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
    ) -> Result<Committed<K, W>> {
        // A decision that a read without the guard settles with nothing to
        // do (releasing a free lock) needs no write at all: it works on a
        // read-only file system. Anything else is decided again, under the guard.
        if self.read(key)? == Current::Free
            && let Decision::Keep(outcome, events) = decide(&Current::Free)?
            && events.is_empty()
        {
            return Ok(Committed::Done(outcome));
        }
        let (p, parts) = self.open_parts()?;
        let guard = Self::open_guard(&parts.keys, key)?;
        let current = read::lock_dir(&parts.locks, &lock_name(key))?;
        self.check_coherent(&p, &current)?;
        let committed = parts.apply(key, &current, decide(&current)?)?;
        drop(guard);
        Ok(committed)
    }

    /// Sorts the lock names first (each is its lowercase key), then reads
    /// and hands over one record at a time.
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        let Some((p, run, locks)) = self.open_locks()? else {
            return Ok(0);
        };
        list::visit(&run, &locks, &mut |c| self.check_coherent(&p, c), visit)
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let Some(opened) = self.layer.open(false)? else {
            return Ok(Vec::new());
        };
        history::read(&opened.run, key, limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{self, Acquire, AcquireRequest, Context};
    use proptest::prelude::*;
    #[cfg(unix)]
    use std::ffi::CString;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// What a reader without the guard sees of `key` now.
    fn read_lock(store: &FileStore, key: &LockKey) -> Current {
        read_lock_with(store, key, &mut || {})
    }

    fn read_lock_with(store: &FileStore, key: &LockKey, between: &mut dyn FnMut()) -> Current {
        match store.open_locks().unwrap() {
            Some((_, _, locks)) => read::lock_dir_with(&locks, &lock_name(key), between).unwrap(),
            None => Current::Free,
        }
    }

    fn acquire(store: &FileStore, key: &LockKey) -> OwnerRecord {
        let req = AcquireRequest {
            ttl: 60,
            note: None,
            owner_pid: None,
            owner_pgid: None,
            since: None,
        };
        engine::acquire(store, key, &req, &Context::here()).unwrap();
        match store.read(key).unwrap() {
            Current::Held(r) => r.record,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reader_is_exact_when_the_lock_changes_between_its_looks() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        let key = LockKey::new("s", "o/r").unwrap();
        acquire(&store, &key);
        let ctx = Context::here();
        let path = store.lock_path(&key);
        // Between opening the directory and its record, the lock is released
        // and taken again, three times: the reader sees the last lock whole.
        let mut changes = 0;
        let got = read_lock_with(&store, &key, &mut || {
            if changes < 3 {
                engine::release(&store, &key, None, false, &ctx).unwrap();
                acquire(&store, &key);
                changes += 1;
            }
        });
        assert!(
            matches!(&got, Current::Held(r) if r.holder().fence == 4),
            "{got:?}"
        );
        // Released in between and not taken again: free, never corrupt.
        let got = read_lock_with(&store, &key, &mut || {
            let _ = engine::release(&store, &key, None, false, &ctx);
        });
        assert_eq!(got, Current::Free);
        // A directory that truly has no record, still in place, is corrupt.
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(read_lock(&store, &key), Current::Corrupt(_)));
    }

    /// A takeover replaces the record in place: a reader without the guard
    /// sees the old holder or the new one, never a free lock (before, the
    /// stale lock was buried and the new one renamed in after it, and a
    /// release's first look could answer `not_held` in that gap).
    #[test]
    fn a_reader_never_sees_a_lock_free_while_it_is_taken_over() {
        use crate::clock::Now;
        use crate::engine::Clock;
        const TAKEOVERS: i64 = 400;
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        let key = LockKey::new("s", "o/r").unwrap();
        // Each acquire's clock is past the previous lease: every one after
        // the first is a takeover of an expired lock.
        let at = |i: i64| {
            let now = Now {
                wall_ms: 1_800_000_000_000 + i * 10_000,
                boot: None,
            };
            Context {
                host: "h".into(),
                now: now.clone(),
                clock: Clock::Fixed(now),
            }
        };
        let req = AcquireRequest {
            ttl: 1,
            note: None,
            owner_pid: None,
            owner_pgid: None,
            since: None,
        };
        engine::acquire(&store, &key, &req, &at(0)).unwrap();
        let done = AtomicBool::new(false);
        let (reads, free) = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let (mut reads, mut free) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    match read_lock(&store, &key) {
                        Current::Held(_) => {}
                        Current::Free => free += 1,
                        Current::Corrupt(why) => panic!("corrupt: {why}"),
                    }
                    reads += 1;
                }
                (reads, free)
            });
            for i in 1..=TAKEOVERS {
                let got = engine::acquire(&store, &key, &req, &at(i)).unwrap();
                assert!(
                    matches!(
                        &got,
                        Acquire::Acquired {
                            took_over: Some(_),
                            ..
                        }
                    ),
                    "{got:?}"
                );
            }
            done.store(true, Ordering::Relaxed);
            reader.join().unwrap()
        });
        assert!(reads > 0);
        assert_eq!(free, 0, "{free} of {reads} reads saw the lock free");
        assert!(
            common_tombs_empty(&store),
            "a takeover of a lock with a record leaves no tombstone"
        );
    }

    fn common_tombs_empty(store: &FileStore) -> bool {
        std::fs::read_dir(store.run_path().join("tombs")).map_or(true, |mut d| d.next().is_none())
    }

    /// `list` reads each record in one lookup where it can; it must judge
    /// every shape of lock, healthy or damaged, exactly as the two-step
    /// reader that `status` uses. (Unix: it plants a link and a FIFO.)
    #[cfg(unix)]
    #[test]
    fn list_judges_every_shape_of_lock_as_status_does() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        let keys: Vec<LockKey> = (0..8)
            .map(|i| LockKey::new(&format!("s{i}"), "o/r").unwrap())
            .collect();
        for key in &keys {
            acquire(&store, key);
        }
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let lock = |i: usize| store.lock_path(&keys[i]);
        // 1: the lock directory is a symlink to a directory with a record.
        std::fs::rename(lock(1), elsewhere.join("l1")).unwrap();
        symlink(elsewhere.join("l1"), lock(1)).unwrap();
        // 2: the record is a symlink to a good record.
        std::fs::rename(lock(2).join(RECORD), elsewhere.join("r2")).unwrap();
        symlink(elsewhere.join("r2"), lock(2).join(RECORD)).unwrap();
        // 3: no record.  4: the record is a directory.  5: not JSON.
        std::fs::remove_file(lock(3).join(RECORD)).unwrap();
        std::fs::remove_file(lock(4).join(RECORD)).unwrap();
        std::fs::create_dir(lock(4).join(RECORD)).unwrap();
        std::fs::write(lock(5).join(RECORD), "{ not json").unwrap();
        // 6: the lock path is a plain file.  7: a FIFO as the record.
        std::fs::remove_dir_all(lock(6)).unwrap();
        std::fs::write(lock(6), "x").unwrap();
        std::fs::remove_file(lock(7).join(RECORD)).unwrap();
        let fifo =
            CString::new(lock(7).join(RECORD).into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);

        let mut listed = Vec::new();
        store
            .visit_locks(&mut |l| {
                listed.push(l);
                Ok(())
            })
            .unwrap();
        assert_eq!(listed.len(), keys.len(), "{listed:?}");
        for l in &listed {
            let exact = store.read(&l.key).unwrap();
            assert_eq!(l.current, exact, "{}", l.key.name());
        }
        let healthy = listed
            .iter()
            .filter(|l| matches!(l.current, Current::Held(_)))
            .count();
        assert_eq!(healthy, 1, "only s0 is whole: {listed:?}");
    }

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
            let req = AcquireRequest { ttl: 60, note: None, owner_pid: None, owner_pgid: None, since: None };
            let got = engine::acquire(&store, &key, &req, &Context::here()).unwrap();
            let acquired = matches!(got, Acquire::Acquired { .. });
            prop_assert!(acquired);
            let mut locks = Vec::new();
            store.visit_locks(&mut |l| { locks.push(l); Ok(()) }).unwrap();
            prop_assert_eq!(locks.len(), 1);
            prop_assert_eq!(locks[0].key.skill(), skill.as_str());
            prop_assert_eq!(locks[0].key.repo(), repo.as_str());
        }
    }
}
