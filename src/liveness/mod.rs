//! Liveness (SPEC §6): is a record's owner certainly gone?
//!
//! This module answers only that question; whether a lease ran out is
//! [`crate::lease`]'s (which asks here, never the other way round).
//!
//! Conservative by rule. A record carries the identity of the process that
//! wrote it ([`Origin`]: machine, boot, pid namespace, time namespace). Its
//! pid is judged only from the same boot **and** the same pid namespace:
//! `kill(pid, 0)` failing with ESRCH means gone, EPERM means alive, a live
//! pid whose start time differs from the recorded one is a reused pid. A
//! reboot (another boot id) proves the owner gone only on the same machine,
//! known by its own machine id (never one baked into a container image).
//! The hostname proves nothing. Everything else, and anything unknown, is
//! judged by its lease alone: a lock is never taken from a holder that might
//! still be running.

use crate::record::Holder;

per_os!();

use sys::Os;

/// What each platform answers, checked by the compiler on both
/// (`unix.rs`, `windows.rs`); the verdicts built on it are written once
/// here.
trait Platform {
    /// This process's origin (read once: [`Origin::here`]).
    fn origin() -> Origin;
    /// The OS's name for this machine.
    fn system_hostname() -> Option<String>;
    /// Milliseconds on the boot-time clock, where the OS has one.
    fn boot_ms() -> Option<u64>;
    /// Start time of a process (opaque units, comparable on one boot).
    fn process_start(pid: u32) -> Option<u64>;
    /// Does a process with this pid exist here? (`None`: cannot tell.)
    fn pid_exists(pid: u32) -> Option<bool>;
    /// Is any process of group `pgid` alive here? (`None`: cannot tell.)
    fn group_alive(pgid: u32, leader_start: Option<u64>) -> Option<bool>;
    /// Every process `root` owns (see [`tree`]).
    fn tree(root: u32) -> Option<Vec<u32>>;
    /// Does a pid recorded in `holder` mean the same process here?
    fn pid_comparable(holder: &Holder, here: &Origin) -> bool;
}

/// Where a process runs, as far as it can be known for certain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origin {
    /// This machine, when certain: a hash of its own machine id (none inside
    /// a detectable container, whose id may be baked into its image).
    pub machine: Option<String>,
    /// The boot id (Linux: `/proc/sys/kernel/random/boot_id`).
    pub boot_id: Option<String>,
    /// The pid namespace (Linux: inode of `/proc/self/ns/pid`).
    pub pid_ns: Option<u64>,
    /// Start time of the pid namespace's init (Linux: `/proc/1/stat`, read
    /// only when `/proc` is this namespace's own). An inode number is reused
    /// once its namespace ended, so outside the initial namespace the inode
    /// alone does not name one: with this it does.
    pub pid_ns_start: Option<u64>,
    /// The time namespace (Linux: inode of `/proc/self/ns/time`).
    pub time_ns: Option<u64>,
}

impl Origin {
    /// This process's origin, read once per process.
    ///
    /// A process that names itself another host (`SKILL_LOCK_HOST`, for tests
    /// of cross-host behaviour) vouches for no identity at all: its records
    /// are judged by their lease alone, and it judges others' the same way.
    #[must_use]
    pub fn here() -> &'static Self {
        static HERE: std::sync::OnceLock<Origin> = std::sync::OnceLock::new();
        HERE.get_or_init(|| {
            if host_override().is_some() {
                Self::default()
            } else {
                Os::origin()
            }
        })
    }
}

#[allow(
    clippy::disallowed_methods,
    reason = "SKILL_LOCK_HOST is the test hook that names another host; read with the hostname"
)]
fn host_override() -> Option<String> {
    std::env::var_os("SKILL_LOCK_HOST")
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
}

/// Hostname of this machine (`SKILL_LOCK_HOST` overrides it, for tests of
/// cross-host behaviour). Shown in records; never proves anything.
#[must_use]
pub(crate) fn hostname() -> String {
    host_override()
        .or_else(Os::system_hostname)
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Milliseconds on the boot-time clock (Linux `CLOCK_BOOTTIME`), where the
/// OS has one.
#[must_use]
pub(crate) fn boot_ms() -> Option<u64> {
    Os::boot_ms()
}

/// Start time of a process (opaque units, comparable on one boot), if known.
#[must_use]
pub(crate) fn process_start(pid: u32) -> Option<u64> {
    Os::process_start(pid)
}

/// Does a process with this pid exist here? (`None`: cannot tell.)
#[must_use]
pub(crate) fn pid_exists(pid: u32) -> Option<bool> {
    Os::pid_exists(pid)
}

/// Is any process of group `pgid` alive here? (`None`: cannot tell.)
/// `leader_start`, the recorded start time of the group's first leader,
/// tells a reused id from the group (Windows, which has no groups: the
/// leader's pid and creation time alone).
#[must_use]
pub(crate) fn group_alive(pgid: u32, leader_start: Option<u64>) -> Option<bool> {
    Os::group_alive(pgid, leader_start)
}

/// Every process that `run`'s keeper `root` owns (SPEC §2.7): its
/// descendants by parent links (on Linux the keeper is a child subreaper,
/// so what left CMD's group or session by `setsid` or a double fork is
/// still among them) and the members of the group it leads, `root` itself
/// excluded. `None`: the platform cannot list processes (the caller then
/// signals the group).
#[must_use]
#[cfg_attr(
    windows,
    expect(
        dead_code,
        reason = "only the Unix keeper walks a process tree; a Job Object needs no walk"
    )
)]
pub(crate) fn tree(root: u32) -> Option<Vec<u32>> {
    Os::tree(root)
}

