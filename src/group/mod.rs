//! A process and everything it starts, killed as one: the git store's
//! subprocesses at their deadline (git and the ssh or credential helper it
//! starts), and on Windows `run`'s command (SPEC §2.7, §10).
//!
//! The per-OS part is the [`Platform`] trait, implemented in `unix.rs` (a
//! process group of its own, killed by `killpg`) and `windows.rs` (a Job
//! Object that kills every process in it when its last handle closes, and
//! that none can leave; `run` on Windows uses that `Job` itself).

use std::process::{Child, Command};

per_os!(pub(crate));

/// What each platform's group provides, checked by the compiler on both.
trait Platform: Sized {
    /// Readies `cmd`, before it is spawned, so that what it starts can be
    /// killed with it.
    fn prepare(cmd: &mut Command);
    /// The group of `child`, spawned from a prepared command.
    ///
    /// # Errors
    /// The OS error.
    fn of(child: &Child) -> std::io::Result<Self>;
    /// Kills every process of the group.
    fn kill(&self);
}

/// A started process and everything it starts, to be killed together: the
/// one face of [`Platform`] its callers use.
pub(crate) struct Group(sys::Group);

impl Group {
    /// Readies `cmd`, before it is spawned, so that what it starts can be
    /// killed with it (Unix: a process group of its own).
    pub(crate) fn prepare(cmd: &mut Command) {
        sys::Group::prepare(cmd);
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
