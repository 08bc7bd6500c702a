//! Unix: the layer's directory handle by `openat`, `renameat2` and
//! `unlinkat` relative to an open directory, never following a link.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};

use super::{Misfit, Open, untrusted};

use crate::error::{Error, Result};
/// Positioned reads and writes (`pread`, `pwrite`), as on Windows.
pub use std::os::unix::fs::FileExt;

/// An open directory of the layer and the path it was reached by (for messages).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

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

/// What stands at a name, for messages (`None`: a link, or gone).
pub(super) fn found(st: Option<&Stat>) -> &'static str {
    st.map_or("a symbolic link", kind_of)
}

/// The error for an entry that is not what the layer needs there.
pub(super) fn not_a(path: &Path, want: &str, found: &str) -> Error {
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
                Err(Misfit::Io(e)) => return Err(Error::io("open", &path, e)),
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
    pub(crate) fn dir_plain(&self, name: &OsStr) -> std::result::Result<Option<Self>, Misfit> {
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
                Err(Misfit::NotADirectory)
            }
            Err(e) => Err(Misfit::Io(e.into())),
        }
    }

    /// [`Dir::file`], with the file's size (from the same `fstat`).
    pub(super) fn file_sized(&self, name: &OsStr, how: Open) -> Result<Option<(File, u64)>> {
        let path = self.join(name);
        match self.file_plain(name, how) {
            Ok(f) => Ok(f),
            Err(Misfit::NotAFile(what)) => Err(not_a(&path, "a regular file", what)),
            Err(Misfit::NotADirectory) => Err(not_a(&path, "a regular file", "a symbolic link")),
            Err(Misfit::Io(e)) => Err(Error::io("open", &path, e)),
        }
    }

    /// [`Dir::file`], telling what is there instead of failing on it.
    pub(crate) fn file_plain(
        &self,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<Option<(File, u64)>, Misfit> {
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
                return Err(Misfit::NotAFile("a symbolic link"));
            }
            Err(e) if e == rustix::io::Errno::ISDIR || e == rustix::io::Errno::NXIO => {
                return Err(Misfit::NotAFile(found(
                    self.stat_at(name).ok().flatten().as_ref(),
                )));
            }
            Err(e) => return Err(Misfit::Io(e.into())),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| Misfit::Io(e.into()))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(Misfit::NotAFile(kind_of(&st)));
        }
        // A file written in place (the history, its counter) must be ours
        // alone: a hard link would carry the write to another name.
        if how != Open::Read && st.st_nlink > 1 {
            return Err(Misfit::NotAFile("a file with other hard links"));
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
trait Mode0700 {
    fn mode_0700(&mut self) -> &mut Self;
}

impl Mode0700 for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

/// How to remove a file that must not be there, for messages.
pub(super) fn remove_file_fix(path: &Path) -> String {
    format!(
        "remove it (rm {})",
        crate::shell::quote(&path.display().to_string())
    )
}
