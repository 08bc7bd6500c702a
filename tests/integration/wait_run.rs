//! `acquire --wait` (SPEC §2.1) and `run` (SPEC §2.7) with real processes,
//! each test in its own temporary git repository.
//!
//! Timing bounds are deliberately generous: a bound only catches "never
//! waited" or "waited far too long", never a few hundred milliseconds.
//!
//! Covers: SPEC §2.1, §2.7.

use crate::common;

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{BIN, Out, TestEnv, Value, gone};

const SKILL: &str = "s";
const REPO: &str = "o/r";

/// The binary with `args` in `cwd`, ready to spawn. The forwarded signals
/// get their default disposition first, so that a harness started with
/// SIGINT ignored (a background job of a non-interactive shell) does not make
/// CMD ignore it too.
fn command(env: &TestEnv, cwd: &Path, args: &[&str]) -> Command {
    let mut cmd = env.cmd(cwd).args(args).command();
    // SAFETY: only async-signal-safe calls (signal) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

/// Starts the binary with stdin closed and stdout/stderr captured.
fn spawn(env: &TestEnv, cwd: &Path, args: &[&str]) -> Child {
    command(env, cwd, args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts")
}

/// Waits for `child` and its output, at most `limit`; kills it and fails
/// the test when it takes longer.
#[track_caller]
fn finish(child: Child, limit: Duration) -> Output {
    let pid = pid_of(&child);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for the binary"),
        Err(_) => {
            signal(pid, libc::SIGKILL);
            panic!("pid {pid} still running after {limit:?}");
        }
    }
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

/// The last line of `run`'s standard error, which must be its JSON object.
#[track_caller]
fn last_json(stderr: &str) -> Value {
    let last = stderr.lines().last().unwrap_or("");
    serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last stderr line is not JSON ({e}): {stderr:?}"))
}

/// A one-shot invocation of the binary in `cwd`.
fn lock(env: &TestEnv, cwd: &Path, args: &[&str]) -> Out {
    env.cmd(cwd).args(args).run()
}

fn acquire(env: &TestEnv, cwd: &Path, extra: &[&str]) -> Out {
    let mut args = vec!["acquire", SKILL, "--repo", REPO];
    args.extend_from_slice(extra);
    lock(env, cwd, &args)
}

/// The `status` object of the lock.
#[track_caller]
fn status(env: &TestEnv, cwd: &Path) -> Value {
    lock(env, cwd, &["status", SKILL, "--repo", REPO])
        .expect(0, "status")
        .clone()
}

/// Polls `f` every 20 ms until it gives a value; fails after `limit`.
#[track_caller]
fn until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "not {what} after {limit:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the lock is held (by whoever).
#[track_caller]
fn until_held(env: &TestEnv, cwd: &Path) -> Value {
    until(Duration::from_secs(10), "held", || {
        let s = status(env, cwd);
        (s["state"] == "held").then_some(s)
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
fn assert_held_by_run(holder: &Value, child: &Child) {
    assert_eq!(holder["owner_pid"], Value::Null, "{holder}");
    let keeper = holder["owner_pgid"].as_u64().expect("owner_pgid");
    let stat = std::fs::read_to_string(format!("/proc/{keeper}/stat")).unwrap();
    let ppid = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1);
    assert_eq!(
        ppid,
        Some(child.id().to_string().as_str()),
        "the group is not the keeper's: {holder}"
    );
}

#[track_caller]
fn assert_free(env: &TestEnv, cwd: &Path) {
    let s = status(env, cwd);
    assert_eq!(s["state"], "free", "{s}");
}

// ---------------------------------------------------------------- --wait

#[test]
fn waiter_acquires_when_a_short_lease_ends() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let first = acquire(&env, &repo, &["--ttl", "2"]);
    let fence = first.expect(0, "acquired")["fence"].as_u64().unwrap();
    let start = Instant::now();
    let waited = acquire(&env, &repo, &["--wait", "10"]);
    let elapsed = start.elapsed();
    let v = waited.expect(0, "acquired");
    assert_eq!(v["took_over"]["reason"], "expired", "{v}");
    assert_eq!(v["took_over"]["holder"]["fence"], fence, "{v}");
    assert!(v["fence"].as_u64().unwrap() > fence, "{v}");
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(8),
        "a 2 s lease was taken over after {elapsed:?}"
    );
}

#[test]
fn waiter_gives_up_on_time() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    acquire(&env, &repo, &["--ttl", "600"]).expect(0, "acquired");
    let start = Instant::now();
    let waited = acquire(&env, &repo, &["--wait", "1"]);
    let elapsed = start.elapsed();
    let v = waited.expect(3, "already_running");
    assert!(v["holder"].is_object(), "{v}");
    assert!(v.get("token").is_none(), "{v}");
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(5),
        "--wait 1 gave up after {elapsed:?}"
    );
    // The holder is untouched.
    assert_eq!(status(&env, &repo)["state"], "held");
}

