//! Unix: `kill(pid, 0)` and `kill(-pgid, 0)` (ESRCH: gone, EPERM: alive),
//! `gethostname`, and a pid judged only from the same boot and pid
//! namespace; what differs by system (boot id, namespaces, start times,
//! process lists) is in `unix/linux.rs` and, elsewhere, `unix/other.rs`,
//! with the same functions.

use super::{Origin, same};
use crate::record::Holder;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as os;
#[cfg(not(target_os = "linux"))]
mod other;
#[cfg(not(target_os = "linux"))]
use other as os;

pub(super) use os::{boot_ms, origin, process_start, tree};

pub(super) fn system_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // when the name fits (POSIX).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec())
        .ok()
        .filter(|h| !h.is_empty())
}

/// True when a pid recorded in `holder` means the same process here: same
/// boot and same pid namespace, both known (outside the initial namespace,
/// the namespace's init start time too).
pub(super) fn pid_comparable(holder: &Holder, here: &Origin) -> bool {
    same(holder.boot_id.as_ref(), here.boot_id.as_ref())
        && same(holder.pid_ns.as_ref(), here.pid_ns.as_ref())
        && (os::initial_pid_ns(here.pid_ns)
            || same(holder.pid_ns_start.as_ref(), here.pid_ns_start.as_ref()))
}

/// Does a process with this pid exist here? (`None`: cannot tell.)
#[must_use]
pub(crate) fn pid_exists(pid: u32) -> Option<bool> {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return Some(false);
    };
    if raw <= 0 {
        return Some(false);
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(raw, 0) };
    if rc == 0 {
        return Some(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Some(false),
        Some(libc::EPERM) => Some(true),
        _ => None,
    }
}

/// Is any process of group `pgid` alive on this host? (`None`: cannot tell.)
///
/// `leader_start` is the recorded start time of the group's first leader
/// (whose pid is the group id): a live process with that pid but another
/// start time proves the group ended and its id was reused, since a group id
/// is never handed out as a pid while any member of that group lives. A
/// group whose members are all zombies writes nothing more: it is gone.
#[must_use]
pub(crate) fn group_alive(pgid: u32, leader_start: Option<u64>) -> Option<bool> {
    let raw = match libc::pid_t::try_from(pgid) {
        Ok(raw) if raw > 1 => raw,
        _ => return Some(false),
    };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    if unsafe { libc::kill(-raw, 0) } != 0 {
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ESRCH) => return Some(false),
            Some(libc::EPERM) => {}
            _ => return None,
        }
    }
    if let (Some(recorded), Some(current)) = (leader_start, process_start(pgid))
        && recorded != current
    {
        return Some(false);
    }
    Some(os::group_has_running_member(pgid).unwrap_or(true))
}
