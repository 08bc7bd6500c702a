//! `run` at its edges (SPEC §2.7, issue 27): a CMD that signals its own
//! process group, a wrapper SIGKILLed with its whole group, a keeper
//! SIGKILLed by its pid. Each test checks effects: which `acquire` of the
//! same lock succeeds while which of CMD's processes still lives, and
//! what `run` said.
//!
//! Covers: SPEC §2.7.
#![cfg(target_os = "linux")]

use crate::harness;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use harness::{Lock, Reply};
use harness::{TestEnv, gone};
use harness::{kill_leftover, names, reply_line};

const SKILL: &str = "s";
const REPO: &str = "o/r";

/// One test's world: a repository, its store, the lock in it, and the
/// pids its CMD wrote down (SIGKILLed on drop if a failing test left them
/// running).
struct World {
    env: TestEnv,
    lock: Lock,
    pids: Vec<PathBuf>,
}

impl World {
    /// A world on the file store, or on a git store (a `file://` remote),
    /// which judges a lock by its lease alone.
    fn new(git: bool) -> Self {
        let env = TestEnv::new();
        let repo = env.git_repo("r");
        let lock = if git {
            harness::stores::Store::git(&env, None).lock(&repo, SKILL, REPO)
        } else {
            Lock::new(&repo, SKILL, REPO)
        };
        Self {
            env,
            lock,
            pids: Vec::new(),
        }
    }

    /// A file for CMD to write a pid into; remembered for the cleanup.
    fn pidfile(&mut self, name: &str) -> PathBuf {
        let path = self.env.path(name);
        self.pids.push(path.clone());
        path
    }

    /// `run --ttl TTL -- sh -c SCRIPT sh ARGS...`, output captured, in a
    /// process group of its own when `own_group`.
    fn spawn_run(&self, ttl: u64, script: &str, args: &[&Path], own_group: bool) -> Child {
        let args: Vec<&str> = args.iter().map(|p| p.to_str().unwrap()).collect();
        let mut cmd = (self.lock.op("run").ttl(ttl).sh(script, &args))
            .default_signals(false)
            .into_command();
        if own_group {
            cmd.process_group(0);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts")
    }

    /// One `acquire` of the lock: `Some(token)` when it got it (exit 0),
    /// `None` when it was held (exit 3).
    #[track_caller]
    fn try_acquire(&self) -> Option<String> {
        match self.lock.op("acquire").ttl(60).reply() {
            r @ Reply::Acquired { .. } => Some(r.token().to_owned()),
            Reply::AlreadyRunning { .. } => None,
            other => panic!("acquire: {other:?}"),
        }
    }

    /// Fails the test when an `acquire` got the lock while `alive` (after
    /// releasing it again, so the failure leaves nothing held); true when
    /// it was refused while `alive` held throughout.
    #[track_caller]
    fn assert_refused_while(&self, what: &str, alive: impl Fn() -> bool) -> bool {
        let before = alive();
        let got = self.try_acquire();
        let still = alive();
        if let Some(token) = got {
            let _ = self.lock.release(&token);
            assert!(
                !(before && still),
                "a second acquire got the lock while {what} still ran"
            );
            return false;
        }
        before && still
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for pid in self.pids.iter().filter_map(|f| read_pid(f)) {
            kill_leftover(pid, names(pid, &self.env.root));
        }
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path)
        .ok()
        .filter(|s| s.ends_with('\n'))?
        .trim()
        .parse()
        .ok()
}

#[track_caller]
fn until_pid(path: &Path) -> i32 {
    let start = Instant::now();
    loop {
        if let Some(pid) = read_pid(path) {
            return pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{} never written",
            path.display()
        );
        thread::sleep(Duration::from_millis(10));
    }
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// Hands every line of `run`'s standard error over, each with whether
/// `alive` held when it was read.
fn lines_seen(
    child: &mut Child,
    alive: impl Fn() -> bool + Send + 'static,
) -> mpsc::Receiver<(String, bool)> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send((line, alive()));
        }
    });
    rx
}