#[test]
fn waiter_acquires_promptly_after_a_release() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    acquire(&env, &repo, &[]).expect(0, "acquired");
    let mut waiter = spawn(
        &env,
        &repo,
        &["acquire", SKILL, "--repo", REPO, "--wait", "20"],
    );
    thread::sleep(Duration::from_millis(500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the waiter ended while the lock was held"
    );
    lock(&env, &repo, &["release", SKILL, "--repo", REPO]).expect(0, "released");
    let released = Instant::now();
    let out = Out::from(finish(waiter, Duration::from_secs(15)));
    let v = out.expect(0, "acquired");
    assert!(v["took_over"].is_null(), "{v}");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "the waiter took {:?} after the release",
        released.elapsed()
    );
    assert_eq!(status(&env, &repo)["state"], "held");
}

// ------------------------------------------------------------------ run

#[test]
fn ten_waiting_runs_take_turns_without_overlap() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let witness = env.path("witness");
    let w = witness.to_str().unwrap();
    let script = r#"echo enter $$ >> "$1"; sleep 0.2; echo exit $$ >> "$1""#;
    let runs: Vec<Child> = (0..10)
        .map(|_| {
            spawn(
                &env,
                &repo,
                &[
                    "run", SKILL, "--repo", REPO, "--wait", "60", "--", "sh", "-c", script, "sh", w,
                ],
            )
        })
        .collect();
    let outs: Vec<Output> = runs
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(60)))
        .collect();

    let mut fences = Vec::new();
    for out in &outs {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let v = last_json(&stderr);
        assert_eq!(v["result"], "ran", "{v}");
        assert_eq!(v["exit_status"], 0, "{v}");
        assert_eq!(v["released"], true, "{v}");
        assert_eq!(v["lost"], false, "{v}");
        fences.push(v["fence"].as_u64().expect("fence"));
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
    assert_free(&env, &repo);
}