/// The verdict on a `run` lock's process group, where the record names one
/// and was written in this boot and pid namespace (SPEC §6): `Some(true)` while any member
/// lives (held, even past `expires`: those members may still write),
/// `Some(false)` once none does. `None`: not a group lock, or not certain.
#[must_use]
pub(crate) fn group_verdict(holder: &Holder, here: &Origin) -> Option<bool> {
    let pgid = holder.owner_pgid?;
    if !pid_comparable(holder, here) {
        return None;
    }
    group_alive(pgid, holder.group_start)
}

pub(crate) fn same<T: PartialEq>(a: Option<&T>, b: Option<&T>) -> bool {
    matches!((a, b), (Some(x), Some(y)) if x == y)
}

/// True when a pid recorded in `holder` means the same process here: same
/// boot and same pid namespace, both known. Outside the initial namespace
/// (which lives as long as the boot) the same inode number is not enough:
/// a sandbox creates a namespace per call and the kernel hands a freed
/// inode number to the next, so the namespace's init start time must match
/// too.
#[must_use]
pub(crate) fn pid_comparable(holder: &Holder, here: &Origin) -> bool {
    Os::pid_comparable(holder, here)
}

/// True when `holder` was certainly written on this machine before its
/// current boot: the same certain machine id, another boot id.
#[must_use]
pub(crate) fn rebooted_since(holder: &Holder, here: &Origin) -> bool {
    same(holder.machine.as_ref(), here.machine.as_ref())
        && matches!(
            (holder.boot_id.as_ref(), here.boot_id.as_ref()),
            (Some(theirs), Some(ours)) if theirs != ours
        )
}

/// Is the owner named by `holder` certainly gone, seen from `here`?
#[must_use]
pub(crate) fn owner_gone(holder: &Holder, here: &Origin) -> bool {
    let Some(pid) = holder.owner_pid else {
        return false;
    };
    if rebooted_since(holder, here) {
        return true;
    }
    if !pid_comparable(holder, here) {
        return false;
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

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::record::tests::sample;

    fn here_now() -> Origin {
        let mut o = Os::origin();
        // Judge as the machine itself would, even inside this test's container.
        o.machine = Some("this-machine".into());
        o
    }

    fn holder_of(here: &Origin, pid: u32) -> Holder {
        let mut h = sample(None).holder;
        h.host = "anything".into();
        h.machine.clone_from(&here.machine);
        h.boot_id.clone_from(&here.boot_id);
        h.pid_ns = here.pid_ns;
        h.pid_ns_start = here.pid_ns_start;
        h.time_ns = here.time_ns;
        h.owner_pid = Some(pid);
        h.owner_start = process_start(pid);
        h
    }

    #[test]
    fn own_process_is_alive_and_a_reaped_child_is_dead() {
        let here = here_now();
        let me = std::process::id();
        assert_eq!(pid_exists(me), Some(true));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(pid_exists(pid), Some(false));
        let h = holder_of(&here, me);
        assert!(!owner_gone(&h, &here));
        let mut dead = holder_of(&here, pid);
        dead.owner_start = None;
        if here.boot_id.is_some() && here.pid_ns.is_some() {
            assert!(owner_gone(&dead, &here));
        }
        // Another pid namespace or boot id, or no identity at all: the pid
        // is never looked up, whatever the hostname says.
        let mut other_ns = dead.clone();
        other_ns.pid_ns = other_ns.pid_ns.map(|n| n + 1);
        assert!(!owner_gone(&other_ns, &here));
        // A namespace other than the initial one whose inode number was
        // handed on (its first owner ended): another init start, another
        // namespace, whatever the number says.
        let sandboxed = Origin {
            pid_ns: Some(4_026_532_175),
            pid_ns_start: Some(1000),
            ..here.clone()
        };
        let mut earlier_call = dead.clone();
        earlier_call.pid_ns = sandboxed.pid_ns;
        earlier_call.pid_ns_start = Some(900);
        assert!(!pid_comparable(&earlier_call, &sandboxed));
        assert!(!owner_gone(&earlier_call, &sandboxed));
        earlier_call.pid_ns_start = sandboxed.pid_ns_start;
        assert!(pid_comparable(&earlier_call, &sandboxed));
        earlier_call.pid_ns_start = None;
        assert!(
            !pid_comparable(&earlier_call, &sandboxed),
            "an older record"
        );
        let mut unknown = dead.clone();
        (unknown.boot_id, unknown.pid_ns, unknown.machine) = (None, None, None);
        assert!(!owner_gone(&unknown, &here));
        assert!(!owner_gone(&dead, &Origin::default()));
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
    fn reused_pid_and_reboot_count_as_dead_only_when_certain() {
        let here = here_now();
        let me = std::process::id();
        let mut h = holder_of(&here, me);
        h.owner_start = process_start(me).map(|s| s + 1);
        assert!(owner_gone(&h, &here), "start time differs: reused pid");
        h.owner_start = process_start(me);
        h.boot_id = Some("another-boot".into());
        assert!(owner_gone(&h, &here), "this machine rebooted since");
        // Another machine (a cloned VM or a container with the same
        // hostname), or a machine id that is not certain: lease alone.
        h.machine = Some("another-machine".into());
        assert!(!owner_gone(&h, &here));
        h.machine = None;
        assert!(!owner_gone(&h, &here));
        let uncertain = Origin {
            machine: None,
            ..here.clone()
        };
        h.machine.clone_from(&here.machine);
        assert!(!owner_gone(&h, &uncertain));
    }
}
