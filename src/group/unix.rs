//! Unix: a process group of its own, killed with `killpg`.

use std::process::{Child, Command};

/// Makes the child lead a process group of its own.
pub(super) fn prepare(cmd: &mut Command) {
    std::os::unix::process::CommandExt::process_group(cmd, 0);
}

/// The process group a prepared child leads (its pid).
pub(super) struct Group(libc::pid_t);

impl Group {
    #[allow(
        clippy::unnecessary_wraps,
        reason = "the same functions as on Windows, where joining a job may fail"
    )]
    pub(super) fn of(child: &Child) -> std::io::Result<Self> {
        Ok(Self(libc::pid_t::try_from(child.id()).unwrap_or(0)))
    }

    pub(super) fn kill(&self) {
        if self.0 > 0 {
            // SAFETY: signals only the process group this child leads.
            unsafe {
                libc::killpg(self.0, libc::SIGKILL);
            }
        }
    }
}
