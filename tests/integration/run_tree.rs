//! `run` owns everything CMD starts (SPEC §2.7, issue 19): processes that
//! leave CMD's process group or session (`setsid`, a double or triple fork,
//! `setpgid` with the standard streams closed) and a SIGKILL of the
//! wrapper's whole process group. Every test ends the same way: the next
//! holder acquires, writes twice, and the witness must hold **no** write of
//! an older fence after the new holder's first one.
//!
//! Each scenario runs on the file store and, with `SKILL_LOCK_TEST_ETCD`
//! set, on etcd (skipped visibly without it).
//!
//! Covers: SPEC §2.7.
#![cfg(target_os = "linux")]

use crate::harness;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use harness::Lock;
use harness::{BIN, TestEnv, gone};
use harness::{FenceLog, kill_leftover, names};

const SKILL: &str = "s";
const REPO: &str = "o/r";

/// Where the lock lives.
#[derive(Clone, Copy, Debug)]
enum Store {
    File,
    Etcd,
}

/// The writer every scenario leaves behind: records its pid, then appends
/// `$SKILL_LOCK_FENCE` to `$W` every 20 ms, ignoring nothing.
const WRITER: &str = r#"#!/bin/sh
echo $$ >> "$PIDS"
while :; do echo "$SKILL_LOCK_FENCE" >> "$W"; sleep 0.02; done
"#;

/// One scenario's world: a repository, a store, the writer script, the
/// witness and the file of writer pids (killed on drop, if still theirs).
struct World {
    env: TestEnv,
    repo: PathBuf,
    store: Option<String>,
    writer: PathBuf,
    witness: PathBuf,
    pids: PathBuf,
}

