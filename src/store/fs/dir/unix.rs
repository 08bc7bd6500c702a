//! Unix: the system calls under the layer's directory handle, `openat`,
//! `mkdirat`, `renameat2` and `unlinkat` by rustix relative to an open
//! directory, never following a link; the owner and mode check.

use std::ffi::{OsStr, OsString};
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::{Failed, Open, untrusted};
use crate::error::{Error, Result};

/// What `fstat` tells about an entry.
pub(super) use rustix::fs::Stat;
/// Positioned reads and writes (`pread`, `pwrite`), as on Windows.
pub use std::os::unix::fs::FileExt;

/// What a rename answers.
type Io = std::io::Result<()>;

/// An open handle.
pub(super) type Owned = OwnedFd;
/// A borrowed handle (for `fstatfs` and the like).
pub(super) type Handle<'a> = BorrowedFd<'a>;

/// What stands at a name that vanished before it could be looked at.
pub(super) const GONE: &str = "a symbolic link";
/// What refuses to be opened as a directory.
pub(super) const LINK: &str = "a symbolic link";
/// The command that removes a file, for messages.
pub(super) const REMOVE_FILE: &str = "rm";
/// The command that removes a tree, for messages.
pub(super) const REMOVE_TREE: &str = "rm -r";

/// `s` quoted for the shell of the fixes in messages.
pub(super) fn quote(s: &str) -> String {
    crate::shell::quote(s)
}

pub(super) fn borrow(h: &Owned) -> Handle<'_> {
    h.as_fd()
}

