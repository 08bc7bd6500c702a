//! `acquire --wait` (SPEC §2.1) and `run` (SPEC §2.7) with real processes,
//! each test in its own temporary git repository.
//!
//! Timing bounds are deliberately generous: a bound only catches "never
//! waited" or "waited far too long", never a few hundred milliseconds.
//!
//! Covers: SPEC §2.1, §2.7.

use crate::harness;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use harness::{BIN, Cmd, TestEnv, gone};
use harness::{FenceLog, KillOnDrop, finish, finish_output, until};
use harness::{Holder, Lock, Reply};

const SKILL: &str = "s";
const REPO: &str = "o/r";

/// A test's world: a git repository `r` and the lock `s` of `o/r` in it.
fn world() -> (TestEnv, Lock) {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, SKILL, REPO);
    (env, lock)
}

/// Starts `cmd`, the signals `run` forwards at their defaults (every
/// test here sends them), stdout/stderr captured.
fn spawn(cmd: Cmd) -> Child {
    cmd.default_signals(false).spawn()
}

/// [`spawn`] with nothing captured (its wrapper is to be SIGKILLed).
fn spawn_quiet(cmd: Cmd) -> Child {
    cmd.default_signals(false).quiet().spawn()
}

fn pid_of(child: &Child) -> i32 {
    i32::try_from(child.id()).expect("pid fits in i32")
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: plain kill(2) on a process this test started.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Waits until the lock is held (by whoever): its `status`.
#[track_caller]
fn until_held(lock: &Lock) -> Reply {
    until(Duration::from_secs(10), "held", || {
        let s = lock.status();
        (s.state() == "held").then_some(s)
    })
}

/// Waits until the lock is no longer held: its `status`.
#[track_caller]
fn until_not_held(lock: &Lock, limit: Duration) -> Reply {
    until(limit, "released", || {
        let s = lock.status();
        (s.state() != "held").then_some(s)
    })
}

/// Reads a file that a shell writes with `echo ... > F`, once complete.
#[track_caller]
fn until_file(path: &Path) -> String {
    until(Duration::from_secs(10), "written", || {
        std::fs::read_to_string(path)
            .ok()
            .filter(|s| s.ends_with('\n'))
    })
}

/// `holder` is the lock of the `run` whose wrapper is `child`: it names no
/// pid whose death would make it stale (SPEC §2.7: the owner is what CMD
/// starts), and its group is that of the wrapper's keeper.
#[track_caller]
fn assert_held_by_run(holder: &Holder, child: &Child) {
    assert_eq!(holder.owner_pid, None, "{holder:?}");
    let keeper = holder.owner_pgid.expect("owner_pgid");
    let stat = std::fs::read_to_string(format!("/proc/{keeper}/stat")).unwrap();
    let ppid = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1);
    assert_eq!(
        ppid,
        Some(child.id().to_string().as_str()),
        "the group is not the keeper's: {holder:?}"
    );
}

// ---------------------------------------------------------------- --wait

#[test]
fn waiter_acquires_when_a_short_lease_ends() {
    let (_env, lock) = world();
    let fence = lock
        .op("acquire")
        .ttl(2)
        .reply()
        .is("acquired")
        .must_fence();
    let start = Instant::now();
    let v = lock.op("acquire").wait(10).reply().is("acquired");
    let elapsed = start.elapsed();
    assert_eq!(v.took_over_from(), Some(("expired", Some(fence))), "{v:?}");
    assert!(v.must_fence() > fence, "{v:?}");
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(8),
        "a 2 s lease was taken over after {elapsed:?}"
    );
}

#[test]
fn waiter_gives_up_on_time() {
    let (_env, lock) = world();
    lock.op("acquire").ttl(600).reply().is("acquired");
    let start = Instant::now();
    let v = lock.op("acquire").wait(1).reply();
    let elapsed = start.elapsed();
    // A holder and no token: the typed reply has no field for one.
    assert!(matches!(v, Reply::AlreadyRunning { .. }), "{v:?}");
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(5),
        "--wait 1 gave up after {elapsed:?}"
    );
    // The holder is untouched.
    assert_eq!(lock.state(), "held");
}

