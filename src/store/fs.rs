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
//!   never overlap and a decision always acts on the state it read; a guard
//!   held for more than 10 s (a stopped process) is reported, never waited
//!   for without end;
//! - under the guard, every part of the layout is re-created where missing,
//!   and "no lock" is never confused with "no directory";
//! - a reader opens the lock directory first and the record relative to it,
//!   and believes "a directory without a record" only when that same
//!   directory is still the lock, so it never reports a healthy lock corrupt;
//! - a lock directory appears only by renaming a fully written directory into
//!   place, a record is replaced (renew, takeover) only by renaming a fully
//!   written file over it, and a lock disappears only by being renamed to a
//!   tombstone (release); readers therefore never see a partial state, and
//!   never see a lock free while it passes from one holder to the next;
//! - the fence counter is written (by rename) before the lock that carries
//!   the new fence is published, so it never falls behind a published fence;
//!   a damaged or missing counter is rebuilt from the record and the history,
//!   and a counter at `u64::MAX` refuses rather than wrap;
//! - on a network file system, a record written by another machine is
//!   refused (`store_unavailable`), since there `flock` is not coherent.

use std::ffi::{CStr, CString};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::history::{Event, EventKind, FileHistory};
use crate::key::LockKey;
use crate::liveness::{self, Origin};
use crate::record::{Holder, MAX_RECORD_BYTES, OwnerRecord, random_suffix};
use crate::store::{Change, Committed, Current, Decision, Listed, Listing, Store};

const RECORD: &str = "owner.json";
const LOCK_SUFFIX: &str = ".lock";
/// The longest wait for another process's critical section (SPEC §7).
pub const GUARD_WAIT: Duration = Duration::from_secs(10);
/// How often a reader looks again when the lock changed under it.
const MAX_LOOKS: u32 = 1000;

/// The file store rooted at a personal layer (or at a `file:DIR`).
#[derive(Debug, Clone)]
pub struct FileStore {
    base: PathBuf,
    run: PathBuf,
    history: FileHistory,
    /// The network file system the layer is on, if any (looked up once).
    network: OnceLock<Option<&'static str>>,
}

/// Takes an exclusive `flock` on `file`, waiting at most [`GUARD_WAIT`].
///
/// A process stopped inside its critical section costs others 10 s, never
/// forever. (A thread left blocked after a timeout lets go of the lock as
/// soon as it gets it.)
///
/// # Errors
/// [`Error::StoreUnavailable`] naming the process that holds it, after 10 s;
/// [`Error::Io`] when `flock` itself fails.
pub fn lock_bounded(file: &File, path: &Path) -> Result<()> {
    lock_bounded_as(file, path, false)
}

/// [`lock_bounded`], for a shared lock when `shared`.
///
/// # Errors
/// As [`lock_bounded`].
pub fn lock_bounded_as(file: &File, path: &Path, shared: bool) -> Result<()> {
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
    let (who, what) = match flock_holder(file) {
        Some(pid) => (
            format!("process {pid}{}", process_name(pid)),
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

fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|n| format!(" ({})", n.trim()))
        .unwrap_or_default()
}

/// The pid holding a `flock` on `file`, from `/proc/locks` (Linux; the
/// kernel shows it in our pid namespace). Elsewhere: unknown.
fn flock_holder(file: &File) -> Option<u32> {
    if !cfg!(target_os = "linux") {
        return None;
    }
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

/// The kind of network file system `path` is on (Linux `statfs`), if any.
fn network_fs_at(path: &Path) -> Option<&'static str> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        // The layer may not exist yet: ask about its nearest existing ancestor.
        let existing = path.ancestors().find(|p| p.exists())?;
        let c = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
        // SAFETY: statfs is plain data; zeroed is a valid value for it.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: c is a valid NUL-terminated path, st a valid statfs to fill.
        if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } != 0 {
            return None;
        }
        // f_type is a signed word of varying width; the magics are 32-bit.
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let magic = st.f_type as u32;
        network_fs_name(magic)
    }
    #[cfg(not(target_os = "linux"))]
    {
        // macOS: statfs's f_fstypename ("nfs", "smbfs", "macfuse") would tell.
        let _ = path;
        None
    }
}

