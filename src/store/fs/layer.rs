//! The one way to touch a personal layer (SPEC §5 "Trust", §7 "Hostile layers").
//!
//! The layer may lie in a working tree (an adopted project) or be reachable
//! by other local users, so nothing found in it is trusted. Every open,
//! create, rename and delete under `P/run/` (and the read of
//! `P/skill-lock.toml`) goes through a [`Dir`]: an open directory handle,
//! and single-name `*at` calls relative to it that never follow a symbolic
//! link (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`). The invariants:
//!
//! - P is reached from its anchor (the checkout, the git common directory,
//!   or a `file:DIR` the user named) one component at a time without
//!   following links, and P and P/run must be directories owned by the
//!   invoking user that group and others cannot write, as ssh demands of
//!   `~/.ssh`; otherwise [`Error::Untrusted`] names the path and the fix;
//! - a directory below P/run is opened the same way, and must be owned by
//!   the invoking user too; a file is opened non-blocking and must be a
//!   regular file (a FIFO, a device or a directory is refused at once, never
//!   waited on); a read is bounded ([`READ_LIMIT`]);
//! - nothing is created, written, renamed or deleted except by name inside
//!   a handle below P/run, so no link can lead a write outside it; a tree is
//!   removed only by walking handles, never leaving the device it is on.

use std::ffi::{OsStr, OsString};
use std::fs::File;
#[cfg(unix)]
use std::io::Write;
use std::io::{ErrorKind, Read};
#[cfg(unix)]
use std::os::fd::{AsFd, OwnedFd};
#[cfg(unix)]
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[cfg(unix)]
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};

use crate::error::{Error, Result};

// Windows: the same `Dir` by NT handles relative to their directory.
#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::{Dir, FileExt, SHARING_RETRY, Stat, remote_protocol};
#[cfg(windows)]
use windows::{found, not_a};

/// What both platforms' handles build from their primitives
/// (`file_sized`, `remove_file`, `create_new`, `rename`), written once.
impl Dir {
    /// Opens file `name` without following a link and without blocking; it
    /// must be a regular file. `None` when absent (and not created).
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link or a special file; [`Error::Io`].
    pub fn file(&self, name: impl AsRef<OsStr>, how: Open) -> Result<Option<File>> {
        Ok(self.file_sized(name.as_ref(), how)?.map(|(f, _)| f))
    }

    /// Replaces file `name` with one holding `bytes`: written whole to `tmp`
    /// (whatever was at `tmp` is unlinked first, never followed), then
    /// renamed over `name`, so a reader sees the old file or the new one.
    ///
    /// # Errors
    /// [`Error::Io`]; [`Error::Untrusted`] when a directory stands at `tmp`
    /// or at `name` (naming it and how to clear it).
    pub fn replace(&self, tmp: &str, name: impl AsRef<OsStr>, bytes: &[u8]) -> Result<()> {
        self.remove_file(tmp)?;
        if !self.create_new(tmp, bytes)? {
            return Err(Error::io(
                "create",
                self.join(tmp),
                std::io::Error::other("another process created it at the same moment"),
            ));
        }
        self.rename(tmp, self, name.as_ref(), false).map_err(|e| {
            let path = self.join(name.as_ref());
            if matches!(
                e.kind(),
                ErrorKind::IsADirectory | ErrorKind::DirectoryNotEmpty
            ) {
                // A directory planted where the file goes: name it and the
                // way to clear it (SPEC §5), as for any entry of the wrong type.
                let fix = format!(
                    "remove it (rm -r {}) and run again",
                    crate::shell::quote(&path.display().to_string())
                );
                return untrusted(&path, "it is a directory, not a regular file".into(), fix);
            }
            Error::io("rename", path, e)
        })
    }
}

/// The most bytes read from any file of the layer (a record, a counter, the
/// config): a planted endless or huge file costs one bounded read.
pub const READ_LIMIT: usize = 64 * 1024;

/// How a file of the layer is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Read only; absent is `None`.
    Read,
    /// Read and write, created (0600) when absent.
    ReadWriteCreate,
    /// Read and append, created (0600) when absent.
    AppendCreate,
}

#[cfg(unix)]
/// An open directory of the layer and the path it was reached by (for messages).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

#[cfg(unix)]
fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(unix)]
/// Who owns uid `n`, for messages: a name where the passwd file says one.
fn user_name(n: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.get(2) == Some(&n.to_string().as_str())).then(|| f[0].to_owned())
            })
        })
        .map_or_else(|| format!("uid {n}"), |name| format!("{name} (uid {n})"))
}