#[test]
fn waiter_acquires_promptly_after_a_release() {
    let (_env, lock) = world();
    lock.acquire().is("acquired");
    let mut waiter = spawn(lock.op("acquire").wait(20));
    thread::sleep(Duration::from_millis(500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the waiter ended while the lock was held"
    );
    let r = lock.op("release").reply();
    assert_eq!(r.result(), "released", "{r:?}");
    let released = Instant::now();
    let v = finish(waiter, Duration::from_secs(15)).reply();
    assert!(
        matches!(
            v,
            Reply::Acquired {
                took_over: None,
                ..
            }
        ),
        "{v:?}"
    );
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter took {:?} after the release",
        released.elapsed()
    );
    assert_eq!(lock.state(), "held");
}

// ------------------------------------------------------------------ run

#[test]
fn ten_waiting_runs_take_turns_without_overlap() {
    let (env, lock) = world();
    let witness = env.path("witness");
    let w = witness.to_str().unwrap();
    let script = r#"echo enter $$ >> "$1"; sleep 0.2; echo exit $$ >> "$1""#;
    let runs: Vec<Child> = (0..10)
        .map(|_| spawn(lock.op("run").wait(60).sh(script, &[w])))
        .collect();
    let outs: Vec<_> = runs
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();

    let mut fences = Vec::new();
    for out in &outs {
        assert_eq!(out.code, 0, "{}", out.stderr);
        let r = out.run_reply();
        assert_eq!(
            (r.exit_status(), r.released(), r.lost()),
            (0, true, false),
            "{r:?}"
        );
        fences.push(r.must_fence());
    }
    let mut distinct = fences.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 10, "fences not distinct: {fences:?}");

    let text = std::fs::read_to_string(&witness).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20, "{text}");
    for pair in lines.chunks(2) {
        let enter = pair[0].strip_prefix("enter ");
        let exit = pair[1].strip_prefix("exit ");
        assert!(
            enter.is_some() && enter == exit,
            "overlapping critical sections: {pair:?} in\n{text}"
        );
    }
    assert_eq!(lock.state(), "free");
}

#[test]
fn run_passes_stdio_through_and_exits_with_the_status_of_cmd() {
    let (_env, lock) = world();

    // stdin -> cat -> stdout, byte for byte, no trailing newline.
    let input: &[u8] = b"\x00\xff\xfebinary\n\x80\xc3(line two, no newline";
    let child = spawn(lock.op("run").command(["cat"]).stdin(input));
    let raw = finish_output(child, Duration::from_secs(20));
    assert_eq!(raw.stdout, input, "stdout differs from stdin");
    let out = harness::Out::from(raw);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.run_reply().exit_status(), 0, "{}", out.stderr);
    assert_eq!(lock.state(), "free");

    // Exit status passthrough; CMD's own stderr comes before the JSON line.
    let script = "echo cmd-out; echo cmd-err-1 >&2; echo cmd-err-2 >&2; exit 7";
    let out = finish(
        spawn(lock.op("run").sh(script, &[])),
        Duration::from_secs(20),
    );
    let stderr = &out.stderr;
    assert_eq!(out.code, 7, "{stderr}");
    assert_eq!(out.stdout, "cmd-out\n", "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    let pos = |needle: &str| lines.iter().position(|l| *l == needle);
    let (e1, e2) = (pos("cmd-err-1"), pos("cmd-err-2"));
    assert!(
        e1.is_some() && e1 < e2 && e2 < Some(lines.len() - 1),
        "CMD's stderr must come before the JSON line: {stderr:?}"
    );
    // run must not print the token: the typed `ran` has no field for one.
    let r = out.run_reply();
    assert_eq!(
        (r.exit_status(), r.signal(), r.released()),
        (7, None, true),
        "{r:?}"
    );
    assert!(
        matches!(&r, Reply::Ran { skill, repo, .. } if skill == SKILL && repo == REPO),
        "{r:?}"
    );
    assert_eq!(lock.state(), "free");
}

