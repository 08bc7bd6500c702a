//! The engine/store contract (issue 21): a store shows the engine the
//! record as it stored it and says how it is judged; outcomes are built
//! from one judgement and from what was written; `run`'s one object goes
//! to standard error whatever stops it.
//!
//! Covers: SPEC §2.7, §8.

use crate::git_store::{foreign_state, plant};
use crate::harness::Reply;
use crate::harness::stores::Store;
use crate::harness::{BIN, Out, TestEnv};
use crate::harness::{GitState, typed};
use std::process::Command;

/// Seconds since the epoch of an RFC 3339 UTC timestamp the tool printed.
fn secs(t: &str) -> i64 {
    let out = Command::new("date")
        .args(["-u", "-d", t, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn a_git_holder_is_shown_as_stored_and_every_answer_judges_it_with_the_allowance() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    let lock = || remote.lock(&cwd, "s", "o/r");
    // Another machine's lock, expired 5 s ago by this clock: inside the
    // 30 s allowance, so still held.
    let planted = foreign_state(5);
    plant(remote.remote_dir(), "s@o__r", &planted);
    let stored = typed::<GitState>(&planted).record;
    let held = lock().acquire();
    let Reply::AlreadyRunning {
        holder, expires_in, ..
    } = &held
    else {
        panic!("not held: {held:?}");
    };
    // The holder as it was written: its own `expires` (the allowance is in
    // `expires_in` and `clock_skew`, never in the record) and its pid.
    assert_eq!(secs(&holder.expires), secs(&stored.expires), "{held:?}");
    assert_eq!(holder.owner_pid, Some(4242), "{held:?}");
    let left = *expires_in;
    assert!((20..=26).contains(&left), "{held:?}");
    // A renew with another token is judged the same way: the lease it
    // reports is the one a takeover waits for.
    let refused = lock().renew("not-the-token");
    let refused = refused.is("not_owner");
    let theirs = refused.expires_in().expect("expires_in");
    assert!(theirs.abs_diff(left) <= 2, "{refused:?} vs {held:?}");
    let theirs = refused.holder();
    assert_eq!(secs(&theirs.expires), secs(&stored.expires));
    // Taken over past a small allowance: the holder replaced is the stored one.
    let took = lock()
        .with_env("SKILL_LOCK_CLOCK_SKEW", "2")
        .acquire()
        .is("acquired");
    let replaced = took
        .took_over()
        .and_then(|t| t.holder.as_ref())
        .unwrap_or_else(|| panic!("no holder taken over: {took:?}"));
    assert_eq!(secs(&replaced.expires), secs(&stored.expires), "{took:?}");
    assert_eq!(replaced.owner_pid, Some(4242), "{took:?}");
}

#[test]
fn run_prints_its_one_object_on_stderr_even_when_the_environment_cannot_be_read() {
    let env = TestEnv::new();
    let gone = env.dir("gone");
    // A working directory removed under the process: the environment
    // (the current directory) cannot be read, before any command starts.
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"cd "$1" && rmdir "$1" && exec "$2" run s --repo o/r -- true"#)
        .args(["sh", gone.to_str().unwrap(), BIN])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let out = Out::from(out);
    assert_eq!(out.code, 2, "{} {}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "", "run's standard output is CMD's alone");
    let v = out.run_reply();
    assert!(
        matches!(&v, Reply::Error { error, .. } if error == "io"),
        "{}",
        out.stderr
    );
}
