//! Shell completion scripts (SPEC §2 `completions`), written by clap on
//! standard output.

use super::ExitStatus;

/// Prints the completion script of `cmd` for `shell` on stdout (SPEC §2).
pub(crate) fn print_completions(
    cmd: &mut clap::Command,
    shell: clap_complete::Shell,
) -> ExitStatus {
    clap_complete::generate(shell, cmd, "skill-lock", &mut super::writer::stdout());
    ExitStatus::Success
}
