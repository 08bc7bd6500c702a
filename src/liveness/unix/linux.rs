//! Linux: boot id, namespaces and machine id from `/proc` and `/etc`,
//! `CLOCK_BOOTTIME`, process start time from `/proc/<pid>/stat`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::System;
use crate::liveness::Origin;

/// Inode of the initial pid namespace (`PROC_PID_INIT_INO`).
const INIT_PID_NS: u64 = 0xEFFF_FFFC;

/// Linux's answers.
pub(super) struct Linux;

impl super::System for Linux {
    fn origin() -> Origin {
        let pid_ns = ns_inode("pid");
        Origin {
            machine: certain_machine(pid_ns),
            pid_ns_start: pid_ns_start(),
            boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|id| id.trim().to_owned())
                .filter(|id| !id.is_empty()),
            pid_ns,
            time_ns: ns_inode("time"),
        }
    }

    /// The initial pid namespace is never freed, so its inode alone names it.
    fn initial_pid_ns(pid_ns: Option<u64>) -> bool {
        pid_ns == Some(INIT_PID_NS)
    }

    /// `CLOCK_BOOTTIME`.
    fn boot_ms() -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec to write into.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) } != 0 {
            return None;
        }
        u64::try_from(ts.tv_sec)
            .ok()?
            .checked_mul(1000)?
            .checked_add(u64::try_from(ts.tv_nsec).ok()? / 1_000_000)
    }

    /// Field 22 of `/proc/<pid>/stat`: start time in clock ticks after boot
    /// (`None` when `/proc` is another namespace's, whose `<pid>` is another process).
    fn process_start(pid: u32) -> Option<u64> {
        if !proc_is_ours() {
            return None;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name (field 2) may hold spaces and ')': skip past the last ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(19)?.parse().ok()
    }

    /// Scans `/proc` for a member of group `pgid` that is not a zombie.
    /// `Some(false)`: members seen, all zombies; `None`: no member visible
    /// (`/proc` mounted with `hidepid`, say, or another namespace's `/proc`),
    /// so the caller decides by `kill`.
    fn group_has_running_member(pgid: u32) -> Option<bool> {
        if !proc_is_ours() {
            return None;
        }
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

    /// Every process below `root` (by parent links, which on Linux end at the
    /// nearest child subreaper: a process that `setsid()`s or double-forks is
    /// re-parented to `root` when `root` is one) and every member of the
    /// process group `root` leads, `root` itself excluded; `None` when `/proc`
    /// cannot be read. One pass over `/proc/*/stat`: a process that forks
    /// during the pass may be missed, so callers that must stop everything
    /// repeat until nothing is left.
    fn tree(root: u32) -> Option<Vec<u32>> {
        use std::collections::HashMap;
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let mut fields = rest.split_whitespace().skip(1);
            let (Some(parent), Some(pgrp)) = (
                fields.next().and_then(|f| f.parse::<u32>().ok()),
                fields.next().and_then(|f| f.parse::<u32>().ok()),
            ) else {
                continue;
            };
            children.entry(parent).or_default().push(pid);
            if pgrp == root && pid != root {
                found.push(pid);
            }
        }
        let mut seen: std::collections::HashSet<u32> = found.iter().copied().collect();
        let mut todo = vec![root];
        todo.extend(found.iter().copied());
        while let Some(parent) = todo.pop() {
            for &child in children.get(&parent).map_or(&[][..], Vec::as_slice) {
                if child != root && seen.insert(child) {
                    found.push(child);
                    todo.push(child);
                }
            }
        }
        found.sort_unstable();
        Some(found)
    }
}

fn ns_inode(kind: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/self/ns/{kind}"))
        .ok()
        .map(|m| m.ino())
}

/// Is `/proc` this pid namespace's own? Its `/proc/self/status` then lists
/// one pid in `NSpid`; a `/proc` mounted for an ancestor namespace (what the
/// agent's sandbox runs its commands under: a nested namespace below
/// bubblewrap's) lists one per level, and its `/proc/<pid>` entries are the
/// ancestor's numbering, naming other processes than our pids do.
fn proc_is_ours() -> bool {
    static OURS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OURS.get_or_init(|| {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .is_some_and(|pids| pids.split_whitespace().count() == 1)
        })
    })
}

/// Start time of this pid namespace's init (its pid 1), when `/proc` is ours.
fn pid_ns_start() -> Option<u64> {
    Linux::process_start(1)
}

fn machine_id_at(path: &str) -> Option<String> {
    let id = std::fs::read_to_string(path).ok()?;
    let id = id.trim();
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) && id.bytes().any(|b| b != b'0'))
        .then(|| id.to_ascii_lowercase())
}

/// A hash of `/etc/machine-id`, only when it is certainly this machine's own:
/// not inside a container we can detect (another pid namespace than the
/// initial one, `/.dockerenv`, `/run/.containerenv`), and not contradicted by
/// `/var/lib/dbus/machine-id`. The id itself is never stored (systemd asks
/// that it be kept private).
fn certain_machine(pid_ns: Option<u64>) -> Option<String> {
    if pid_ns != Some(INIT_PID_NS)
        || Path::new("/.dockerenv").exists()
        || Path::new("/run/.containerenv").exists()
    {
        return None;
    }
    let id = machine_id_at("/etc/machine-id")?;
    if let Some(dbus) = machine_id_at("/var/lib/dbus/machine-id")
        && dbus != id
    {
        return None;
    }
    let digest = Sha256::digest(format!("skill-lock machine {id}").as_bytes());
    Some(crate::record::hex(&digest[..16]))
}
