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

/// A started process and everything it starts, to be killed together:
/// each platform's `Group` implements it, checked by the compiler on both.
pub(crate) trait Platform: Sized {
    /// Readies `cmd`, before it is spawned, so that what it starts can be
    /// killed with it (Unix: a process group of its own).
    fn prepare(cmd: &mut Command);
    /// The group of `child`, spawned from a prepared command.
    ///
    /// # Errors
    /// The OS error (Windows: no Job Object could be made or joined).
    fn of(child: &Child) -> std::io::Result<Self>;
    /// Kills every process of the group.
    fn kill(&self);
}

/// This platform's group.
pub(crate) use sys::Group;
