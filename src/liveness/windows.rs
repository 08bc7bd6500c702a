//! Windows (SPEC §6, §10): a process is its pid **and its creation time**
//! (`GetProcessTimes`, 100 ns since 1601), the machine is a hash of
//! `HKLM\SOFTWARE\Microsoft\Cryptography\MachineGuid`, the boot is the
//! kernel's boot counter (`...\PrefetchParameters\BootId`, where Windows
//! keeps one) and the boot clock `GetTickCount64` (counts sleep, never
//! steps).
//!
//! A pid with its creation time names one process on one machine for good
//! (a later process with the same pid has a later creation time, in any
//! boot), so a record written on this machine is judged by its pid without
//! a boot id: no process with that pid, or one created at another time,
//! means its owner is gone. There are no pid namespaces; a Windows
//! container (the `ContainerType` value of
//! `HKLM\SYSTEM\CurrentControlSet\Control`) has its own pids and maybe
//! its image's MachineGuid, so inside one no machine is certain and every
//! record is judged by its lease alone, as is one from any other machine.

use std::os::windows::io::{AsRawHandle, BorrowedHandle, FromRawHandle, OwnedHandle};

use sha2::{Digest, Sha256};
use windows_sys::Win32::Foundation::{ERROR_SUCCESS, FILETIME};
use windows_sys::Win32::System::Threading::{
    GetProcessTimes, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION, PROCESS_SYNCHRONIZE,
};

use super::Origin;
use crate::record::Holder;

const CONTROL: &str = r"SYSTEM\CurrentControlSet\Control";
const PREFETCH: &str =
    r"SYSTEM\CurrentControlSet\Control\Session Manager\Memory Management\PrefetchParameters";

/// Windows's answers.
pub(super) struct Os;

impl super::Platform for Os {
    fn origin() -> Origin {
        Origin {
            machine: certain_machine(),
            boot_id: boot_id(),
            pid_ns: None,
            pid_ns_start: None,
            time_ns: None,
        }
    }

    /// A pid recorded in `holder` is judged here when the record is certainly
    /// this machine's (the same MachineGuid hash, outside a container): a pid
    /// with its creation time names one process across boots.
    fn pid_comparable(holder: &Holder, here: &Origin) -> bool {
        matches!((&holder.machine, &here.machine), (Some(a), Some(b)) if a == b)
    }

    /// `GetTickCount64`: counts sleep, never steps.
    fn boot_ms() -> Option<u64> {
        // SAFETY: no preconditions.
        Some(unsafe { windows_sys::Win32::System::SystemInformation::GetTickCount64() })
    }

    fn process_start(pid: u32) -> Option<u64> {
        process_creation(pid)
    }

    /// Does a running process with this pid exist here? (`None`: cannot tell.)
    fn pid_exists(pid: u32) -> Option<bool> {
        if pid == 0 {
            return Some(false);
        }
        // Waiting on a process needs SYNCHRONIZE: without it the wait fails,
        // which once read as "exited" and judged every live owner dead.
        match open_process(pid, PROCESS_QUERY_LIMITED_INFORMATION | PROCESS_SYNCHRONIZE) {
            Ok(None) => Some(false),
            // An exited process whose object someone still holds is gone.
            Ok(Some(h)) => running(std::os::windows::io::AsHandle::as_handle(&h)),
            // Access denied: it exists, and is someone else's.
            Err(e) if e.raw_os_error() == Some(5) => Some(true),
            Err(_) => None,
        }
    }

    /// Windows has no process groups: a "group" recorded by another platform
    /// is judged by its leader's pid and creation time.
    fn group_alive(pgid: u32, leader_start: Option<u64>) -> Option<bool> {
        if !Self::pid_exists(pgid)? {
            return Some(false);
        }
        match (leader_start, Self::process_start(pgid)) {
            (Some(recorded), Some(current)) if recorded != current => Some(false),
            _ => Some(true),
        }
    }

    /// `run` owns its command's processes through a Job Object instead.
    fn tree(_root: u32) -> Option<Vec<u32>> {
        None
    }

