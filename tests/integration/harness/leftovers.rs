//! Witnesses and leftovers of tests that run real processes: a file of
//! fences that shows two writers at once ([`FenceLog`]), and the processes a
//! failing test would leave behind, SIGKILLed only while still its own.

use std::path::Path;
use std::time::Duration;

/// A witness file of fences, one line per write: CMD's writers append
/// `$SKILL_LOCK_FENCE`, the next holder appends its own, and any older
/// fence written after the next holder's first line is two writers at once.
pub struct FenceLog<'a>(pub &'a Path);

impl FenceLog<'_> {
    /// The next holder (fence `fence`) writes twice, 300 ms apart, as the
    /// old one would.
    pub fn write_as(&self, fence: u64) {
        for _ in 0..2 {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(self.0)
                .unwrap();
            std::io::Write::write_all(&mut f, format!("{fence}\n").as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The writes of an older fence that followed the first line of `fence`.
    #[track_caller]
    pub fn late_after(&self, fence: u64) -> Vec<u64> {
        let text = std::fs::read_to_string(self.0).unwrap();
        let fences: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        let first = fences
            .iter()
            .position(|f| *f == fence)
            .expect("the new holder wrote");
        fences[first..]
            .iter()
            .copied()
            .filter(|f| *f < fence)
            .collect()
    }

    /// Fails when a line of an older fence follows the first line of `fence`.
    #[track_caller]
    pub fn assert_no_older_write_after(&self, fence: u64) {
        let late = self.late_after(fence);
        assert!(
            late.is_empty(),
            "{} writes of fences {late:?} after fence {fence} took the lock: two writers overlapped",
            late.len()
        );
    }
}

/// Field 22 of `/proc/<pid>/stat` (Linux): when the process started.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Is `pid` a process of this test, its command line naming `marker` (the
/// test's directory, or its script)? Pids are reused (this VM's `pid_max`
/// is 32768): a stale kill could hit another test's process.
pub fn names(pid: i32, marker: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker.to_str().unwrap_or("\0")))
}

/// SIGKILLs `pid`, a process a failing test would leave behind, if it still
/// runs and `ours` (checked to be still the test's process).
pub fn kill_leftover(pid: i32, ours: bool) {
    if pid > 1 && ours && !super::gone(pid) {
        // SAFETY: kill(2) of a process this test made, checked by the caller.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// SIGKILLs `pid` when dropped (see [`kill_leftover`]), if it is still the
/// process that ran when the guard was made (same start time).
pub struct KillOnDrop(i32, Option<u64>);

impl KillOnDrop {
    /// A guard of `pid`, which runs now.
    pub fn new(pid: i32) -> Self {
        Self(pid, start_time(pid))
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let same = match self.1 {
            Some(t) => start_time(self.0) == Some(t),
            None => std::thread::panicking(),
        };
        kill_leftover(self.0, same);
    }
}
