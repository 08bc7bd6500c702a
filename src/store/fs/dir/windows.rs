//! The personal layer on Windows (SPEC §5 "Trust", §7 "Hostile layers",
//! §10): the system calls under the same [`super::Dir`] as on Unix, by NT
//! handles.
//!
//! The invariants are the Unix ones, kept with what NTFS offers:
//!
//! - every entry below the anchor is opened by `NtCreateFile` **relative to
//!   the open handle of its directory** (the `openat` of Windows: one name,
//!   no path walk) with `FILE_OPEN_REPARSE_POINT`, so a symbolic link, a
//!   junction or a mount point is opened itself, never followed, and then
//!   refused by its `FILE_ATTRIBUTE_REPARSE_POINT`; a name is one component
//!   (no `\`, `/`, `:` stream, `.` or `..`);
//! - only directories and regular disk files are used (`GetFileType` must
//!   say `FILE_TYPE_DISK`); a read is bounded by [`super::READ_LIMIT`]; a file
//!   written in place must have one link;
//! - P and P/run must be owned by the invoking user (the owner SID of the
//!   directory is the token's user, or the Administrators group when this
//!   token is a member, which is whom an elevated process creates files
//!   for). The DACL is not inspected: Windows has no `go-w` bit, and a
//!   directory created here inherits its parent's ACL (docs/safety.md, "Windows");
//! - nothing is created, renamed or deleted except by name relative to a
//!   handle below P/run: a rename is `FileRenameInformation` on a handle of the
//!   source with the destination directory's handle as its root, a delete
//!   is `FileDispositionInformation` on a handle opened without following links.
//!
//! Handles are opened sharing read, write and delete, so readers never
//! block a rename; where NTFS still refuses one for a moment (an open
//! handle without delete sharing, an indexer, a virus scanner), the rename
//! or delete is retried for at most [`SHARING_RETRY`].

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::ErrorKind;
use std::os::windows::ffi::{OsStrExt, OsStringExt};
use std::os::windows::io::{AsHandle, AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle};
use std::path::Path;
use std::time::Duration;

use windows_sys::Wdk::Foundation::OBJECT_ATTRIBUTES;
use windows_sys::Wdk::Storage::FileSystem::{
    FILE_CREATE, FILE_DIRECTORY_FILE, FILE_DISPOSITION_DELETE, FILE_DISPOSITION_INFORMATION,
    FILE_DISPOSITION_POSIX_SEMANTICS, FILE_INFORMATION_CLASS, FILE_NON_DIRECTORY_FILE, FILE_OPEN,
    FILE_OPEN_FOR_BACKUP_INTENT, FILE_OPEN_IF, FILE_OPEN_REPARSE_POINT, FILE_RENAME_INFORMATION,
    FILE_RENAME_POSIX_SEMANTICS, FILE_RENAME_REPLACE_IF_EXISTS, FILE_SYNCHRONOUS_IO_NONALERT,
    FileDispositionInformation, FileDispositionInformationEx, FileRenameInformation,
    FileRenameInformationEx, NtCreateFile, NtSetInformationFile,
};
use windows_sys::Win32::Foundation::{
    HANDLE, NTSTATUS, OBJ_CASE_INSENSITIVE, RtlNtStatusToDosError, STATUS_FILE_IS_A_DIRECTORY,
    STATUS_NOT_A_DIRECTORY, STATUS_OBJECT_NAME_COLLISION, STATUS_OBJECT_NAME_NOT_FOUND,
    STATUS_OBJECT_PATH_NOT_FOUND, UNICODE_STRING,
};
use windows_sys::Win32::Storage::FileSystem::{
    BY_HANDLE_FILE_INFORMATION, DELETE, FILE_ACCESS_RIGHTS, FILE_APPEND_DATA,
    FILE_ATTRIBUTE_DIRECTORY, FILE_ATTRIBUTE_NORMAL, FILE_ATTRIBUTE_REPARSE_POINT,
    FILE_FLAG_BACKUP_SEMANTICS, FILE_GENERIC_READ, FILE_GENERIC_WRITE, FILE_ID_BOTH_DIR_INFO,
    FILE_LIST_DIRECTORY, FILE_READ_ATTRIBUTES, FILE_SHARE_DELETE, FILE_SHARE_READ,
    FILE_SHARE_WRITE, FILE_TRAVERSE, FILE_TYPE_DISK, FILE_WRITE_ATTRIBUTES,
    FileIdBothDirectoryInfo, FileIdBothDirectoryRestartInfo, GetFileInformationByHandle,
    GetFileInformationByHandleEx, GetFileType, READ_CONTROL, SYNCHRONIZE,
};
use windows_sys::Win32::System::IO::IO_STATUS_BLOCK;

