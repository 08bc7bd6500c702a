//! Other Unix systems: no boot id or start time yet, so a pid
//! is judged by existence alone (macOS: `sysctl kern.proc.pid` would add the
//! start time, `kern.bootsessionuuid` the boot id).

use crate::lease::BootClock;

pub(super) fn boot_clock() -> Option<BootClock> {
    None
}

pub(super) fn process_start(_pid: u32) -> Option<u64> {
    None
}

/// No portable way to list a group's members: `kill(-pgid, 0)` alone decides.
pub(super) fn group_has_running_member(_pgid: u32) -> Option<bool> {
    None
}
