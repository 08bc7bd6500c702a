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
//! The handle's system calls are per OS, with the same functions on both:
//! `unix.rs` (`openat`, `renameat2`, `unlinkat` by rustix) and `windows.rs`
//! (`NtCreateFile` relative to a directory handle, reparse points refused);
//! what is built from them is written once, here.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

per_os!();

pub use sys::{Dir, FileExt};
#[cfg(windows)]
pub use sys::{SHARING_RETRY, Stat, remote_protocol};
use sys::{found, not_a};

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
                sys::remove_file_fix(&self.join(name)),
            ));
        }
        Ok(Some(bytes))
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

fn untrusted(path: &Path, why: String, fix: String) -> Error {
    Error::Untrusted {
        path: path.to_path_buf(),
        why,
        fix,
    }
}

/// What stands at a name when it is not what was asked for.
#[derive(Debug)]
pub(crate) enum Misfit {
    /// Not a directory (a file, a link, a special file).
    NotADirectory,
    /// Not a regular file (what it is instead).
    NotAFile(&'static str),
    /// Another OS error.
    Io(std::io::Error),
}

pub(crate) use crate::bounded::read_bounded;

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
                Err(Misfit::Io(e)) => return Err(Error::io("open", at.join(name), e)),
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
