//! Windows helpers shared by the layer, liveness, `run` and the git store
//! (SPEC §10): who owns a handle, a process's creation time, and a Job
//! Object that kills every process in it when its last handle closes (so
//! nothing a wrapped command started outlives the process that holds it).

use std::os::windows::io::{AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle};

use windows_sys::Win32::Foundation::{ERROR_SUCCESS, FILETIME, HANDLE, HLOCAL, LocalFree};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, GetSecurityInfo, SE_FILE_OBJECT,
};
use windows_sys::Win32::Security::{
    CheckTokenMembership, CreateWellKnownSid, EqualSid, GetTokenInformation,
    OWNER_SECURITY_INFORMATION, PSECURITY_DESCRIPTOR, PSID, TOKEN_QUERY, TOKEN_USER, TokenUser,
    WinBuiltinAdministratorsSid,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_BASIC_ACCOUNTING_INFORMATION, JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    JobObjectBasicAccountingInformation, JobObjectExtendedLimitInformation,
    QueryInformationJobObject, SetInformationJobObject, TerminateJobObject,
};
use windows_sys::Win32::System::Threading::{
    GetCurrentProcess, GetProcessTimes, OpenProcess, OpenProcessToken,
    PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SET_QUOTA, PROCESS_TERMINATE,
};