impl World {
    /// None when the store is etcd and no endpoint is configured.
    fn new(store: Store, test: &str) -> Option<Self> {
        let env = TestEnv::new();
        let repo = env.git_repo("r");
        let store = match store {
            Store::File => None,
            Store::Etcd => {
                let ep = harness::etcd_endpoint(&format!("{test} on etcd"))?;
                Some(format!(
                    "etcd://{ep}{}",
                    harness::etcd_prefix(&env, "run-tree")
                ))
            }
        };
        let writer = env.path("writer.sh");
        std::fs::write(&writer, WRITER).unwrap();
        std::fs::set_permissions(&writer, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let (witness, pids) = (env.path("W"), env.path("PIDS"));
        std::fs::write(&witness, "").unwrap();
        std::fs::write(&pids, "").unwrap();
        Some(Self {
            env,
            repo,
            store,
            writer,
            witness,
            pids,
        })
    }

    /// The lock, on the store, with the writer's environment.
    fn lock(&self) -> Lock {
        let lock = Lock::new(&self.repo, SKILL, REPO)
            .with_env("WRITER", &self.writer)
            .with_env("W", &self.witness)
            .with_env("PIDS", &self.pids);
        match &self.store {
            Some(store) => lock.with_env("SKILL_LOCK_STORE", store),
            None => lock,
        }
    }

    /// `run --ttl TTL -- sh -c SCRIPT`, with the forwarded signals at their
    /// defaults, output discarded, and `setsid` first when asked.
    fn spawn_run(&self, ttl: u64, script: &str, own_session: bool) -> Child {
        let call = self.lock().op("run").ttl(ttl).command(["sh", "-c", script]);
        call.default_signals(own_session).quiet().spawn()
    }

    /// Waits until the writer has written (so it runs, under fence `fence`).
    #[track_caller]
    fn until_written(&self) {
        let start = Instant::now();
        while std::fs::read_to_string(&self.witness).map_or(true, |w| w.is_empty()) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the writer never wrote"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The next holder: acquires (waiting up to 20 s), writes twice 300 ms
    /// apart and waits 400 ms more, then counts the older fences' writes
    /// that followed its first one.
    #[track_caller]
    fn next_holder_counts_late_writes(&self) -> (u64, usize) {
        let got = self.lock().op("acquire").wait(20).ttl(60).reply();
        assert_eq!(
            got.result(),
            "acquired",
            "the next holder never got the lock: {got:?}"
        );
        let fence = got.must_fence();
        let log = FenceLog(&self.witness);
        log.write_as(fence);
        thread::sleep(Duration::from_millis(400));
        let late = log.late_after(fence).len();
        (fence, late)
    }

    /// Asserts that nothing of the old holder wrote after the new one took
    /// the lock, and that every writer is gone.
    #[track_caller]
    fn assert_no_late_writes(&self, what: &str) {
        let (fence, late) = self.next_holder_counts_late_writes();
        assert_eq!(
            late, 0,
            "{what}: {late} writes of an older fence after fence {fence} acquired (store {:?})",
            self.store
        );
        for pid in self.writer_pids() {
            assert!(gone(pid), "{what}: writer {pid} outlived the lock");
        }
    }

    fn writer_pids(&self) -> Vec<i32> {
        std::fs::read_to_string(&self.pids)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // A failing test must not leave its writers behind (checked to be
        // still theirs: the writer script is in their command line).
        for pid in self.writer_pids() {
            kill_leftover(pid, names(pid, &self.writer));
        }
    }
}

fn sigkill_group(pgid: i32) {
    // SAFETY: kill(2) of a process group this test made.
    let rc = unsafe { libc::kill(-pgid, libc::SIGKILL) };
    assert_eq!(
        rc,
        0,
        "kill -KILL -- -{pgid}: {}",
        std::io::Error::last_os_error()
    );
}

fn wait_bounded(mut child: Child) {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("run did not end within 30 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- scenarios

/// The issue's first case: CMD starts a daemon (`setsid`, in the
/// background) and exits 0.3 s later; `run` must not release while the
/// daemon lives, and must stop it first.
fn daemon_escapes(store: Store) {
    let Some(w) = World::new(store, "daemon_escapes") else {
        return;
    };
    let run = w.spawn_run(5, r#"setsid "$WRITER" & sleep .3"#, false);
    w.until_written();
    wait_bounded(run);
    w.assert_no_late_writes("a setsid daemon");
}

#[test]
fn a_setsid_daemon_is_stopped_before_the_release_on_the_file_store() {
    daemon_escapes(Store::File);
}

#[test]
fn a_setsid_daemon_is_stopped_before_the_release_on_etcd() {
    daemon_escapes(Store::Etcd);
}

/// The issue's second case: `setsid skill-lock run --ttl 3 -- writer`, then
/// `kill -KILL -- -PGID`: the wrapper dies with its group; CMD must not.
fn group_kill(store: Store) {
    let Some(w) = World::new(store, "group_kill") else {
        return;
    };
    let run = w.spawn_run(3, r#"exec "$WRITER""#, true);
    w.until_written();
    let pgid = i32::try_from(run.id()).unwrap();
    sigkill_group(pgid);
    wait_bounded(run);
    w.assert_no_late_writes("SIGKILL of the wrapper's process group");
}

#[test]
fn sigkill_of_the_wrappers_group_stops_cmd_on_the_file_store() {
    group_kill(Store::File);
}

#[test]
fn sigkill_of_the_wrappers_group_stops_cmd_on_etcd() {
    group_kill(Store::Etcd);
}

/// A classic daemon: fork, `setsid`, fork, fork; every intermediate parent
/// exits, so the writer is three forks from CMD, in a session of its own,
/// re-parented away from all of them. CMD then exits.
fn triple_fork(store: Store) {
    let Some(w) = World::new(store, "triple_fork") else {
        return;
    };
    let script = r#"( setsid sh -c '( ( "$WRITER" & ) & )' & ); sleep .3"#;
    let run = w.spawn_run(5, script, false);
    w.until_written();
    wait_bounded(run);
    w.assert_no_late_writes("a triple-forked daemon");
}

#[test]
fn a_triple_forked_daemon_is_stopped_before_the_release_on_the_file_store() {
    triple_fork(Store::File);
}

#[test]
fn a_triple_forked_daemon_is_stopped_before_the_release_on_etcd() {
    triple_fork(Store::Etcd);
}

/// CMD itself closes its standard streams and moves to a process group of
/// its own (nothing ties it to the wrapper but its parent), then writes;
/// the wrapper is SIGKILLed.
fn leaves_group(store: Store) {
    let Some(w) = World::new(store, "leaves_group") else {
        return;
    };
    let script = r#"exec perl -e 'close STDIN; close STDOUT; close STDERR; setpgrp(0, 0) or die; exec $ENV{WRITER} or die'"#;
    let run = w.spawn_run(3, script, false);
    w.until_written();
    let pid = i32::try_from(run.id()).unwrap();
    // SAFETY: kill(2) of the wrapper this test started (not reaped yet).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_bounded(run);
    w.assert_no_late_writes("a CMD that closed its stdio and left its group");
}

#[test]
fn a_cmd_that_leaves_its_group_and_closes_its_stdio_is_stopped_on_the_file_store() {
    leaves_group(Store::File);
}

#[test]
fn a_cmd_that_leaves_its_group_and_closes_its_stdio_is_stopped_on_etcd() {
    leaves_group(Store::Etcd);
}

/// The wrapper is one process of a job (a shell's background job, its
/// group led by the shell) whose CMD both daemonizes a writer and writes
/// itself; the whole job's group is SIGKILLed, wrapper and shell together
/// (where the keeper used to live too).
fn job_kill(store: Store) {
    let Some(w) = World::new(store, "job_kill") else {
        return;
    };
    let pidfile = w.env.path("WRAPPER");
    let line = format!(
        r#"{BIN} run {SKILL} --repo {REPO} --ttl 3 -- sh -c 'setsid "$WRITER" & exec "$WRITER"' & echo $! > {}; wait"#,
        pidfile.display()
    );
    let mut job = Command::new("sh");
    job.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .args(["-c", &line])
        .current_dir(&w.repo)
        .env("WRITER", &w.writer)
        .env("W", &w.witness)
        .env("PIDS", &w.pids)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(store) = &w.store {
        job.env("SKILL_LOCK_STORE", store);
    }
    // SAFETY: only async-signal-safe calls (setsid) between fork and exec.
    unsafe {
        job.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let job = job.spawn().unwrap();
    let start = Instant::now();
    while w.writer_pids().len() < 2 || !pidfile_written(&pidfile) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the job never started"
        );
        thread::sleep(Duration::from_millis(20));
    }
    w.until_written();
    let wrapper: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pgid = i32::try_from(job.id()).unwrap();
    // The wrapper and the shell share the group the shell leads.
    // SAFETY: getpgid(2) of the wrapper this test's job started.
    assert_eq!(unsafe { libc::getpgid(wrapper) }, pgid);
    sigkill_group(pgid);
    wait_bounded(job);
    w.assert_no_late_writes("SIGKILL of a job holding the wrapper");
}

fn pidfile_written(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| s.ends_with('\n'))
}

#[test]
fn sigkill_of_a_job_with_the_wrapper_stops_cmd_and_its_daemon_on_the_file_store() {
    job_kill(Store::File);
}

#[test]
fn sigkill_of_a_job_with_the_wrapper_stops_cmd_and_its_daemon_on_etcd() {
    job_kill(Store::Etcd);
}