#[test]
fn run_gives_cmd_its_token_and_fence() {
    let (_env, lock) = world();
    let script = r#"echo "$SKILL_LOCK_FENCE"; "$1" check s --repo o/r --token "$SKILL_LOCK_TOKEN" >/dev/null; echo "check=$?""#;
    let out = finish(
        spawn(lock.op("run").sh(script, &[BIN])),
        Duration::from_secs(20),
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = out.run_reply();
    assert_eq!(
        out.stdout,
        format!("{}\ncheck=0\n", r.must_fence()),
        "{}",
        out.stderr
    );
}

#[test]
fn run_refuses_when_held_and_does_not_run_cmd() {
    let (env, lock) = world();
    lock.acquire().is("acquired");
    let marker = env.path("MARKER");
    let out = lock
        .op("run")
        .command(["touch", marker.to_str().unwrap()])
        .run();
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert_eq!(out.stdout, "", "nothing on stdout when refused");
    let v = out.run_reply();
    assert!(matches!(v, Reply::AlreadyRunning { .. }), "{v:?}");
    assert!(!marker.exists(), "CMD ran although the lock was held");
    assert_eq!(lock.state(), "held");
}

#[test]
fn run_forwards_sigterm_to_cmd_and_releases() {
    let (env, lock) = world();
    let got = env.path("F");
    let ready = env.path("R");
    let script = r#"trap 'echo got-term > "$1"; exit 5' TERM; echo ready > "$2"; while :; do sleep 0.05; done"#;
    let child = spawn(
        lock.op("run")
            .sh(script, &[got.to_str().unwrap(), ready.to_str().unwrap()]),
    );
    let held = until_held(&lock);
    assert_held_by_run(held.holder(), &child);
    until_file(&ready);
    signal(pid_of(&child), libc::SIGTERM);
    let out = finish(child, Duration::from_secs(20));
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default(),
        "got-term\n"
    );
    let r = out.run_reply();
    assert_eq!((r.exit_status(), r.released()), (5, true), "{r:?}");
    assert_eq!(lock.state(), "free");
}

#[test]
fn run_forwards_sigint_and_sighup_and_reports_128_plus_signal() {
    let (env, lock) = world();
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGHUP, 129)] {
        let ready = env.path(&format!("P{sig}"));
        let child = spawn(lock.op("run").sh(
            r#"echo $$ > "$1"; exec sleep 30"#,
            &[ready.to_str().unwrap()],
        ));
        until_file(&ready);
        until_held(&lock);
        // Let `run` learn CMD's pid (it does right after the exec).
        thread::sleep(Duration::from_millis(100));
        signal(pid_of(&child), sig);
        let out = finish(child, Duration::from_secs(20));
        assert_eq!(out.code, code, "signal {sig}: {}", out.stderr);
        let r = out.run_reply();
        assert_eq!(
            (i32::from(r.exit_status()), r.signal(), r.released()),
            (code, Some(sig), true),
            "{r:?}"
        );
        assert_eq!(lock.state(), "free");
    }
}

#[test]
fn renewal_keeps_the_lock_past_its_ttl() {
    let (_env, lock) = world();
    let started = Instant::now();
    let child = spawn(lock.op("run").ttl(2).command(["sleep", "5"]));
    until_held(&lock);
    thread::sleep(Duration::from_millis(3500).saturating_sub(started.elapsed()));
    let v = lock.acquire();
    let Reply::AlreadyRunning { holder, .. } = &v else {
        panic!("not held: {v:?}");
    };
    assert_held_by_run(holder, &child);
    let out = finish(child, Duration::from_secs(20));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let r = out.run_reply();
    assert_eq!(
        (r.exit_status(), r.lost(), r.released()),
        (0, false, true),
        "{r:?}"
    );
    assert!(r.renewals() >= 2, "{r:?}");
    assert_eq!(lock.state(), "free");
}

#[test]
fn a_forced_release_stops_cmd() {
    let (_env, lock) = world();
    let child = spawn(lock.op("run").ttl(3).command(["sleep", "30"]));
    until_held(&lock);
    let forced = lock.force_release();
    assert!(
        matches!(forced, Reply::Released { forced: true, .. }),
        "{forced:?}"
    );
    let start = Instant::now();
    let out = finish(child, Duration::from_secs(15));
    let elapsed = start.elapsed();
    let stderr = &out.stderr;
    assert_eq!(out.code, 143, "{stderr}");
    assert!(
        elapsed < Duration::from_secs(8),
        "CMD stopped {elapsed:?} after the lease was lost"
    );
    let r = out.run_reply();
    assert_eq!(
        (r.lost(), r.exit_status(), r.signal()),
        (true, 143, Some(libc::SIGTERM)),
        "{r:?}"
    );
    let said = stderr.to_lowercase();
    assert!(
        said.contains("lost") || said.contains("released"),
        "stderr does not say the lease was lost: {stderr}"
    );
    assert_eq!(lock.state(), "free");
}

