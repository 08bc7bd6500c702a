//! The NT calls under the Windows layer handle: one name opened relative
//! to a directory handle, renames and deletes on a handle, the sharing
//! retry. Every path-free primitive [`super::Dir`] is built from.

#![allow(clippy::wildcard_imports)]
use super::*;

/// One component of a name, as UTF-16, or `None` when it is not one.
pub(super) fn component(name: &OsStr) -> Option<Vec<u16>> {
    let wide: Vec<u16> = name.encode_wide().collect();
    let bad = |c: u16| c < 0x20 || u8::try_from(c).is_ok_and(|b| br#"\/:*?"<>|"#.contains(&b));
    let dots = wide.iter().all(|&c| c == u16::from(b'.'));
    (!wide.is_empty() && !dots && !wide.iter().any(|&c| bad(c))).then_some(wide)
}

pub(super) fn nt_error(status: NTSTATUS) -> std::io::Error {
    // SAFETY: a pure mapping.
    let code = unsafe { RtlNtStatusToDosError(status) };
    std::io::Error::from_raw_os_error(i32::try_from(code).unwrap_or(i32::MAX))
}

/// `NtCreateFile` of the single name `name` relative to directory `root`.
pub(super) fn nt_open(
    root: BorrowedHandle<'_>,
    name: &OsStr,
    access: FILE_ACCESS_RIGHTS,
    disposition: u32,
    options: u32,
) -> std::result::Result<OwnedHandle, NTSTATUS> {
    let Some(mut wide) = component(name) else {
        return Err(STATUS_OBJECT_NAME_NOT_FOUND_INVALID);
    };
    let bytes = u16::try_from(wide.len() * 2).map_err(|_| STATUS_OBJECT_NAME_NOT_FOUND_INVALID)?;
    let uname = UNICODE_STRING {
        Length: bytes,
        MaximumLength: bytes,
        Buffer: wide.as_mut_ptr(),
    };
    let attrs = OBJECT_ATTRIBUTES {
        Length: u32::try_from(std::mem::size_of::<OBJECT_ATTRIBUTES>()).unwrap_or(48),
        RootDirectory: root.as_raw_handle(),
        ObjectName: &raw const uname,
        Attributes: OBJ_CASE_INSENSITIVE,
        SecurityDescriptor: std::ptr::null(),
        SecurityQualityOfService: std::ptr::null(),
    };
    // SAFETY: zeroed plain data the call fills in.
    let mut iosb: IO_STATUS_BLOCK = unsafe { std::mem::zeroed() };
    let mut handle: HANDLE = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the name outlives it.
    let status = unsafe {
        NtCreateFile(
            &raw mut handle,
            access,
            &raw const attrs,
            &raw mut iosb,
            std::ptr::null(),
            FILE_ATTRIBUTE_NORMAL,
            SHARE_ALL,
            disposition,
            options | FILE_OPEN_REPARSE_POINT | FILE_SYNCHRONOUS_IO_NONALERT,
            std::ptr::null(),
            0,
        )
    };
    if status < 0 {
        return Err(status);
    }
    // SAFETY: a handle NtCreateFile just returned, owned by no one else.
    Ok(unsafe { OwnedHandle::from_raw_handle(handle) })
}

/// `STATUS_OBJECT_NAME_INVALID`: a name that is not one component.
const STATUS_OBJECT_NAME_NOT_FOUND_INVALID: NTSTATUS = 0xC000_0033_u32.cast_signed();

pub(super) fn absent(status: NTSTATUS) -> bool {
    status == STATUS_OBJECT_NAME_NOT_FOUND || status == STATUS_OBJECT_PATH_NOT_FOUND
}

/// Runs `op` again while NTFS refuses it for a sharing reason, at most
/// [`SHARING_RETRY`].
pub(super) fn retry_sharing<T>(mut op: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    let until = crate::clock::lease_clock() + SHARING_RETRY;
    loop {
        match op() {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(ERROR_SHARING_VIOLATION | ERROR_ACCESS_DENIED)
                ) && crate::clock::lease_clock() < until =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// The status of a file information class this file system or kernel
/// does not know (older Windows, FAT, wine): the caller falls back.
pub(super) fn unsupported(status: NTSTATUS) -> bool {
    // STATUS_NOT_IMPLEMENTED, STATUS_INVALID_INFO_CLASS,
    // STATUS_INVALID_PARAMETER, STATUS_NOT_SUPPORTED.
    [0xC000_0002_u32, 0xC000_0003, 0xC000_000D, 0xC000_00BB]
        .iter()
        .any(|&c| c.cast_signed() == status)
}

/// `NtSetInformationFile` of `class` with the bytes at `info`.
pub(super) fn set_information(
    h: BorrowedHandle<'_>,
    info: *const std::ffi::c_void,
    len: usize,
    class: FILE_INFORMATION_CLASS,
) -> NTSTATUS {
    // SAFETY: zeroed plain data the call fills in.
    let mut iosb: IO_STATUS_BLOCK = unsafe { std::mem::zeroed() };
    // SAFETY: a valid handle; `info` points to `len` readable bytes.
    unsafe {
        NtSetInformationFile(
            h.as_raw_handle(),
            &raw mut iosb,
            info,
            u32::try_from(len).unwrap_or(u32::MAX),
            class,
        )
    }
}

/// Marks the entry open at `h` for deletion (POSIX semantics where the
/// file system has them: the name goes at once, even while another
/// handle is open).
pub(super) fn delete_handle(h: BorrowedHandle<'_>) -> std::io::Result<()> {
    let flags: u32 = FILE_DISPOSITION_DELETE | FILE_DISPOSITION_POSIX_SEMANTICS;
    let mut status = set_information(
        h,
        (&raw const flags).cast(),
        4,
        FileDispositionInformationEx,
    );
    if unsupported(status) {
        let info = FILE_DISPOSITION_INFORMATION { DeleteFile: true };
        status = set_information(
            h,
            (&raw const info).cast(),
            std::mem::size_of::<FILE_DISPOSITION_INFORMATION>(),
            FileDispositionInformation,
        );
    }
    if status < 0 {
        return Err(nt_error(status));
    }
    Ok(())
}

/// Renames the entry open at `h` to `to` in directory `dest`: POSIX
/// semantics where the file system has them (a replaced file may still be
/// open elsewhere), else the classic rename.
pub(super) fn rename_handle(
    h: BorrowedHandle<'_>,
    dest: BorrowedHandle<'_>,
    to: &[u16],
    replace: bool,
) -> std::io::Result<()> {
    let head = std::mem::offset_of!(FILE_RENAME_INFORMATION, FileName);
    let size = head + to.len() * 2;
    let mut buf = vec![0u64; (size + 2).div_ceil(8)];
    let info = buf.as_mut_ptr().cast::<FILE_RENAME_INFORMATION>();
    let replace_flag = if replace {
        FILE_RENAME_REPLACE_IF_EXISTS
    } else {
        0
    };
    // SAFETY: buf is large enough and 8-aligned for the header and the name.
    unsafe {
        (*info).Anonymous.Flags = replace_flag | FILE_RENAME_POSIX_SEMANTICS;
        (*info).RootDirectory = dest.as_raw_handle();
        (*info).FileNameLength = u32::try_from(to.len() * 2).unwrap_or(0);
        std::ptr::copy_nonoverlapping(to.as_ptr(), (&raw mut (*info).FileName).cast(), to.len());
    }
    let mut status = set_information(h, info.cast_const().cast(), size, FileRenameInformationEx);
    if unsupported(status) {
        // The classic class: a BOOLEAN ReplaceIfExists in the first byte.
        // SAFETY: as above.
        unsafe { (*info).Anonymous.Flags = replace_flag };
        status = set_information(h, info.cast_const().cast(), size, FileRenameInformation);
    }
    if status < 0 {
        return Err(nt_error(status));
    }
    Ok(())
}

/// Positional reads and writes (`pread`/`pwrite` on Unix): `seek_read` and
/// `seek_write`, looped until done. (They move the handle's position,
/// which no caller relies on.)
pub(in crate::store::fs) trait FileExt {
    /// Reads into `buf` at `offset`; the count read.
    ///
    /// # Errors
    /// The OS error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// The OS error; `UnexpectedEof` when the file is shorter.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
    /// Writes all of `buf` at `offset`.
    ///
    /// # Errors
    /// The OS error.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()>;
}

impl FileExt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(self, buf, offset)
    }

    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> std::io::Result<()> {
        while !buf.is_empty() {
            match std::os::windows::fs::FileExt::seek_write(self, buf, offset) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