/// The name of a network file system by its `statfs` magic number.
#[must_use]
pub fn network_fs_name(magic: u32) -> Option<&'static str> {
    Some(match magic {
        0x6969 => "NFS",
        0x517B => "SMB",
        0xFF53_4D42 => "CIFS",
        0xFE53_4D42 => "SMB2",
        0x6573_5546 => "FUSE (sshfs and the like)",
        0x0102_1997 => "9p",
        0x00C3_6400 => "Ceph",
        0x5346_414F => "AFS",
        0x7375_7245 => "Coda",
        0x564C => "NCP",
        0x0BD0_0BD0 => "Lustre",
        0x0116_1970 => "GFS2",
        0x7461_636F => "OCFS2",
        _ => return None,
    })
}

/// On a network file system, is `holder` from another machine? Then the
/// file store must not decide on what it sees (SPEC §8): the reason.
///
/// Another machine: a different certain machine id, or (where either is not
/// certain) a different, known hostname.
#[must_use]
pub fn refuse_foreign(
    network: Option<&str>,
    holder: &Holder,
    here: &Origin,
    host: &str,
    layer: &Path,
) -> Option<String> {
    let fs = network?;
    let other = match (&holder.machine, &here.machine) {
        (Some(theirs), Some(ours)) => theirs != ours,
        _ => !holder.host.is_empty() && holder.host != host,
    };
    other.then(|| {
        format!(
            "{} is on a network file system ({fs}) and this lock was taken by another machine \
             ({}); file locks are not coherent between machines there, so the file store will \
             not decide on what it sees. Use a store made for several machines: \
             --store etcd://HOST:PORT (an etcd cluster) or --store git:REMOTE (a git remote \
             every machine can push to), or SKILL_LOCK_STORE / skill-lock.toml to set it once",
            layer.display(),
            if holder.host.is_empty() {
                "unknown host"
            } else {
                &holder.host
            }
        )
    })
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
            network: OnceLock::new(),
        }
    }

    fn network(&self) -> Option<&'static str> {
        *self.network.get_or_init(|| network_fs_at(&self.base))
    }

    /// Refuses a record from another machine on a network file system.
    fn check_coherent(&self, current: &Current) -> Result<()> {
        if self.network().is_none() {
            return Ok(()); // the common case: no hostname to look up per lock
        }
        if let Current::Held(rec) = current
            && let Some(why) = refuse_foreign(
                self.network(),
                &rec.holder,
                Origin::here(),
                &liveness::hostname(),
                &self.base,
            )
        {
            return Err(Error::StoreUnavailable(why));
        }
        Ok(())
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
    /// Runs under a lock's guard on every change (a few `mkdir` that find
    /// the directory there), so a layout cut short by a crash while it was
    /// first made, or removed by hand, is whole again before anything uses it.
    fn ensure_layout(&self) -> Result<()> {
        // `keys` last: a racer that finds it opens a guard and goes on to
        // use `tmp`, `locks` and `tombs`, which must exist by then.
        for sub in ["locks", "tmp", "tombs", "keys"] {
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
                let keys = self.run.join("keys");
                mkdir(&keys).map_err(|e| Error::io("create", &keys, e))?;
                open().map_err(|e| Error::io("create", &path, e))?
            }
            Err(e) => return Err(Error::io("create", &path, e)),
        };
        lock_bounded(&file, &path)?;
        Ok(file)
    }

    /// The next fence: one more than every fence this lock ever handed out.
    ///
    /// The counter is the authority; when it is missing or damaged (a power
    /// cut, a hand edit) it is rebuilt from the record in place and every
    /// fence in the history, never read as 0.
    fn next_fence(&self, key: &LockKey, seen_fence: u64) -> Result<u64> {
        let path = self.keys(key, "fence");
        let stored = match std::fs::read_to_string(&path) {
            Ok(t) => {
                let parsed = t.trim().parse::<u64>().ok();
                if parsed.is_none() {
                    eprintln!(
                        "skill-lock: warning: the fence counter {} was damaged ({:?}); \
                         rebuilt from the lock and its history",
                        path.display(),
                        t.chars().take(40).collect::<String>()
                    );
                }
                parsed
            }
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(Error::io("read", path, e)),
        };
        let last = match stored {
            Some(n) => n,
            None => self.fence_from_history(key)?,
        };
        last.max(seen_fence).checked_add(1).ok_or_else(|| {
            Error::io(
                "advance the fence counter",
                &path,
                std::io::Error::other(
                    "it is at 18446744073709551615 and no later fence exists; \
                     this lock cannot be acquired again in this store",
                ),
            )
        })
    }

    /// The highest fence the history knows for `key` (0: none).
    fn fence_from_history(&self, key: &LockKey) -> Result<u64> {
        Ok(self
            .history
            .read(Some(key), usize::MAX)?
            .iter()
            .flat_map(|e| [e.fence, e.previous.as_ref().map(|h| h.fence)])
            .flatten()
            .max()
            .unwrap_or(0))
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
    ///
    /// "No lock" and "no tombs directory" both fail the rename with ENOENT:
    /// only the first is "nothing there" (the second re-creates `tombs/`).
    fn bury(&self, key: &LockKey) -> Result<Option<PathBuf>> {
        let lock = self.lock_dir(key);
        let tomb = self.tombstone(key);
        for _ in 0..2 {
            match std::fs::rename(&lock, &tomb) {
                Ok(()) => return Ok(Some(tomb)),
                Err(e) if is_not_found(&e) => {
                    if std::fs::symlink_metadata(&lock).is_err() {
                        return Ok(None);
                    }
                    let tombs = self.run.join("tombs");
                    mkdir(&tombs).map_err(|e| Error::io("create", &tombs, e))?;
                }
                Err(e) => return Err(Error::io("rename", &lock, e)),
            }
        }
        Err(Error::io(
            "rename",
            &lock,
            std::io::Error::other("its tombstone directory keeps disappearing"),
        ))
    }

    /// Removes every tombstone (ours and leftovers of killed runs).
    fn sweep_tombs(&self) {
        if let Ok(dir) = std::fs::read_dir(self.run.join("tombs")) {
            for entry in dir.flatten() {
                remove_tree(&entry.path());
            }
        }
    }

    /// Gives `rec` the lock's next fence, written to the counter first, so
    /// the counter never falls behind a published fence.
    fn with_next_fence(
        &self,
        key: &LockKey,
        mut rec: OwnerRecord,
        seen_fence: u64,
    ) -> Result<OwnerRecord> {
        let fence = self.next_fence(key, seen_fence)?;
        rec.holder.fence = fence;
        replace_file(
            &self.keys(key, "fence.tmp"),
            &self.keys(key, "fence"),
            format!("{fence}\n").as_bytes(),
        )?;
        Ok(rec)
    }

    /// Replaces the record inside the lock directory (one rename of a fully
    /// written file over it): the lock is the old record or the new one to
    /// every reader, never absent.
    fn replace_record(&self, key: &LockKey, rec: &OwnerRecord) -> Result<()> {
        let dir = self.lock_dir(key);
        replace_file(
            &dir.join("owner.json.tmp"),
            &dir.join(RECORD),
            &rec.to_bytes()?,
        )
    }

    /// Publishes a new record for `key` where there is no lock directory with
    /// a record: fence, build, (bury what is there), rename into place.
    /// Sets `buried` once the old state is gone, so a failure after that
    /// point is reported for what it did.
    fn publish(
        &self,
        key: &LockKey,
        rec: OwnerRecord,
        bury_first: bool,
        seen_fence: u64,
        buried: &mut bool,
    ) -> Result<OwnerRecord> {
        let rec = self.with_next_fence(key, rec, seen_fence)?;
        let built = self.build(key, &rec)?;
        let tomb = if bury_first { self.bury(key)? } else { None };
        *buried = tomb.is_some();
        let lock = self.lock_dir(key);
        rename_noreplace(&built, &lock).map_err(|e| Error::io("publish", &lock, e))?;
        if tomb.is_some() {
            self.sweep_tombs();
        }
        Ok(rec)
    }

    fn append_history(&self, events: &[Event]) {
        if let Err(e) = self.history.append(events) {
            eprintln!("skill-lock: warning: the history was not written ({e})");
        }
    }

    fn apply(
        &self,
        key: &LockKey,
        current: &Current,
        change: Change,
        buried: &mut bool,
    ) -> Result<Option<OwnerRecord>> {
        let seen_fence = match current {
            Current::Held(r) => r.holder.fence,
            _ => 0,
        };
        match change {
            Change::Keep => Ok(None),
            Change::Create(rec) => self.publish(key, rec, false, seen_fence, buried).map(Some),
            // A stale lock with a record is taken over in place, as a renew
            // rewrites it: the lock never passes through "free" on the way
            // from its old holder to its new one, so a reader without the
            // guard (status, check, a release's first look) never sees it
            // free. Only a damaged lock (no directory with a record file)
            // is buried first; it was held by no one.
            Change::Takeover(rec) if matches!(current, Current::Held(_)) => {
                let rec = self.with_next_fence(key, rec, seen_fence)?;
                self.replace_record(key, &rec)?;
                Ok(Some(rec))
            }
            Change::Takeover(rec) => self.publish(key, rec, true, seen_fence, buried).map(Some),
            Change::Rewrite(rec) => {
                self.replace_record(key, &rec)?;
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

fn open_dir(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
}

/// Opens `name` inside the open directory `dir`, following no symlink and
/// never blocking (a FIFO there is "not a file", not a hang).
fn open_in(dir: &File, name: &CStr) -> std::io::Result<File> {
    open_at(dir, name, libc::O_NONBLOCK)
}

fn open_at(dir: &File, name: &CStr, flags: libc::c_int) -> std::io::Result<File> {
    // SAFETY: dir is an open directory descriptor, name a valid C string.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | flags,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// True when the open directory `dir` is still the one at `path`. The open
/// descriptor keeps its inode alive, so equal numbers mean the same directory.
fn still_at(dir: &File, path: &Path) -> Result<bool> {
    let held = dir.metadata().map_err(|e| Error::io("read", path, e))?;
    Ok(match std::fs::symlink_metadata(path) {
        Ok(m) => m.dev() == held.dev() && m.ino() == held.ino() && held.nlink() > 0,
        Err(e) if is_not_found(&e) => false,
        Err(e) => return Err(Error::io("read", path, e)),
    })
}

fn not_a(what: &str, path: &Path) -> Current {
    Current::Corrupt(format!("{} is not a {what}", path.display()))
}

/// Reads a lock without its guard, exactly.
///
/// The lock directory is opened first and its record opened relative to
/// that descriptor, so both looks see the same directory. A directory with
/// no record is believed only while that very directory is still the lock
/// (a published lock always has its record); when it was moved away in
/// between (a release or takeover), the reader looks again.
fn read_lock_dir(path: &Path) -> Result<Current> {
    read_lock_dir_with(path, &mut || {})
}

/// [`read_lock_dir`], running `between` after the directory is opened and
/// before its record is (tests put a release or takeover there).
fn read_lock_dir_with(path: &Path, between: &mut dyn FnMut()) -> Result<Current> {
    for _ in 0..MAX_LOOKS {
        let dir = match open_dir(path) {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => return Ok(Current::Free),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
                // The lock path itself is a file or a symlink (corrupt), or
                // a directory above it is not a directory (an I/O problem).
                return match std::fs::symlink_metadata(path) {
                    Ok(_) => Ok(not_a("directory", path)),
                    Err(e2) if is_not_found(&e2) => continue,
                    Err(_) => Err(Error::io("read", path, e)),
                };
            }
            Err(e) => return Err(Error::io("read", path, e)),
        };
        between();
        let record = path.join(RECORD);
        let file = match open_in(&dir, c"owner.json") {
            Ok(f) => f,
            Err(e) if is_not_found(&e) => {
                if still_at(&dir, path)? {
                    return Ok(Current::Corrupt(
                        "the lock directory holds no record".to_owned(),
                    ));
                }
                continue;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EISDIR)) => {
                return Ok(not_a("file", &record));
            }
            Err(e) => return Err(Error::io("read", record, e)),
        };
        return read_record(file, &record);
    }
    Err(Error::io(
        "read",
        path,
        std::io::Error::other(format!(
            "the lock changed {MAX_LOOKS} times while it was being read; try again"
        )),
    ))
}

/// Reads the open record file `file` (at `record`, named in messages).
fn read_record(mut file: File, record: &Path) -> Result<Current> {
    let meta = file.metadata().map_err(|e| Error::io("read", record, e))?;
    if !meta.is_file() {
        return Ok(not_a("file", record));
    }
    // A published record is never written again (it is replaced by a
    // rename), so its size is final: read exactly that, one call, no
    // read for the end of file; one byte past the limit shows too big.
    let want = usize::try_from(meta.len())
        .unwrap_or(usize::MAX)
        .min(MAX_RECORD_BYTES + 1);
    let mut bytes = vec![0u8; want];
    let mut got = 0;
    while let Some(rest) = bytes.get_mut(got..).filter(|r| !r.is_empty()) {
        match file.read(rest) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read", record, e)),
        }
    }
    bytes.truncate(got);
    Ok(match OwnerRecord::parse(&bytes) {
        Ok(r) => Current::Held(r),
        Err(why) => Current::Corrupt(why),
    })
}

/// Opens `<lock>/owner.json` inside the open `locks/` directory in one
/// lookup (Linux `openat2`: no symlink on the way, nothing outside
/// `locks/`). The file found is the complete record of a lock that was at
/// that path during the lookup, which is all a reader needs. None when that
/// is not so simple (no such file, a symlink, an older kernel or a sandbox
/// without `openat2`): the caller then looks the exact, two-step way.
#[cfg(target_os = "linux")]
fn open_record_beneath(locks: &File, lock_record: &CStr) -> Option<File> {
    /// `struct open_how` of linux/openat2.h (libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: u64::try_from(
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
        .ok()?,
        mode: 0,
        resolve: libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_BENEATH,
    };
    // SAFETY: a valid directory descriptor, C string and open_how of the
    // size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            locks.as_raw_fd(),
            lock_record.as_ptr(),
            &raw const how,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let fd = libc::c_int::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    Some(unsafe { File::from_raw_fd(fd) })
}

#[cfg(not(target_os = "linux"))]
fn open_record_beneath(_locks: &File, _lock_record: &CStr) -> Option<File> {
    None
}

impl Store for FileStore {
    fn describe(&self) -> String {
        self.run.join("locks").display().to_string()
    }

    fn location(&self, key: &LockKey) -> String {
        self.lock_dir(key).display().to_string()
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let current = read_lock_dir(&self.lock_dir(key))?;
        self.check_coherent(&current)?;
        Ok(current)
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        // A decision that a read without the guard settles with nothing to
        // do (releasing a free lock) needs no write at all: it works on a
        // read-only file system. Anything else is decided again, under the guard.
        if self.read(key)? == Current::Free {
            let first = decide(&Current::Free)?;
            if matches!(first.change, Change::Keep) && first.events.is_empty() {
                return Ok(Committed {
                    value: first.value,
                    written: None,
                });
            }
        }
        let guard = self.open_guard(key)?;
        self.ensure_layout()?;
        let current = self.read(key)?;
        let Decision {
            change,
            mut events,
            value,
        } = decide(&current)?;
        let mut buried = false;
        let written = match self.apply(key, &current, change, &mut buried) {
            Ok(w) => w,
            Err(e) => {
                if buried {
                    // The stale lock is gone but no new one was published:
                    // the history says exactly that, and nothing more.
                    let gone: Vec<Event> = events
                        .into_iter()
                        .filter(|ev| ev.event == EventKind::TookOver)
                        .map(|mut ev| {
                            ev.fence = None;
                            ev.reason = Some(format!(
                                "{}; the stale lock was removed but the new one was not published: {e}",
                                ev.reason.as_deref().unwrap_or("stale")
                            ));
                            ev
                        })
                        .collect();
                    self.append_history(&gone);
                }
                return Err(e);
            }
        };
        if let Some(rec) = &written {
            for ev in events.iter_mut().filter(|e| e.fence.is_none()) {
                ev.fence = Some(rec.holder.fence);
            }
        }
        self.append_history(&events);
        drop(guard);
        Ok(Committed { value, written })
    }

    fn list(&self) -> Result<Listing> {
        let mut locks = Vec::new();
        let tombstones = self.visit_locks(&mut |lock| {
            locks.push(lock);
            Ok(())
        })?;
        Ok(Listing { locks, tombstones })
    }

    /// Sorts the lock names first (each is its lowercase key), then reads
    /// and hands over one record at a time.
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        let locks_dir = self.run.join("locks");
        let mut names = Vec::new();
        match std::fs::read_dir(&locks_dir) {
            Ok(dir) => {
                for entry in dir {
                    let entry = entry.map_err(|e| Error::io("read", &locks_dir, e))?;
                    let file_name = entry.file_name();
                    let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(LOCK_SUFFIX))
                    else {
                        continue;
                    };
                    // A key parsed from a name has the repo in lowercase already.
                    names.extend(LockKey::from_name(name));
                }
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::io("read", locks_dir, e)),
        }
        names.sort_unstable_by(|a, b| (a.skill(), a.repo()).cmp(&(b.skill(), b.repo())));
        // Each record is opened relative to one descriptor of locks/ (gone
        // since it was listed: no lock left to show).
        let parent = match open_dir(&locks_dir) {
            Ok(d) => Some(d),
            Err(e) if is_not_found(&e) => None,
            Err(e) => return Err(Error::io("read", locks_dir, e)),
        };
        for key in names {
            let Some(parent) = parent.as_ref() else { break };
            let file_name = format!("{}{LOCK_SUFFIX}", key.name());
            let path = locks_dir.join(&file_name);
            let c_record = CString::new(format!("{file_name}/{RECORD}"))
                .map_err(|_| Error::io("read", &path, ErrorKind::InvalidInput.into()))?;
            // The exact two-step reader for anything the one lookup cannot take.
            let current = match open_record_beneath(parent, &c_record) {
                Some(file) => read_record(file, &path.join(RECORD))?,
                None => read_lock_dir(&path)?,
            };
            self.check_coherent(&current)?;
            if current != Current::Free {
                visit(Listed::new(key, path.display().to_string(), current))?;
            }
        }
        Ok(match std::fs::read_dir(self.run.join("tombs")) {
            Ok(d) => d.count(),
            Err(_) => 0,
        })
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

    fn acquire(store: &FileStore, key: &LockKey) -> OwnerRecord {
        let req = AcquireRequest {
            ttl: 60,
            note: None,
            owner_pid: None,
            owner_pgid: None,
        };
        engine::acquire(store, key, &req, &Context::here()).unwrap();
        match store.read(key).unwrap() {
            Current::Held(r) => r,
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
        let path = store.lock_dir(&key);
        // Between opening the directory and its record, the lock is released
        // and taken again, three times: the reader sees the last lock whole.
        let mut changes = 0;
        let got = read_lock_dir_with(&path, &mut || {
            if changes < 3 {
                engine::release(&store, &key, None, false, &ctx).unwrap();
                acquire(&store, &key);
                changes += 1;
            }
        })
        .unwrap();
        assert!(
            matches!(&got, Current::Held(r) if r.holder.fence == 4),
            "{got:?}"
        );
        // Released in between and not taken again: free, never corrupt.
        let got = read_lock_dir_with(&path, &mut || {
            let _ = engine::release(&store, &key, None, false, &ctx);
        })
        .unwrap();
        assert_eq!(got, Current::Free);
        // A directory that truly has no record, still in place, is corrupt.
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(read_lock_dir(&path).unwrap(), Current::Corrupt(_)));
    }

    /// A takeover replaces the record in place: a reader without the guard
    /// sees the old holder or the new one, never a free lock (before, the
    /// stale lock was buried and the new one renamed in after it, and a
    /// release's first look could answer `not_held` in that gap).
    #[test]
    fn a_reader_never_sees_a_lock_free_while_it_is_taken_over() {
        use crate::engine::Clock;
        use crate::lease::Now;
        const TAKEOVERS: i64 = 400;
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path());
        let key = LockKey::new("s", "o/r").unwrap();
        let path = store.lock_dir(&key);
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
        };
        engine::acquire(&store, &key, &req, &at(0)).unwrap();
        let done = AtomicBool::new(false);
        let (reads, free) = std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let (mut reads, mut free) = (0u64, 0u64);
                while !done.load(Ordering::Relaxed) {
                    match read_lock_dir(&path).unwrap() {
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
        std::fs::read_dir(store.run.join("tombs")).map_or(true, |mut d| d.next().is_none())
    }

    /// `list` reads each record in one lookup where it can; it must judge
    /// every shape of lock, healthy or damaged, exactly as the two-step
    /// reader that `status` uses.
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
        let lock = |i: usize| store.lock_dir(&keys[i]);
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

    #[test]
    fn another_machine_on_a_network_file_system_is_refused() {
        let nfs = network_fs_name(0x6969);
        assert_eq!(nfs, Some("NFS"));
        assert_eq!(network_fs_name(0xEF53), None, "ext4 is local");
        for magic in [0xFF53_4D42, 0x6573_5546, 0x0102_1997] {
            assert!(network_fs_name(magic).is_some(), "{magic:x}");
        }
        let here = Origin {
            machine: Some("m1".into()),
            ..Origin::default()
        };
        let layer = Path::new("/home/u/p/.git/apache-magpie");
        let mut h = crate::record::tests::sample(None).holder;
        h.host = "laptop".into();
        h.machine = Some("m1".into());
        // One machine alone keeps working, on NFS or not.
        assert_eq!(refuse_foreign(nfs, &h, &here, "laptop", layer), None);
        // Another machine id: refused on NFS, whatever the hostname says.
        h.machine = Some("m2".into());
        let why = refuse_foreign(nfs, &h, &here, "laptop", layer).unwrap();
        assert!(
            why.contains("etcd") && why.contains("git:") && why.contains("NFS"),
            "{why}"
        );
        assert_eq!(
            refuse_foreign(None, &h, &here, "laptop", layer),
            None,
            "local disk"
        );
        // Machine ids unknown (containers, older records): the hostname decides.
        h.machine = None;
        assert_eq!(refuse_foreign(nfs, &h, &here, "laptop", layer), None);
        h.host = "desktop".into();
        assert!(refuse_foreign(nfs, &h, &here, "laptop", layer).is_some());
        h.host = String::new();
        assert_eq!(refuse_foreign(nfs, &h, &here, "laptop", layer), None);
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
