//! Other Unix systems: no boot id, namespaces or start time yet, so every
//! record is judged by its lease alone (macOS: `sysctl kern.bootsessionuuid`
//! would add the boot id, `kern.proc.pid` the start time, and
//! `IOPlatformUUID` the machine).

use crate::liveness::Origin;

pub(in crate::liveness) fn origin() -> Origin {
    Origin::default()
}

/// No pid namespaces here.
pub(in crate::liveness) fn initial_pid_ns(_pid_ns: Option<u64>) -> bool {
    false
}

pub(in crate::liveness) fn boot_ms() -> Option<u64> {
    None
}

pub(in crate::liveness) fn process_start(_pid: u32) -> Option<u64> {
    None
}

/// No portable way to list a group's members: `kill(-pgid, 0)` alone decides.
pub(in crate::liveness) fn group_has_running_member(_pgid: u32) -> Option<bool> {
    None
}

/// No portable way to list processes: the caller signals the group instead.
pub(in crate::liveness) fn tree(_root: u32) -> Option<Vec<u32>> {
    None
}