    /// This computer's NetBIOS name.
    fn system_hostname() -> Option<String> {
        use windows_sys::Win32::System::SystemInformation::{
            ComputerNamePhysicalDnsHostname, GetComputerNameExW,
        };
        let mut buf = [0u16; 256];
        let mut len = u32::try_from(buf.len()).unwrap_or(256);
        // SAFETY: a buffer of `len` wide characters.
        let ok = unsafe {
            GetComputerNameExW(
                ComputerNamePhysicalDnsHostname,
                buf.as_mut_ptr(),
                &raw mut len,
            )
        };
        if ok == 0 {
            return None;
        }
        let name = String::from_utf16_lossy(buf.get(..usize::try_from(len).ok()?)?);
        (!name.is_empty()).then_some(name)
    }
}

/// The machine, unless inside a container: a hash of MachineGuid (the id
/// itself is never stored).
fn certain_machine() -> Option<String> {
    if registry_has(CONTROL, "ContainerType") {
        return None;
    }
    let guid = registry_string(r"SOFTWARE\Microsoft\Cryptography", "MachineGuid")?;
    let digest = Sha256::digest(format!(
        "skill-lock machine windows {}",
        guid.to_ascii_lowercase()
    ));
    Some(crate::record::hex(&digest[..16]))
}

/// The kernel's boot counter, with the machine it counts on (a counter
/// alone repeats across machines).
fn boot_id() -> Option<String> {
    use windows_sys::Win32::System::Registry::{
        HKEY_LOCAL_MACHINE, RRF_RT_REG_DWORD, RRF_SUBKEY_WOW6464KEY, RegGetValueW,
    };
    let machine = certain_machine()?;
    let key: Vec<u16> = PREFETCH.encode_utf16().chain([0]).collect();
    let value: Vec<u16> = "BootId".encode_utf16().chain([0]).collect();
    let mut n = 0u32;
    let mut len = 4u32;
    // SAFETY: NUL-terminated names and a 4-byte buffer for a DWORD.
    let rc = unsafe {
        RegGetValueW(
            HKEY_LOCAL_MACHINE,
            key.as_ptr(),
            value.as_ptr(),
            RRF_RT_REG_DWORD | RRF_SUBKEY_WOW6464KEY,
            std::ptr::null_mut(),
            (&raw mut n).cast(),
            &raw mut len,
        )
    };
    (rc == 0).then(|| format!("windows-boot-{n}-{machine}"))
}

// ---------------------------------------------------- processes, registry

fn filetime(ft: FILETIME) -> u64 {
    (u64::from(ft.dwHighDateTime) << 32) | u64::from(ft.dwLowDateTime)
}

/// A process by pid: `Ok(None)` when no such process exists here.
///
/// # Errors
/// The OS error (access denied: it exists, but is not ours to query).
fn open_process(pid: u32, access: u32) -> std::io::Result<Option<OwnedHandle>> {
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

/// Is the process open at `h` (with `SYNCHRONIZE`) still running, not
/// exited? (`None`: the wait failed, so it cannot tell.)
#[must_use]
fn running(h: BorrowedHandle<'_>) -> Option<bool> {
    use windows_sys::Win32::Foundation::{WAIT_OBJECT_0, WAIT_TIMEOUT};
    use windows_sys::Win32::System::Threading::WaitForSingleObject;
    // SAFETY: a valid process handle; a zero timeout only polls.
    match unsafe { WaitForSingleObject(h.as_raw_handle(), 0) } {
        WAIT_TIMEOUT => Some(true),
        WAIT_OBJECT_0 => Some(false),
        _ => None,
    }
}

/// The creation time of process `pid` (100 ns since 1601), if it exists
/// and may be queried.
#[must_use]
fn process_creation(pid: u32) -> Option<u64> {
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

/// Reads the string value `value` of `HKLM\key` (64-bit view).
#[must_use]
fn registry_string(key: &str, value: &str) -> Option<String> {
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
fn registry_has(key: &str, value: &str) -> bool {
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
