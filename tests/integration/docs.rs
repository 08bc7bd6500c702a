//! The man pages and completions generated from the clap definition name
//! every command and every option, so the shipped docs cannot drift.
//!
//! Covers: SPEC §2.

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
    let env = crate::harness::TestEnv::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = crate::harness::Cmd::new(&env.root)
            .args(["completions", shell])
            .run();
        assert_eq!(out.code, 0, "{shell}: {}", out.stderr);
        for word in ["skill-lock", "acquire", "owner-pid"] {
            assert!(out.stdout.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = crate::harness::Cmd::new(&env.root)
        .args(["completions", "tcsh"])
        .run();
    out.expect_error("usage");
}

/// Every test module names the SPEC sections it covers, and docs/tests.md's
/// index says the same (so the index cannot drift from the tests).
#[test]
fn every_test_module_names_the_spec_sections_it_covers() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    let index = std::fs::read_to_string(dir.join("../../docs/tests.md")).unwrap();
    let mut modules = 0;
    for line in main.lines() {
        let Some(name) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) else {
            continue;
        };
        if name == "harness" {
            continue;
        }
        modules += 1;
        let text = std::fs::read_to_string(dir.join(format!("{name}.rs"))).unwrap();
        let covers = text
            .lines()
            .take_while(|l| l.starts_with("//!") || l.starts_with("#!"))
            .find_map(|l| l.strip_prefix("//! Covers: SPEC "))
            .unwrap_or_else(|| {
                panic!("{name}.rs: no `//! Covers: SPEC §...` line in its module doc")
            });
        let covers = covers.trim_end_matches('.');
        assert!(
            covers.split(", ").all(|s| s.starts_with('§')),
            "{name}.rs: `Covers:` lists sections as §N, §N.M: {covers}"
        );
        let row = format!("| `{name}` | {covers} |");
        assert!(
            index.lines().any(|l| l == row),
            "docs/tests.md has no row {row:?} (the module's `Covers:` line)"
        );
    }
    let rows = index.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(
        rows, modules,
        "docs/tests.md lists a module the test binary does not have"
    );
}

/// Every file path and every function the prose names exists, so a moved
/// module or a renamed test cannot leave a stale pointer behind. Checked:
/// backquoted spans in README.md and docs/*.md (the contract aside, which
/// names no file of this repository; BENCHMARKS.md is a dated record of
/// runs) that are a path from the repository's root (`src/…`, `tests/…`,
/// `scripts/…`, …) or a `.rs` path below one, and `module::function` where
/// `function` is a snake_case name: `module` must be a file of `src/` or
/// `tests/` defining it, or else name no such file while `function` is not
/// ours (a library's, with fewer than three underscores). Placeholders (a run of capitals,
/// `*`) are left alone.
#[test]
fn the_files_and_functions_the_prose_names_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut prose = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") && !path.ends_with("contract.md") {
            prose.push(path);
        }
    }
    let tops = [
        "src/",
        "tests/",
        "scripts/",
        "packaging/",
        "fuzz/",
        "benches/",
        "docs/",
        ".ci/",
        ".github/",
    ];
    let mut files = Vec::new();
    let mut stack = vec![root.join("src"), root.join("tests")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(
                    path.strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/"),
                );
            }
        }
    }
    let code: String = files
        .iter()
        .filter(|f| f.ends_with(".rs"))
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
    let placeholder = |s: &str| {
        s.contains('*')
            || s.as_bytes()
                .windows(3)
                .any(|w| w.iter().all(u8::is_ascii_uppercase))
    };
    let mut stale = Vec::new();
    for file in &prose {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            for span in line.split('`').skip(1).step_by(2) {
                let span = span
                    .split('#')
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches('/');
                let plain = !span.is_empty()
                    && span
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._/-:".contains(c));
                if !plain || placeholder(span) {
                    continue;
                }
                if let Some((module, function)) = span.rsplit_once("::") {
                    // `a::tests::f` is `f` in module `a`; `Type::item` is no module.
                    let module = module
                        .rsplit("::")
                        .find(|m| *m != "tests")
                        .unwrap_or_default();
                    if module.starts_with(|c: char| c.is_ascii_uppercase()) {
                        continue;
                    }
                    let known = files.iter().any(|f| {
                        f.ends_with(&format!("/{module}.rs"))
                            || f.ends_with(&format!("/{module}/mod.rs"))
                    });
                    let snake = function.contains('_')
                        && function
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                    let defined = code.contains(&format!("fn {function}"));
                    let test_like = function.matches('_').count() >= 3;
                    if snake && known && !defined {
                        stale.push(format!("{name}:{}: `{span}`: no such function", n + 1));
                    } else if snake && !known && (defined || test_like) {
                        stale.push(format!("{name}:{}: `{span}`: no module `{module}`", n + 1));
                    }
                    continue;
                }
                let exists = if tops.iter().any(|t| span.starts_with(t)) {
                    root.join(span).exists()
                } else if span.contains('/') && span.ends_with(".rs") {
                    files.iter().any(|f| f.ends_with(&format!("/{span}")))
                } else {
                    continue;
                };
                if !exists {
                    stale.push(format!("{name}:{}: `{span}`: no such file", n + 1));
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "the prose names what is not there:\n{}",
        stale.join("\n")
    );
}