#[test]
fn run_passes_stdio_through_and_exits_with_the_status_of_cmd() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");

    // stdin -> cat -> stdout, byte for byte, no trailing newline.
    let input: &[u8] = b"\x00\xff\xfebinary\n\x80\xc3(line two, no newline";
    let mut child = command(&env, &repo, &["run", SKILL, "--repo", REPO, "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = thread::spawn(move || {
        stdin.write_all(input).unwrap();
    });
    let out = finish(child, Duration::from_secs(20));
    feeder.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(out.stdout, input, "stdout differs from stdin");
    let v = last_json(&stderr);
    assert_eq!(
        (v["result"].as_str(), v["exit_status"].as_u64()),
        (Some("ran"), Some(0)),
        "{v}"
    );
    assert_free(&env, &repo);

    // Exit status passthrough; CMD's own stderr comes before the JSON line.
    let out = finish(
        spawn(
            &env,
            &repo,
            &[
                "run",
                SKILL,
                "--repo",
                REPO,
                "--",
                "sh",
                "-c",
                "echo cmd-out; echo cmd-err-1 >&2; echo cmd-err-2 >&2; exit 7",
            ],
        ),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert_eq!(out.stdout, b"cmd-out\n", "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    let pos = |needle: &str| lines.iter().position(|l| *l == needle);
    let (e1, e2) = (pos("cmd-err-1"), pos("cmd-err-2"));
    assert!(
        e1.is_some() && e1 < e2 && e2 < Some(lines.len() - 1),
        "CMD's stderr must come before the JSON line: {stderr:?}"
    );
    let v = last_json(&stderr);
    assert_eq!(v["result"], "ran", "{v}");
    assert_eq!(v["exit_status"], 7, "{v}");
    assert!(v["signal"].is_null(), "{v}");
    assert_eq!(v["released"], true, "{v}");
    assert_eq!(v["skill"], SKILL, "{v}");
    assert_eq!(v["repo"], REPO, "{v}");
    assert!(
        v.get("token").is_none(),
        "run must not print the token: {v}"
    );
    assert_free(&env, &repo);
}

#[test]
fn run_gives_cmd_its_token_and_fence() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let script = r#"echo "$SKILL_LOCK_FENCE"; "$1" check s --repo o/r --token "$SKILL_LOCK_TOKEN" >/dev/null; echo "check=$?""#;
    let out = finish(
        spawn(
            &env,
            &repo,
            &[
                "run", SKILL, "--repo", REPO, "--", "sh", "-c", script, "sh", BIN,
            ],
        ),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v = last_json(&stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout, format!("{}\ncheck=0\n", v["fence"]), "{stderr}");
}

#[test]
fn run_refuses_when_held_and_does_not_run_cmd() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    acquire(&env, &repo, &[]).expect(0, "acquired");
    let marker = env.path("MARKER");
    let out = lock(
        &env,
        &repo,
        &[
            "run",
            SKILL,
            "--repo",
            REPO,
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert_eq!(out.stdout, "", "nothing on stdout when refused");
    let v = last_json(&out.stderr);
    assert_eq!(v["result"], "already_running", "{v}");
    assert!(v["holder"].is_object(), "{v}");
    assert!(!marker.exists(), "CMD ran although the lock was held");
    assert_eq!(status(&env, &repo)["state"], "held");
}

#[test]
fn run_forwards_sigterm_to_cmd_and_releases() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let got = env.path("F");
    let ready = env.path("R");
    let script = r#"trap 'echo got-term > "$1"; exit 5' TERM; echo ready > "$2"; while :; do sleep 0.05; done"#;
    let child = spawn(
        &env,
        &repo,
        &[
            "run",
            SKILL,
            "--repo",
            REPO,
            "--",
            "sh",
            "-c",
            script,
            "sh",
            got.to_str().unwrap(),
            ready.to_str().unwrap(),
        ],
    );
    let held = until_held(&env, &repo);
    assert_held_by_run(&held["holder"], &child);
    until_file(&ready);
    signal(pid_of(&child), libc::SIGTERM);
    let out = finish(child, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&got).unwrap_or_default(),
        "got-term\n"
    );
    let v = last_json(&stderr);
    assert_eq!(v["result"], "ran", "{v}");
    assert_eq!(v["exit_status"], 5, "{v}");
    assert_eq!(v["released"], true, "{v}");
    assert_free(&env, &repo);
}

#[test]
fn run_forwards_sigint_and_sighup_and_reports_128_plus_signal() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGHUP, 129)] {
        let ready = env.path(&format!("P{sig}"));
        let child = spawn(
            &env,
            &repo,
            &[
                "run",
                SKILL,
                "--repo",
                REPO,
                "--",
                "sh",
                "-c",
                r#"echo $$ > "$1"; exec sleep 30"#,
                "sh",
                ready.to_str().unwrap(),
            ],
        );
        until_file(&ready);
        until_held(&env, &repo);
        // Let `run` learn CMD's pid (it does right after the exec).
        thread::sleep(Duration::from_millis(100));
        signal(pid_of(&child), sig);
        let out = finish(child, Duration::from_secs(20));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "signal {sig}: {stderr}");
        let v = last_json(&stderr);
        assert_eq!(v["result"], "ran", "{v}");
        assert_eq!(v["exit_status"], code, "{v}");
        assert_eq!(v["signal"], sig, "{v}");
        assert_eq!(v["released"], true, "{v}");
        assert_free(&env, &repo);
    }
}

