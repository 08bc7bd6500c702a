//! The `skill-lock` binary: hands the arguments to the library and exits with its status.

fn main() -> std::process::ExitCode {
    // `run` starts this binary again as the keeper of its command's processes.
    if let Some(status) = skill_lock::run::main_if_keeper() {
        return status;
    }
    skill_lock::run(std::env::args_os()).into()
}
