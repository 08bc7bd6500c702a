//! The personal layer on Windows (SPEC §5 "Trust", §7 "Hostile layers",
//! §10): the same [`Dir`] as on Unix, by NT handles.
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
//!   directory created here inherits its parent's ACL (docs/design.md);
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
use std::io::{ErrorKind, Write};
use std::os::windows::ffi::{OsStrExt, OsStringExt};
use std::os::windows::io::{AsHandle, AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle};
use std::path::{Path, PathBuf};
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

use super::{Misfit, Open, untrusted};
use crate::error::{Error, Result};

mod nt;
mod owner;
#[allow(clippy::wildcard_imports)]
use nt::*;
pub use nt::{FileExt, remote_protocol};

/// How long a rename or delete that NTFS refuses for a sharing reason (an
/// open handle elsewhere) is retried.
pub const SHARING_RETRY: Duration = Duration::from_secs(2);

const SHARE_ALL: u32 = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
const DIR_ACCESS: FILE_ACCESS_RIGHTS =
    FILE_LIST_DIRECTORY | FILE_TRAVERSE | FILE_READ_ATTRIBUTES | READ_CONTROL | SYNCHRONIZE;
const ERROR_ACCESS_DENIED: i32 = 5;
const ERROR_SHARING_VIOLATION: i32 = 32;
const ERROR_NO_MORE_FILES: i32 = 18;

/// What `GetFileInformationByHandle` tells about an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
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

/// An open directory of the layer and the path it was reached by (for messages).
#[derive(Debug)]
pub struct Dir {
    handle: OwnedHandle,
    path: PathBuf,
}

/// Quotes `s` for PowerShell (the fixes in messages are PowerShell lines).
fn ps_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// How to remove a file that must not be there, for messages.
pub(super) fn remove_file_fix(path: &Path) -> String {
    format!(
        "remove it (Remove-Item {})",
        ps_quote(&path.display().to_string())
    )
}

pub(super) fn not_a(path: &Path, want: &str, found: &str) -> Error {
    untrusted(
        path,
        format!(
            "it is {found}, not {want}; the tool never follows links or opens special files in the personal layer"
        ),
        format!(
            "remove it (Remove-Item -Recurse -Force {}) and run again",
            ps_quote(&path.display().to_string())
        ),
    )
}

pub(super) fn found(st: Option<&Stat>) -> &'static str {
    st.map_or("gone", Stat::kind)
}