#[test]
fn renewal_keeps_the_lock_past_its_ttl() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let started = Instant::now();
    let child = spawn(
        &env,
        &repo,
        &[
            "run", SKILL, "--repo", REPO, "--ttl", "2", "--", "sleep", "5",
        ],
    );
    until_held(&env, &repo);
    thread::sleep(Duration::from_millis(3500).saturating_sub(started.elapsed()));
    let other = acquire(&env, &repo, &[]);
    let v = other.expect(3, "already_running");
    assert_held_by_run(&v["holder"], &child);
    let out = finish(child, Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v = last_json(&stderr);
    assert_eq!(v["exit_status"], 0, "{v}");
    assert!(v["renewals"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["lost"], false, "{v}");
    assert_eq!(v["released"], true, "{v}");
    assert_free(&env, &repo);
}

#[test]
fn a_forced_release_stops_cmd() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let child = spawn(
        &env,
        &repo,
        &[
            "run", SKILL, "--repo", REPO, "--ttl", "3", "--", "sleep", "30",
        ],
    );
    until_held(&env, &repo);
    let forced = lock(&env, &repo, &["release", SKILL, "--repo", REPO, "--force"]);
    assert_eq!(forced.expect(0, "released")["forced"], true);
    let start = Instant::now();
    let out = finish(child, Duration::from_secs(15));
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(
        elapsed < Duration::from_secs(8),
        "CMD stopped {elapsed:?} after the lease was lost"
    );
    let v = last_json(&stderr);
    assert_eq!(v["result"], "ran", "{v}");
    assert_eq!(v["lost"], true, "{v}");
    assert_eq!(v["exit_status"], 143, "{v}");
    assert_eq!(v["signal"], libc::SIGTERM, "{v}");
    let said = stderr.to_lowercase();
    assert!(
        said.contains("lost") || said.contains("released"),
        "stderr does not say the lease was lost: {stderr}"
    );
    assert_free(&env, &repo);
}

#[test]
fn a_lease_lost_to_a_newcomer_stops_cmd_and_leaves_the_newcomer_alone() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let child = spawn(
        &env,
        &repo,
        &[
            "run", SKILL, "--repo", REPO, "--ttl", "3", "--", "sleep", "30",
        ],
    );
    until_held(&env, &repo);
    lock(&env, &repo, &["release", SKILL, "--repo", REPO, "--force"]).expect(0, "released");
    let newcomer = acquire(&env, &repo, &["--ttl", "600"]);
    let fence = newcomer.expect(0, "acquired")["fence"].as_u64().unwrap();
    let out = finish(child, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    let v = last_json(&stderr);
    assert_eq!(v["lost"], true, "{v}");
    assert_eq!(v["released"], false, "{v}");
    let s = status(&env, &repo);
    assert_eq!(
        (s["state"].as_str(), s["holder"]["fence"].as_u64()),
        (Some("held"), Some(fence)),
        "run released the newcomer's lock: {s}"
    );
}

#[test]
fn sigkill_of_run_stops_its_group_and_the_keeper_releases_only_then() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let pidfile = env.path("P");
    let mut child = command(
        &env,
        &repo,
        &run_sh(
            "8",
            r#"echo $$ > "$1"; exec sleep 30"#,
            &[pidfile.to_str().unwrap()],
        ),
    )
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let cmd_pid: i32 = until_file(&pidfile).trim().parse().unwrap();
    let _cleanup = KillOnDrop::new(cmd_pid);
    until_held(&env, &repo);
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();

    // The keeper stops the group within the grace (1 s for ttl 8) and then
    // releases the lock itself (SPEC §2.7), once nothing of it is left.
    let s = until(Duration::from_secs(10), "released", || {
        let s = status(&env, &repo);
        (s["state"] != "held").then_some(s)
    });
    assert!(gone(cmd_pid), "the lock was freed while CMD lived: {s}");
    assert_eq!(s["state"], "free", "{s}");
    let taken = acquire(&env, &repo, &[]);
    let v = taken.expect(0, "acquired");
    assert_eq!(v["took_over"], Value::Null, "{v}");
}