use super::{DirSys, Failed, Open, untrusted};
use crate::error::{Error, Result};

mod nt;
mod owner;
#[allow(clippy::wildcard_imports)]
use nt::*;
pub(in crate::store::fs) use nt::FileExt;

/// How long a rename or delete that NTFS refuses for a sharing reason (an
/// open handle elsewhere) is retried.
const SHARING_RETRY: Duration = Duration::from_secs(2);

const SHARE_ALL: u32 = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
const DIR_ACCESS: FILE_ACCESS_RIGHTS =
    FILE_LIST_DIRECTORY | FILE_TRAVERSE | FILE_READ_ATTRIBUTES | READ_CONTROL | SYNCHRONIZE;
const ERROR_ACCESS_DENIED: i32 = 5;
const ERROR_SHARING_VIOLATION: i32 = 32;
const ERROR_NO_MORE_FILES: i32 = 18;

/// What `GetFileInformationByHandle` tells about an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::store::fs) struct Stat {
    attributes: u32,
    volume: u32,
    index: u64,
    links: u32,
    size: u64,
    disk: bool,
}

impl Stat {
    fn of(h: BorrowedHandle<'_>) -> std::io::Result<Self> {
        // SAFETY: zeroed plain data the call fills in.
        let mut info: BY_HANDLE_FILE_INFORMATION = unsafe { std::mem::zeroed() };
        // SAFETY: a valid handle and out-pointer.
        if unsafe { GetFileInformationByHandle(h.as_raw_handle(), &raw mut info) } == 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a valid handle.
        let kind = unsafe { GetFileType(h.as_raw_handle()) };
        Ok(Self {
            attributes: info.dwFileAttributes,
            volume: info.dwVolumeSerialNumber,
            index: (u64::from(info.nFileIndexHigh) << 32) | u64::from(info.nFileIndexLow),
            links: info.nNumberOfLinks,
            size: (u64::from(info.nFileSizeHigh) << 32) | u64::from(info.nFileSizeLow),
            disk: kind == FILE_TYPE_DISK,
        })
    }

    fn is_link(&self) -> bool {
        self.attributes & FILE_ATTRIBUTE_REPARSE_POINT != 0
    }

    fn is_dir(&self) -> bool {
        !self.is_link() && self.attributes & FILE_ATTRIBUTE_DIRECTORY != 0
    }

    fn is_file(&self) -> bool {
        !self.is_link() && self.attributes & FILE_ATTRIBUTE_DIRECTORY == 0 && self.disk
    }

    fn kind(&self) -> &'static str {
        if self.is_link() {
            "a symbolic link, junction or mount point"
        } else if self.is_dir() {
            "a directory"
        } else if self.is_file() {
            "a regular file"
        } else {
            "a special file"
        }
    }
}

/// What a rename answers.
type Io = std::io::Result<()>;

fn os(status: NTSTATUS) -> Failed {
    Failed::Io(nt_error(status))
}

fn delete_entry(h: BorrowedHandle<'_>, name: &OsStr, options: u32) {
    if let Ok(opened) = nt_open(
        h,
        name,
        DELETE | FILE_READ_ATTRIBUTES | SYNCHRONIZE,
        FILE_OPEN,
        options,
    ) {
        let _ = retry_sharing(|| delete_handle(opened.as_handle()));
    }
}

