//! Unix: a process group of its own, killed with `killpg`.

use std::process::{Child, Command};

/// The process group a prepared child leads (its pid).
pub(crate) struct Group(libc::pid_t);

impl super::Platform for Group {
    /// Makes the child lead a process group of its own.
    fn prepare(cmd: &mut Command) {
        std::os::unix::process::CommandExt::process_group(cmd, 0);
    }

    /// The group is the child's pid: nothing can fail.
    fn of(child: &Child) -> std::io::Result<Self> {
        Ok(Self(libc::pid_t::try_from(child.id()).unwrap_or(0)))
    }

    fn kill(&self) {
        if self.0 > 0 {
            // SAFETY: signals only the process group this child leads.
            unsafe {
                libc::killpg(self.0, libc::SIGKILL);
            }
        }
    }
}