/// SIGKILLs `pid` (a process a failing test would leave behind) when
/// dropped, if it is still that process: pids are reused (this VM's
/// `pid_max` is 32768), and a stale kill could hit another test's process.
struct KillOnDrop(i32, Option<u64>);

impl KillOnDrop {
    fn new(pid: i32) -> Self {
        Self(pid, start_time(pid))
    }
}

/// Field 22 of `/proc/<pid>/stat` (Linux): when the process started.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let same = match self.1 {
            Some(t) => start_time(self.0) == Some(t),
            None => thread::panicking(),
        };
        if self.0 > 1 && same && !gone(self.0) {
            // SAFETY: kill(2) on a process this test made, checked above.
            unsafe { libc::kill(self.0, libc::SIGKILL) };
        }
    }
}

/// `run --ttl TTL` of a [`writer_cmd`] CMD, with its witness and pid files.
struct WriterRun {
    ttl: &'static str,
    tail: &'static str,
    witness: PathBuf,
    pidfile: PathBuf,
}

impl WriterRun {
    fn new(env: &TestEnv, ttl: &'static str, tail: &'static str) -> Self {
        Self {
            ttl,
            tail,
            witness: env.path("W"),
            pidfile: env.path("P"),
        }
    }

    /// The words after `skill-lock`.
    fn args(&self) -> Vec<&str> {
        let mut args = vec!["run", SKILL, "--repo", REPO, "--ttl", self.ttl];
        args.extend(writer_cmd(
            self.tail,
            self.witness.to_str().unwrap(),
            self.pidfile.to_str().unwrap(),
        ));
        args
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
fn writer_cmd<'a>(tail: &'a str, witness: &'a str, pidfile: &'a str) -> Vec<&'a str> {
    let script: &'static str = match tail {
        "wait" => {
            r#"(while :; do echo "$SKILL_LOCK_FENCE" >> "$1"; sleep 0.02; done) & echo $! > "$2"; wait"#
        }
        _ => {
            r#"(while :; do echo "$SKILL_LOCK_FENCE" >> "$1"; sleep 0.02; done) & echo $! > "$2"; exit 0"#
        }
    };
    vec!["--", "sh", "-c", script, "sh", witness, pidfile]
}

/// Fails when a line of an older fence follows the first line of `fence`.
#[track_caller]
fn assert_no_older_write_after(witness: &Path, fence: u64) {
    let text = std::fs::read_to_string(witness).unwrap();
    let fences: Vec<u64> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
    let first = fences
        .iter()
        .position(|f| *f == fence)
        .expect("the new holder wrote");
    let late: Vec<u64> = fences[first..]
        .iter()
        .copied()
        .filter(|f| *f < fence)
        .collect();
    assert!(
        late.is_empty(),
        "{} writes of fences {late:?} after fence {fence} took the lock: two writers overlapped",
        late.len()
    );
}

