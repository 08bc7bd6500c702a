//! The `skill-lock` binary: hands the arguments to the library and exits with its status.

fn main() -> std::process::ExitCode {
    // `run` starts this binary again as the keeper of its command's processes.
    if let Some(keeper) = skill_lock::run::main_if_keeper() {
        // Typed by hand: the usual one JSON object, as for any bad argument.
        return keeper.unwrap_or_else(|err| skill_lock::cli::report_error(&err).into());
    }
    skill_lock::run(std::env::args_os()).into()
}
