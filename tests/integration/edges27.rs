//! No second writer at the edges (issue 27): an empty `SKILL_LOCK_TOKEN` is
//! a lost token, never "no token" (§2); a result that cannot be written
//! gives its lock back (§3).
//!
//! Covers: SPEC §2, §3.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::verbs::{Lock, Reply, reply, run_reply};
use crate::common::{BIN, Out, TestEnv};

/// The verbs that read a token, each with `SKILL_LOCK_TOKEN` set but empty.
const TOKEN_VERBS: [(&str, &[&str]); 4] = [
    ("renew", &[]),
    ("check", &[]),
    ("release", &[]),
    ("release", &["--force"]),
];

/// The lock is still held by `token`'s run, at `fence`, never renewed.
#[track_caller]
fn still_held_by(lock: &Lock, token: &str, fence: u64) {
    assert!(
        matches!(lock.check(token), Reply::Held { fence: f, .. } if f == fence),
        "the first run lost its lock"
    );
    match lock.call("status", &[]) {
        Reply::Status {
            state,
            holder: Some(holder),
            ..
        } => {
            assert_eq!((state.as_str(), holder.fence), ("held", fence));
            assert_eq!(holder.renewed, None, "the lock was renewed");
        }
        other => panic!("not held: {other:?}"),
    }
}

#[test]
fn an_empty_token_variable_is_a_usage_error_that_changes_nothing() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let first = lock.acquire();
    let (token, fence) = (first.token().to_owned(), first.fence().unwrap());
    for (verb, extra) in TOKEN_VERBS {
        let out = lock.cmd(verb, extra).env("SKILL_LOCK_TOKEN", "").run();
        match reply(&out) {
            Reply::Error { error, .. } => assert_eq!(error, "usage", "{verb} {extra:?}"),
            other => panic!("{verb} {extra:?} with an empty SKILL_LOCK_TOKEN: {other:?}"),
        }
        still_held_by(&lock, &token, fence);
    }
    // `--token ''` is a token given, that matches nothing: never "no token".
    let empty = |verb: &str, extra: &[&str]| {
        let mut args = vec!["--token", ""];
        args.extend_from_slice(extra);
        reply(&lock.cmd(verb, &args).env("SKILL_LOCK_TOKEN", "").run())
    };
    assert!(matches!(empty("check", &[]), Reply::NotOwner { .. }));
    assert!(matches!(empty("renew", &[]), Reply::NotOwner { .. }));
    assert!(matches!(empty("release", &[]), Reply::Refused { .. }));
    still_held_by(&lock, &token, fence);
    // The real token in the variable still works.
    let out = lock
        .cmd("release", &[])
        .env("SKILL_LOCK_TOKEN", &token)
        .run();
    assert!(matches!(reply(&out), Reply::Released { forced: false, .. }));
}

/// `BIN args...` run in `cwd` by `sh -c SCRIPT` (which gets BIN and args
/// as `$0 "$@"`), so the shell can close or redirect its streams.
fn via_sh(cwd: &Path, script: &str, args: &[&str]) -> Out {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(BIN)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .output()
        .expect("sh runs");
    Out::from(out)
}

/// The lock is free: the next acquire takes it without a takeover.
#[track_caller]
fn free(lock: &Lock) {
    match lock.acquire() {
        Reply::Acquired {
            took_over, token, ..
        } => {
            assert_eq!(took_over, None, "the lock was still held");
            lock.release(&token);
        }
        other => panic!("the lock is not free: {other:?}"),
    }
}

#[test]
fn an_acquire_whose_result_cannot_be_written_holds_no_lock() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let args = ["acquire", "s", "--repo", "o/r"];
    for (how, script) in [
        ("full", r#"exec "$0" "$@" >/dev/full"#),
        ("closed", r#"exec "$0" "$@" >&-"#),
    ] {
        let out = via_sh(&repo, script, &args);
        assert_eq!(out.code, 2, "{how}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{how}");
        free(&lock);
    }
    // A pipe whose reader left (`true` reads nothing); its status is
    // written to a file, as `set -o pipefail` is not POSIX.
    let status = env.path("status");
    let script = format!(
        r#"trap '' PIPE; {{ "$0" "$@"; echo $? >'{}'; }} | true"#,
        status.display()
    );
    via_sh(&repo, &script, &args);
    let code = std::fs::read_to_string(&status).unwrap();
    assert_eq!(code.trim(), "2", "an acquire into a closed pipe");
    free(&lock);
    // `>/dev/null` is the caller's choice, not a closed stream.
    let out = via_sh(&repo, r#"exec "$0" "$@" >/dev/null"#, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(matches!(lock.call("status", &[]), Reply::Status { state, .. } if state == "held"));
}

#[test]
fn an_acquire_that_waited_gives_the_lock_back_when_its_result_is_lost() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let first = lock.acquire_with(&["--ttl", "1"]);
    let fence = first.fence().unwrap();
    // Waits out the first lease, takes the lock over, cannot print it.
    let out = via_sh(
        &repo,
        r#"exec "$0" "$@" >/dev/full"#,
        &["acquire", "s", "--repo", "o/r", "--wait", "20"],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    match lock.acquire() {
        Reply::Acquired {
            took_over,
            fence: f,
            ..
        } => {
            assert_eq!(took_over, None, "the waiter left the lock held");
            assert!(f > fence + 1, "the waiter never acquired ({f})");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_run_whose_result_cannot_be_written_leaves_no_lock() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, "s", "o/r");
    let out = via_sh(
        &repo,
        r#"exec "$0" "$@" >&- 2>/dev/full"#,
        &["run", "s", "--repo", "o/r", "--", "true"],
    );
    assert_eq!(out.code, 2, "{}", out.stderr);
    free(&lock);
    // Its stdout closed, run still runs CMD and reports on stderr.
    let out = via_sh(
        &repo,
        r#"exec "$0" "$@" >&-"#,
        &["run", "s", "--repo", "o/r", "--", "true"],
    );
    assert!(matches!(
        run_reply(&out),
        Reply::Ran {
            released: true,
            exit_status: 0,
            ..
        }
    ));
    free(&lock);
}
