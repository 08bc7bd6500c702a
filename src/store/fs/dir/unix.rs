//! Unix: the system calls under the layer's directory handle, `openat`,
//! `mkdirat`, `renameat2` and `unlinkat` by rustix relative to an open
//! directory, never following a link; the owner and mode check.

use std::ffi::{OsStr, OsString};
use std::io::ErrorKind;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;

use super::{DirSys, Failed, Open, untrusted};
use crate::error::{Error, Result};

/// Positioned reads and writes (`pread`, `pwrite`), as on Windows.
pub(in crate::store::fs) use std::os::unix::fs::FileExt;

/// What a rename answers.
type Io = std::io::Result<()>;

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

/// Under sudo, gives what the tool just created to the user sudo ran it
/// for (SPEC §5), so that their own later runs can use it.
fn give_to_invoker(fd: BorrowedFd<'_>) -> std::result::Result<(), Failed> {
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

/// The system calls of Unix.
#[derive(Debug)]
pub(in crate::store::fs) struct Platform;

impl DirSys for Platform {
    type Owned = OwnedFd;
    /// A borrowed handle (for `fstatfs` and the like).
    type Handle<'a> = BorrowedFd<'a>;
    /// What `fstat` tells about an entry.
    type Stat = Stat;

    const GONE: &'static str = "a symbolic link";
    const LINK: &'static str = "a symbolic link";
    const REMOVE_FILE: &'static str = "rm";
    const REMOVE_TREE: &'static str = "rm -r";

    /// `s` quoted for the shell of the fixes in messages.
    fn quote(s: &str) -> String {
        crate::shell::quote(s)
    }

    fn borrow(h: &OwnedFd) -> BorrowedFd<'_> {
        h.as_fd()
    }

    /// What `st` is, for messages.
    fn kind(st: &Stat) -> &'static str {
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

    fn is_file(st: &Stat) -> bool {
        FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
    }

    fn size(st: &Stat) -> u64 {
        u64::try_from(st.st_size).unwrap_or(0)
    }

    #[allow(clippy::useless_conversion, reason = "nlink_t is u16 on macOS")]
    fn links(st: &Stat) -> u64 {
        u64::from(st.st_nlink)
    }

    /// The device `st` is on.
    #[allow(clippy::useless_conversion, reason = "dev_t is i32 on macOS")]
    fn device(st: &Stat) -> Option<u64> {
        u64::try_from(st.st_dev).ok()
    }

    /// Are `a` and `b` the same entry (device and inode)?
    fn same_file(a: &Stat, b: &Stat) -> bool {
        a.st_dev == b.st_dev && a.st_ino == b.st_ino
    }

    /// Refuses the directory open at `h` (reached by `path`) unless it is the
    /// invoking user's alone.
    fn check_owner(h: BorrowedFd<'_>, path: &Path) -> Result<()> {
        let st = Self::fstat(h).map_err(|e| Error::io("stat", path, e))?;
        let me = uid();
        let quoted = Self::quote(&path.display().to_string());
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
    fn open_anchor(path: &Path) -> std::result::Result<OwnedFd, Failed> {
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

    /// Creates directory `path` (0700), parents too.
    fn create_dir_all(path: &Path) -> std::io::Result<()> {
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

    fn fstat(h: BorrowedFd<'_>) -> std::io::Result<Stat> {
        rustix::fs::fstat(h).map_err(Into::into)
    }

    /// Status of entry `name` of `h`, links not followed; `None` when absent.
    fn stat_at(h: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<Option<Stat>> {
        match rustix::fs::statat(h, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e == Errno::NOENT => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates directory `name` (0700) in `h`.
    fn mkdir_at(h: BorrowedFd<'_>, name: &OsStr) -> std::result::Result<(), Failed> {
        match rustix::fs::mkdirat(h, name, Mode::RWXU) {
            Ok(()) if crate::ownership::sudo_owner().is_some() => {
                let made = Self::open_dir(h, name)?;
                give_to_invoker(made.as_fd())
            }
            Ok(()) => Ok(()),
            Err(e) if e == Errno::EXIST => Err(Failed::Exists),
            Err(e) => Err(os(e)),
        }
    }

    /// Opens directory `name` of `h` without following a link.
    fn open_dir(h: BorrowedFd<'_>, name: &OsStr) -> std::result::Result<OwnedFd, Failed> {
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
    fn open_file(
        h: BorrowedFd<'_>,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<(OwnedFd, Stat), Failed> {
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
    fn open_beneath(h: BorrowedFd<'_>, rel: &str) -> Option<(OwnedFd, Stat)> {
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
    fn create_file(h: BorrowedFd<'_>, name: &OsStr) -> std::result::Result<OwnedFd, Failed> {
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
    fn unlink_file(h: BorrowedFd<'_>, name: &OsStr) -> std::result::Result<(), Failed> {
        match rustix::fs::unlinkat(h, name, AtFlags::empty()) {
            Ok(()) => Ok(()),
            Err(e) if e == Errno::NOENT => Err(Failed::Absent(e.into())),
            Err(e) if e == Errno::ISDIR || e == Errno::PERM => Err(Failed::WrongType(None)),
            Err(e) => Err(os(e)),
        }
    }

    /// Best effort: unlinks entry `name` of `h` (not a directory).
    fn remove_at(h: BorrowedFd<'_>, name: &OsStr) {
        let _ = rustix::fs::unlinkat(h, name, AtFlags::empty());
    }

    /// Best effort: removes the empty directory `name` of `h`, open as `held`.
    fn remove_dir_at(h: BorrowedFd<'_>, name: &OsStr, held: OwnedFd) {
        let _ = rustix::fs::unlinkat(h, name, AtFlags::REMOVEDIR);
        drop(held);
    }

    /// Renames entry `from` of `h` to `to` in `dest`, replacing what is
    /// there (a link is moved itself).
    fn rename_at(h: BorrowedFd<'_>, from: &OsStr, dest: BorrowedFd<'_>, to: &OsStr) -> Io {
        rustix::fs::renameat(h, from, dest, to).map_err(Into::into)
    }

    /// `rename_at`, but `AlreadyExists` rather than replace an entry at `to`.
    fn rename_excl_at(h: BorrowedFd<'_>, from: &OsStr, dest: BorrowedFd<'_>, to: &OsStr) -> Io {
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
        if Self::stat_at(dest, to)
            .map_err(|_| std::io::Error::from(ErrorKind::Other))?
            .is_some()
        {
            return Err(ErrorKind::AlreadyExists.into());
        }
        Self::rename_at(h, from, dest, to)
    }

    /// The names of the entries of directory `h` (not `.` and `..`).
    fn names(h: BorrowedFd<'_>) -> std::io::Result<Vec<OsString>> {
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
}