/// The new holder (fence `fence`) writes twice, 300 ms apart, as the old one would.
fn write_as(witness: &Path, fence: u64) {
    for _ in 0..2 {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(witness)
            .unwrap();
        writeln!(f, "{fence}").unwrap();
        thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn sigkill_of_run_leaves_no_background_writer_beside_the_next_holder() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let w = WriterRun::new(&env, "8", "wait");
    let args = w.args();
    let witness = w.witness.clone();
    let mut child = command(&env, &repo, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (writer, _cleanup) = w.writer();
    until_file(&witness);
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();

    let next = acquire(&env, &repo, &["--wait", "20", "--ttl", "60"]);
    let fence = next.expect(0, "acquired")["fence"].as_u64().unwrap();
    write_as(&witness, fence);
    assert!(gone(writer), "CMD's background writer outlived the lock");
    assert_no_older_write_after(&witness, fence);
}

#[test]
fn a_live_keeper_holds_the_lock_past_its_expiry_until_its_tree_ends() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let w = WriterRun::new(&env, "1", "wait");
    let args = w.args();
    let witness = w.witness.clone();
    let mut child = command(&env, &repo, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (writer, _cleanup) = w.writer();
    let held = until_held(&env, &repo);
    let keeper = i32::try_from(held["holder"]["owner_pgid"].as_u64().expect("owner_pgid")).unwrap();
    // Nothing of skill-lock can act: the wrapper and the keeper are both
    // stopped; the background writer goes on past the 1 s lease.
    signal(pid_of(&child), libc::SIGSTOP);
    signal(keeper, libc::SIGSTOP);
    thread::sleep(Duration::from_millis(1500));
    assert!(!gone(writer));

    let s = status(&env, &repo);
    assert_eq!(
        s["state"], "held",
        "a lock whose keeper lives is not stale, past its lease too: {s}"
    );
    let v = acquire(&env, &repo, &[]);
    v.expect(3, "already_running");

    // The wrapper dies; the keeper, resumed, finds its stop moment passed
    // and its wrapper gone: it stops the tree, then releases the lock.
    signal(pid_of(&child), libc::SIGKILL);
    child.wait().unwrap();
    signal(keeper, libc::SIGCONT);
    let s = until(Duration::from_secs(5), "released", || {
        let s = status(&env, &repo);
        (s["state"] != "held").then_some(s)
    });
    assert!(
        gone(writer),
        "the lock was freed while the writer lived: {s}"
    );
    let v = acquire(&env, &repo, &["--ttl", "60"]);
    let fence = v.expect(0, "acquired")["fence"].as_u64().unwrap();
    write_as(&witness, fence);
    assert_no_older_write_after(&witness, fence);
}

#[test]
fn cmd_leaving_a_background_job_has_it_stopped_before_the_release() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let w = WriterRun::new(&env, "8", "exit");
    let args = w.args();
    let witness = w.witness.clone();
    let out = finish(spawn(&env, &repo, &args), Duration::from_secs(20));
    let (writer, _cleanup) = w.writer();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "CMD's own status: {stderr}");
    let v = last_json(&stderr);
    assert_eq!(
        (v["released"].as_bool(), v["lost"].as_bool()),
        (Some(true), Some(false)),
        "{v}"
    );
    assert!(gone(writer), "the background job outlived run: {stderr}");

    let v = acquire(&env, &repo, &["--ttl", "60"]);
    let fence = v.expect(0, "acquired")["fence"].as_u64().unwrap();
    if std::fs::metadata(&witness).is_ok() {
        write_as(&witness, fence);
        assert_no_older_write_after(&witness, fence);
    }
}

#[test]
fn a_forced_release_stops_the_whole_group() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let w = WriterRun::new(&env, "3", "wait");
    let args = w.args();
    let witness = w.witness.clone();
    let child = spawn(&env, &repo, &args);
    let (writer, _cleanup) = w.writer();
    until_file(&witness);
    lock(&env, &repo, &["release", SKILL, "--repo", REPO, "--force"]).expect(0, "released");
    let out = finish(child, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert_eq!(last_json(&stderr)["lost"], true, "{stderr}");
    assert!(
        gone(writer),
        "the background writer outlived the lost lease"
    );
}

/// Boot-clock seconds (`/proc/uptime`, 10 ms steps) of each witness line.
#[cfg(target_os = "linux")]
/// The words of a `run --ttl TTL` whose CMD's background child appends
/// `/proc/uptime` to `witness` every 20 ms while CMD waits for it.
#[cfg(target_os = "linux")]
fn uptime_writer_run<'a>(ttl: &'a str, witness: &'a Path) -> Vec<&'a str> {
    let script = r#"(while :; do cut -d' ' -f1 /proc/uptime >> "$1"; sleep 0.02; done) & wait"#;
    run_sh(ttl, script, &[witness.to_str().unwrap()])
}

/// The words of `run --ttl TTL -- sh -c SCRIPT sh ARGS...` (ARGS are $1...).
fn run_sh<'a>(ttl: &'a str, script: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut words = vec![
        "run", SKILL, "--repo", REPO, "--ttl", ttl, "--", "sh", "-c", script, "sh",
    ];
    words.extend_from_slice(args);
    words
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