/// The `ran` object `run` printed last, whether `alive` held when it was
/// read, and all it said.
#[track_caller]
fn last_ran(lines: &mpsc::Receiver<(String, bool)>) -> (Reply, bool, String) {
    let mut all = String::new();
    let mut last = None;
    while let Ok((line, alive)) = lines.recv_timeout(Duration::from_secs(20)) {
        all.push_str(&line);
        all.push('\n');
        if let Some(r) = reply_line(&line) {
            last = Some((r, alive));
        }
    }
    let (r, alive) = last.unwrap_or_else(|| panic!("no object: {all}"));
    (r.is("ran"), alive, all)
}

/// Waits for `child` (at most `limit`): its exit code.
#[track_caller]
fn finish(mut child: Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("run did not end within {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `alive` (acquiring the lock meanwhile, which must fail) until it
/// is false, at most `limit`; then acquires until it gets the lock and
/// returns how long after the end that took.
#[track_caller]
fn refused_while_then_acquired(
    w: &World,
    what: &str,
    alive: &dyn Fn() -> bool,
    limit: Duration,
) -> Duration {
    let start = Instant::now();
    let mut refused = 0;
    while alive() {
        refused += u32::from(w.assert_refused_while(what, alive));
        assert!(start.elapsed() < limit, "{what} still runs after {limit:?}");
        thread::sleep(Duration::from_millis(20));
    }
    let ended = Instant::now();
    eprintln!(
        "{what}: {refused} acquires refused while it ran, for {:?}",
        ended - start
    );
    assert!(
        refused > 0,
        "{what} ended before any acquire could be tried"
    );
    while w.try_acquire().is_none() {
        assert!(
            ended.elapsed() < Duration::from_secs(20),
            "no acquire got the lock 20 s after {what} ended"
        );
        thread::sleep(Duration::from_millis(20));
    }
    ended.elapsed()
}

/// A CMD fragment: `setsid` a daemon that writes its pid to `$1`, ignores
/// SIGTERM, and appends a heartbeat to `$2` every 0.1 s for about 3 s.
const DAEMON: &str = r#"setsid sh -c 'echo $$ > "$1"; trap "" TERM; end=$(( $(date +%s) + 3 )); while [ "$(date +%s)" -lt "$end" ]; do date +%s%N >> "$2"; sleep 0.1; done' sh "$1" "$2" &
while [ ! -s "$1" ]; do sleep 0.01; done
"#;

#[test]
fn a_cmd_that_kills_its_own_group_never_frees_the_lock_while_its_daemon_lives() {
    let mut w = World::new(false);
    let daemon_pid = w.pidfile("D");
    let heartbeat = w.env.path("HB");
    let script = format!("{DAEMON}kill -9 0");
    let mut run = w.spawn_run(8, &script, &[&daemon_pid, &heartbeat], false);
    let daemon = until_pid(&daemon_pid);
    let lines = lines_seen(&mut run, move || !gone(daemon));
    let took = refused_while_then_acquired(
        &w,
        "the daemon CMD started",
        &|| !gone(daemon),
        Duration::from_secs(15),
    );
    eprintln!("acquired {took:?} after the daemon's end");
    assert!(
        took <= Duration::from_secs(1),
        "the lock was acquired only {took:?} after the daemon's end"
    );
    let beats = size(&heartbeat);
    assert!(beats > 0, "the daemon never beat");
    thread::sleep(Duration::from_millis(300));
    assert_eq!(size(&heartbeat), beats, "the daemon still beats");
    finish(run, Duration::from_secs(20));
    let (r, daemon_alive, stderr) = last_ran(&lines);
    assert!(
        !(daemon_alive && r.released()),
        "run said released while the daemon CMD started still ran: {stderr}"
    );
}

/// The wrapper, in a process group of its own, is SIGKILLed with that
/// whole group while CMD and its child (both ignoring SIGTERM) run. The
/// wrapper stays unreaped until the end, as when the shell whose job it
/// was died with the same group and its orphan went to an init that does
/// not reap (this VM's does not): no pid of it can tell that it is gone.
fn wrapper_group_killed(git: bool) {
    let mut w = World::new(git);
    let (cmd_pid, child_pid) = (w.pidfile("C"), w.pidfile("K"));
    // SIGTERM is ignored before either pid is written (and inherited).
    let script = r#"trap '' TERM; sh -c 'echo $$ > "$1"; while :; do sleep 0.05; done' sh "$2" & echo $$ > "$1"; while :; do sleep 0.05; done"#;
    let mut run = w.spawn_run(10, script, &[&cmd_pid, &child_pid], true);
    let pids = [until_pid(&cmd_pid), until_pid(&child_pid)];
    let pgid = i32::try_from(run.id()).unwrap();
    // SAFETY: kill(2) of the process group this test made for the wrapper.
    assert_eq!(unsafe { libc::kill(-pgid, libc::SIGKILL) }, 0);
    let alive = || pids.iter().any(|p| !gone(*p));
    let took = refused_while_then_acquired(&w, "CMD", &alive, Duration::from_secs(10));
    eprintln!("acquired {took:?} after CMD's last process ended");
    run.wait().unwrap();
    assert!(
        took <= Duration::from_secs(1),
        "the lock was acquired only {took:?} after CMD's last process ended"
    );
}

#[test]
fn a_wrapper_sigkilled_with_its_group_releases_when_cmd_ends_on_the_file_store() {
    wrapper_group_killed(false);
}

#[test]
fn a_wrapper_sigkilled_with_its_group_releases_when_cmd_ends_on_a_git_store() {
    wrapper_group_killed(true);
}

#[test]
fn a_sigkilled_keeper_leaves_the_lock_to_its_lease_and_run_reports_lost() {
    let mut w = World::new(false);
    let (daemon_pid, cmd_pid) = (w.pidfile("D"), w.pidfile("C"));
    let heartbeat = w.env.path("HB");
    let script = format!(r#"{DAEMON}echo $$ > "$3"; while :; do sleep 0.05; done"#);
    let mut run = w.spawn_run(6, &script, &[&daemon_pid, &heartbeat, &cmd_pid], false);
    let (daemon, cmd) = (until_pid(&daemon_pid), until_pid(&cmd_pid));
    let lines = lines_seen(&mut run, move || !gone(daemon) || !gone(cmd));
    let Reply::Status {
        holder: Some(holder),
        ..
    } = w.lock.status()
    else {
        panic!("not held while CMD runs");
    };
    let keeper = i32::try_from(holder.owner_pgid.expect("the keeper's group")).unwrap();
    // SAFETY: kill(2) of the keeper of the run this test started.
    assert_eq!(unsafe { libc::kill(keeper, libc::SIGKILL) }, 0);
    let alive = || !gone(daemon) || !gone(cmd);
    let start = Instant::now();
    let mut refused = 0;
    while alive() {
        refused += u32::from(w.assert_refused_while("a process CMD started", alive));
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "CMD's processes live on"
        );
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{refused} acquires refused while CMD's processes ran, for {:?}",
        start.elapsed()
    );
    assert!(
        refused > 0,
        "CMD's processes ended before any acquire could be tried"
    );
    let code = finish(run, Duration::from_secs(20));
    let (r, _, stderr) = last_ran(&lines);
    assert_eq!((r.lost(), r.released()), (true, false), "{stderr}");
    assert!(code.is_some_and(|c| c > 128), "{code:?}: {stderr}");
    assert_left_to_its_lease(&w);
}

/// The lock stays held (never free, never `owner_dead`) until its lease
/// runs out, and is then stale as `expired`.
#[track_caller]
fn assert_left_to_its_lease(w: &World) {
    let first = Instant::now();
    let mut left = None;
    loop {
        match w.lock.status() {
            Reply::Status {
                state, expires_in, ..
            } if state == "held" => {
                left.get_or_insert(expires_in.unwrap_or(0));
            }
            Reply::Status {
                state,
                stale_reason,
                ..
            } => {
                assert_eq!(
                    (state.as_str(), stale_reason.as_deref()),
                    ("stale", Some("expired")),
                    "the lock was released or judged by a dead owner before its lease ended"
                );
                let held_for = first.elapsed();
                let lease = Duration::from_secs(left.unwrap_or(0));
                assert!(
                    held_for + Duration::from_secs(1) >= lease,
                    "stale {held_for:?} after it had {lease:?} left"
                );
                return;
            }
            other => panic!("status: {other:?}"),
        }
        assert!(
            first.elapsed() < Duration::from_secs(15),
            "held past its lease"
        );
        thread::sleep(Duration::from_millis(50));
    }
}
