//! examples/write-phase.sh, the runnable form of docs/write-lock.md, run for
//! real against the binary under test in a fresh `git init` repository.
//!
//! Covers: SPEC §2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::harness::{BIN, Lock};

const SKILL: &str = "example-sweep";
const REPO: &str = "apache/example";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/write-phase.sh")
}

/// A temporary directory holding a real git repository at `repo/`.
fn git_repo() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let out = Command::new("git")
        .args(["init", "-q"])
        .current_dir(&repo)
        .output()
        .expect("git must be installed");
    assert!(out.status.success(), "git init: {out:?}");
    (dir, repo)
}

fn run_script(repo: &Path, posts: &Path) -> Output {
    Command::new("bash")
        .arg(script())
        .arg(posts)
        .current_dir(repo)
        .env("SKILL_LOCK", BIN)
        .env("SKILL", SKILL)
        .env("REPO", REPO)
        .env_remove("SKILL_LOCK_STORE")
        .output()
        .expect("run examples/write-phase.sh")
}

/// The example's lock, seen from `repo` (no store but the checkout's).
fn example_lock(repo: &Path) -> Lock {
    Lock::new(repo, SKILL, REPO)
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn write_phase_posts_three_times_and_releases() {
    let (dir, repo) = git_repo();
    let posts = dir.path().join("posts.txt");
    let out = run_script(&repo, &posts);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    let text = std::fs::read_to_string(&posts).expect("posts file");
    assert_eq!(
        text.lines().count(),
        3,
        "posts: {text:?}\n{}",
        describe(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("renewed"), "{}", describe(&out));

    assert_eq!(example_lock(&repo).state(), "free");
}

#[test]
fn write_phase_stops_on_already_running_and_shows_the_holder() {
    let (dir, repo) = git_repo();
    let lock = example_lock(&repo);
    let held = lock.op("acquire").note("the other run (pid 4242)").reply();
    let held = held.is("acquired");

    let posts = dir.path().join("posts.txt");
    let out = run_script(&repo, &posts);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let posted = std::fs::read_to_string(&posts).unwrap_or_default();
    assert!(posted.is_empty(), "posted while held: {posted:?}");

    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("already_running"), "{}", describe(&out));
    assert!(
        stdout.contains("the other run (pid 4242)"),
        "holder note not shown\n{}",
        describe(&out)
    );
    let started = held.started();
    assert!(
        stdout.contains(started),
        "holder.started not shown\n{}",
        describe(&out)
    );
    assert!(
        stdout.contains(&format!("release {SKILL} --repo {REPO} --force")),
        "hint not shown\n{}",
        describe(&out)
    );

    // The other run's lock is untouched: still held, same fence.
    let status = lock.status();
    assert_eq!(status.state(), "held", "{status:?}");
    assert_eq!(Some(status.holder().fence), held.fence(), "{status:?}");
}