#[cfg(target_os = "linux")]
fn uptimes(witness: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(witness).unwrap();
    text.lines().map(|l| l.trim().parse().unwrap()).collect()
}

#[cfg(target_os = "linux")]
#[test]
fn failing_renewals_stop_the_group_before_the_confirmed_lease_ends() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let store = env.path("store");
    std::fs::create_dir(&store).unwrap();
    let url = format!("file:{}", store.display());
    let witness = env.path("W");
    let mut args = vec!["--store", &url];
    args.extend(uptime_writer_run("2", &witness));
    let child = spawn(&env, &repo, &args);
    until_file(&witness);
    thread::sleep(Duration::from_millis(1000));
    // The store becomes unreachable for good (root ignores modes, so the
    // directory is replaced by a file): every renewal fails from now on.
    let moved = env.path("store.gone");
    std::fs::rename(&store, &moved).unwrap();
    std::fs::write(&store, "not a directory").unwrap();
    let out = finish(child, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(143 | 137)), "{stderr}");
    let v = last_json(&stderr);
    assert_eq!(v["lost"], true, "{v}");
    assert!(v["renewals"].as_u64().unwrap() >= 1, "{v}");
    assert!(stderr.contains("renewal failed"), "{stderr}");

    let moved_url = format!("file:{}", moved.display());
    let s = lock(
        &env,
        &repo,
        &["--store", &moved_url, "status", SKILL, "--repo", REPO],
    );
    let deadline_ms = s.expect(0, "status")["holder"]["deadline_boot_ms"]
        .as_u64()
        .unwrap();
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
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let witness = env.path("W");
    let child = spawn(&env, &repo, &uptime_writer_run("2", &witness));
    let wrapper = pid_of(&child);
    until_file(&witness);
    thread::sleep(Duration::from_millis(300));
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(wrapper, libc::SIGSTOP) };
    let held = lock(&env, &repo, &["status", SKILL, "--repo", REPO]);
    let deadline_ms = held.expect(0, "status")["holder"]["deadline_boot_ms"]
        .as_u64()
        .unwrap();
    // Past the lease (2 s) and then some: had the group outlived it, the
    // witness would still grow.
    thread::sleep(Duration::from_millis(3000));
    let times = uptimes(&witness);
    thread::sleep(Duration::from_millis(300));
    let later = uptimes(&witness).len();
    // SAFETY: as above.
    unsafe { libc::kill(wrapper, libc::SIGCONT) };
    let out = finish(child, Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(later, times.len(), "the group still writes: {stderr}");
    assert_last_write_before(&times, deadline_ms);
    assert!(matches!(out.status.code(), Some(143 | 137)), "{stderr}");
    assert_eq!(last_json(&stderr)["lost"], true, "{stderr}");
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
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let fence = acquire(&env, &repo, &["--ttl", "120"]).expect(0, "acquired")["fence"].clone();
    let ran = env.path("ran");
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let child = spawn(
            &env,
            &repo,
            &[
                "run",
                SKILL,
                "--repo",
                REPO,
                "--wait",
                "60",
                "--",
                "sh",
                "-c",
                r#"echo ran > "$1""#,
                "sh",
                ran.to_str().unwrap(),
            ],
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
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(128 + sig), "{stderr}");
        let v = last_json(&stderr);
        assert_eq!(
            (v["result"].as_str(), v["signal"].as_i64()),
            (Some("interrupted"), Some(i64::from(sig))),
            "{v}"
        );
        assert!(!ran.exists(), "CMD ran after a signal ended the wait");
        let s = status(&env, &repo);
        assert_eq!(
            (&s["state"], &s["holder"]["fence"]),
            (&"held".into(), &fence),
            "{s}"
        );
    }
}