#[test]
fn a_lease_lost_to_a_newcomer_stops_cmd_and_leaves_the_newcomer_alone() {
    let (_env, lock) = world();
    let child = spawn(lock.op("run").ttl(3).command(["sleep", "30"]));
    until_held(&lock);
    let forced = lock.force_release();
    assert_eq!(forced.result(), "released", "{forced:?}");
    let fence = lock
        .op("acquire")
        .ttl(600)
        .reply()
        .is("acquired")
        .must_fence();
    let out = finish(child, Duration::from_secs(15));
    assert_eq!(out.code, 143, "{}", out.stderr);
    let r = out.run_reply();
    assert_eq!((r.lost(), r.released()), (true, false), "{r:?}");
    let s = lock.status();
    assert_eq!(s.state(), "held", "{s:?}");
    assert_eq!(
        s.holder().fence,
        fence,
        "run released the newcomer's lock: {s:?}"
    );
}

#[test]
fn sigkill_of_run_stops_its_group_and_the_keeper_releases_only_then() {
    let (env, lock) = world();
    let pidfile = env.path("P");
    let mut child = spawn_quiet(lock.op("run").ttl(8).sh(
        r#"echo $$ > "$1"; exec sleep 30"#,
        &[pidfile.to_str().unwrap()],
    ));
    let cmd_pid: i32 = until_file(&pidfile).trim().parse().unwrap();
    let _cleanup = KillOnDrop::new(cmd_pid);
    until_held(&lock);
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();

    // The keeper stops the group within the grace (1 s for ttl 8) and then
    // releases the lock itself (SPEC §2.7), once nothing of it is left.
    let s = until_not_held(&lock, Duration::from_secs(10));
    assert!(gone(cmd_pid), "the lock was freed while CMD lived: {s:?}");
    assert_eq!(s.state(), "free", "{s:?}");
    let v = lock.acquire().is("acquired");
    assert_eq!(v.took_over(), None, "{v:?}");
}

/// `run --ttl TTL` of a [`writer_script`] CMD, with its witness and pid files.
struct WriterRun {
    ttl: u64,
    tail: &'static str,
    witness: PathBuf,
    pidfile: PathBuf,
}

impl WriterRun {
    fn new(env: &TestEnv, ttl: u64, tail: &'static str) -> Self {
        Self {
            ttl,
            tail,
            witness: env.path("W"),
            pidfile: env.path("P"),
        }
    }

    /// The `run` of `lock`.
    fn cmd(&self, lock: &Lock) -> Cmd {
        lock.op("run").ttl(self.ttl).sh(
            writer_script(self.tail),
            &[
                self.witness.to_str().unwrap(),
                self.pidfile.to_str().unwrap(),
            ],
        )
    }

    /// The background writer's pid once it runs, and a guard that kills it
    /// if the test fails.
    fn writer(&self) -> (i32, KillOnDrop) {
        let writer: i32 = until_file(&self.pidfile).trim().parse().unwrap();
        (writer, KillOnDrop::new(writer))
    }
}

/// A CMD whose background child appends `$SKILL_LOCK_FENCE` to `$1` every
/// 20 ms and records its pid in `$2`; the shell itself then does `tail`.
fn writer_script(tail: &str) -> &'static str {
    match tail {
        "wait" => {
            r#"(while :; do echo "$SKILL_LOCK_FENCE" >> "$1"; sleep 0.02; done) & echo $! > "$2"; wait"#
        }
        _ => {
            r#"(while :; do echo "$SKILL_LOCK_FENCE" >> "$1"; sleep 0.02; done) & echo $! > "$2"; exit 0"#
        }
    }
}

#[test]
fn sigkill_of_run_leaves_no_background_writer_beside_the_next_holder() {
    let (env, lock) = world();
    let w = WriterRun::new(&env, 8, "wait");
    let mut child = spawn_quiet(w.cmd(&lock));
    let (writer, _cleanup) = w.writer();
    until_file(&w.witness);
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();

    let fence = lock
        .op("acquire")
        .wait(20)
        .ttl(60)
        .reply()
        .is("acquired")
        .must_fence();
    let log = FenceLog(&w.witness);
    log.write_as(fence);
    assert!(gone(writer), "CMD's background writer outlived the lock");
    log.assert_no_older_write_after(fence);
}

