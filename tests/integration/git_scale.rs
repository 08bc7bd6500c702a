//! The git store at scale and against a hostile remote (SPEC §8, issue 29):
//! whatever a remote serves is read bounded (a lock record that unpacks to
//! 200 MB costs a few MB, in skill-lock and in every git it starts), and
//! `list` reads every lock in the same number of git processes for 10 refs
//! as for 5,000, a change of a lock is one push and `history` of every lock
//! is the same few processes for 3 locks as for 40 (counted by a `git`
//! wrapper first on PATH).
//!
//! Covers: SPEC §8.

use crate::harness;

use harness::gitd::bare_repo;
use harness::{Cmd, Out, TestEnv};
use harness::{GitState, json_bytes};
use harness::{Lock, Reply};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Peak resident set size allowed to one `status`, `list` or `acquire`
/// (and to each git it starts): 150 MB, well under the 200 MB record, which
/// a process that read it whole would hold (measured: about 12 MB, the
/// measuring process's own few MB included, alone or beside the whole suite).
const PEAK_KIB: i64 = 150 * 1024;

/// `git ARGS` in `dir`, fed `input`; its stdout.
fn git_in(dir: &Path, args: &[&str], input: Option<&[u8]>) -> String {
    let mut child = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = input {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The variable that makes [`measure`] the measuring process of one command.
const MEASURE: &str = "SKILL_LOCK_TEST_MEASURE";

/// One command [`measure`] runs, and the directory it reports in
/// (`stdout`, `stderr`, and `usage`: the wait status and the peak in KiB).
#[derive(Serialize, Deserialize)]
struct Measured {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: PathBuf,
    dir: PathBuf,
}

/// Runs `cmd` (a [`Cmd`]: its environment cleared, then set) to its end and
/// measures it as `time -v` does: the largest resident set of the process
/// and of every descendant it waited for (each git it started, and theirs),
/// in KiB (`wait4`'s `ru_maxrss`). It is started by a fresh process of this
/// test binary ([`measure`]), never by the test process itself: Linux folds
/// the memory a process had before its exec into its `ru_maxrss`, and a
/// child of the test process had the test process's own peak, which under
/// load is that of every test running beside it.
fn run_measured(env: &TestEnv, cmd: Cmd) -> (Out, i64) {
    let cmd = cmd.into_command();
    let dir = tempfile::tempdir_in(&env.root).unwrap();
    let text = |s: &std::ffi::OsStr| s.to_str().unwrap().to_owned();
    let spec = Measured {
        program: cmd.get_program().into(),
        args: cmd.get_args().map(text).collect(),
        env: cmd
            .get_envs()
            .filter_map(|(k, v)| Some((text(k), text(v?))))
            .collect(),
        cwd: cmd.get_current_dir().unwrap().to_owned(),
        dir: dir.path().to_owned(),
    };
    let test = concat!(module_path!(), "::measure");
    let test = test.split_once("::").map_or(test, |(_, t)| t);
    let helper = Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--ignored", "--test-threads=1", "-q"])
        .env(MEASURE, serde_json::to_string(&spec).unwrap())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap_or_default();
    let usage = String::from_utf8(read("usage")).unwrap();
    let Some((status, peak)) = usage.split_once(' ') else {
        panic!("the measuring process failed: {helper:?}");
    };
    let out = std::process::Output {
        status: std::process::ExitStatus::from_raw(status.parse().unwrap()),
        stdout: read("stdout"),
        stderr: read("stderr"),
    };
    (Out::from(out), peak.trim().parse().unwrap())
}

/// The measuring process of [`run_measured`] (a no-op unless it set
/// [`MEASURE`]): starts the command, reaps it with `wait4`, and writes its
/// wait status and `ru_maxrss` down.
#[test]
#[ignore = "the measuring process of run_measured, which starts it"]
// The child is reaped by wait4, which the lint does not know.
#[allow(clippy::zombie_processes)]
fn measure() {
    let Ok(spec) = std::env::var(MEASURE) else {
        return;
    };
    let m: Measured = serde_json::from_str(&spec).unwrap();
    let file = |name: &str| std::fs::File::create(m.dir.join(name)).unwrap();
    let child = Command::new(&m.program)
        .args(&m.args)
        .env_clear()
        .envs(m.env)
        .current_dir(&m.cwd)
        .stdin(Stdio::null())
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .spawn()
        .unwrap();
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid out-parameter; the pid is our child's.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    // SAFETY: waits for our own child, writing into locals.
    let got = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(got, pid, "wait4: {}", std::io::Error::last_os_error());
    std::fs::write(m.dir.join("usage"), format!("{status} {}", usage.ru_maxrss)).unwrap();
}

/// A bare remote whose lock ref `s@o__r` points at a commit holding a
/// `lock.json` of `size` bytes (a held state whose note never ends), packed
/// as a server keeps it: a few hundred KB that unpack to `size`.
fn hostile_remote(env: &TestEnv, size: usize) -> PathBuf {
    let dir = bare_repo(&env.path("hostile.git"));
    let mut child = Command::new("git")
        .args(["hash-object", "-w", "--stdin"])
        .current_dir(&dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let head = br#"{"format":1,"state":"held","fence":7,"depth":1,"record":{"skill":"s","repo":"o/r","note":""#;
    stdin.write_all(head).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut left = size - head.len() - 4;
    while left > 0 {
        let n = left.min(chunk.len());
        stdin.write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    stdin.write_all(b"\"}}\n").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let blob = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let tree = git_in(
        &dir,
        &["mktree"],
        Some(format!("100644 blob {blob}\tlock.json\n").as_bytes()),
    );
    let commit = git_in(
        &dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit-tree",
            &tree,
            "-m",
            "hostile",
        ],
        None,
    );
    git_in(
        &dir,
        &["update-ref", "refs/skill-lock/s@o__r", &commit],
        None,
    );
    git_in(&dir, &["repack", "-a", "-d", "-q"], None);
    git_in(&dir, &["prune"], None);
    dir
}

#[test]
fn a_lock_record_that_unpacks_to_200_mb_is_read_bounded() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let dir = hostile_remote(&env, 200 << 20);
    let packed: u64 = std::fs::read_dir(dir.join("objects/pack"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(packed < 2 << 20, "the remote packs to {packed} bytes");
    let url = format!("git:file://{}", dir.display());
    // Each command on a machine of its own (an empty cache: it fetches),
    // and each again on a cache that holds the objects.
    for (i, verb) in ["status", "list", "acquire"].into_iter().enumerate() {
        for warm in [false, true] {
            let lock = Lock::new(&cwd, "s", "o/r")
                .with_env("SKILL_LOCK_STORE", &url)
                .with_env("SKILL_LOCK_GIT_CACHE", env.path(&format!("cache{i}")));
            let cmd = if verb == "list" {
                lock.store_op("list")
            } else {
                lock.op(verb)
            };
            let start = Instant::now();
            let (out, peak) = run_measured(&env, cmd);
            let took = start.elapsed();
            let what = format!("{verb} (warm cache: {warm}): {}", out.stdout);
            println!("{verb} (warm cache: {warm}): peak RSS {peak} KiB in {took:?}");
            assert!(
                peak < PEAK_KIB,
                "{what}: peak RSS {peak} KiB (a process read the record whole)"
            );
            assert!(took < Duration::from_secs(10), "{what}: took {took:?}");
            match out.reply() {
                Reply::Status {
                    state,
                    stale_reason,
                    ..
                } => {
                    assert_eq!(verb, "status", "{what}");
                    assert_eq!(
                        (state.as_str(), stale_reason.as_deref()),
                        ("stale", Some("corrupt")),
                        "{what}"
                    );
                }
                Reply::List { locks, .. } => {
                    assert_eq!(verb, "list", "{what}");
                    assert_eq!(locks.len(), 1, "{what}");
                    assert_eq!(locks[0].state, "stale", "{what}");
                    assert_eq!(locks[0].stale_reason.as_deref(), Some("corrupt"));
                }
                // No fence can be read under it: an operator must remove the
                // ref, and the error names it.
                Reply::Error { error, message, .. } => {
                    assert_eq!(verb, "acquire", "{what}");
                    assert_eq!(error, "io", "{what}");
                    assert!(message.contains("refs/skill-lock/s@o__r"), "{what}");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}

/// A `git` first on PATH that counts its invocations (one line each in
/// `counter`, its arguments) and runs the real one.
fn counting_git(env: &TestEnv) -> (PathBuf, String) {
    let real = crate::harness::real_git();
    let bin = env.dir("wrapper");
    let counter = env.path("git-calls");
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
        counter.display(),
        real.trim()
    );
    std::fs::write(bin.join("git"), script).unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(bin.join("git"))
        .status()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (counter, path)
}

/// A remote holding `n` held locks `s0@o__r` ... : one real acquire, then
/// `n` copies of its state (each naming its own skill) made by one
/// `git fast-import`, their refs written as a server packs them.
fn remote_with_locks(env: &TestEnv, name: &str, n: usize) -> String {
    let dir = bare_repo(&env.path(name));
    let url = format!("git:file://{}", dir.display());
    let cwd = env.dir("w");
    Lock::new(&cwd, "s0", "o/r")
        .with_env("SKILL_LOCK_STORE", &url)
        .with_env("SKILL_LOCK_GIT_CACHE", env.path("seed-cache"))
        .op("acquire")
        .ttl(3600)
        .reply()
        .is("acquired");
    let state = git_in(
        &dir,
        &["cat-file", "blob", "refs/skill-lock/s0@o__r:lock.json"],
        None,
    );
    let state: GitState = serde_json::from_str(&state).unwrap();
    let mut stream = Vec::new();
    for i in 0..n {
        let mut s = state.clone();
        s.record.skill = format!("s{i}");
        let body = json_bytes(&s);
        let msg = format!("skill-lock: acquired s{i}@o__r (fence 1)\n");
        write!(
            stream,
            "reset refs/scratch\ncommit refs/scratch\nmark :{}\ncommitter t <t@t> 1700000000 +0000\ndata {}\n{msg}M 100644 inline lock.json\ndata {}\n",
            i + 1,
            msg.len(),
            body.len()
        )
        .unwrap();
        stream.extend_from_slice(&body);
        stream.push(b'\n');
    }
    let marks = env.path(&format!("{name}.marks"));
    let arg = format!("--export-marks={}", marks.display());
    git_in(&dir, &["fast-import", "--quiet", &arg], Some(&stream));
    let mut refs: Vec<(String, String)> = std::fs::read_to_string(&marks)
        .unwrap()
        .lines()
        .map(|l| {
            let (mark, oid) = l.split_once(' ').unwrap();
            let i: usize = mark.trim_start_matches(':').parse().unwrap();
            (format!("refs/skill-lock/s{}@o__r", i - 1), oid.to_owned())
        })
        .collect();
    refs.sort();
    let mut packed = String::from("# pack-refs with: peeled fully-peeled sorted \n");
    for (r, oid) in &refs {
        packed.push_str(&format!("{oid} {r}\n"));
    }
    std::fs::write(dir.join("packed-refs"), packed).unwrap();
    for r in ["refs/scratch", "refs/skill-lock/s0@o__r"] {
        let _ = std::fs::remove_file(dir.join(r));
    }
    url
}

#[test]
fn list_reads_10_and_5000_locks_in_the_same_number_of_git_processes() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let (counter, path) = counting_git(&env);
    let mut counts = Vec::new();
    for (n, name) in [(10, "ten.git"), (5000, "many.git")] {
        let url = remote_with_locks(&env, name, n);
        // A cold cache (everything fetched), then a warm one.
        for run in 0..2 {
            let _ = std::fs::remove_file(&counter);
            let start = Instant::now();
            let out = Lock::new(&cwd, "s", "o/r")
                .with_env("PATH", &path)
                .with_env("SKILL_LOCK_STORE", &url)
                .with_env("SKILL_LOCK_GIT_CACHE", env.path(&format!("cache-{name}")))
                .store_op("list")
                .run();
            let took = start.elapsed();
            let calls = std::fs::read_to_string(&counter).unwrap_or_default();
            let Reply::List { locks, .. } = out.reply() else {
                panic!("{n} locks: {}", out.stdout);
            };
            assert_eq!(locks.len(), n, "{n} locks, run {run}");
            assert!(locks.iter().all(|l| l.state == "held"), "{n} locks");
            assert!(
                took < Duration::from_secs(10),
                "{n} locks, run {run}: took {took:?}"
            );
            println!(
                "list of {n} locks, run {run}: {} git processes in {took:?}",
                calls.lines().count()
            );
            counts.push((n, run, calls.lines().count(), calls));
        }
    }
    for run in 0..2 {
        let (few, many) = (&counts[run], &counts[2 + run]);
        assert_eq!(
            few.2, many.2,
            "git processes of list, run {run}: 10 locks:\n{}\n5000 locks:\n{}",
            few.3, many.3
        );
    }
}

/// The git subcommands in `calls` (the wrapper's log), in order: each
/// line's first word that is not a global option or its value.
fn subcommands(calls: &str) -> Vec<String> {
    calls
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            while let Some(w) = words.next() {
                match w {
                    "-c" | "-C" | "--git-dir" => {
                        words.next();
                    }
                    w if w.starts_with('-') => {}
                    w => return Some(w.to_owned()),
                }
            }
            None
        })
        .collect()
}

/// Issue 38: a lock costs what a push costs. Each change this host can
/// decide without a read (a lock never taken, one it wrote last, one it
/// only listed) is one `git push`, `status` one `ls-remote`, and `history`
/// of every lock of a store the same processes for 3 locks as for 40.
#[test]
fn a_change_is_one_push_a_status_one_read_and_history_is_bounded() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let (counter, path) = counting_git(&env);
    let url = remote_with_locks(&env, "few.git", 3);
    let on = |host: &str, skill: &str| {
        Lock::new(&cwd, skill, "o/r")
            .with_env("PATH", &path)
            .with_env("SKILL_LOCK_STORE", &url)
            .with_env("SKILL_LOCK_GIT_CACHE", env.path(host))
    };
    let calls = |what: &str, f: &dyn Fn() -> Reply| {
        let _ = std::fs::remove_file(&counter);
        let reply = f();
        let log = std::fs::read_to_string(&counter).unwrap_or_default();
        println!("{what}: {:?}", subcommands(&log));
        (reply, subcommands(&log))
    };
    let push = vec!["push".to_owned()];
    // Host 1's cache is made (git init, config) by a first command.
    assert_eq!(on("cache-1", "other").state(), "free");
    let one = on("cache-1", "fresh");
    // Host 1 has read nothing of this lock yet: taking it is one push.
    let (first, git) = calls("acquire of a lock never taken", &|| one.acquire());
    let token = first.is("acquired").token().to_owned();
    assert_eq!(git, push, "acquire of a lock never taken");
    let (status, git) = calls("status", &|| one.status());
    assert_eq!(status.state(), "held");
    assert_eq!(git, vec!["ls-remote".to_owned()], "status");
    let (renewed, git) = calls("renew", &|| one.renew(&token));
    renewed.is("renewed");
    assert_eq!(git, push, "renew of the lock this host wrote last");
    let (released, git) = calls("release", &|| one.release(&token));
    released.is("released");
    assert_eq!(git, push, "release of the lock this host wrote last");
    // Host 2 lists the store, then takes the free lock on what list saw.
    let two = on("cache-2", "fresh");
    two.list().is("list");
    let (taken, git) = calls("acquire of a lock only listed", &|| two.acquire());
    assert_eq!(taken.is("acquired").fence(), Some(2));
    assert_eq!(git, push, "acquire of a lock this host only listed");
    // History of every lock: as many processes for 3 locks as for 40,
    // each taken for real (its event is in its commit).
    let mut counts = Vec::new();
    for n in [3, 40] {
        let dir = bare_repo(&env.path(&format!("history-{n}.git")));
        let store = format!("git:file://{}", dir.display());
        for i in 0..n {
            Lock::new(&cwd, &format!("s{i}"), "o/r")
                .with_env("SKILL_LOCK_STORE", &store)
                .with_env("SKILL_LOCK_GIT_CACHE", env.path("cache-taker"))
                .acquire()
                .is("acquired");
        }
        let host = format!("cache-h{n}");
        let lock = Lock::new(&cwd, "s", "o/r")
            .with_env("PATH", &path)
            .with_env("SKILL_LOCK_STORE", &store)
            .with_env("SKILL_LOCK_GIT_CACHE", env.path(&host));
        let (h, git) = calls("history of every lock", &|| lock.store_history());
        let Reply::History { events, .. } = h else {
            panic!("not a history: {h:?}");
        };
        assert_eq!(events.len(), n, "{n} locks: {events:?}");
        counts.push(git);
    }
    assert_eq!(counts[0], counts[1], "history of 3 and of 40 locks");
}
