//! Liveness (SPEC §6): is a record's owner still there?
//!
//! Conservative by rule: a pid is judged only on the host, and the boot, that
//! recorded it; `kill(pid, 0)` failing with ESRCH means dead, EPERM means
//! alive; a live pid whose start time differs from the recorded one is a
//! reused pid, so the owner is dead. Anything unknown counts as alive, so a
//! lock is never taken from a holder that might still be running.

use crate::lease::{BootClock, Now, remaining_ms};
use crate::record::Holder;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
use linux as os;
#[cfg(not(target_os = "linux"))]
mod fallback;
#[cfg(not(target_os = "linux"))]
use fallback as os;

/// Why a lock is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleReason {
    /// now ≥ expires.
    Expired,
    /// The owner pid on this host is gone, reused, or the host rebooted.
    OwnerDead,
    /// The record cannot be read or parsed.
    Corrupt,
}

impl StaleReason {
    /// The SPEC spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Expired => "expired",
            Self::OwnerDead => "owner_dead",
            Self::Corrupt => "corrupt",
        }
    }
}

/// Hostname of this machine (`SKILL_LOCK_HOST` overrides it, for tests of
/// cross-host behaviour).
#[must_use]
pub fn hostname() -> String {
    if let Some(h) = std::env::var_os("SKILL_LOCK_HOST").and_then(|h| h.into_string().ok())
        && !h.is_empty()
    {
        return h;
    }
    system_hostname().unwrap_or_else(|| "localhost".to_owned())
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

/// The boot-time clock, where the OS has one.
#[must_use]
pub fn boot_clock() -> Option<BootClock> {
    os::boot_clock()
}

/// Start time of a process (opaque units, comparable on one boot), if known.
#[must_use]
pub fn process_start(pid: u32) -> Option<u64> {
    os::process_start(pid)
}

/// Does a process with this pid exist on this host? (`None`: cannot tell.)
#[must_use]
pub fn pid_exists(pid: u32) -> Option<bool> {
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
pub fn group_alive(pgid: u32, leader_start: Option<u64>) -> Option<bool> {
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

/// The verdict on a `run` lock's process group, where the record names one
/// and was written on this host and boot: `Some(true)` while any member
/// lives (held, even past `expires`: those members may still write),
/// `Some(false)` once none does. `None`: not a group lock, or not certain.
#[must_use]
pub fn group_verdict(holder: &Holder, host: &str, now: &Now) -> Option<bool> {
    let pgid = holder.owner_pgid?;
    let same_boot = matches!(
        (holder.boot_id.as_deref(), now.boot.as_ref()),
        (Some(theirs), Some(ours)) if theirs == ours.id
    );
    if holder.host != host || !(same_boot || now.boot.is_none()) {
        return None;
    }
    group_alive(pgid, holder.group_start)
}

/// Is the owner pid named by `holder` known to be dead?
#[must_use]
pub fn owner_dead(holder: &Holder, host: &str, now: &Now) -> bool {
    let Some(pid) = holder.owner_pid else {
        return false;
    };
    if holder.host != host {
        return false;
    }
    if let (Some(theirs), Some(ours)) = (holder.boot_id.as_deref(), now.boot.as_ref())
        && theirs != ours.id
    {
        return true;
    }
    match pid_exists(pid) {
        Some(false) => true,
        Some(true) => match (holder.owner_start, process_start(pid)) {
            (Some(recorded), Some(current)) => recorded != current,
            _ => false,
        },
        None => false,
    }
}

/// The verdict on a readable record.
#[must_use]
pub fn judge(holder: &Holder, host: &str, now: &Now) -> Option<StaleReason> {
    // `run`'s lock: held while any process of its group lives, past
    // `expires` too; once none does, its wrapper (`owner_pid`) and its lease
    // decide as for any lock (the wrapper releases after its group is gone).
    if group_verdict(holder, host, now) == Some(true) {
        return None;
    }
    if remaining_ms(holder, now) <= 0 {
        Some(StaleReason::Expired)
    } else if owner_dead(holder, host, now) {
        Some(StaleReason::OwnerDead)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::sample;

    #[test]
    fn own_process_is_alive_and_a_reaped_child_is_dead() {
        let me = std::process::id();
        assert_eq!(pid_exists(me), Some(true));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(pid_exists(pid), Some(false));
        let now = Now::read();
        let mut h = sample(None).holder;
        h.host = "here".into();
        h.boot_id = now.boot.as_ref().map(|b| b.id.clone());
        h.owner_pid = Some(me);
        h.owner_start = process_start(me);
        assert!(!owner_dead(&h, "here", &now));
        assert!(!owner_dead(&h, "elsewhere-pid-not-judged", &now));
        h.owner_pid = Some(pid);
        assert!(owner_dead(&h, "here", &now));
        assert!(!owner_dead(&h, "other-host", &now));
    }

    #[test]
    fn a_group_is_alive_while_a_member_runs_and_gone_once_none_does() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id();
        let start = process_start(pgid);
        assert_eq!(group_alive(pgid, start), Some(true));
        if let Some(s) = start {
            assert_eq!(group_alive(pgid, Some(s + 1)), Some(false), "reused id");
        }
        child.kill().unwrap();
        // Not reaped yet: its only member is a zombie, which writes nothing.
        if cfg!(target_os = "linux") {
            let t = std::time::Instant::now();
            while group_alive(pgid, start) != Some(false) {
                assert!(
                    t.elapsed().as_secs() < 5,
                    "a zombie-only group counts as alive"
                );
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        child.wait().unwrap();
        assert_eq!(group_alive(pgid, start), Some(false));
        assert_eq!(group_alive(0, None), Some(false));
        assert_eq!(group_alive(1, None), Some(false), "never init's group");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reused_pid_and_reboot_count_as_dead() {
        let now = Now::read();
        let me = std::process::id();
        let mut h = sample(None).holder;
        h.host = "here".into();
        h.owner_pid = Some(me);
        h.boot_id = now.boot.as_ref().map(|b| b.id.clone());
        h.owner_start = process_start(me).map(|s| s + 1);
        assert!(
            owner_dead(&h, "here", &now),
            "start time differs: reused pid"
        );
        h.owner_start = process_start(me);
        h.boot_id = Some("another-boot".into());
        assert!(owner_dead(&h, "here", &now), "host rebooted since");
    }
}