#[test]
fn a_live_keeper_holds_the_lock_past_its_expiry_until_its_tree_ends() {
    let (env, lock) = world();
    let w = WriterRun::new(&env, 1, "wait");
    let mut child = spawn_quiet(w.cmd(&lock));
    let (writer, _cleanup) = w.writer();
    let held = until_held(&lock);
    let keeper = held.holder().owner_pgid.expect("owner_pgid");
    let keeper = i32::try_from(keeper).unwrap();
    // Nothing of skill-lock can act: the wrapper and the keeper are both
    // stopped; the background writer goes on past the 1 s lease.
    signal(pid_of(&child), libc::SIGSTOP);
    signal(keeper, libc::SIGSTOP);
    thread::sleep(Duration::from_millis(1500));
    assert!(!gone(writer));

    let s = lock.status();
    assert_eq!(
        s.state(),
        "held",
        "a lock whose keeper lives is not stale, past its lease too: {s:?}"
    );
    let v = lock.acquire();
    assert!(matches!(v, Reply::AlreadyRunning { .. }), "{v:?}");

    // The wrapper dies; the keeper, resumed, finds its stop moment passed
    // and its wrapper gone: it stops the tree, then releases the lock.
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();
    signal(keeper, libc::SIGCONT);
    let s = until_not_held(&lock, Duration::from_secs(5));
    assert!(
        gone(writer),
        "the lock was freed while the writer lived: {s:?}"
    );
    let fence = lock
        .op("acquire")
        .ttl(60)
        .reply()
        .is("acquired")
        .must_fence();
    let log = FenceLog(&w.witness);
    log.write_as(fence);
    log.assert_no_older_write_after(fence);
}

#[test]
fn cmd_leaving_a_background_job_has_it_stopped_before_the_release() {
    let (env, lock) = world();
    let w = WriterRun::new(&env, 8, "exit");
    let out = finish(spawn(w.cmd(&lock)), Duration::from_secs(20));
    let (writer, _cleanup) = w.writer();
    let stderr = &out.stderr;
    assert_eq!(out.code, 0, "CMD's own status: {stderr}");
    let r = out.run_reply();
    assert_eq!((r.released(), r.lost()), (true, false), "{r:?}");
    assert!(gone(writer), "the background job outlived run: {stderr}");

    let fence = lock
        .op("acquire")
        .ttl(60)
        .reply()
        .is("acquired")
        .must_fence();
    if std::fs::metadata(&w.witness).is_ok() {
        let log = FenceLog(&w.witness);
        log.write_as(fence);
        log.assert_no_older_write_after(fence);
    }
}

#[test]
fn a_forced_release_stops_the_whole_group() {
    let (env, lock) = world();
    let w = WriterRun::new(&env, 3, "wait");
    let child = spawn(w.cmd(&lock));
    let (writer, _cleanup) = w.writer();
    until_file(&w.witness);
    let forced = lock.force_release();
    assert_eq!(forced.result(), "released", "{forced:?}");
    let out = finish(child, Duration::from_secs(15));
    assert_eq!(out.code, 143, "{}", out.stderr);
    assert!(out.run_reply().lost(), "{}", out.stderr);
    assert!(
        gone(writer),
        "the background writer outlived the lost lease"
    );
}

/// The `run --ttl TTL` of `lock` whose CMD's background child appends
/// `/proc/uptime` to `witness` every 20 ms while CMD waits for it.
#[cfg(target_os = "linux")]
fn uptime_writer_run(lock: &Lock, ttl: u64, witness: &Path) -> Cmd {
    let script = r#"(while :; do cut -d' ' -f1 /proc/uptime >> "$1"; sleep 0.02; done) & wait"#;
    lock.op("run")
        .ttl(ttl)
        .sh(script, &[witness.to_str().unwrap()])
}

/// Fails when a witnessed write (an uptime) is not before `deadline_ms`,
/// the confirmed lease end on the boot clock.
#[cfg(target_os = "linux")]
#[track_caller]
fn assert_last_write_before(times: &[f64], deadline_ms: u64) {
    let last = times.iter().copied().fold(0.0, f64::max);
    // Whole 10 ms steps of /proc/uptime, rounded down: compare in ms.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let last_ms = (last * 1000.0).round() as u64;
    assert!(
        last_ms + 10 <= deadline_ms,
        "a write at {last_ms} ms, after the confirmed lease end {deadline_ms} ms"
    );
}