#[cfg(unix)]
fn kind_of(st: &Stat) -> &'static str {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

fn untrusted(path: &Path, why: String, fix: String) -> Error {
    Error::Untrusted {
        path: path.to_path_buf(),
        why,
        fix,
    }
}

#[cfg(unix)]
/// What stands at a name, for messages (`None`: a link, or gone).
fn found(st: Option<&Stat>) -> &'static str {
    st.map_or("a symbolic link", kind_of)
}

#[cfg(unix)]
/// The error for an entry that is not what the layer needs there.
fn not_a(path: &Path, want: &str, found: &str) -> Error {
    untrusted(
        path,
        format!(
            "it is {found}, not {want}; the tool never follows links or opens special files in the personal layer"
        ),
        format!(
            "remove it (rm -r {}) and run again",
            crate::shell::quote(&path.display().to_string())
        ),
    )
}

#[cfg(unix)]
/// Refuses a directory that is not the invoking user's alone.
fn check_owner(path: &Path, st: &Stat) -> Result<()> {
    let me = uid();
    let quoted = crate::shell::quote(&path.display().to_string());
    if st.st_uid != me {
        return Err(untrusted(
            path,
            format!(
                "it is owned by {}, not by you ({}); another user's directory could redirect or forge locks",
                user_name(st.st_uid),
                user_name(me)
            ),
            format!(
                "run skill-lock as its owner, or take it over: chown -R {me} {quoted} (or pick another store: --store file:DIR)"
            ),
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(untrusted(
            path,
            format!(
                "group or others can write it (mode {:o}); they could replace its locks",
                st.st_mode & 0o7777
            ),
            format!("chmod go-w {quoted}"),
        ));
    }
    Ok(())
}

#[cfg(unix)]
impl Dir {
    /// Opens the anchor of a layer: a path the user chose (links followed).
    /// `None` when it does not exist.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be opened as a directory.
    pub fn anchor(path: &Path) -> Result<Option<Self>> {
        match rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(Self {
                fd,
                path: path.to_path_buf(),
            })),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
            Err(e) => Err(Error::io("open", path, e.into())),
        }
    }

    /// The anchor, created (0700, parents too) when absent.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be created or opened.
    pub fn anchor_create(path: &Path) -> Result<Self> {
        if let Some(d) = Self::anchor(path)? {
            return Ok(d);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode_0700()
            .create(path)
            .map_err(|e| Error::io("create", path, e))?;
        Self::anchor(path)?.ok_or_else(|| {
            Error::io(
                "open",
                path,
                std::io::Error::other("it disappeared right after it was created"),
            )
        })
    }

    /// The path this handle was reached by.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The handle itself (for `fstatfs` and the like).
    #[must_use]
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The path of entry `name` (for messages).
    #[must_use]
    pub fn join(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// Status of this directory.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn stat(&self) -> Result<Stat> {
        rustix::fs::fstat(&self.fd).map_err(|e| Error::io("stat", &self.path, e.into()))
    }

    /// Refuses this directory unless it is the invoking user's alone.
    ///
    /// # Errors
    /// [`Error::Untrusted`], [`Error::Io`].
    pub fn check_owner(&self) -> Result<()> {
        check_owner(&self.path, &self.stat()?)
    }

    /// Status of entry `name`, links not followed; `None` when absent.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn stat_at(&self, name: impl AsRef<OsStr>) -> Result<Option<Stat>> {
        let name = name.as_ref();
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
            Err(e) => Err(Error::io("stat", self.join(name), e.into())),
        }
    }

    /// Opens subdirectory `name` without following a link, created (0700)
    /// when absent and `create`; `None` when absent and not `create`. It must
    /// be the invoking user's alone.
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link, a non-directory or a foreign or
    /// writable-by-others directory; [`Error::Io`] otherwise.
    pub fn dir(&self, name: impl AsRef<OsStr>, create: bool) -> Result<Option<Self>> {
        let name = name.as_ref();
        let path = self.join(name);
        for _ in 0..2 {
            match self.dir_plain(name) {
                Ok(Some(d)) => {
                    d.check_owner()?;
                    return Ok(Some(d));
                }
                Ok(None) => {
                    if !create {
                        return Ok(None);
                    }
                    match rustix::fs::mkdirat(&self.fd, name, Mode::RWXU) {
                        Ok(()) => {}
                        Err(e) if e == rustix::io::Errno::EXIST => {}
                        Err(e) => return Err(Error::io("create", &path, e.into())),
                    }
                }
                Err(Entry::Io(e)) => return Err(Error::io("open", &path, e)),
                Err(_) => {
                    return Err(not_a(
                        &path,
                        "a directory",
                        found(self.stat_at(name)?.as_ref()),
                    ));
                }
            }
        }
        Err(Error::io(
            "open",
            &path,
            std::io::Error::other("it keeps disappearing right after it is created"),
        ))
    }

    /// Opens subdirectory `name` without following a link and without the
    /// ownership check (a lock directory, a tombstone): `None` when absent,
    /// `Err(kind)` when something else is there.
    pub(crate) fn dir_plain(&self, name: &OsStr) -> std::result::Result<Option<Self>, Entry> {
        match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY
                | OFlags::DIRECTORY
                | OFlags::NOFOLLOW
                | OFlags::CLOEXEC
                | OFlags::NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(Self {
                fd,
                path: self.join(name),
            })),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(None),
            Err(e) if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::NOTDIR => {
                Err(Entry::NotADirectory)
            }
            Err(e) => Err(Entry::Io(e.into())),
        }
    }

    /// [`Dir::file`], with the file's size (from the same `fstat`).
    fn file_sized(&self, name: &OsStr, how: Open) -> Result<Option<(File, u64)>> {
        let path = self.join(name);
        match self.file_plain(name, how) {
            Ok(f) => Ok(f),
            Err(Entry::NotAFile(what)) => Err(not_a(&path, "a regular file", what)),
            Err(Entry::NotADirectory) => Err(not_a(&path, "a regular file", "a symbolic link")),
            Err(Entry::Io(e)) => Err(Error::io("open", &path, e)),
        }
    }

    /// [`Dir::file`], telling what is there instead of failing on it.
    pub(crate) fn file_plain(
        &self,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<Option<(File, u64)>, Entry> {
        let base = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let flags = match how {
            Open::Read => base | OFlags::RDONLY,
            Open::ReadWriteCreate => base | OFlags::RDWR | OFlags::CREATE,
            Open::AppendCreate => base | OFlags::RDWR | OFlags::APPEND | OFlags::CREATE,
        };
        let fd = match rustix::fs::openat(&self.fd, name, flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => fd,
            Err(e) if e == rustix::io::Errno::NOENT && how == Open::Read => return Ok(None),
            Err(e) if e == rustix::io::Errno::LOOP => {
                return Err(Entry::NotAFile("a symbolic link"));
            }
            Err(e) if e == rustix::io::Errno::ISDIR || e == rustix::io::Errno::NXIO => {
                return Err(Entry::NotAFile(found(
                    self.stat_at(name).ok().flatten().as_ref(),
                )));
            }
            Err(e) => return Err(Entry::Io(e.into())),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| Entry::Io(e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Entry::NotAFile(kind_of(&st)));
        }
        // A file written in place (the history, its counter) must be ours
        // alone: a hard link would carry the write to another name.
        if how != Open::Read && st.st_nlink > 1 {
            return Err(Entry::NotAFile("a file with other hard links"));
        }
        Ok(Some((
            File::from(fd),
            u64::try_from(st.st_size).unwrap_or(0),
        )))
    }

    /// Opens the regular file at the relative path `rel` below this
    /// directory in one lookup (Linux `openat2` with no link anywhere on the
    /// way and nothing outside this directory), with its size. `None` for
    /// anything that is not that simple (absent, a link, not a regular
    /// file, an older kernel or a sandbox without `openat2`, another OS):
    /// the caller then looks the exact, step-by-step way.
    #[must_use]
    pub fn file_beneath(&self, rel: &str) -> Option<(File, u64)> {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use rustix::fs::ResolveFlags;
            let fd = rustix::fs::openat2(
                &self.fd,
                rel,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH,
            )
            .ok()?;
            let st = rustix::fs::fstat(&fd).ok()?;
            (FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
                .then(|| (File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = rel;
            None
        }
    }

    /// Reads file `name` whole, at most [`READ_LIMIT`] bytes (one more shows
    /// that it is larger); `None` when absent.
    ///
    /// # Errors
    /// As [`Dir::file`]; [`Error::Io`] when it is larger than the limit.
    pub fn read_small(&self, name: impl AsRef<OsStr>) -> Result<Option<Vec<u8>>> {
        let name = name.as_ref();
        let Some((file, len)) = self.file_sized(name, Open::Read)? else {
            return Ok(None);
        };
        let bytes = read_bounded(file, len, READ_LIMIT + 1)
            .map_err(|e| Error::io("read", self.join(name), e))?;
        if bytes.len() > READ_LIMIT {
            return Err(untrusted(
                &self.join(name),
                format!("it is larger than {READ_LIMIT} bytes, which no file of the tool ever is"),
                format!(
                    "remove it (rm {})",
                    crate::shell::quote(&self.join(name).display().to_string())
                ),
            ));
        }
        Ok(Some(bytes))
    }

    /// Creates file `name` (0600) holding `bytes`; `false` when something
    /// is already there (it is left alone).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn create_new(&self, name: impl AsRef<OsStr>, bytes: &[u8]) -> Result<bool> {
        let name = name.as_ref();
        let path = self.join(name);
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        ) {
            Ok(fd) => fd,
            Err(e) if e == rustix::io::Errno::EXIST => return Ok(false),
            Err(e) => return Err(Error::io("create", &path, e.into())),
        };
        File::from(fd)
            .write_all(bytes)
            .map_err(|e| Error::io("write", &path, e))?;
        Ok(true)
    }

    /// Unlinks entry `name` if it is not a directory (a link is removed
    /// itself, never followed); absent is fine.
    ///
    /// # Errors
    /// [`Error::Untrusted`] when it is a directory; [`Error::Io`].
    pub fn remove_file(&self, name: &str) -> Result<()> {
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::NOENT => Ok(()),
            Err(e) if e == rustix::io::Errno::ISDIR || e == rustix::io::Errno::PERM => Err(not_a(
                &self.join(name),
                "a regular file",
                found(self.stat_at(name)?.as_ref()),
            )),
            Err(e) => Err(Error::io("remove", self.join(name), e.into())),
        }
    }

    /// Renames entry `from` of this directory to `to` in `dest` (a link is
    /// moved itself). `noreplace`: fail with `AlreadyExists` rather than
    /// replace an entry at `to`.
    ///
    /// # Errors
    /// The OS error.
    pub fn rename(
        &self,
        from: &str,
        dest: &Dir,
        to: &OsStr,
        noreplace: bool,
    ) -> std::io::Result<()> {
        if !noreplace {
            return rustix::fs::renameat(&self.fd, from, &dest.fd, to).map_err(Into::into);
        }
        #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
        {
            // RENAME_NOREPLACE on Linux, RENAME_EXCL on macOS.
            let flags = RenameFlags::NOREPLACE;
            match rustix::fs::renameat_with(&self.fd, from, &dest.fd, to, flags) {
                Ok(()) => return Ok(()),
                Err(e) if e == rustix::io::Errno::NOSYS || e == rustix::io::Errno::INVAL => {}
                Err(e) => return Err(e.into()),
            }
        }
        // Fallback (an old kernel or a file system without it): every caller
        // holds the lock's guard, so nobody else creates `to` meanwhile, and
        // rename(2) never replaces a non-empty directory.
        if dest
            .stat_at(to)
            .map_err(|_| std::io::Error::from(ErrorKind::Other))?
            .is_some()
        {
            return Err(ErrorKind::AlreadyExists.into());
        }
        rustix::fs::renameat(&self.fd, from, &dest.fd, to).map_err(Into::into)
    }

    /// The names of the entries of this directory (not `.` and `..`).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn names(&self) -> Result<Vec<OsString>> {
        let read = |e: rustix::io::Errno| Error::io("read", &self.path, e.into());
        let mut dir = rustix::fs::Dir::read_from(&self.fd).map_err(read)?;
        let mut out = Vec::new();
        for entry in &mut dir {
            let entry = entry.map_err(read)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(OsStr::from_bytes(name).to_owned());
            }
        }
        Ok(out)
    }

    /// Removes entry `name` and, if it is a directory, everything in it,
    /// walking handles without following links and never leaving this
    /// directory's device (a mount point inside is left alone). Best effort:
    /// what cannot be removed stays (a leftover `list` counts).
    pub fn remove_tree(&self, name: &OsStr) {
        #[allow(clippy::useless_conversion, reason = "dev_t is i32 on macOS")]
        let Ok(dev) = self
            .stat()
            .map(|s| u64::try_from(s.st_dev).unwrap_or(u64::MAX))
        else {
            return;
        };
        self.remove_tree_on(name, dev, 0);
    }

    fn remove_tree_on(&self, name: &OsStr, dev: u64, depth: u32) {
        match self.dir_plain(name) {
            Ok(Some(sub)) if depth < 64 => {
                #[allow(clippy::useless_conversion, reason = "dev_t is i32 on macOS")]
                if sub
                    .stat()
                    .is_ok_and(|s| u64::try_from(s.st_dev).ok() == Some(dev))
                {
                    for child in sub.names().unwrap_or_default() {
                        sub.remove_tree_on(&child, dev, depth + 1);
                    }
                    let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR);
                }
            }
            Ok(Some(_) | None) => {}
            Err(_) => {
                let _ = rustix::fs::unlinkat(&self.fd, name, AtFlags::empty());
            }
        }
    }

    /// Is entry `name` still the directory `held` (same device and inode,
    /// links not followed)?
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn still_is(&self, name: &OsStr, held: &Dir) -> Result<bool> {
        let held = held.stat()?;
        Ok(self.stat_at(name)?.is_some_and(|st| {
            st.st_dev == held.st_dev && st.st_ino == held.st_ino && held.st_nlink > 0
        }))
    }
}

