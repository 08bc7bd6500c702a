//! The command line itself (SPEC §2, §3): argument parsing, `--help` and
//! `--version`, the error object of bad input and of a usage error (exit 2,
//! nothing created), the write phase `--help` shows. What a command does to
//! a lock is in `conformance` (every store, the file store among them), the
//! file store's layout and root discovery in `fs_store`.
//!
//! Covers: SPEC §2, §3.

use crate::harness;

use harness::Lock;
use harness::{Cmd, TestEnv, tree};
use std::path::Path;

#[test]
fn bad_input_is_refused_with_nothing_created() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let before = tree(&repo);
    let cases: &[(&[&str], &str)] = &[
        (&["acquire", "", "--repo", "a/b"], "invalid_skill"),
        (&["acquire", "-x", "--repo", "a/b"], "usage"),
        (&["acquire", ".x", "--repo", "a/b"], "invalid_skill"),
        (&["acquire", "a/b", "--repo", "a/b"], "invalid_skill"),
        (&["acquire", "a@b", "--repo", "a/b"], "invalid_skill"),
        (
            &["acquire", &"s".repeat(65), "--repo", "a/b"],
            "invalid_skill",
        ),
        (&["acquire", "s", "--repo", "ab"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a/b/c"], "invalid_repo"),
        (&["acquire", "s", "--repo", "../b"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a/.."], "invalid_repo"),
        (&["acquire", "s", "--repo", "a__x/b"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a_/b"], "invalid_repo"),
        (&["acquire", "s", "--repo", "a b/c"], "invalid_repo"),
        (
            &["acquire", "s", "--repo", &format!("{}/b", "o".repeat(101))],
            "invalid_repo",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--ttl", "0"],
            "invalid_ttl",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--ttl", "2592001"],
            "invalid_ttl",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--ttl", "ten"],
            "invalid_ttl",
        ),
        (
            &["renew", "s", "--repo", "a/b", "--ttl", "-5"],
            "invalid_ttl",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--note", "two\nlines"],
            "invalid_note",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--note", &"n".repeat(1001)],
            "invalid_note",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--owner-pid", "0"],
            "invalid_pid",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--owner-pid", "abc"],
            "invalid_pid",
        ),
        (
            &["acquire", "s", "--repo", "a/b", "--owner-pid", "2147483647"],
            "invalid_pid",
        ),
        (&["acquire", "s", "--repo", "a/b", "--since", "-1"], "usage"),
        (
            &["acquire", "s", "--repo", "a/b", "--since", "fence"],
            "usage",
        ),
        (&["acquire", "s", "--repo", "a/b", "--since", ""], "usage"),
        (&["acquire", "s"], "usage"),
        (&["check", "s", "--repo", "a/b"], "usage"),
        (&["frobnicate"], "usage"),
        (&[], "usage"),
        (&["acquire", "s", "--repo", "a/b", "--bogus"], "usage"),
        (
            &["acquire", "s", "--repo", "a/b", "--store", "redis://x"],
            "usage",
        ),
    ];
    for (args, code) in cases {
        let out = Cmd::new(&repo).args(*args).run();
        assert_eq!(out.reply().error(), *code, "{args:?}: {}", out.stdout);
        out.expect_error(code);
    }
    // A note of exactly 1,000 bytes (multi-byte) is fine.
    let note = "é".repeat(500);
    let lock = Lock::new(&repo, "s", "a/b");
    lock.status().is("status");
    assert_eq!(tree(&repo), before, "bad input created files");
    lock.op("acquire").note(&note).reply().is("acquired");
}

#[test]
fn non_utf8_arguments_are_refused() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let bad = OsStr::from_bytes(b"s\xff");
    let out = Cmd::new(&repo)
        .arg("acquire")
        .arg(bad)
        .args(["--repo", "a/b"])
        .run();
    out.expect_error("invalid_skill");
    let out = Cmd::new(&repo)
        .args(["acquire", "s", "--repo", "a/b", "--note"])
        .arg(bad)
        .run();
    out.expect_error("invalid_note");
}

#[test]
fn help_and_version_are_text_and_exit_zero() {
    let env = TestEnv::new();
    let h = Cmd::new(&env.root).arg("--help").run();
    assert_eq!(h.code, 0);
    for word in [
        "acquire",
        "renew",
        "release",
        "status",
        "list",
        "check",
        "history",
        "Exit status",
    ] {
        assert!(h.stdout.contains(word), "--help lacks {word}");
    }
    let v = Cmd::new(&env.root).arg("--version").run();
    assert_eq!(
        (v.code, v.stdout.trim()),
        (
            0,
            format!("skill-lock {}", env!("CARGO_PKG_VERSION")).as_str()
        )
    );
    let a = Cmd::new(&env.root).args(["acquire", "--help"]).run();
    assert!(a.code == 0 && a.stdout.contains("--owner-pid"));
}

/// The write phase shown by `--help`, as a script: its lines, unindented.
fn help_write_phase(env: &TestEnv) -> String {
    let help = Cmd::new(&env.root).arg("--help").run().stdout;
    let start = help
        .find("Typical write phase")
        .expect("--help shows the write phase");
    let block = &help[start..];
    let end = block
        .find("\n\n")
        .expect("the example ends with a blank line");
    block[..end]
        .lines()
        .skip(1)
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_help_write_phase_matches_the_docs_and_runs_under_set_euo_pipefail() {
    let env = TestEnv::new();
    let script = help_write_phase(&env);
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/write-lock.md"))
            .unwrap();
    for (verb, token) in [
        ("status", false),
        ("acquire", false),
        ("renew", true),
        ("release", true),
    ] {
        let in_help = format!("skill-lock {verb} issue-triage --repo apache/airflow");
        let in_docs = format!("skill-lock {verb} <skill> --repo <owner/repo>");
        assert!(script.contains(&in_help), "--help lacks {in_help}");
        assert!(docs.contains(&in_docs), "docs lack {in_docs}");
        if token {
            // The token travels in every command, in the variable that
            // keeps it out of the process list, never in one that must
            // outlive a shell.
            let with = format!("SKILL_LOCK_TOKEN=$token {in_help}");
            assert!(script.contains(&with), "--help lacks {with}");
            assert!(docs.contains(&format!(
                "SKILL_LOCK_TOKEN=<token> uvx --from ~/.claude/magpie/skill-lock {in_docs}"
            )));
        }
    }
    assert!(script.contains("--since $since") && docs.contains("--since <fence>"));
    // `skill-lock` on PATH is the binary under test.
    let bin = env.dir("bin");
    std::os::unix::fs::symlink(harness::BIN, bin.join("skill-lock")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let repo = env.git_repo("r");
    let run = || {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("set -euo pipefail\n{script}"))
            .current_dir(&repo)
            .env_clear()
            .env("PATH", &path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let lock = Lock::new(&repo, "issue-triage", "apache/airflow");
    let status = |what: &str| lock.state() == what;
    // Free: it posts, and the exit trap releases with the token.
    let (code, out, err) = run();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("post 1") && out.contains(r#""result":"released""#),
        "{out}"
    );
    assert!(status("free"));
    // Held by another run: no post, exit 0, and that run's lock is untouched.
    lock.acquire().is("acquired");
    let (code, out, err) = run();
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        out.contains("held, not posting") && !out.contains("post 1"),
        "{out}"
    );
    assert!(status("held"));
}

#[test]
fn usage_errors_suggest_and_point_to_the_subcommands_help() {
    let env = TestEnv::new();
    let msg = |args: &[&str]| {
        let out = Cmd::new(&env.root).args(args).run();
        if args[0] == "run" {
            // run's object goes to stderr.
            let r = out.run_reply().is("error");
            assert_eq!(r.error(), "usage", "{}", out.stderr);
            return r.message().to_owned();
        }
        out.error_message("usage")
    };
    let m = msg(&["aquire", "s", "--repo", "a/b"]);
    assert!(m.contains("did you mean 'acquire'?"), "{m}");
    assert!(m.ends_with("run 'skill-lock --help' for usage"), "{m}");
    let m = msg(&["run", "x", "--repo", "a/b", "sh", "-c", "true"]);
    assert!(m.contains("put -- before the command"), "{m}");
    assert!(m.ends_with("run 'skill-lock run --help' for usage"), "{m}");
    let m = msg(&["acquire", "x", "--repo"]);
    assert_eq!(
        m,
        "a value is required for '--repo <OWNER/NAME>' but none was supplied; \
         run 'skill-lock acquire --help' for usage"
    );
    let m = msg(&["renew", "x", "--repo", "a/b", "--tokn", "t"]);
    assert!(m.contains("did you mean '--token'?"), "{m}");
}