/// Boot-clock seconds (`/proc/uptime`, 10 ms steps) of each witness line.
#[cfg(target_os = "linux")]
fn uptimes(witness: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(witness).unwrap();
    text.lines().map(|l| l.trim().parse().unwrap()).collect()
}

/// `holder.deadline_boot_ms` of the lock, which must be held.
#[cfg(target_os = "linux")]
#[track_caller]
fn deadline_boot_ms(lock: &Lock) -> u64 {
    let s = lock.status();
    s.holder()
        .deadline_boot_ms
        .unwrap_or_else(|| panic!("no deadline_boot_ms: {s:?}"))
}

#[cfg(target_os = "linux")]
#[test]
fn failing_renewals_stop_the_group_before_the_confirmed_lease_ends() {
    let (env, lock) = world();
    let store = env.path("store");
    std::fs::create_dir(&store).unwrap();
    let lock = lock.in_store(&format!("file:{}", store.display()));
    let witness = env.path("W");
    let child = spawn(uptime_writer_run(&lock, 2, &witness));
    until_file(&witness);
    thread::sleep(Duration::from_millis(1000));
    // The store becomes unreachable for good (root ignores modes, so the
    // directory is replaced by a file): every renewal fails from now on.
    let moved = env.path("store.gone");
    std::fs::rename(&store, &moved).unwrap();
    std::fs::write(&store, "not a directory").unwrap();
    let out = finish(child, Duration::from_secs(15));
    let stderr = &out.stderr;
    assert!(matches!(out.code, 143 | 137), "{stderr}");
    let r = out.run_reply();
    assert!(r.lost() && r.renewals() >= 1, "{r:?}");
    assert!(stderr.contains("renewal failed"), "{stderr}");

    let moved =
        Lock::new(&env.path("r"), SKILL, REPO).in_store(&format!("file:{}", moved.display()));
    let deadline_ms = deadline_boot_ms(&moved);
    let times = uptimes(&witness);
    assert_last_write_before(&times, deadline_ms);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        uptimes(&witness).len(),
        times.len(),
        "the group still writes"
    );
}

/// The wrapper SIGSTOPped (a debugger, a frozen container, a starved
/// machine): nothing renews and nothing watches the lease in it, so the
/// keeper stops the group at the last confirmed end less the margin. On a
/// network store no group liveness protects the lock after its lease, so
/// this is what keeps the writer from outliving it there.
#[cfg(target_os = "linux")]
#[test]
fn a_stopped_wrapper_still_has_its_group_stopped_before_the_lease_ends() {
    let (env, lock) = world();
    let witness = env.path("W");
    let child = spawn(uptime_writer_run(&lock, 2, &witness));
    let wrapper = pid_of(&child);
    until_file(&witness);
    thread::sleep(Duration::from_millis(300));
    signal(wrapper, libc::SIGSTOP);
    let deadline_ms = deadline_boot_ms(&lock);
    // Past the lease (2 s) and then some: had the group outlived it, the
    // witness would still grow.
    thread::sleep(Duration::from_millis(3000));
    let times = uptimes(&witness);
    thread::sleep(Duration::from_millis(300));
    let later = uptimes(&witness).len();
    signal(wrapper, libc::SIGCONT);
    let out = finish(child, Duration::from_secs(15));
    let stderr = &out.stderr;
    assert_eq!(later, times.len(), "the group still writes: {stderr}");
    assert_last_write_before(&times, deadline_ms);
    assert!(matches!(out.code, 143 | 137), "{stderr}");
    assert!(out.run_reply().lost(), "{stderr}");
}

/// Has `pid` blocked SIGTERM yet (Linux); elsewhere, after a second.
fn signals_blocked(pid: i32) -> bool {
    if !cfg!(target_os = "linux") {
        thread::sleep(Duration::from_secs(1));
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigBlk:"))
                .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        })
        .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
}

