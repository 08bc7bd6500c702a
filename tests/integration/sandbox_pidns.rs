//! A pid namespace per call, as the agent's sandbox makes one for every
//! shell command (SPEC §6, §9): the kernel hands the inode number of a
//! namespace that ended to the next one created, so a record written with
//! `--owner-pid` in one call's namespace and judged from the next call's,
//! which may carry the same number, must be judged by its lease alone: held,
//! never `owner_dead`.
//!
//! Covers: SPEC §6, §9.

use std::ffi::OsStr;
use std::process::{Command, Stdio};

use crate::harness::{Cmd, Out, TestEnv};
use crate::harness::{Lock, Reply};

/// How `unshare` may make a pid namespace with its own `/proc` here.
fn unshare_pid_args() -> Option<Vec<&'static str>> {
    [
        vec!["--pid", "--fork", "--mount-proc"],
        vec!["-r", "--pid", "--fork", "--mount-proc"],
    ]
    .into_iter()
    .find(|args| {
        Command::new("unshare")
            .args(args)
            .arg("true")
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Runs `cmd` as pid 1 of a fresh pid namespace; returns what it printed
/// and the namespace's inode number.
fn in_fresh_ns(unshare: &[&str], cmd: Cmd) -> (Out, String) {
    let mut pre: Vec<&OsStr> = unshare.iter().map(OsStr::new).collect();
    pre.extend(
        [
            "sh",
            "-c",
            "readlink /proc/self/ns/pid >&2; exec \"$0\" \"$@\"",
        ]
        .map(OsStr::new),
    );
    let out = cmd.through("unshare", &pre).run();
    let ns = out.stderr.lines().next().unwrap_or_default().to_owned();
    (out, ns)
}

#[test]
fn an_owner_pid_from_an_earlier_calls_namespace_is_judged_by_the_lease_even_when_its_inode_is_reused()
 {
    let Some(unshare) = unshare_pid_args() else {
        eprintln!("SKIPPED: unshare --pid is not allowed here");
        return;
    };
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let lock = Lock::new(&repo, "pidns", "apache/example");
    let mut reused = 0;
    for attempt in 0..20u64 {
        // The owner is the acquiring process itself, pid 1 of its namespace,
        // which ends with it (as a sandboxed shell call ends).
        let (acq, first) = in_fresh_ns(&unshare, lock.op("acquire").owner_pid(1).ttl(600));
        let got = acq.reply();
        assert!(matches!(got, Reply::Acquired { .. }), "{got:?}");
        // The next call: pid 1 again, another process in another namespace.
        // (An ended namespace's number is freed a moment after it ends, as
        // between two shell calls of an agent.)
        std::thread::sleep(std::time::Duration::from_millis(20 * (attempt + 1)));
        let (status, second) = in_fresh_ns(&unshare, lock.op("status"));
        assert_eq!(
            status.reply().state(),
            "held",
            "a record from another pid namespace ({first}, judged from {second}) was judged by its pid: {}",
            status.stdout
        );
        if first == second {
            reused += 1;
        }
        let released = lock.op("release").reply();
        assert!(matches!(released, Reply::Released { .. }), "{released:?}");
        if reused >= 3 {
            break;
        }
    }
    if reused == 0 {
        eprintln!("NOTE: the kernel never reused a pid namespace's inode in 20 tries here");
    }
}