/// Who owns a file or directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
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
pub fn owned_by_me(h: BorrowedHandle<'_>) -> std::io::Result<Owner> {
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

fn filetime(ft: FILETIME) -> u64 {
    (u64::from(ft.dwHighDateTime) << 32) | u64::from(ft.dwLowDateTime)
}

/// A process by pid: `Ok(None)` when no such process exists here.
///
/// # Errors
/// The OS error (access denied: it exists, but is not ours to query).
pub fn open_process(pid: u32, access: u32) -> std::io::Result<Option<OwnedHandle>> {
    // SAFETY: plain call; the handle is owned below.
    let h = unsafe { OpenProcess(access, 0, pid) };
    if h.is_null() {
        let e = std::io::Error::last_os_error();
        // ERROR_INVALID_PARAMETER: no process has this pid.
        return if e.raw_os_error() == Some(87) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: a handle OpenProcess just returned.
    Ok(Some(unsafe { OwnedHandle::from_raw_handle(h) }))
}

/// Is the process open at `h` still running (not exited)?
#[must_use]
pub fn running(h: BorrowedHandle<'_>) -> bool {
    use windows_sys::Win32::System::Threading::WaitForSingleObject;
    // SAFETY: a valid process handle; a zero timeout only polls.
    let rc = unsafe { WaitForSingleObject(h.as_raw_handle(), 0) };
    rc == 0x0000_0102 // WAIT_TIMEOUT
}

/// The creation time of process `pid` (100 ns since 1601), if it exists
/// and may be queried.
#[must_use]
pub fn process_creation(pid: u32) -> Option<u64> {
    let h = open_process(pid, PROCESS_QUERY_LIMITED_INFORMATION).ok()??;
    let zero = FILETIME {
        dwLowDateTime: 0,
        dwHighDateTime: 0,
    };
    let (mut created, mut exited, mut kernel, mut user) = (zero, zero, zero, zero);
    // SAFETY: a valid process handle and out-pointers.
    let ok = unsafe {
        GetProcessTimes(
            h.as_raw_handle(),
            &raw mut created,
            &raw mut exited,
            &raw mut kernel,
            &raw mut user,
        )
    };
    (ok != 0).then(|| filetime(created))
}

/// A Job Object that kills every process in it when its last handle is
/// closed (this process ending, however, closes it), and lets none break
/// away.
#[derive(Debug)]
pub struct Job(OwnedHandle);

impl Job {
    /// A new, empty job.
    ///
    /// # Errors
    /// The OS error.
    pub fn new() -> std::io::Result<Self> {
        // SAFETY: no name, default security; the handle is owned below.
        let h = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
        if h.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a handle CreateJobObjectW just returned.
        let job = Self(unsafe { OwnedHandle::from_raw_handle(h) });
        // SAFETY: zeroed plain data; only the limit flags are set.
        let mut limits: JOBOBJECT_EXTENDED_LIMIT_INFORMATION = unsafe { std::mem::zeroed() };
        limits.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE;
        // SAFETY: a valid job handle and a buffer of the class's size.
        let ok = unsafe {
            SetInformationJobObject(
                job.0.as_raw_handle(),
                JobObjectExtendedLimitInformation,
                (&raw const limits).cast(),
                u32::try_from(std::mem::size_of::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>())
                    .unwrap_or(0),
            )
        };
        if ok == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(job)
    }

    /// Puts process `pid` into the job (what it starts from then on is in
    /// the job too).
    ///
    /// # Errors
    /// The OS error.
    pub fn assign(&self, pid: u32) -> std::io::Result<()> {
        let Some(p) = open_process(pid, PROCESS_SET_QUOTA | PROCESS_TERMINATE)? else {
            return Err(std::io::ErrorKind::NotFound.into());
        };
        // SAFETY: valid job and process handles.
        if unsafe { AssignProcessToJobObject(self.0.as_raw_handle(), p.as_raw_handle()) } == 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many processes of the job are still running (`None`: unknown).
    #[must_use]
    pub fn active(&self) -> Option<u32> {
        // SAFETY: zeroed plain data the call fills in.
        let mut info: JOBOBJECT_BASIC_ACCOUNTING_INFORMATION = unsafe { std::mem::zeroed() };
        // SAFETY: a valid job handle and a buffer of the class's size.
        let ok = unsafe {
            QueryInformationJobObject(
                self.0.as_raw_handle(),
                JobObjectBasicAccountingInformation,
                (&raw mut info).cast(),
                u32::try_from(std::mem::size_of::<JOBOBJECT_BASIC_ACCOUNTING_INFORMATION>())
                    .unwrap_or(0),
                std::ptr::null_mut(),
            )
        };
        (ok != 0).then_some(info.ActiveProcesses)
    }

    /// Ends every process of the job with `code`.
    pub fn terminate(&self, code: u32) {
        // SAFETY: a valid job handle.
        unsafe { TerminateJobObject(self.0.as_raw_handle(), code) };
    }
}

/// Reads the string value `value` of `HKLM\key` (64-bit view).
#[must_use]
pub fn registry_string(key: &str, value: &str) -> Option<String> {
    use windows_sys::Win32::System::Registry::{
        HKEY_LOCAL_MACHINE, RRF_RT_REG_SZ, RRF_SUBKEY_WOW6464KEY, RegGetValueW,
    };
    let wide = |s: &str| s.encode_utf16().chain([0]).collect::<Vec<u16>>();
    let (k, v) = (wide(key), wide(value));
    let mut buf = [0u16; 256];
    let mut len = u32::try_from(buf.len() * 2).unwrap_or(512);
    // SAFETY: NUL-terminated names and a buffer of `len` bytes.
    let rc = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            k.as_ptr(),
            v.as_ptr(),
            RRF_RT_REG_SZ | RRF_SUBKEY_WOW6464KEY,
            std::ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    if rc != ERROR_SUCCESS {
        return None;
    }
    let n = usize::try_from(len).unwrap_or(0) / 2;
    let s = String::from_utf16_lossy(buf.get(..n)?);
    let s = s.trim_end_matches('\0').trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// Does the registry value `HKLM\key\value` exist (any type)?
#[must_use]
pub fn registry_has(key: &str, value: &str) -> bool {
    use windows_sys::Win32::System::Registry::{
        HKEY_LOCAL_MACHINE, RRF_RT_ANY, RRF_SUBKEY_WOW6464KEY, RegGetValueW,
    };
    let wide = |s: &str| s.encode_utf16().chain([0]).collect::<Vec<u16>>();
    let (k, v) = (wide(key), wide(value));
    let mut len = 0u32;
    // SAFETY: NUL-terminated names; a null buffer asks for the size only.
    let rc = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            k.as_ptr(),
            v.as_ptr(),
            RRF_RT_ANY | RRF_SUBKEY_WOW6464KEY,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &raw mut len,
        )
    };
    rc == ERROR_SUCCESS
}
