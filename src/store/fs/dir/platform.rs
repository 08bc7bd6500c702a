//! The per-OS interface of [`super::Dir`]: the system calls it is built
//! from, declared once as a trait that `unix.rs` and `windows.rs` each
//! implement, and how a call says what stood in its way.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::ErrorKind;
use std::path::Path;

use super::Open;
use crate::error::Result;

/// The system calls [`Dir`] is built from, declared once and implemented
/// by each OS's `Platform` (`unix.rs`, `windows.rs`), so the compiler
/// checks that both have every one. Each tells what stands in its way as a
/// [`Failed`]; every decision on those answers is made in `mod.rs`.
pub(in crate::store::fs) trait DirSys {
    /// An open handle (a file's becomes a [`File`]).
    type Owned: std::fmt::Debug + Into<File>;
    /// A borrowed handle (for `fstatfs`, the remote protocol and the like).
    type Handle<'a>;
    /// What a status call tells about an entry.
    type Stat;

    /// What stands at a name that vanished before it could be looked at.
    const GONE: &'static str;
    /// What refuses to be opened as a directory.
    const LINK: &'static str;
    /// The command that removes a file, for messages.
    const REMOVE_FILE: &'static str;
    /// The command that removes a tree, for messages.
    const REMOVE_TREE: &'static str;

    /// `s` quoted for the shell of the fixes in messages.
    fn quote(s: &str) -> String;
    /// The handle `h`, borrowed.
    fn borrow(h: &Self::Owned) -> Self::Handle<'_>;

    /// What `st` is, for messages.
    fn kind(st: &Self::Stat) -> &'static str;
    /// Is `st` a regular file?
    fn is_file(st: &Self::Stat) -> bool;
    /// Its size in bytes.
    fn size(st: &Self::Stat) -> u64;
    /// Its number of hard links.
    fn links(st: &Self::Stat) -> u64;
    /// The device or volume it is on.
    fn device(st: &Self::Stat) -> Option<u64>;
    /// Are `a` and `b` the same entry?
    fn same_file(a: &Self::Stat, b: &Self::Stat) -> bool;

    /// Refuses the directory open at `h` (reached by `path`) unless it is
    /// the invoking user's alone.
    fn check_owner(h: Self::Handle<'_>, path: &Path) -> Result<()>;
    /// Opens the directory at `path` (links followed).
    fn open_anchor(path: &Path) -> std::result::Result<Self::Owned, Failed>;
    /// Creates directory `path` (0700 on Unix), parents too.
    fn create_dir_all(path: &Path) -> std::io::Result<()>;
    /// Status of the open `h`.
    fn fstat(h: Self::Handle<'_>) -> std::io::Result<Self::Stat>;
    /// Status of entry `name` of `h`, links not followed; `None` when absent.
    fn stat_at(h: Self::Handle<'_>, name: &OsStr) -> std::io::Result<Option<Self::Stat>>;
    /// Creates directory `name` (0700 on Unix) in `h`.
    fn mkdir_at(h: Self::Handle<'_>, name: &OsStr) -> std::result::Result<(), Failed>;
    /// Opens directory `name` of `h` without following a link.
    fn open_dir(h: Self::Handle<'_>, name: &OsStr) -> std::result::Result<Self::Owned, Failed>;
    /// Opens file `name` of `h` without following a link and without
    /// blocking (created 0600 when `how` says so), with its status.
    fn open_file(
        h: Self::Handle<'_>,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<(Self::Owned, Self::Stat), Failed>;
    /// Opens the file at the relative path `rel` below `h` in one lookup,
    /// with its status, where the OS can (Linux `openat2`); `None` for
    /// anything else.
    fn open_beneath(h: Self::Handle<'_>, rel: &str) -> Option<(Self::Owned, Self::Stat)>;
    /// Creates file `name` (0600 on Unix) in `h`, failing when anything is there.
    fn create_file(h: Self::Handle<'_>, name: &OsStr) -> std::result::Result<Self::Owned, Failed>;
    /// Unlinks entry `name` of `h` unless it is a directory (a link is
    /// removed itself).
    fn unlink_file(h: Self::Handle<'_>, name: &OsStr) -> std::result::Result<(), Failed>;
    /// Best effort: unlinks entry `name` of `h` (not a directory).
    fn remove_at(h: Self::Handle<'_>, name: &OsStr);
    /// Best effort: removes the empty directory `name` of `h`, open as `held`.
    fn remove_dir_at(h: Self::Handle<'_>, name: &OsStr, held: Self::Owned);
    /// Renames entry `from` of `h` to `to` in `dest`, replacing what is
    /// there (a link is moved itself).
    fn rename_at(
        h: Self::Handle<'_>,
        from: &OsStr,
        dest: Self::Handle<'_>,
        to: &OsStr,
    ) -> std::io::Result<()>;
    /// [`DirSys::rename_at`], but `AlreadyExists` rather than replace an
    /// entry at `to`.
    fn rename_excl_at(
        h: Self::Handle<'_>,
        from: &OsStr,
        dest: Self::Handle<'_>,
        to: &OsStr,
    ) -> std::io::Result<()>;
    /// The names of the entries of directory `h` (not `.` and `..`).
    fn names(h: Self::Handle<'_>) -> std::io::Result<Vec<OsString>>;
}

/// Why a system call at a name did not do what was asked, as the
/// [`DirSys`] tells it; what follows is decided by [`super::Dir`].
#[derive(Debug)]
pub(in crate::store::fs) enum Failed {
    /// Nothing is at the name.
    Absent(std::io::Error),
    /// Something is already at the name (a create).
    Exists,
    /// Not a directory (a file, a link, a special file).
    NotADirectory,
    /// Something of another type: what, when the call learned it.
    WrongType(Option<&'static str>),
    /// The status of what was opened could not be read.
    #[cfg_attr(unix, allow(dead_code, reason = "only Windows reads it apart"))]
    Stat(std::io::Error),
    /// Another OS error.
    Io(std::io::Error),
}

impl Failed {
    /// The OS error this stands for.
    pub(super) fn into_io(self) -> std::io::Error {
        match self {
            Self::Absent(e) | Self::Stat(e) | Self::Io(e) => e,
            Self::Exists => ErrorKind::AlreadyExists.into(),
            Self::NotADirectory => ErrorKind::NotADirectory.into(),
            Self::WrongType(_) => ErrorKind::InvalidInput.into(),
        }
    }
}
