//! The man pages and completions generated from the clap definition name
//! every command and every option, so the shipped docs cannot drift.

#[test]
fn man_pages_and_completions_name_every_command_and_option() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = skill_lock::cli::command();
    clap_mangen::generate_to(cmd.clone(), dir.path()).unwrap();
    let mut all = String::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        all.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    // roff escapes '-' as '\-'.
    let all = all.replace("\\-", "-");
    let mut bash = Vec::new();
    clap_complete::generate(
        clap_complete::Shell::Bash,
        &mut cmd.clone(),
        "skill-lock",
        &mut bash,
    );
    let bash = String::from_utf8(bash).unwrap();
    let commands = [
        "acquire",
        "renew",
        "release",
        "status",
        "list",
        "check",
        "run",
        "history",
        "completions",
    ];
    for c in commands {
        assert!(
            dir.path().join(format!("skill-lock-{c}.1")).is_file(),
            "no page for {c}"
        );
        assert!(bash.contains(c), "bash completion lacks {c}");
    }
    let mut options = vec!["--root".to_owned(), "--store".to_owned()];
    for sub in cmd.get_subcommands() {
        for arg in sub.get_arguments() {
            if let Some(long) = arg.get_long() {
                options.push(format!("--{long}"));
            }
        }
    }
    for want in [
        "--ttl",
        "--note",
        "--owner-pid",
        "--wait",
        "--token",
        "--force",
        "--repo",
        "--limit",
    ] {
        assert!(options.iter().any(|o| o == want), "clap lost {want}");
    }
    for o in &options {
        assert!(all.contains(o.as_str()), "man pages lack {o}");
        assert!(bash.contains(o.as_str()), "bash completion lacks {o}");
    }
}

/// `completions SHELL` prints the script on stdout and exits 0 (SPEC §2), in
/// any directory (it needs no project and no store), for every shell.
#[test]
fn completions_print_a_script_for_every_shell() {
    let env = crate::common::TestEnv::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = env.cmd(&env.root).args(["completions", shell]).run();
        assert_eq!(out.code, 0, "{shell}: {}", out.stderr);
        for word in ["skill-lock", "acquire", "owner-pid"] {
            assert!(out.stdout.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = env.cmd(&env.root).args(["completions", "tcsh"]).run();
    out.expect_error("usage");
}