#[test]
fn a_signal_ends_run_wait_at_once_with_nothing_acquired_or_run() {
    let (env, lock) = world();
    let fence = lock
        .op("acquire")
        .ttl(120)
        .reply()
        .is("acquired")
        .must_fence();
    let ran_file = env.path("ran");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let child = spawn(
            lock.op("run")
                .wait(60)
                .sh(r#"echo ran > "$1""#, &[ran_file.to_str().unwrap()]),
        );
        let pid = pid_of(&child);
        until(Duration::from_secs(10), "signals blocked", || {
            signals_blocked(pid).then_some(())
        });
        thread::sleep(Duration::from_millis(200));
        signal(pid, sig);
        let start = Instant::now();
        let out = finish(child, Duration::from_secs(10));
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "the wait went on {:?}",
            start.elapsed()
        );
        assert_eq!(out.code, 128 + sig, "{}", out.stderr);
        let v = out.run_reply();
        assert!(
            matches!(v, Reply::Interrupted { signal, .. } if signal == sig),
            "{v:?}"
        );
        assert!(!ran_file.exists(), "CMD ran after a signal ended the wait");
        let s = lock.status();
        assert_eq!(s.state(), "held", "{s:?}");
        assert_eq!(s.holder().fence, fence, "{s:?}");
    }
}

#[test]
fn a_command_that_cannot_start_is_refused_before_the_lock_is_touched() {
    let (env, lock) = world();
    let fence = lock
        .op("acquire")
        .ttl(1)
        .reply()
        .is("acquired")
        .must_fence();
    until(Duration::from_secs(5), "stale", || {
        (lock.status().state() == "stale").then_some(())
    });
    let plain = env.path("plain");
    std::fs::write(&plain, "#!/bin/sh\necho ran\n").unwrap();
    let dir = env.path("");
    for cmd in [
        "no-such-command-here",
        plain.to_str().unwrap(),
        dir.to_str().unwrap(),
    ] {
        let out = lock.op("run").command([cmd]).run();
        assert_eq!(out.code, 2, "{cmd}: {out:?}");
        let v = out.run_reply();
        assert!(
            matches!(&v, Reply::Error { error, message, .. }
                if error == "usage" && message.contains("cannot run")),
            "{v:?}"
        );
        let s = lock.status();
        assert_eq!(
            (s.state(), s.holder().fence),
            ("stale", fence),
            "{cmd}: the stale lock was taken over before CMD was found: {s:?}"
        );
    }
}

#[test]
fn run_without_a_command_is_a_usage_error_on_stderr() {
    let (_env, lock) = world();
    // The subject is the missing CMD: `run` with a bare `--`, and without.
    for cmd in [lock.op("run").args(["--"]), lock.op("run")] {
        let out = cmd.run();
        assert_eq!(out.code, 2, "{out:?}");
        assert_eq!(out.stdout, "", "run's JSON goes to stderr (SPEC §2.7)");
        let v = out.run_reply();
        assert!(
            matches!(&v, Reply::Error { error, message, .. }
                if error == "usage" && !message.is_empty()),
            "{v:?}"
        );
    }
    assert_eq!(lock.state(), "free");
}