fn rename(h: BorrowedHandle<'_>, from: &OsStr, dest: BorrowedHandle<'_>, to: &OsStr, replace: bool) -> Io {
    let to_wide = component(to).ok_or_else(|| std::io::Error::from(ErrorKind::InvalidInput))?;
    retry_sharing(|| {
        let opened = nt_open(
            h,
            from,
            DELETE | FILE_READ_ATTRIBUTES | SYNCHRONIZE,
            FILE_OPEN,
            0,
        )
        .map_err(|s| {
            if absent(s) {
                ErrorKind::NotFound.into()
            } else {
                nt_error(s)
            }
        })?;
        rename_handle(opened.as_handle(), dest, &to_wide, replace)
    })
}

/// The system calls of Windows.
#[derive(Debug)]
pub(in crate::store::fs) struct Platform;

impl DirSys for Platform {
    type Owned = OwnedHandle;
    /// A borrowed handle (for the network file system check).
    type Handle<'a> = BorrowedHandle<'a>;
    /// What `GetFileInformationByHandle` tells about an entry.
    type Stat = Stat;

    const GONE: &'static str = "gone";
    const LINK: &'static str = "a link";
    const REMOVE_FILE: &'static str = "Remove-Item";
    const REMOVE_TREE: &'static str = "Remove-Item -Recurse -Force";

