//! The `skill-lock` binary: hands the arguments to the library and exits with its status.

fn main() -> std::process::ExitCode {
    skill_lock::main()
}