fn os(e: Errno) -> Failed {
    Failed::Io(e.into())
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

/// What `st` is, for messages.
pub(super) fn kind(st: &Stat) -> &'static str {
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

pub(super) fn is_file(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
}

pub(super) fn size(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

#[allow(clippy::useless_conversion, reason = "nlink_t is u16 on macOS")]
pub(super) fn links(st: &Stat) -> u64 {
    u64::from(st.st_nlink)
}

/// The device `st` is on.
#[allow(clippy::useless_conversion, reason = "dev_t is i32 on macOS")]
pub(super) fn device(st: &Stat) -> Option<u64> {
    u64::try_from(st.st_dev).ok()
}

/// Are `a` and `b` the same entry (device and inode)?
pub(super) fn same_file(a: &Stat, b: &Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

/// Refuses the directory open at `h` (reached by `path`) unless it is the
/// invoking user's alone.
pub(super) fn check_owner(h: Handle<'_>, path: &Path) -> Result<()> {
    let st = fstat(h).map_err(|e| Error::io("stat", path, e))?;
    let me = uid();
    let quoted = quote(&path.display().to_string());
    // Under sudo, what the invoking user owns is theirs (SPEC §5).
    let sudo_user = crate::ownership::sudo_owner().map(|(u, _)| u);
    if st.st_uid != me && Some(st.st_uid) != sudo_user {
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

/// Opens the directory at `path` (links followed).
pub(super) fn open_anchor(path: &Path) -> std::result::Result<Owned, Failed> {
    match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(e) if e == Errno::NOENT => Err(Failed::Absent(e.into())),
        Err(e) => Err(os(e)),
    }
}

/// Under sudo, gives what the tool just created to the user sudo ran it
/// for (SPEC §5), so that their own later runs can use it.
fn give_to_invoker(fd: Handle<'_>) -> std::result::Result<(), Failed> {
    match crate::ownership::sudo_owner() {
        Some((u, g)) => rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(u)),
            Some(rustix::fs::Gid::from_raw(g)),
        )
        .map_err(os),
        None => Ok(()),
    }
}

/// Creates directory `path` (0700), parents too.
pub(super) fn create_dir_all(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)?;
    if let Some((u, g)) = crate::ownership::sudo_owner() {
        std::os::unix::fs::chown(path, Some(u), Some(g))?;
    }
    Ok(())
}

pub(super) fn fstat(h: Handle<'_>) -> std::io::Result<Stat> {
    rustix::fs::fstat(h).map_err(Into::into)
}

/// Status of entry `name` of `h`, links not followed; `None` when absent.
pub(super) fn stat_at(h: Handle<'_>, name: &OsStr) -> std::io::Result<Option<Stat>> {
    match rustix::fs::statat(h, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st)),
        Err(e) if e == Errno::NOENT => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Creates directory `name` (0700) in `h`.
pub(super) fn mkdir_at(h: Handle<'_>, name: &OsStr) -> std::result::Result<(), Failed> {
    match rustix::fs::mkdirat(h, name, Mode::RWXU) {
        Ok(()) if crate::ownership::sudo_owner().is_some() => {
            let made = open_dir(h, name)?;
            give_to_invoker(made.as_fd())
        }
        Ok(()) => Ok(()),
        Err(e) if e == Errno::EXIST => Err(Failed::Exists),
        Err(e) => Err(os(e)),
    }
}

/// Opens directory `name` of `h` without following a link.
pub(super) fn open_dir(h: Handle<'_>, name: &OsStr) -> std::result::Result<Owned, Failed> {
    match rustix::fs::openat(
        h,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(fd),
        Err(e) if e == Errno::NOENT => Err(Failed::Absent(e.into())),
        Err(e) if e == Errno::LOOP || e == Errno::NOTDIR => Err(Failed::NotADirectory),
        Err(e) => Err(os(e)),
    }
}

/// Opens file `name` of `h` without following a link and without
/// blocking (created 0600 when `how` says so), with its status.
pub(super) fn open_file(
    h: Handle<'_>,
    name: &OsStr,
    how: Open,
) -> std::result::Result<(Owned, Stat), Failed> {
    let base = OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let flags = match how {
        Open::Read => base | OFlags::RDONLY,
        Open::ReadWriteCreate => base | OFlags::RDWR | OFlags::CREATE,
        Open::AppendCreate => base | OFlags::RDWR | OFlags::APPEND | OFlags::CREATE,
    };
    let fd = match rustix::fs::openat(h, name, flags, Mode::RUSR | Mode::WUSR) {
        Ok(fd) => fd,
        Err(e) if e == Errno::NOENT => return Err(Failed::Absent(e.into())),
        Err(e) if e == Errno::LOOP => return Err(Failed::WrongType(Some("a symbolic link"))),
        Err(e) if e == Errno::ISDIR || e == Errno::NXIO => return Err(Failed::WrongType(None)),
        Err(e) => return Err(os(e)),
    };
    if how != Open::Read {
        give_to_invoker(fd.as_fd())?;
    }
    let st = rustix::fs::fstat(&fd).map_err(os)?;
    Ok((fd, st))
}

/// Opens the file at the relative path `rel` below `h` in one lookup
/// (Linux `openat2` with no link anywhere on the way and nothing outside
/// `h`), with its status; `None` for anything else (and off Linux).
pub(super) fn open_beneath(h: Handle<'_>, rel: &str) -> Option<(Owned, Stat)> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::fs::ResolveFlags;
        let fd = rustix::fs::openat2(
            h,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH,
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        Some((fd, st))
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = (h, rel);
        None
    }
}

/// Creates file `name` (0600) in `h`, failing when anything is there.
pub(super) fn create_file(h: Handle<'_>, name: &OsStr) -> std::result::Result<Owned, Failed> {
    match rustix::fs::openat(
        h,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    ) {
        Ok(fd) => {
            give_to_invoker(fd.as_fd())?;
            Ok(fd)
        }
        Err(e) if e == Errno::EXIST => Err(Failed::Exists),
        Err(e) => Err(os(e)),
    }
}

/// Unlinks entry `name` of `h` unless it is a directory (a link is
/// removed itself).
pub(super) fn unlink_file(h: Handle<'_>, name: &OsStr) -> std::result::Result<(), Failed> {
    match rustix::fs::unlinkat(h, name, AtFlags::empty()) {
        Ok(()) => Ok(()),
        Err(e) if e == Errno::NOENT => Err(Failed::Absent(e.into())),
        Err(e) if e == Errno::ISDIR || e == Errno::PERM => Err(Failed::WrongType(None)),
        Err(e) => Err(os(e)),
    }
}

/// Best effort: unlinks entry `name` of `h` (not a directory).
pub(super) fn remove_at(h: Handle<'_>, name: &OsStr) {
    let _ = rustix::fs::unlinkat(h, name, AtFlags::empty());
}

/// Best effort: removes the empty directory `name` of `h`, open as `held`.
pub(super) fn remove_dir_at(h: Handle<'_>, name: &OsStr, held: Owned) {
    let _ = rustix::fs::unlinkat(h, name, AtFlags::REMOVEDIR);
    drop(held);
}

/// Renames entry `from` of `h` to `to` in `dest`, replacing what is
/// there (a link is moved itself).
pub(super) fn rename_at(h: Handle<'_>, from: &OsStr, dest: Handle<'_>, to: &OsStr) -> Io {
    rustix::fs::renameat(h, from, dest, to).map_err(Into::into)
}

/// [`rename_at`], but `AlreadyExists` rather than replace an entry at `to`.
pub(super) fn rename_excl_at(h: Handle<'_>, from: &OsStr, dest: Handle<'_>, to: &OsStr) -> Io {
    #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple"))]
    {
        // RENAME_NOREPLACE on Linux, RENAME_EXCL on macOS.
        let flags = RenameFlags::NOREPLACE;
        match rustix::fs::renameat_with(h, from, dest, to, flags) {
            Ok(()) => return Ok(()),
            Err(e) if e == Errno::NOSYS || e == Errno::INVAL => {}
            Err(e) => return Err(e.into()),
        }
    }
    // Fallback (an old kernel or a file system without it): every caller
    // holds the lock's guard, so nobody else creates `to` meanwhile, and
    // rename(2) never replaces a non-empty directory.
    if stat_at(dest, to)
        .map_err(|_| std::io::Error::from(ErrorKind::Other))?
        .is_some()
    {
        return Err(ErrorKind::AlreadyExists.into());
    }
    rename_at(h, from, dest, to)
}

/// The names of the entries of directory `h` (not `.` and `..`).
pub(super) fn names(h: Handle<'_>) -> std::io::Result<Vec<OsString>> {
    let mut dir = rustix::fs::Dir::read_from(h)?;
    let mut out = Vec::new();
    for entry in &mut dir {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_owned());
        }
    }
    Ok(out)
}
