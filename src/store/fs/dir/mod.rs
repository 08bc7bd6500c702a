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
//!
//! Only the system calls are per OS, declared once as the trait [`DirSys`]
//! (`platform.rs`) that each OS's `Platform` implements: `unix.rs` (`openat`,
//! `mkdirat`, `renameat2`, `unlinkat` by rustix; the owner and mode check)
//! and `windows.rs` (`NtCreateFile` relative to a directory handle, reparse
//! points refused; the owner SID). Each tells what stands in its way as a
//! `Failed`; [`Dir`], every decision on those answers, the errors and their
//! messages are written once, here.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

per_os!();
mod location;
mod platform;

pub(crate) use location::Location;
use platform::{DirSys, Failed};
pub(super) use sys::FileExt;
use sys::Platform;

/// An open handle of this OS.
type Owned = <Platform as DirSys>::Owned;
/// A borrowed handle of this OS (what [`Dir::fd`] lends).
pub(super) type Handle<'a> = <Platform as DirSys>::Handle<'a>;
/// What a status call of this OS tells about an entry.
pub(super) type Stat = <Platform as DirSys>::Stat;

/// An open directory of the layer and the path it was reached by (for messages).
#[derive(Debug)]
pub(super) struct Dir {
    handle: Owned,
    path: PathBuf,
}

/// What stands at a name, for messages (`None`: gone, or on Unix a link).
fn found(st: Option<&Stat>) -> &'static str {
    st.map_or(Platform::GONE, Platform::kind)
}

/// The error for an entry that is not what the layer needs there.
fn not_a(path: &Path, want: &str, found: &str) -> Error {
    untrusted(
        path,
        format!(
            "it is {found}, not {want}; the tool never follows links or opens special files in the personal layer"
        ),
        format!(
            "remove it ({} {}) and run again",
            Platform::REMOVE_TREE,
            Platform::quote(&path.display().to_string())
        ),
    )
}

/// How to remove a file that must not be there, for messages.
fn remove_file_fix(path: &Path) -> String {
    format!(
        "remove it ({} {})",
        Platform::REMOVE_FILE,
        Platform::quote(&path.display().to_string())
    )
}

impl Dir {
    /// Opens the anchor of a layer: a path the user chose (links followed).
    /// `None` when it does not exist.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be opened as a directory.
    pub(super) fn anchor(path: &Path) -> Result<Option<Self>> {
        match Platform::open_anchor(path) {
            Ok(handle) => Ok(Some(Self {
                handle,
                path: path.to_path_buf(),
            })),
            Err(Failed::Absent(_)) => Ok(None),
            Err(Failed::Stat(e)) => Err(Error::io("stat", path, e)),
            Err(f) => Err(Error::io("open", path, f.into_io())),
        }
    }

    /// The anchor, created (0700 on Unix, parents too) when absent.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be created or opened.
    pub(super) fn anchor_create(path: &Path) -> Result<Self> {
        if let Some(d) = Self::anchor(path)? {
            return Ok(d);
        }
        Platform::create_dir_all(path).map_err(|e| Error::io("create", path, e))?;
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
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// The handle itself (for `fstatfs`, the remote protocol and the like).
    #[must_use]
    pub(super) fn fd(&self) -> Handle<'_> {
        Platform::borrow(&self.handle)
    }

    /// The path of entry `name` (for messages).
    #[must_use]
    pub(super) fn join(&self, name: impl AsRef<OsStr>) -> PathBuf {
        self.path.join(name.as_ref())
    }