/// What stands at a name when it is not what was asked for.
#[derive(Debug)]
pub(crate) enum Entry {
    /// Not a directory (a file, a link, a special file).
    NotADirectory,
    /// Not a regular file (what it is instead).
    NotAFile(&'static str),
    /// Another OS error.
    Io(std::io::Error),
}

/// Reads at most `limit` bytes of the regular file `file` of size `size`
/// (from the `fstat` that checked it): exactly its size when that is smaller (one read, no read for the end of file: a file of
/// the layer is replaced by rename, never written in place, so its size is
/// final), else `limit` bytes.
///
/// # Errors
/// The OS error.
pub fn read_bounded(mut file: File, size: u64, limit: usize) -> std::io::Result<Vec<u8>> {
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

#[cfg(unix)]
trait Mode0700 {
    fn mode_0700(&mut self) -> &mut Self;
}

#[cfg(unix)]
impl Mode0700 for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

/// Where a personal layer is: an anchor the user chose (the checkout, the
/// git common directory, a `file:DIR`), opened as given, and the names below
/// it that lead to P, each opened without following a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    anchor: PathBuf,
    below: Vec<OsString>,
}

/// The open layer: P and P/run, both checked.
#[derive(Debug)]
pub struct Opened {
    /// P.
    pub p: Dir,
    /// P/run.
    pub run: Dir,
}

impl Location {
    /// The layer at `anchor/below[0]/below[1]/...`.
    #[must_use]
    pub fn new(anchor: &Path, below: &[&str]) -> Self {
        Self {
            anchor: anchor.to_path_buf(),
            below: below.iter().map(OsString::from).collect(),
        }
    }

