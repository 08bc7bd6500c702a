//! Unix: `kill(pid, 0)` and `kill(-pgid, 0)` (ESRCH: gone, EPERM: alive),
//! `gethostname`, and a pid judged only from the same boot and pid
//! namespace; what differs by system (boot id, namespaces, start times,
//! process lists) is the [`System`] trait, implemented in `unix/linux.rs`
//! and, elsewhere, `unix/other.rs`.

use super::{Origin, same};
use crate::record::Holder;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux::Linux as This;
#[cfg(not(target_os = "linux"))]
mod other;
#[cfg(not(target_os = "linux"))]
use other::Other as This;

/// What differs by Unix system, checked by the compiler on each.
trait System {
    /// This process's origin.
    fn origin() -> Origin;
    /// Is `pid_ns` the initial pid namespace (never freed, so its inode
    /// alone names it)?
    fn initial_pid_ns(pid_ns: Option<u64>) -> bool;
    /// Milliseconds on the boot-time clock, where there is one.
    fn boot_ms() -> Option<u64>;
    /// Start time of a process, if known.
    fn process_start(pid: u32) -> Option<u64>;
    /// Is a member of group `pgid` not a zombie? `None`: cannot list them.
    fn group_has_running_member(pgid: u32) -> Option<bool>;
    /// Every process `root` owns (see [`crate::liveness::tree`]).
    fn tree(root: u32) -> Option<Vec<u32>>;
}

/// Unix's answers.
pub(super) struct Os;

impl super::Platform for Os {
    fn origin() -> Origin {
        This::origin()
    }

    fn boot_ms() -> Option<u64> {
        This::boot_ms()
    }

    fn process_start(pid: u32) -> Option<u64> {
        This::process_start(pid)
    }

    fn tree(root: u32) -> Option<Vec<u32>> {
        This::tree(root)
    }

    fn system_hostname() -> Option<String> {
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
    fn pid_comparable(holder: &Holder, here: &Origin) -> bool {
        same(holder.boot_id.as_ref(), here.boot_id.as_ref())
            && same(holder.pid_ns.as_ref(), here.pid_ns.as_ref())
            && (This::initial_pid_ns(here.pid_ns)
                || same(holder.pid_ns_start.as_ref(), here.pid_ns_start.as_ref()))
    }

    /// Does a process with this pid exist here? (`None`: cannot tell.)
    fn pid_exists(pid: u32) -> Option<bool> {
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
    fn group_alive(pgid: u32, leader_start: Option<u64>) -> Option<bool> {
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
        if let (Some(recorded), Some(current)) = (leader_start, This::process_start(pgid))
            && recorded != current
        {
            return Some(false);
        }
        Some(This::group_has_running_member(pgid).unwrap_or(true))
    }
}
