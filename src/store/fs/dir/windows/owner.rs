//! Windows: who owns an open file or directory (SPEC §5 "Trust", §10),
//! judged against this process's token.

use std::os::windows::io::{AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle};

use windows_sys::Win32::Foundation::{ERROR_SUCCESS, HANDLE, HLOCAL, LocalFree};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, GetSecurityInfo, SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    CheckTokenMembership, CreateWellKnownSid, EqualSid, GetTokenInformation,
    OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, PSID, TOKEN_QUERY, TOKEN_USER, TokenUser,
    WinBuiltinAdministratorsSid,
};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};

/// Who owns a file or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Owner {
    /// The invoking user (or the Administrators group, when this token is
    /// a member of it: elevated processes create files owned by it).
    Me,
    /// Someone else, by SID.
    Other(String),
}

/// The owner of the object open at `h`, judged against this process's token.
///
/// # Errors
/// The OS error.
pub(super) fn owned_by_me(h: BorrowedHandle<'_>) -> std::io::Result<Owner> {
    let mut owner: PSID = std::ptr::null_mut();
    let mut sd: PSECURITY_DESCRIPTOR = std::ptr::null_mut();
    // SAFETY: a valid handle; the out-pointers are valid; sd is freed below.
    let rc = unsafe {
        GetSecurityInfo(
            h.as_raw_handle(),
            SE_FILE_OBJECT,
            OWNER_SECURITY_INFORMATION,
            &raw mut owner,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &raw mut sd,
        )
    };
    if rc != ERROR_SUCCESS {
        return Err(std::io::Error::from_raw_os_error(
            i32::try_from(rc).unwrap_or(i32::MAX),
        ));
    }
    let verdict = judge_owner(owner);
    // SAFETY: sd was allocated by GetSecurityInfo (LocalAlloc).
    unsafe { LocalFree(sd as HLOCAL) };
    verdict
}

fn judge_owner(owner: PSID) -> std::io::Result<Owner> {
    if owner.is_null() {
        return Ok(Owner::Other("no owner".into()));
    }
    let (_keep, user) = token_user()?;
    // SAFETY: both are valid SIDs (user's buffer is alive in _keep).
    if unsafe { EqualSid(owner, user) } != 0 {
        return Ok(Owner::Me);
    }
    let mut admins = [0u8; 68];
    let mut len = u32::try_from(admins.len()).unwrap_or(68);
    // SAFETY: a buffer of `len` bytes for the well-known SID.
    let made = unsafe {
        CreateWellKnownSid(
            WinBuiltinAdministratorsSid,
            std::ptr::null_mut(),
            admins.as_mut_ptr().cast(),
            &raw mut len,
        )
    } != 0;
    let mut member = 0;
    // SAFETY: valid SIDs; a null token means this thread's effective token.
    if made
        && unsafe { EqualSid(owner, admins.as_mut_ptr().cast()) } != 0
        && unsafe {
            CheckTokenMembership(
                std::ptr::null_mut(),
                admins.as_mut_ptr().cast(),
                &raw mut member,
            )
        } != 0
        && member != 0
    {
        return Ok(Owner::Me);
    }
    Ok(Owner::Other(sid_string(owner)))
}

/// The SID of this process's user: the buffer holding it, and the SID
/// (which points into that buffer's heap allocation).
fn token_user() -> std::io::Result<(Vec<u64>, PSID)> {
    let mut token: HANDLE = std::ptr::null_mut();
    // SAFETY: the pseudo-handle of this process; token is closed below.
    if unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &raw mut token) } == 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a handle OpenProcessToken returned, owned here.
    let token = unsafe { OwnedHandle::from_raw_handle(token) };
    let mut buf = vec![0u64; 64];
    let mut len = 0u32;
    // SAFETY: a buffer of 512 bytes, 8-aligned.
    if unsafe {
        GetTokenInformation(
            token.as_raw_handle(),
            TokenUser,
            buf.as_mut_ptr().cast(),
            512,
            &raw mut len,
        )
    } == 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the call wrote a TOKEN_USER at the start of buf.
    let sid = unsafe { (*buf.as_ptr().cast::<TOKEN_USER>()).User.Sid };
    Ok((buf, sid))
}

fn sid_string(sid: PSID) -> String {
    let mut out: windows_sys::core::PWSTR = std::ptr::null_mut();
    // SAFETY: a valid SID; out is freed with LocalFree.
    if unsafe { ConvertSidToStringSidW(sid, &raw mut out) } == 0 || out.is_null() {
        return "another account".into();
    }
    // SAFETY: a NUL-terminated wide string the call allocated.
    let s = unsafe {
        let n = (0..32_768).take_while(|&i| *out.add(i) != 0).count();
        String::from_utf16_lossy(std::slice::from_raw_parts(out, n))
    };
    // SAFETY: allocated by ConvertSidToStringSidW.
    unsafe { LocalFree(out.cast()) };
    format!("the account {s}")
}
