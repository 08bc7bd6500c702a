//! The lock's life in verbs (`lock.acquire()`, `lock.check(&token)`, ...),
//! read into typed mirrors of the wire objects, and the `hint` of
//! `already_running` (SPEC §2.1): its three launch forms, each pasted into
//! `sh -c` to prove it really releases the lock.
//!
//! Covers: SPEC §2.

use std::path::Path;

use crate::harness::{BIN, TestEnv};
use crate::harness::{Lock, Reply};

#[test]
fn a_lock_lives_and_dies_by_its_token() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "issue-triage", "apache/airflow");
    let got = lock.op("acquire").note("run 7").reply();
    let token = got.token().to_owned();
    let Reply::Acquired {
        fence,
        note,
        took_over,
        ..
    } = &got
    else {
        unreachable!()
    };
    assert_eq!((note.as_deref(), took_over), (Some("run 7"), &None));
    assert!(matches!(lock.check(&token), Reply::Held { fence: f, .. } if f == *fence));
    assert!(matches!(
        lock.check("nope"),
        Reply::NotOwner {
            holder: Some(_),
            ..
        }
    ));
    assert!(matches!(lock.acquire(), Reply::AlreadyRunning { .. }));
    assert!(matches!(
        lock.renew(&token),
        Reply::Renewed { was_expired: false, fence: f, .. } if f == *fence
    ));
    assert!(matches!(lock.release("nope"), Reply::Refused { .. }));
    assert!(matches!(
        lock.release(&token),
        Reply::Released {
            forced: false,
            holder: Some(_),
            ..
        }
    ));
    assert!(matches!(lock.check(&token), Reply::NotHeld { .. }));
    assert!(matches!(
        lock.acquire(),
        Reply::Acquired { fence: f, .. } if f > *fence
    ));
}

/// The hint of a held lock, asked from `cwd` with `env` added.
fn hint_of(lock: &Lock, envs: &[(&str, &str)]) -> String {
    let call = envs
        .iter()
        .fold(lock.op("acquire"), |call, (k, v)| call.env(k, v));
    match call.reply() {
        Reply::AlreadyRunning { hint, .. } => hint,
        other => panic!("not held: {other:?}"),
    }
}

/// Pastes `hint` into `sh -c` (in `cwd`, with `path` as PATH) and checks that
/// the lock is free afterwards.
fn paste_releases(hint: &str, cwd: &Path, path: &str, lock: &Lock) {
    let out = std::process::Command::new("sh")
        .args(["-c", hint])
        .current_dir(cwd)
        .env_clear()
        .env("PATH", path)
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "{hint}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(r#""result":"released""#),
        "{hint}"
    );
    assert!(matches!(lock.acquire(), Reply::Acquired { .. }), "{hint}");
}

#[test]
fn hint_uses_the_absolute_path_when_skill_lock_on_path_is_not_this_program() {
    let env = TestEnv::new();
    let repo = env.git_repo("my repo");
    let lock = Lock::new(&repo, "s", "o/r");
    lock.acquire();
    // A different `skill-lock` first on PATH: the hint must not name it.
    let bin = env.dir("other-bin");
    std::fs::write(bin.join("skill-lock"), "#!/bin/sh\nexit 9\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        bin.join("skill-lock"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let hint = hint_of(&lock, &[("PATH", &path)]);
    assert_eq!(
        hint,
        format!(
            "{BIN} release s --repo o/r --force --root '{}'",
            repo.display()
        )
    );
    // Pasted anywhere, even where another skill-lock comes first on PATH.
    paste_releases(&hint, &env.root, &path, &lock);
}

#[test]
fn hint_says_skill_lock_when_that_name_on_path_is_this_program() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let bin = env.dir("bin");
    std::os::unix::fs::symlink(BIN, bin.join("skill-lock")).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let lock = Lock::new(&repo, "s", "o/r");
    lock.acquire();
    let hint = hint_of(&lock, &[("PATH", &path)]);
    assert_eq!(
        hint,
        format!(
            "skill-lock release s --repo o/r --force --root {}",
            repo.display()
        )
    );
    paste_releases(&hint, &env.root, &path, &lock);
}

#[test]
fn hint_starts_with_the_launcher_and_names_the_store() {
    let env = TestEnv::new();
    let dir = env.dir("wd");
    // A launch line of several words, as a plugin's session hook sets it.
    let launcher = format!("env SKILL_LOCK_HOST=elsewhere {BIN}");
    // A relative file: store is made absolute, so the hint works from anywhere.
    let lock = Lock::new(&dir, "s", "o/r").in_store("file:locks here");
    lock.acquire();
    let hint = hint_of(&lock, &[("SKILL_LOCK_LAUNCHER", &launcher)]);
    assert_eq!(
        hint,
        format!(
            "{launcher} release s --repo o/r --force --store 'file:{}/locks here'",
            dir.display()
        )
    );
    paste_releases(&hint, &env.root, "/usr/bin:/bin", &lock);
}
