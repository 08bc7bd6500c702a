//! Writes shell completions (bash, zsh, fish) and the man page of
//! `skill-lock` from its clap definition, so they never drift from the code.
//!
//! `cargo run --example gen-docs -- OUT_DIR` writes `OUT_DIR/skill-lock.1` and
//! `OUT_DIR/skill-lock-<command>.1`,
//! `OUT_DIR/skill-lock.bash`, `OUT_DIR/_skill-lock` and `OUT_DIR/skill-lock.fish`.

#![allow(
    clippy::disallowed_methods,
    clippy::print_stdout,
    reason = "a build tool: it reads its argument and reports on stdout"
)]

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(
        std::env::args_os()
            .nth(1)
            .unwrap_or_else(|| "target/docs".into()),
    );
    std::fs::create_dir_all(&out)?;
    let mut cmd = skill_lock::cli::command();
    // skill-lock.1 and one page per command (skill-lock-acquire.1, ...).
    clap_mangen::generate_to(cmd.clone(), &out)?;
    for (shell, name) in [
        (clap_complete::Shell::Bash, "skill-lock.bash"),
        (clap_complete::Shell::Zsh, "_skill-lock"),
        (clap_complete::Shell::Fish, "skill-lock.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut cmd, "skill-lock", &mut buf);
        std::fs::write(out.join(name), buf)?;
    }
    println!("wrote man page and completions to {}", out.display());
    Ok(())
}
