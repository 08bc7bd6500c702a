//! A process and everything it starts, killed as one: the git store's
//! subprocesses at their deadline (git and the ssh or credential helper it
//! starts), and on Windows `run`'s command (SPEC §2.7, §10).
//!
//! The per-OS part is in `unix.rs` (a process group of its own, killed by
//! `killpg`) and `windows.rs` (a Job Object that kills every process in it
//! when its last handle closes, and that none can leave), with the same
//! functions on both.

use std::process::{Child, Command};

per_os!();

#[cfg(windows)]
pub(crate) use windows::Job;

/// A started process and everything it starts, to be killed together.
pub(crate) struct Group(sys::Group);

impl Group {
    /// Readies `cmd`, before it is spawned, so that what it starts can be
    /// killed with it (Unix: a process group of its own).
    pub(crate) fn prepare(cmd: &mut Command) {
        sys::prepare(cmd);
    }

    /// The group of `child`, spawned from a [`Group::prepare`]d command.
    ///
    /// # Errors
    /// The OS error (Windows: no Job Object could be made or joined).
    pub(crate) fn of(child: &Child) -> std::io::Result<Self> {
        sys::Group::of(child).map(Self)
    }

    /// Kills every process of the group.
    pub(crate) fn kill(&self) {
        self.0.kill();
    }
}