    /// Quotes `s` for PowerShell (the fixes in messages are PowerShell lines).
    fn quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', "''"))
    }

    fn borrow(h: &OwnedHandle) -> BorrowedHandle<'_> {
        h.as_handle()
    }

    /// What `st` is, for messages.
    fn kind(st: &Stat) -> &'static str {
        st.kind()
    }

    fn is_file(st: &Stat) -> bool {
        st.is_file()
    }

    fn size(st: &Stat) -> u64 {
        st.size
    }

    fn links(st: &Stat) -> u64 {
        u64::from(st.links)
    }

    /// The volume `st` is on.
    fn device(st: &Stat) -> Option<u64> {
        Some(u64::from(st.volume))
    }

    /// Are `a` and `b` the same entry (volume and file id)?
    fn same_file(a: &Stat, b: &Stat) -> bool {
        a.volume == b.volume && a.index == b.index
    }

    /// Refuses the directory open at `h` (reached by `path`) unless the
    /// invoking user owns it.
    fn check_owner(h: BorrowedHandle<'_>, path: &Path) -> Result<()> {
        match owner::owned_by_me(h) {
            Ok(owner::Owner::Me) => Ok(()),
            Ok(owner::Owner::Other(sid)) => Err(untrusted(
                path,
                format!(
                    "it is owned by {sid}, not by you; another user's directory could redirect or forge locks"
                ),
                format!(
                    "run skill-lock as its owner, or take it over (takeown /r /f {}), or pick another store: --store file:DIR",
                    Self::quote(&path.display().to_string())
                ),
            )),
            Err(e) => Err(Error::io("inspect the owner of", path, e)),
        }
    }

    /// Opens the directory at `path` (links followed).
    fn open_anchor(path: &Path) -> std::result::Result<OwnedHandle, Failed> {
        use std::os::windows::fs::OpenOptionsExt;
        let file = match std::fs::OpenOptions::new()
            .access_mode(DIR_ACCESS)
            .share_mode(SHARE_ALL)
            .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Err(Failed::Absent(e)),
            Err(e) => return Err(Failed::Io(e)),
        };
        let handle = OwnedHandle::from(file);
        if !Stat::of(handle.as_handle()).map_err(Failed::Stat)?.is_dir() {
            return Err(Failed::Io(std::io::Error::other("it is not a directory")));
        }
        Ok(handle)
    }

    /// Creates directory `path`, parents too.
    fn create_dir_all(path: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn fstat(h: BorrowedHandle<'_>) -> std::io::Result<Stat> {
        Stat::of(h)
    }

    /// Status of entry `name` of `h`, links not followed; `None` when absent.
    fn stat_at(h: BorrowedHandle<'_>, name: &OsStr) -> std::io::Result<Option<Stat>> {
        match nt_open(h, name, FILE_READ_ATTRIBUTES | SYNCHRONIZE, FILE_OPEN, 0) {
            Ok(opened) => Stat::of(opened.as_handle()).map(Some),
            Err(s) if absent(s) => Ok(None),
            Err(s) => Err(nt_error(s)),
        }
    }

    /// Creates directory `name` in `h`.
    fn mkdir_at(h: BorrowedHandle<'_>, name: &OsStr) -> std::result::Result<(), Failed> {
        match nt_open(h, name, DIR_ACCESS, FILE_CREATE, FILE_DIRECTORY_FILE) {
            Ok(_) => Ok(()),
            Err(s) if s == STATUS_OBJECT_NAME_COLLISION => Err(Failed::Exists),
            Err(s) => Err(os(s)),
        }
    }

    /// Opens directory `name` of `h` without following a link.
    fn open_dir(h: BorrowedHandle<'_>, name: &OsStr) -> std::result::Result<OwnedHandle, Failed> {
        let handle = match nt_open(
            h,
            name,
            DIR_ACCESS,
            FILE_OPEN,
            FILE_DIRECTORY_FILE | FILE_OPEN_FOR_BACKUP_INTENT,
        ) {
            Ok(opened) => opened,
            Err(s) if absent(s) => return Err(Failed::Absent(nt_error(s))),
            Err(s) if s == STATUS_NOT_A_DIRECTORY => return Err(Failed::NotADirectory),
            Err(s) => return Err(os(s)),
        };
        let st = Stat::of(handle.as_handle()).map_err(Failed::Io)?;
        if !st.is_dir() {
            return Err(Failed::NotADirectory);
        }
        Ok(handle)
    }

    /// Opens file `name` of `h` without following a link (created when `how`
    /// says so), with its status.
    fn open_file(
        h: BorrowedHandle<'_>,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<(OwnedHandle, Stat), Failed> {
        let (access, disposition) = match how {
            Open::Read => (FILE_GENERIC_READ, FILE_OPEN),
            Open::ReadWriteCreate => (FILE_GENERIC_READ | FILE_GENERIC_WRITE, FILE_OPEN_IF),
            // No FILE_WRITE_DATA: every write goes to the end of the file.
            Open::AppendCreate => (
                FILE_GENERIC_READ | FILE_APPEND_DATA | FILE_WRITE_ATTRIBUTES | SYNCHRONIZE,
                FILE_OPEN_IF,
            ),
        };
        let handle = match nt_open(h, name, access, disposition, FILE_NON_DIRECTORY_FILE) {
            Ok(opened) => opened,
            Err(s) if absent(s) => return Err(Failed::Absent(nt_error(s))),
            Err(s) if s == STATUS_FILE_IS_A_DIRECTORY => return Err(Failed::WrongType(None)),
            Err(s) => return Err(os(s)),
        };
        let st = Stat::of(handle.as_handle()).map_err(Failed::Io)?;
        Ok((handle, st))
    }

    /// Always `None` on Windows: the caller looks step by step.
    fn open_beneath(_: BorrowedHandle<'_>, _: &str) -> Option<(OwnedHandle, Stat)> {
        None
    }

    /// Creates file `name` in `h`, failing when anything is there.
    fn create_file(h: BorrowedHandle<'_>, name: &OsStr) -> std::result::Result<OwnedHandle, Failed> {
        match nt_open(
            h,
            name,
            FILE_GENERIC_WRITE,
            FILE_CREATE,
            FILE_NON_DIRECTORY_FILE,
        ) {
            Ok(opened) => Ok(opened),
            Err(s) if s == STATUS_OBJECT_NAME_COLLISION => Err(Failed::Exists),
            Err(s) => Err(os(s)),
        }
    }

    /// Deletes entry `name` of `h` unless it is a directory (a link is
    /// removed itself).
    fn unlink_file(h: BorrowedHandle<'_>, name: &OsStr) -> std::result::Result<(), Failed> {
        let handle = match nt_open(
            h,
            name,
            DELETE | FILE_READ_ATTRIBUTES | SYNCHRONIZE,
            FILE_OPEN,
            0,
        ) {
            Ok(opened) => opened,
            Err(s) if absent(s) => return Err(Failed::Absent(nt_error(s))),
            Err(s) => return Err(os(s)),
        };
        let st = Stat::of(handle.as_handle()).map_err(Failed::Stat)?;
        if st.is_dir() {
            return Err(Failed::WrongType(Some(st.kind())));
        }
        retry_sharing(|| delete_handle(handle.as_handle())).map_err(Failed::Io)
    }

    /// Best effort: deletes entry `name` of `h` (not followed).
    fn remove_at(h: BorrowedHandle<'_>, name: &OsStr) {
        delete_entry(h, name, 0);
    }

    /// Best effort: deletes the empty directory `name` of `h`, open as
    /// `held` (closed first).
    fn remove_dir_at(h: BorrowedHandle<'_>, name: &OsStr, held: OwnedHandle) {
        drop(held);
        delete_entry(h, name, FILE_DIRECTORY_FILE);
    }

    /// Renames entry `from` of `h` to `to` in `dest`, replacing what is
    /// there (a link is moved itself; NTFS never renames over a directory).
    fn rename_at(h: BorrowedHandle<'_>, from: &OsStr, dest: BorrowedHandle<'_>, to: &OsStr) -> Io {
        rename(h, from, dest, to, true)
    }

    /// `rename_at`, but `AlreadyExists` rather than replace an entry at `to`
    /// (NTFS never renames over anything when not asked to replace).
    fn rename_excl_at(h: BorrowedHandle<'_>, from: &OsStr, dest: BorrowedHandle<'_>, to: &OsStr) -> Io {
        rename(h, from, dest, to, false)
    }

    /// The names of the entries of directory `h` (not `.` and `..`).
    fn names(h: BorrowedHandle<'_>) -> std::io::Result<Vec<OsString>> {
        let mut buf = vec![0u64; 8 * 1024];
        let len = u32::try_from(buf.len() * 8).unwrap_or(u32::MAX);
        let mut out = Vec::new();
        let mut class = FileIdBothDirectoryRestartInfo;
        loop {
            // SAFETY: a valid handle and a buffer of `len` bytes, 8-aligned.
            let ok = unsafe {
                GetFileInformationByHandleEx(h.as_raw_handle(), class, buf.as_mut_ptr().cast(), len)
            };
            if ok == 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(ERROR_NO_MORE_FILES) {
                    return Ok(out);
                }
                return Err(e);
            }
            class = FileIdBothDirectoryInfo;
            let base: *const u8 = buf.as_ptr().cast();
            let mut off = 0usize;
            loop {
                // SAFETY: the entries the call wrote lie inside buf, each at
                // an 8-aligned offset (NextEntryOffset).
                #[allow(
                    clippy::cast_ptr_alignment,
                    reason = "buf is 8-aligned and every NextEntryOffset is a multiple of 8"
                )]
                let entry = unsafe { &*base.add(off).cast::<FILE_ID_BOTH_DIR_INFO>() };
                let chars = usize::try_from(entry.FileNameLength).unwrap_or(0) / 2;
                // SAFETY: FileNameLength bytes of name follow in the buffer.
                let name = unsafe { std::slice::from_raw_parts(entry.FileName.as_ptr(), chars) };
                let name = OsString::from_wide(name);
                if name != "." && name != ".." {
                    out.push(name);
                }
                if entry.NextEntryOffset == 0 {
                    break;
                }
                off += usize::try_from(entry.NextEntryOffset).unwrap_or(usize::MAX / 2);
                if off >= buf.len() * 8 {
                    break;
                }
            }
        }
    }
}