    /// Status of this directory.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(super) fn stat(&self) -> Result<Stat> {
        Platform::fstat(self.fd()).map_err(|e| Error::io("stat", &self.path, e))
    }

    /// Refuses this directory unless it is the invoking user's alone (on
    /// Unix: owned by the user, not writable by group or others; on
    /// Windows: owned by the user).
    ///
    /// # Errors
    /// [`Error::Untrusted`], [`Error::Io`].
    pub(super) fn check_owner(&self) -> Result<()> {
        Platform::check_owner(self.fd(), &self.path)
    }

    /// Status of entry `name`, links not followed; `None` when absent.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(super) fn stat_at(&self, name: impl AsRef<OsStr>) -> Result<Option<Stat>> {
        let name = name.as_ref();
        Platform::stat_at(self.fd(), name).map_err(|e| Error::io("stat", self.join(name), e))
    }

    /// Opens subdirectory `name` without following a link, created (0700
    /// on Unix) when absent and `create`; `None` when absent and not
    /// `create`. It must be the invoking user's alone.
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link, a non-directory or a foreign or
    /// writable-by-others directory; [`Error::Io`] otherwise.
    pub(super) fn dir(&self, name: impl AsRef<OsStr>, create: bool) -> Result<Option<Self>> {
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
                    match Platform::mkdir_at(self.fd(), name) {
                        Ok(()) | Err(Failed::Exists) => {}
                        Err(f) => return Err(Error::io("create", &path, f.into_io())),
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
    pub(super) fn dir_plain(&self, name: &OsStr) -> std::result::Result<Option<Self>, Misfit> {
        match Platform::open_dir(self.fd(), name) {
            Ok(handle) => Ok(Some(Self {
                handle,
                path: self.join(name),
            })),
            Err(Failed::Absent(_)) => Ok(None),
            Err(Failed::Io(e) | Failed::Stat(e)) => Err(Misfit::Io(e)),
            Err(_) => Err(Misfit::NotADirectory),
        }
    }

    /// [`Dir::file`], with the file's size (from the same status call).
    fn file_sized(&self, name: &OsStr, how: Open) -> Result<Option<(File, u64)>> {
        let path = self.join(name);
        match self.file_plain(name, how) {
            Ok(f) => Ok(f),
            Err(Misfit::NotAFile(what)) => Err(not_a(&path, "a regular file", what)),
            Err(Misfit::NotADirectory) => Err(not_a(&path, "a regular file", Platform::LINK)),
            Err(Misfit::Io(e)) => Err(Error::io("open", &path, e)),
        }
    }

    /// [`Dir::file`], telling what is there instead of failing on it.
    pub(super) fn file_plain(
        &self,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<Option<(File, u64)>, Misfit> {
        let (handle, st) = match Platform::open_file(self.fd(), name, how) {
            Ok(opened) => opened,
            Err(Failed::Absent(_)) if how == Open::Read => return Ok(None),
            Err(Failed::WrongType(Some(what))) => return Err(Misfit::NotAFile(what)),
            Err(Failed::WrongType(None)) => {
                return Err(Misfit::NotAFile(found(
                    self.stat_at(name).ok().flatten().as_ref(),
                )));
            }
            Err(f) => return Err(Misfit::Io(f.into_io())),
        };
        if !Platform::is_file(&st) {
            return Err(Misfit::NotAFile(Platform::kind(&st)));
        }
        // A file written in place (the history, its counter) must be ours
        // alone: a hard link would carry the write to another name.
        if how != Open::Read && Platform::links(&st) > 1 {
            return Err(Misfit::NotAFile("a file with other hard links"));
        }
        Ok(Some((handle.into(), Platform::size(&st))))
    }

    /// Opens the regular file at the relative path `rel` below this
    /// directory in one lookup (Linux `openat2` with no link anywhere on the
    /// way and nothing outside this directory), with its size. `None` for
    /// anything that is not that simple (absent, a link, not a regular
    /// file, an older kernel or a sandbox without `openat2`, another OS):
    /// the caller then looks the exact, step-by-step way.
    #[must_use]
    pub(super) fn file_beneath(&self, rel: &str) -> Option<(File, u64)> {
        let (handle, st) = Platform::open_beneath(self.fd(), rel)?;
        Platform::is_file(&st).then(|| (handle.into(), Platform::size(&st)))
    }

    /// Creates file `name` (0600 on Unix) holding `bytes`; `false` when
    /// something is already there (it is left alone).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(super) fn create_new(&self, name: impl AsRef<OsStr>, bytes: &[u8]) -> Result<bool> {
        let name = name.as_ref();
        let path = self.join(name);
        let handle = match Platform::create_file(self.fd(), name) {
            Ok(h) => h,
            Err(Failed::Exists) => return Ok(false),
            Err(f) => return Err(Error::io("create", &path, f.into_io())),
        };
        let mut file: File = handle.into();
        file.write_all(bytes)
            .map_err(|e| Error::io("write", &path, e))?;
        Ok(true)
    }

    /// Unlinks entry `name` if it is not a directory (a link is removed
    /// itself, never followed); absent is fine.
    ///
    /// # Errors
    /// [`Error::Untrusted`] when it is a directory; [`Error::Io`].
    pub(super) fn remove_file(&self, name: &str) -> Result<()> {
        let path = self.join(name);
        match Platform::unlink_file(self.fd(), OsStr::new(name)) {
            Ok(()) | Err(Failed::Absent(_)) => Ok(()),
            Err(Failed::WrongType(Some(what))) => Err(not_a(&path, "a regular file", what)),
            Err(Failed::WrongType(None)) => Err(not_a(
                &path,
                "a regular file",
                found(self.stat_at(name)?.as_ref()),
            )),
            Err(Failed::Stat(e)) => Err(Error::io("stat", &path, e)),
            Err(f) => Err(Error::io("remove", &path, f.into_io())),
        }
    }

    /// Renames entry `from` of this directory to `to` in `dest` (a link is
    /// moved itself). `noreplace`: fail with `AlreadyExists` rather than
    /// replace an entry at `to`.
    ///
    /// # Errors
    /// The OS error.
    pub(super) fn rename(
        &self,
        from: &str,
        dest: &Dir,
        to: &OsStr,
        noreplace: bool,
    ) -> std::io::Result<()> {
        let from = OsStr::new(from);
        if noreplace {
            Platform::rename_excl_at(self.fd(), from, dest.fd(), to)
        } else {
            Platform::rename_at(self.fd(), from, dest.fd(), to)
        }
    }

    /// The names of the entries of this directory (not `.` and `..`).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(super) fn names(&self) -> Result<Vec<OsString>> {
        Platform::names(self.fd()).map_err(|e| Error::io("read", &self.path, e))
    }

    /// Removes entry `name` and, if it is a directory, everything in it,
    /// walking handles without following links and never leaving this
    /// directory's device or volume (a mount point, a junction inside is
    /// not entered). Best effort: what cannot be removed stays (a leftover
    /// `list` counts).
    pub(super) fn remove_tree(&self, name: &OsStr) {
        let Ok(device) = self
            .stat()
            .map(|s| Platform::device(&s).unwrap_or(u64::MAX))
        else {
            return;
        };
        self.remove_tree_on(name, device, 0);
    }

    fn remove_tree_on(&self, name: &OsStr, device: u64, depth: u32) {
        match self.dir_plain(name) {
            Ok(Some(sub)) if depth < 64 => {
                if sub
                    .stat()
                    .is_ok_and(|s| Platform::device(&s) == Some(device))
                {
                    for child in sub.names().unwrap_or_default() {
                        sub.remove_tree_on(&child, device, depth + 1);
                    }
                    Platform::remove_dir_at(self.fd(), name, sub.handle);
                }
            }
            Ok(Some(_) | None) => {}
            Err(_) => Platform::remove_at(self.fd(), name),
        }
    }

    /// Is entry `name` still the directory `held` (same device and inode,
    /// or volume and file id; links not followed)?
    ///
    /// # Errors
    /// [`Error::Io`].
    pub(super) fn still_is(&self, name: &OsStr, held: &Dir) -> Result<bool> {
        let held = held.stat()?;
        Ok(self
            .stat_at(name)?
            .is_some_and(|st| Platform::same_file(&st, &held) && Platform::links(&held) > 0))
    }
}