    /// The path of P.
    #[must_use]
    pub fn dir(&self) -> PathBuf {
        self.below
            .iter()
            .fold(self.anchor.clone(), |p, n| p.join(n))
    }

    /// Opens P, created (0700) when absent and `create`; `None` when absent
    /// and not `create`. P must be the invoking user's alone.
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link on the way, a foreign or
    /// writable-by-others P; [`Error::Io`].
    pub fn open_p(&self, create: bool) -> Result<Option<Dir>> {
        let Some((last, between)) = self.below.split_last() else {
            let anchor = if create {
                Some(Dir::anchor_create(&self.anchor)?)
            } else {
                Dir::anchor(&self.anchor)?
            };
            if let Some(a) = &anchor {
                a.check_owner()?;
            }
            return Ok(anchor);
        };
        let Some(mut at) = Dir::anchor(&self.anchor)? else {
            return Ok(None);
        };
        for name in between {
            at = match at.dir_plain(name) {
                Ok(Some(d)) => d,
                Ok(None) => return Ok(None),
                Err(Entry::Io(e)) => return Err(Error::io("open", at.join(name), e)),
                Err(_) => {
                    return Err(not_a(
                        &at.join(name),
                        "a directory",
                        found(at.stat_at(name)?.as_ref()),
                    ));
                }
            };
        }
        at.dir(last, create)
    }

    /// Opens P and P/run (created when absent and `create`).
    ///
    /// # Errors
    /// As [`Location::open_p`].
    pub fn open(&self, create: bool) -> Result<Option<Opened>> {
        let Some(p) = self.open_p(create)? else {
            return Ok(None);
        };
        Ok(p.dir("run", create)?.map(|run| Opened { p, run }))
    }
}