impl Dir {
    /// Opens the anchor of a layer: a path the user chose (links followed).
    /// `None` when it does not exist.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be opened as a directory.
    pub fn anchor(path: &Path) -> Result<Option<Self>> {
        use std::os::windows::fs::OpenOptionsExt;
        let file = match std::fs::OpenOptions::new()
            .access_mode(DIR_ACCESS)
            .share_mode(SHARE_ALL)
            .custom_flags(FILE_FLAG_BACKUP_SEMANTICS)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("open", path, e)),
        };
        let d = Self {
            handle: OwnedHandle::from(file),
            path: path.to_path_buf(),
        };
        if !d.stat()?.is_dir() {
            return Err(Error::io(
                "open",
                path,
                std::io::Error::other("it is not a directory"),
            ));
        }
        Ok(Some(d))
    }

    /// The anchor, created (parents too) when absent.
    ///
    /// # Errors
    /// [`Error::Io`] when it cannot be created or opened.
    pub fn anchor_create(path: &Path) -> Result<Self> {
        if let Some(d) = Self::anchor(path)? {
            return Ok(d);
        }
        std::fs::create_dir_all(path).map_err(|e| Error::io("create", path, e))?;
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

    /// The handle itself (for the network file system check).
    #[must_use]
    pub fn fd(&self) -> BorrowedHandle<'_> {
        self.handle.as_handle()
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
        Stat::of(self.fd()).map_err(|e| Error::io("stat", &self.path, e))
    }

    /// Refuses this directory unless the invoking user owns it.
    ///
    /// # Errors
    /// [`Error::Untrusted`], [`Error::Io`].
    pub fn check_owner(&self) -> Result<()> {
        match owner::owned_by_me(self.fd()) {
            Ok(owner::Owner::Me) => Ok(()),
            Ok(owner::Owner::Other(sid)) => Err(untrusted(
                &self.path,
                format!(
                    "it is owned by {sid}, not by you; another user's directory could redirect or forge locks"
                ),
                format!(
                    "run skill-lock as its owner, or take it over (takeown /r /f {}), or pick another store: --store file:DIR",
                    ps_quote(&self.path.display().to_string())
                ),
            )),
            Err(e) => Err(Error::io("inspect the owner of", &self.path, e)),
        }
    }

    /// Status of entry `name`, links not followed; `None` when absent.
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn stat_at(&self, name: impl AsRef<OsStr>) -> Result<Option<Stat>> {
        let name = name.as_ref();
        match nt_open(
            self.fd(),
            name,
            FILE_READ_ATTRIBUTES | SYNCHRONIZE,
            FILE_OPEN,
            0,
        ) {
            Ok(h) => Stat::of(h.as_handle())
                .map(Some)
                .map_err(|e| Error::io("stat", self.join(name), e)),
            Err(s) if absent(s) => Ok(None),
            Err(s) => Err(Error::io("stat", self.join(name), nt_error(s))),
        }
    }

    /// Opens subdirectory `name` without following a link, created when
    /// absent and `create`; `None` when absent and not `create`. It must be
    /// the invoking user's.
    ///
    /// # Errors
    /// [`Error::Untrusted`] for a link, a non-directory or a foreign
    /// directory; [`Error::Io`] otherwise.
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
                    match nt_open(
                        self.fd(),
                        name,
                        DIR_ACCESS,
                        FILE_CREATE,
                        FILE_DIRECTORY_FILE,
                    ) {
                        Ok(_) => {}
                        Err(s) if s == STATUS_OBJECT_NAME_COLLISION => {}
                        Err(s) => return Err(Error::io("create", &path, nt_error(s))),
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
    /// ownership check: `None` when absent, `Err(kind)` when something else
    /// is there.
    pub(crate) fn dir_plain(&self, name: &OsStr) -> std::result::Result<Option<Self>, Misfit> {
        let handle = match nt_open(
            self.fd(),
            name,
            DIR_ACCESS,
            FILE_OPEN,
            FILE_DIRECTORY_FILE | FILE_OPEN_FOR_BACKUP_INTENT,
        ) {
            Ok(h) => h,
            Err(s) if absent(s) => return Ok(None),
            Err(s) if s == STATUS_NOT_A_DIRECTORY => return Err(Misfit::NotADirectory),
            Err(s) => return Err(Misfit::Io(nt_error(s))),
        };
        let st = Stat::of(handle.as_handle()).map_err(Misfit::Io)?;
        if !st.is_dir() {
            return Err(Misfit::NotADirectory);
        }
        Ok(Some(Self {
            handle,
            path: self.join(name),
        }))
    }

    pub(super) fn file_sized(&self, name: &OsStr, how: Open) -> Result<Option<(File, u64)>> {
        let path = self.join(name);
        match self.file_plain(name, how) {
            Ok(f) => Ok(f),
            Err(Misfit::NotAFile(what)) => Err(not_a(&path, "a regular file", what)),
            Err(Misfit::NotADirectory) => Err(not_a(&path, "a regular file", "a link")),
            Err(Misfit::Io(e)) => Err(Error::io("open", &path, e)),
        }
    }

    /// [`Dir::file`], telling what is there instead of failing on it.
    pub(crate) fn file_plain(
        &self,
        name: &OsStr,
        how: Open,
    ) -> std::result::Result<Option<(File, u64)>, Misfit> {
        let (access, disposition) = match how {
            Open::Read => (FILE_GENERIC_READ, FILE_OPEN),
            Open::ReadWriteCreate => (FILE_GENERIC_READ | FILE_GENERIC_WRITE, FILE_OPEN_IF),
            // No FILE_WRITE_DATA: every write goes to the end of the file.
            Open::AppendCreate => (
                FILE_GENERIC_READ | FILE_APPEND_DATA | FILE_WRITE_ATTRIBUTES | SYNCHRONIZE,
                FILE_OPEN_IF,
            ),
        };
        let handle = match nt_open(
            self.fd(),
            name,
            access,
            disposition,
            FILE_NON_DIRECTORY_FILE,
        ) {
            Ok(h) => h,
            Err(s) if absent(s) && how == Open::Read => return Ok(None),
            Err(s) if s == STATUS_FILE_IS_A_DIRECTORY => {
                return Err(Misfit::NotAFile(found(
                    self.stat_at(name).ok().flatten().as_ref(),
                )));
            }
            Err(s) => return Err(Misfit::Io(nt_error(s))),
        };
        let st = Stat::of(handle.as_handle()).map_err(Misfit::Io)?;
        if !st.is_file() {
            return Err(Misfit::NotAFile(st.kind()));
        }
        if how != Open::Read && st.links > 1 {
            return Err(Misfit::NotAFile("a file with other hard links"));
        }
        Ok(Some((File::from(handle), st.size)))
    }

    /// Always `None` on Windows: the caller looks step by step.
    #[must_use]
    pub fn file_beneath(&self, rel: &str) -> Option<(File, u64)> {
        let _ = rel;
        None
    }

    /// Creates file `name` holding `bytes`; `false` when something is
    /// already there (it is left alone).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn create_new(&self, name: impl AsRef<OsStr>, bytes: &[u8]) -> Result<bool> {
        let name = name.as_ref();
        let path = self.join(name);
        let handle = match nt_open(
            self.fd(),
            name,
            FILE_GENERIC_WRITE,
            FILE_CREATE,
            FILE_NON_DIRECTORY_FILE,
        ) {
            Ok(h) => h,
            Err(s) if s == STATUS_OBJECT_NAME_COLLISION => return Ok(false),
            Err(s) => return Err(Error::io("create", &path, nt_error(s))),
        };
        File::from(handle)
            .write_all(bytes)
            .map_err(|e| Error::io("write", &path, e))?;
        Ok(true)
    }

    /// Deletes entry `name` if it is not a directory (a link is removed
    /// itself, never followed); absent is fine.
    ///
    /// # Errors
    /// [`Error::Untrusted`] when it is a directory; [`Error::Io`].
    pub fn remove_file(&self, name: &str) -> Result<()> {
        let path = self.join(name);
        let handle = match nt_open(
            self.fd(),
            OsStr::new(name),
            DELETE | FILE_READ_ATTRIBUTES | SYNCHRONIZE,
            FILE_OPEN,
            0,
        ) {
            Ok(h) => h,
            Err(s) if absent(s) => return Ok(()),
            Err(s) => return Err(Error::io("remove", &path, nt_error(s))),
        };
        let st = Stat::of(handle.as_handle()).map_err(|e| Error::io("stat", &path, e))?;
        if st.is_dir() {
            return Err(not_a(&path, "a regular file", st.kind()));
        }
        retry_sharing(|| delete_handle(handle.as_handle()))
            .map_err(|e| Error::io("remove", &path, e))
    }

    /// Renames entry `from` of this directory to `to` in `dest` (a link is
    /// moved itself). `noreplace`: fail with `AlreadyExists` rather than
    /// replace an entry at `to` (NTFS never renames over a directory, nor
    /// over anything when not asked to replace).
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
        let to_wide = component(to).ok_or_else(|| std::io::Error::from(ErrorKind::InvalidInput))?;
        retry_sharing(|| {
            let handle = nt_open(
                self.fd(),
                OsStr::new(from),
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
            rename_handle(handle.as_handle(), dest.fd(), &to_wide, !noreplace)
        })
    }

    /// The names of the entries of this directory (not `.` and `..`).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn names(&self) -> Result<Vec<OsString>> {
        let mut buf = vec![0u64; 8 * 1024];
        let len = u32::try_from(buf.len() * 8).unwrap_or(u32::MAX);
        let mut out = Vec::new();
        let mut class = FileIdBothDirectoryRestartInfo;
        loop {
            // SAFETY: a valid handle and a buffer of `len` bytes, 8-aligned.
            let ok = unsafe {
                GetFileInformationByHandleEx(
                    self.handle.as_raw_handle(),
                    class,
                    buf.as_mut_ptr().cast(),
                    len,
                )
            };
            if ok == 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(ERROR_NO_MORE_FILES) {
                    return Ok(out);
                }
                return Err(Error::io("read", &self.path, e));
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

    /// Removes entry `name` and, if it is a directory, everything in it,
    /// walking handles without following links and never leaving this
    /// directory's volume (a junction or mount point inside is removed
    /// itself, not what it leads to). Best effort.
    pub fn remove_tree(&self, name: &OsStr) {
        let Ok(volume) = self.stat().map(|s| s.volume) else {
            return;
        };
        self.remove_tree_on(name, volume, 0);
    }

    fn remove_tree_on(&self, name: &OsStr, volume: u32, depth: u32) {
        match self.dir_plain(name) {
            Ok(Some(sub)) if depth < 64 => {
                if sub.stat().is_ok_and(|s| s.volume == volume) {
                    for child in sub.names().unwrap_or_default() {
                        sub.remove_tree_on(&child, volume, depth + 1);
                    }
                    drop(sub);
                    self.delete_entry(name, FILE_DIRECTORY_FILE);
                }
            }
            Ok(Some(_) | None) => {}
            Err(_) => self.delete_entry(name, 0),
        }
    }

    fn delete_entry(&self, name: &OsStr, options: u32) {
        if let Ok(h) = nt_open(
            self.fd(),
            name,
            DELETE | FILE_READ_ATTRIBUTES | SYNCHRONIZE,
            FILE_OPEN,
            options,
        ) {
            let _ = retry_sharing(|| delete_handle(h.as_handle()));
        }
    }

    /// Is entry `name` still the directory `held` (same volume and file id,
    /// links not followed)?
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn still_is(&self, name: &OsStr, held: &Dir) -> Result<bool> {
        let held = held.stat()?;
        Ok(self
            .stat_at(name)?
            .is_some_and(|st| st.volume == held.volume && st.index == held.index && held.links > 0))
    }
}