/// What is built from the handle's primitives above.
impl Dir {
    /// Opens file `name` without following a link and without blocking; it
    /// must be a regular file. `None` when absent (and not created).
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link or a special file; [`Error::Io`].
    pub(super) fn file(&self, name: impl AsRef<OsStr>, how: Open) -> Result<Option<File>> {
        Ok(self.file_sized(name.as_ref(), how)?.map(|(f, _)| f))
    }

    /// Replaces file `name` with one holding `bytes`: written whole to `tmp`
    /// (whatever was at `tmp` is unlinked first, never followed), then
    /// renamed over `name`, so a reader sees the old file or the new one.
    ///
    /// # Errors
    /// [`Error::Io`]; [`Error::Untrusted`] when a directory stands at `tmp`
    /// or at `name` (naming it and how to clear it).
    pub(super) fn replace(&self, tmp: &str, name: impl AsRef<OsStr>, bytes: &[u8]) -> Result<()> {
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

    /// Reads file `name` whole, at most [`READ_LIMIT`] bytes (one more shows
    /// that it is larger); `None` when absent.
    ///
    /// # Errors
    /// As [`Dir::file`]; [`Error::Io`] when it is larger than the limit.
    pub(super) fn read_small(&self, name: impl AsRef<OsStr>) -> Result<Option<Vec<u8>>> {
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
                remove_file_fix(&self.join(name)),
            ));
        }
        Ok(Some(bytes))
    }
}

/// The most bytes read from any file of the layer (a record, a counter, the
/// config): a planted endless or huge file costs one bounded read.
const READ_LIMIT: usize = 64 * 1024;

/// How a file of the layer is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Open {
    /// Read only; absent is `None`.
    Read,
    /// Read and write, created (0600) when absent.
    ReadWriteCreate,
    /// Read and append, created (0600) when absent.
    AppendCreate,
}

fn untrusted(path: &Path, why: String, fix: String) -> Error {
    Error::Untrusted {
        path: path.to_path_buf(),
        why,
        fix,
    }
}

/// What stands at a name when it is not what was asked for.
#[derive(Debug)]
pub(super) enum Misfit {
    /// Not a directory (a file, a link, a special file).
    NotADirectory,
    /// Not a regular file (what it is instead).
    NotAFile(&'static str),
    /// Another OS error.
    Io(std::io::Error),
}

pub(super) use crate::bounded::read_bounded;