#[test]
fn a_command_that_cannot_start_is_refused_before_the_lock_is_touched() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let fence = acquire(&env, &repo, &["--ttl", "1"]).expect(0, "acquired")["fence"].clone();
    until(Duration::from_secs(5), "stale", || {
        (status(&env, &repo)["state"] == "stale").then_some(())
    });
    let plain = env.path("plain");
    std::fs::write(&plain, "#!/bin/sh\necho ran\n").unwrap();
    let dir = env.path("");
    for cmd in [
        "no-such-command-here",
        plain.to_str().unwrap(),
        dir.to_str().unwrap(),
    ] {
        let out = lock(&env, &repo, &["run", SKILL, "--repo", REPO, "--", cmd]);
        assert_eq!(out.code, 2, "{cmd}: {out:?}");
        let v = last_json(&out.stderr);
        assert_eq!(v["error"], "usage", "{v}");
        assert!(v["message"].as_str().unwrap().contains("cannot run"), "{v}");
        let s = status(&env, &repo);
        assert_eq!(
            (&s["state"], &s["holder"]["fence"]),
            (&"stale".into(), &fence),
            "{cmd}: the stale lock was taken over before CMD was found: {s}"
        );
    }
}

#[test]
fn run_without_a_command_is_a_usage_error_on_stderr() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    for args in [
        &["run", SKILL, "--repo", REPO, "--"][..],
        &["run", SKILL, "--repo", REPO][..],
    ] {
        let out = lock(&env, &repo, args);
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
        assert_eq!(
            out.stdout, "",
            "{args:?}: run's JSON goes to stderr (SPEC §2.7)"
        );
        let v = last_json(&out.stderr);
        assert_eq!(
            (v["result"].as_str(), v["error"].as_str()),
            (Some("error"), Some("usage")),
            "{v}"
        );
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    assert_free(&env, &repo);
}

#[test]
fn run_of_a_missing_command_is_a_usage_error_and_releases() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let out = lock(
        &env,
        &repo,
        &["run", SKILL, "--repo", REPO, "--", "no-such-command-here"],
    );
    assert_eq!(out.code, 2, "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    let v = last_json(&out.stderr);
    assert_eq!(v["error"], "usage", "{v}");
    assert_free(&env, &repo);
}

#[test]
fn cmd_can_read_the_terminal_run_was_started_from() {
    let Ok(script) = which("script") else {
        eprintln!("SKIPPED: no script(1) to give run a terminal");
        return;
    };
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let line = format!("{BIN} run {SKILL} --repo {REPO} -- sh -c 'read x; echo got $x'");
    let mut child = Command::new(script)
        .args(["-qec", &line, "/dev/null"])
        .current_dir(&repo)
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
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("got hello"),
        "CMD could not read its terminal: {text}"
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
}

fn which(name: &str) -> Result<std::path::PathBuf, ()> {
    std::env::split_paths(&std::env::var_os("PATH").ok_or(())?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or(())
}

#[test]
fn sigkill_of_run_while_it_stops_leftovers_still_stops_them() {
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let (witness, pidfile) = (env.path("W"), env.path("P"));
    // The leftover ignores SIGTERM, so run's stop waits a grace (1 s for
    // ttl 8) before its SIGKILL: the wrapper is SIGKILLed in that window.
    // CMD exits only once the leftover ignores SIGTERM and has written (a
    // SIGTERM before its `trap` ended it at once, and the test with it).
    let script = r#"sh -c 'trap "" TERM; echo "$SKILL_LOCK_FENCE" >> "$1"; echo $$ > "$2"; while :; do echo "$SKILL_LOCK_FENCE" >> "$1"; sleep 0.02; done' sh "$1" "$2" & while [ ! -s "$2" ]; do sleep 0.01; done; exit 0"#;
    let mut child = spawn(
        &env,
        &repo,
        &run_sh(
            "8",
            script,
            &[witness.to_str().unwrap(), pidfile.to_str().unwrap()],
        ),
    );
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
    let v = acquire(&env, &repo, &["--wait", "5", "--ttl", "60"]);
    let fence = v.expect(0, "acquired")["fence"].as_u64().unwrap();
    write_as(&witness, fence);
    assert_no_older_write_after(&witness, fence);
}