#[test]
fn run_of_a_missing_command_is_a_usage_error_and_releases() {
    let (_env, lock) = world();
    let out = lock.op("run").command(["no-such-command-here"]).run();
    assert_eq!(out.code, 2, "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    let v = out.run_reply();
    assert!(
        matches!(&v, Reply::Error { error, .. } if error == "usage"),
        "{v:?}"
    );
    assert_eq!(lock.state(), "free");
}

#[test]
fn cmd_can_read_the_terminal_run_was_started_from() {
    let Ok(script) = which("script") else {
        eprintln!("SKIPPED: no script(1) to give run a terminal");
        return;
    };
    let (env, _lock) = world();
    let line = format!("{BIN} run {SKILL} --repo {REPO} -- sh -c 'read x; echo got $x'");
    let mut child = Command::new(script)
        .args(["-qec", &line, "/dev/null"])
        .current_dir(env.path("r"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    thread::sleep(Duration::from_millis(1000));
    stdin.write_all(b"hello\n").unwrap();
    let out = finish(child, Duration::from_secs(20));
    drop(stdin);
    assert!(
        out.stdout.contains("got hello"),
        "CMD could not read its terminal: {}",
        out.stdout
    );
    assert_eq!(out.code, 0, "{}", out.stdout);
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::split_paths(&std::env::var_os("PATH").ok_or(())?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

#[test]
fn sigkill_of_run_while_it_stops_leftovers_still_stops_them() {
    let (env, lock) = world();
    let (witness, pidfile) = (env.path("W"), env.path("P"));
    // The leftover ignores SIGTERM, so run's stop waits a grace (1 s for
    // ttl 8) before its SIGKILL: the wrapper is SIGKILLed in that window.
    // CMD exits only once the leftover ignores SIGTERM and has written (a
    // SIGTERM before its `trap` ended it at once, and the test with it).
    let script = r#"sh -c 'trap "" TERM; echo "$SKILL_LOCK_FENCE" >> "$1"; echo $$ > "$2"; while :; do echo "$SKILL_LOCK_FENCE" >> "$1"; sleep 0.02; done' sh "$1" "$2" & while [ ! -s "$2" ]; do sleep 0.01; done; exit 0"#;
    let mut child = spawn(lock.op("run").ttl(8).sh(
        script,
        &[witness.to_str().unwrap(), pidfile.to_str().unwrap()],
    ));
    let writer: i32 = until_file(&pidfile).trim().parse().unwrap();
    let _cleanup = KillOnDrop::new(writer);
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let said = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("run says it stops leftovers");
    assert!(said.contains("left running"), "{said}");
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();
    let killed = Instant::now();
    until(Duration::from_secs(8), "the leftover stopped", || {
        gone(writer).then_some(())
    });
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "{:?}",
        killed.elapsed()
    );
    let fence = lock
        .op("acquire")
        .wait(5)
        .ttl(60)
        .reply()
        .is("acquired")
        .must_fence();
    let log = FenceLog(&witness);
    log.write_as(fence);
    log.assert_no_older_write_after(fence);
}

/// A `run` frozen whole (wrapper and keeper) past its lease keeps its lock
/// (`held`, `expires_in: 0`: safe, SPEC §2.7), and once resumed treats the
/// lease as lost: it stops CMD and never revives the lease (no renewal
/// after the freeze, so no new fence CMD was never told).
#[test]
fn a_run_resumed_after_its_lease_ended_stops_cmd_and_never_revives_the_lease() {
    let (_env, lock) = world();
    let child = spawn(lock.op("run").ttl(2).command(["sleep", "60"]));
    let held = until_held(&lock);
    let fence = held.holder().fence;
    let keeper = i32::try_from(held.holder().owner_pgid.expect("owner_pgid")).unwrap();
    let wrapper = pid_of(&child);
    signal(wrapper, libc::SIGSTOP);
    signal(keeper, libc::SIGSTOP);
    thread::sleep(Duration::from_millis(3500));
    let s = lock.status();
    assert_eq!(s.state(), "held", "frozen whole, it keeps its lock: {s:?}");
    assert_eq!(s.expires_in(), Some(0), "{s:?}");
    signal(keeper, libc::SIGCONT);
    signal(wrapper, libc::SIGCONT);
    let out = finish(child, Duration::from_secs(20));
    let stderr = &out.stderr;
    assert!(matches!(out.code, 143 | 137), "stopped as lost: {stderr}");
    assert!(out.run_reply().lost(), "{stderr}");
    let history = lock.op("history").reply();
    let Reply::History { events, .. } = &history else {
        panic!("{history:?}")
    };
    assert!(
        events.iter().all(|e| e.fence.is_none_or(|f| f == fence)),
        "the lease was revived under a new fence: {history:?}"
    );
}

/// `acquire --wait` with standard error on a terminal says who it waits
/// for and until when (a pty from `script(1)`); with standard error not a
/// terminal it says nothing there. Standard output is one JSON object
/// either way.
#[test]
fn a_wait_at_a_terminal_says_who_it_waits_for_and_a_script_hears_nothing() {
    if !harness::have_programs(
        "a_wait_at_a_terminal_says_who_it_waits_for",
        &[("script", "--version")],
    ) {
        return;
    }
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let lock = Lock::new(&repo, SKILL, REPO);
    lock.op("acquire")
        .ttl(3)
        .note("the holder")
        .expect(0, "acquired");
    let out = Command::new("script")
        .args(["-qec"])
        .arg(format!(
            "'{BIN}' acquire {SKILL} --repo {REPO} --wait 30 --ttl 60"
        ))
        .arg("/dev/null")
        .current_dir(&repo)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Blocking waiting for the lock s on o/r held by")
            && text.contains("note \"the holder\"")
            && text.contains("giving up in"),
        "{text}"
    );
    assert!(text.contains(r#""result":"acquired""#), "{text}");
    // Not a terminal: nothing on stderr, one object on stdout.
    let out = lock.op("acquire").wait(1).run();
    assert_eq!(out.code, 3, "{}", out.stdout);
    assert_eq!(out.stderr, "", "a script's stderr never changes");
}
