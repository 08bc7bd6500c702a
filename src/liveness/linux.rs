//! Linux: boot id and `CLOCK_BOOTTIME`, process start time from `/proc`.

use crate::lease::BootClock;

/// The boot id, read once per process (decisions read the clock again).
fn boot_id() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|id| id.trim().to_owned())
    })
    .as_deref()
}

pub(super) fn boot_clock() -> Option<BootClock> {
    let id = boot_id()?;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) } != 0 {
        return None;
    }
    let ms = u64::try_from(ts.tv_sec).ok()? * 1000 + u64::try_from(ts.tv_nsec).ok()? / 1_000_000;
    Some(BootClock {
        id: id.to_owned(),
        ms,
    })
}

/// Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot.
pub(super) fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and ')': skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Scans `/proc` for a member of group `pgid` that is not a zombie.
/// `Some(false)`: members seen, all zombies; `None`: no member visible
/// (`/proc` mounted with `hidepid`, say), so the caller decides by `kill`.
pub(super) fn group_has_running_member(pgid: u32) -> Option<bool> {
    let mut zombies = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the last ')': state, ppid, pgrp, ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let (Some(state), Some(_ppid), Some(pgrp)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if pgrp.parse::<u32>().ok() != Some(pgid) {
            continue;
        }
        if state == "Z" || state == "X" {
            zombies = true;
        } else {
            return Some(true);
        }
    }
    zombies.then_some(false)
}
