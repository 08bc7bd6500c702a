//! Other Unix systems: no boot id, namespaces or start time yet, so every
//! record is judged by its lease alone (macOS: `sysctl kern.bootsessionuuid`
//! would add the boot id, `kern.proc.pid` the start time, and
//! `IOPlatformUUID` the machine).

use crate::liveness::Origin;

/// Another Unix's answers.
pub(super) struct Other;

impl super::System for Other {
    fn origin() -> Origin {
        Origin::default()
    }

    /// No pid namespaces here.
    fn initial_pid_ns(_pid_ns: Option<u64>) -> bool {
        false
    }

    fn boot_ms() -> Option<u64> {
        None
    }

    fn process_start(_pid: u32) -> Option<u64> {
        None
    }

    /// No portable way to list a group's members: `kill(-pgid, 0)` alone decides.
    fn group_has_running_member(_pgid: u32) -> Option<bool> {
        None
    }

    /// No portable way to list processes: the caller signals the group instead.
    fn tree(_root: u32) -> Option<Vec<u32>> {
        None
    }
}
