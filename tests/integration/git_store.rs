//! The git store (SPEC §8 `git:`) against real remotes started here: a
//! `file://` bare repository and a `git daemon` on loopback (ports
//! 24400-24449). Races, the witnessed loop, clones contending through
//! `git:origin`, refs hidden from plain clones, the clock-skew allowance,
//! unknown push outcomes, and remotes that hang or refuse.
//!
//! Covers: SPEC §8.

use crate::common;

use common::gitd::{Daemon, bare_repo};
use common::{Cmd, TestEnv, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One remote for a test: a URL and the cache the binary uses.
pub(crate) struct Remote {
    url: String,
    cache: PathBuf,
    _daemon: Option<Daemon>,
}

impl Remote {
    pub(crate) fn file(env: &TestEnv) -> Self {
        let repo = bare_repo(&env.path("remote.git"));
        Self {
            url: format!("git:file://{}", repo.display()),
            cache: env.path("cache"),
            _daemon: None,
        }
    }

    fn daemon(env: &TestEnv) -> Self {
        let served = env.dir("served");
        bare_repo(&served.join("locks.git"));
        let d = Daemon::start(&served, 24400);
        Self {
            url: format!("git:{}", d.url("locks.git")),
            cache: env.path("cache"),
            _daemon: Some(d),
        }
    }

    pub(crate) fn cmd(&self, cwd: &Path) -> Cmd {
        Cmd::new(cwd)
            .env("SKILL_LOCK_STORE", &self.url)
            .env("SKILL_LOCK_GIT_CACHE", &self.cache)
    }

    /// As on another machine: a cache of its own.
    fn cmd_on(&self, cwd: &Path, machine: usize) -> Cmd {
        self.cmd(cwd).env(
            "SKILL_LOCK_GIT_CACHE",
            self.cache.with_extension(machine.to_string()),
        )
    }
}

fn git_out(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {:?}", out);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn race(remote: &Remote, cwd: &Path, n: usize) -> Vec<common::Out> {
    // Four "machines", four processes each: fetches and cache creation race too.
    let kids: Vec<_> = (0..n)
        .map(|i| {
            remote
                .cmd_on(cwd, i % 4)
                .args(["acquire", "race", "--repo", "o/r", "--ttl", "60"])
                .command()
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    kids.into_iter()
        .map(|k| k.wait_with_output().unwrap().into())
        .collect()
}

fn one_winner(outs: &[common::Out], what: &str) -> Value {
    let winners: Vec<&common::Out> = outs.iter().filter(|o| o.code == 0).collect();
    assert_eq!(
        winners.len(),
        1,
        "{what}: {:?}",
        outs.iter()
            .map(|o| (&o.stdout, &o.stderr))
            .collect::<Vec<_>>()
    );
    for o in outs.iter().filter(|o| o.code != 0) {
        o.expect(3, "already_running");
    }
    winners[0].json.clone()
}

#[test]
fn sixteen_racers_on_a_free_and_on_a_stale_lock_one_winner_each() {
    for make in [Remote::daemon, Remote::file] {
        let env = TestEnv::new();
        let cwd = env.dir("w");
        let remote = make(&env);
        let first = one_winner(&race(&remote, &cwd, 16), &remote.url);
        assert!(first["took_over"].is_null());
        // Make it stale: a 1 s lease, renewed by its own token, then let it run out.
        remote
            .cmd_on(&cwd, 9)
            .args(["renew", "race", "--repo", "o/r", "--ttl", "1"])
            .args(["--token", first["token"].as_str().unwrap()])
            .run()
            .expect(0, "renewed");
        std::thread::sleep(Duration::from_millis(2100));
        let second = one_winner(&race(&remote, &cwd, 16), &remote.url);
        assert_eq!(second["took_over"]["reason"], "expired", "{}", remote.url);
        assert_eq!(
            second["fence"].as_u64(),
            first["fence"].as_u64().map(|f| f + 1)
        );
    }
}

#[test]
fn witnessed_loop_never_overlaps_and_fences_strictly_increase() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Arc::new(Remote::daemon(&env));
    let witness = env.path("witness");
    std::fs::write(&witness, "").unwrap();
    let fences = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (remote, cwd, witness, fences) = (
                Arc::clone(&remote),
                cwd.clone(),
                witness.clone(),
                Arc::clone(&fences),
            );
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let a = remote
                        .cmd_on(&cwd, w)
                        .args(["acquire", "loop", "--repo", "o/r", "--ttl", "60"])
                        .args(["--wait", "60"])
                        .run();
                    let a = a.expect(0, "acquired");
                    let me = format!("worker {w} fence {}", a["fence"]);
                    let before = std::fs::read_to_string(&witness).unwrap();
                    assert_eq!(before, "", "{me} entered while {before} held it");
                    std::fs::write(&witness, &me).unwrap();
                    fences.lock().unwrap().push(a["fence"].as_u64().unwrap());
                    std::thread::sleep(Duration::from_millis(30));
                    assert_eq!(std::fs::read_to_string(&witness).unwrap(), me);
                    std::fs::write(&witness, "").unwrap();
                    remote
                        .cmd_on(&cwd, w)
                        .args(["release", "loop", "--repo", "o/r", "--token"])
                        .arg(a["token"].as_str().unwrap())
                        .run()
                        .expect(0, "released");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let fences = fences.lock().unwrap();
    assert_eq!(fences.len(), 20);
    assert!(
        fences.windows(2).all(|p| p[0] < p[1]),
        "fences in the order the lock was held: {fences:?}"
    );
    // The history is the ref's log: every acquisition and release is there.
    let h = remote
        .cmd(&cwd)
        .args(["history", "loop", "--repo", "o/r", "--limit", "100"])
        .run();
    let events = h.expect(0, "history")["events"].as_array().unwrap().clone();
    let acquired: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "acquired")
        .map(|e| e["fence"].as_u64().unwrap())
        .collect();
    assert_eq!(acquired, *fences);
    assert_eq!(
        events.iter().filter(|e| e["event"] == "released").count(),
        20
    );
}

#[test]
fn two_clones_contend_through_origin_and_plain_clones_never_see_lock_refs() {
    let env = TestEnv::new();
    let origin = bare_repo(&env.path("origin.git"));
    let seed = env.git_repo("seed");
    git_out(&seed, &["push", "-q", origin.to_str().unwrap(), "main"]);
    let clone = |name: &str| {
        git_out(&env.root, &["clone", "-q", origin.to_str().unwrap(), name]);
        env.path(name)
    };
    let laptop = clone("laptop");
    let ci = clone("ci");
    let cache = env.path("cache");
    let at = |dir: &Path| {
        Cmd::new(dir)
            .env("SKILL_LOCK_STORE", "git:origin")
            .env("SKILL_LOCK_GIT_CACHE", &cache)
    };
    let a = at(&laptop)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run();
    let a = a.expect(0, "acquired").clone();
    let other = at(&ci)
        .env("SKILL_LOCK_HOST", "ci-runner")
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run();
    let other = other.expect(3, "already_running");
    assert_eq!(other["holder"]["fence"], a["fence"]);
    assert!(
        other["hint"].as_str().unwrap().contains("git:origin"),
        "{other}"
    );
    // The lock is on the shared remote...
    let remote_refs = git_out(&env.root, &["ls-remote", origin.to_str().unwrap()]);
    assert!(
        remote_refs.contains("refs/skill-lock/issue-triage@apache__airflow"),
        "{remote_refs}"
    );
    // ...but a plain fetch or clone never brings it.
    git_out(&laptop, &["fetch", "-q", "origin"]);
    let fresh = clone("fresh");
    for dir in [&laptop, &ci, &fresh] {
        let refs = git_out(dir, &["for-each-ref"]);
        assert!(!refs.contains("skill-lock"), "{}: {refs}", dir.display());
        assert!(refs.contains("refs/remotes/origin/main"), "{refs}");
    }
    // Nothing was written into either checkout.
    assert!(!laptop.join(".git/apache-magpie").exists());
    at(&ci)
        .args(["release", "issue-triage", "--repo", "apache/airflow"])
        .args(["--token", a["token"].as_str().unwrap()])
        .run()
        .expect(0, "released");
}

/// Pushes a lock state written by "another host" straight to the remote.
pub(crate) fn plant(remote_dir: &Path, lock: &str, state: &Value) {
    let tmp = remote_dir.with_extension("plant");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    git_out(&tmp, &["init", "-q"]);
    std::fs::write(tmp.join("lock.json"), state.to_string()).unwrap();
    git_out(&tmp, &["add", "lock.json"]);
    git_out(
        &tmp,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "planted",
        ],
    );
    git_out(
        &tmp,
        &[
            "push",
            "-q",
            "-f",
            remote_dir.to_str().unwrap(),
            &format!("HEAD:refs/skill-lock/{lock}"),
        ],
    );
}

pub(crate) fn foreign_state(expires_ago: i64) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let t = |s: i64| {
        let out = Command::new("date")
            .args(["-u", "-d", &format!("@{s}"), "+%Y-%m-%dT%H:%M:%SZ"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    serde_json::json!({
        "format": 1, "state": "held", "fence": 41, "depth": 7,
        "record": {
            "skill": "s", "repo": "o/r", "started": t(now - 600),
            "expires": t(now - expires_ago), "renewed": null, "ttl": 600,
            "note": "laptop", "host": "laptop", "owner_pid": 4242, "fence": 41,
            "boot_id": "another-machine-boot", "owner_start": 1,
            "deadline_boot_ms": 5, "format": 1,
            "token_sha256": "0".repeat(64)
        }
    })
}

#[test]
fn another_hosts_expired_lease_is_taken_over_only_after_the_clock_skew_allowance() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    let dir = env.path("remote.git");
    plant(&dir, "s@o__r", &foreign_state(5));
    // Expired 5 s ago by this clock, inside the 30 s allowance: still held.
    let held = remote
        .cmd(&cwd)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let held = held.expect(3, "already_running");
    let left = held["expires_in"].as_u64().unwrap();
    assert!((20..=26).contains(&left), "{held}");
    assert_eq!(held["clock_skew"], 30, "the allowance is reported");
    let s = remote
        .cmd(&cwd)
        .args(["status", "s", "--repo", "o/r"])
        .run();
    assert_eq!(s.expect(0, "status")["state"], "held");
    // Its pid is another machine's: never looked up here.
    assert_ne!(s.json["stale_reason"], "owner_dead");
    // A smaller allowance lets it go, and the fence continues from the record.
    let took = remote
        .cmd(&cwd)
        .env("SKILL_LOCK_CLOCK_SKEW", "2")
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let took = took.expect(0, "acquired");
    assert_eq!(took["took_over"]["reason"], "expired");
    assert_eq!(took["clock_skew"], 2);
    assert_eq!(took["took_over"]["holder"]["note"], "laptop");
    assert_eq!(took["fence"], 42);
    // Past the default allowance, the default takes over too.
    plant(&dir, "s@o__r", &foreign_state(31));
    let took = remote
        .cmd(&cwd)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    assert_eq!(took.expect(0, "acquired")["took_over"]["reason"], "expired");
}

#[test]
fn a_corrupt_state_is_taken_over_with_a_fence_above_its_history() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    let dir = env.path("remote.git");
    plant(&dir, "s@o__r", &foreign_state(100));
    let first = remote
        .cmd(&cwd)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let first = first.expect(0, "acquired").clone();
    assert_eq!(first["fence"], 42);
    // An admin pushes junk on top of it (a commit whose lock.json is not a state).
    let tmp = env.path("junk");
    git_out(
        &env.root,
        &["clone", "-q", "--bare", dir.to_str().unwrap(), "junk"],
    );
    let tree = git_out(&tmp, &["hash-object", "-t", "tree", "-w", "/dev/null"]);
    let tree = tree.trim();
    let tip = git_out(&dir, &["rev-parse", "refs/skill-lock/s@o__r"]);
    let junk = git_out(
        &tmp,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit-tree",
            tree,
            "-p",
            tip.trim(),
            "-m",
            "junk",
        ],
    );
    git_out(
        &tmp,
        &[
            "push",
            "-q",
            "-f",
            dir.to_str().unwrap(),
            &format!("{}:refs/skill-lock/s@o__r", junk.trim()),
        ],
    );
    let s = remote
        .cmd(&cwd)
        .args(["status", "s", "--repo", "o/r"])
        .run();
    assert_eq!(s.expect(0, "status")["stale_reason"], "corrupt");
    let again = remote
        .cmd(&cwd)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let again = again.expect(0, "acquired");
    assert_eq!(again["took_over"]["reason"], "corrupt");
    assert_eq!(again["fence"], 43, "a fence above every readable state");
}

#[test]
fn a_push_whose_answer_never_comes_but_that_landed_reports_acquired() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    // The ref is updated before post-receive runs; the client waits for the
    // hook, so its push times out with the lock already taken.
    let hook = env.path("remote.git/hooks/post-receive");
    std::fs::write(&hook, "#!/bin/sh\nsleep 20\n").unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(&hook)
        .status()
        .unwrap();
    let start = Instant::now();
    let a = remote
        .cmd(&cwd)
        .env("SKILL_LOCK_GIT_TIMEOUT", "3")
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let took = start.elapsed();
    let a = a.expect(0, "acquired").clone();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    std::fs::remove_file(&hook).unwrap();
    let c = remote
        .cmd(&cwd)
        .args(["check", "s", "--repo", "o/r", "--token"])
        .arg(a["token"].as_str().unwrap())
        .run();
    c.expect(0, "held");
}

#[test]
fn a_remote_that_hangs_or_refuses_is_store_unavailable_within_the_bound() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    // Accepts connections and never answers.
    let port = common::gitd::free_port(24400);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&held);
    std::thread::spawn(move || {
        for s in listener.incoming().flatten() {
            keep.lock().unwrap().push(s);
        }
    });
    for (url, bound) in [
        (format!("git:git://127.0.0.1:{port}/x.git"), 2.0),
        (format!("git:git://127.0.0.1:{}/x.git", port + 1), 2.0),
        (format!("git:http://u:s3cret@127.0.0.1:{port}/x.git"), 2.0),
        (
            format!("git:http://u:s3cret@127.0.0.1:{}/x.git", port + 1),
            2.0,
        ),
        (
            format!("git:file://{}/missing.git", env.root.display()),
            2.0,
        ),
    ] {
        let start = Instant::now();
        let out = Cmd::new(&cwd)
            .env("SKILL_LOCK_STORE", &url)
            .env("SKILL_LOCK_GIT_CACHE", env.path("cache"))
            .env("SKILL_LOCK_GIT_TIMEOUT", bound.to_string())
            .args(["acquire", "s", "--repo", "o/r"])
            .run();
        let took = start.elapsed();
        let e = out.expect_error("store_unavailable");
        assert!(
            !out.stdout.contains("s3cret") && !out.stderr.contains("s3cret"),
            "a credential was printed: {}",
            out.stdout
        );
        assert!(
            took < Duration::from_secs_f64(bound + 2.0),
            "{url}: took {took:?}"
        );
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("SKILL_LOCK_GIT_TIMEOUT"),
            "{e}"
        );
    }
    // Default bound: 10 s.
    let start = Instant::now();
    Cmd::new(&cwd)
        .env(
            "SKILL_LOCK_STORE",
            format!("git:git://127.0.0.1:{port}/x.git"),
        )
        .env("SKILL_LOCK_GIT_CACHE", env.path("cache"))
        .args(["status", "s", "--repo", "o/r"])
        .run()
        .expect_error("store_unavailable");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(9) && took < Duration::from_secs(13),
        "{took:?}"
    );
}

#[test]
fn a_bad_store_url_is_a_usage_error() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for url in ["git:", "git:origin", "git:/x#bad@ns"] {
        Cmd::new(&cwd)
            .env("SKILL_LOCK_STORE", url)
            .args(["status", "s", "--repo", "o/r"])
            .run()
            .expect_error("usage");
    }
}

#[test]
fn what_this_host_last_wrote_never_decides_once_another_host_changed_the_lock() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::daemon(&env);
    let mine = remote
        .cmd_on(&cwd, 1)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let mine = mine.expect(0, "acquired").clone();
    let t = mine["token"].as_str().unwrap().to_owned();
    // Another machine forces it away and takes it.
    remote
        .cmd_on(&cwd, 2)
        .args(["release", "s", "--repo", "o/r", "--force"])
        .run()
        .expect(0, "released");
    let theirs = remote
        .cmd_on(&cwd, 2)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let theirs = theirs.expect(0, "acquired").clone();
    // This machine still remembers its own commit as the tip: no effect.
    let r = remote
        .cmd_on(&cwd, 1)
        .args(["renew", "s", "--repo", "o/r", "--token", &t])
        .run();
    assert_eq!(r.expect(4, "not_owner")["holder"]["fence"], theirs["fence"]);
    remote
        .cmd_on(&cwd, 1)
        .args(["release", "s", "--repo", "o/r", "--token", &t])
        .run()
        .expect(4, "refused");
    remote
        .cmd_on(&cwd, 1)
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(3, "already_running");
    remote
        .cmd_on(&cwd, 2)
        .args(["check", "s", "--repo", "o/r", "--token"])
        .arg(theirs["token"].as_str().unwrap())
        .run()
        .expect(0, "held");
    // The holder's own renew and release still work (and use what it wrote).
    remote
        .cmd_on(&cwd, 2)
        .args(["renew", "s", "--repo", "o/r", "--token"])
        .arg(theirs["token"].as_str().unwrap())
        .run()
        .expect(0, "renewed");
    remote
        .cmd_on(&cwd, 2)
        .args(["release", "s", "--repo", "o/r", "--token"])
        .arg(theirs["token"].as_str().unwrap())
        .run()
        .expect(0, "released");
    let again = remote
        .cmd_on(&cwd, 1)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    assert!(again.expect(0, "acquired")["fence"].as_u64() > theirs["fence"].as_u64());
}

#[test]
fn history_is_the_refs_log_bounded_by_new_roots_and_ten_archived_chains() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    let dir = env.path("remote.git");
    let mut fences = Vec::new();
    // 13 acquire/release cycles, 26 commits, chains of 2: 12 roll-overs.
    for _ in 0..13 {
        let a = remote
            .cmd(&cwd)
            .env("SKILL_LOCK_GIT_HISTORY_DEPTH", "2")
            .args(["acquire", "s", "--repo", "o/r"])
            .run();
        fences.push(a.expect(0, "acquired")["fence"].as_u64().unwrap());
        remote
            .cmd(&cwd)
            .env("SKILL_LOCK_GIT_HISTORY_DEPTH", "2")
            .args(["release", "s", "--repo", "o/r"])
            .run()
            .expect(0, "released");
    }
    assert_eq!(
        fences,
        (1..=13).collect::<Vec<u64>>(),
        "fences survive new roots"
    );
    let count = |r: &str| {
        git_out(&dir, &["rev-list", "--count", r])
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    // A fetch of the lock brings its short chain only.
    assert_eq!(count("refs/skill-lock/s@o__r"), 2);
    let archives = git_out(
        &dir,
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/skill-lock-archive/",
        ],
    );
    assert_eq!(archives.lines().count(), 10, "{archives}");
    for a in archives.lines() {
        assert_eq!(count(a), 2, "{a}");
    }
    // history reads the live chain and the ten archived ones, oldest first:
    // the 22 newest of the 26 events.
    let h = remote
        .cmd(&cwd)
        .args(["history", "s", "--repo", "o/r", "--limit", "100"])
        .run();
    let events = h.expect(0, "history")["events"].as_array().unwrap().clone();
    let seq: Vec<(String, u64)> = events
        .iter()
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_owned(),
                e["fence"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = (3..=13)
        .flat_map(|f| [("acquired".to_owned(), f), ("released".to_owned(), f)])
        .collect();
    assert_eq!(seq, want);
    // A fresh cache (another machine) reads the same history.
    let other = remote
        .cmd_on(&cwd, 5)
        .args(["history", "--limit", "3"])
        .run();
    let e = other.expect(0, "history")["events"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(e.len(), 3);
    assert_eq!(
        (e[0]["fence"].as_u64(), e[2]["fence"].as_u64()),
        (Some(12), Some(13))
    );
}

#[test]
fn a_remote_that_refuses_lock_refs_says_so_at_once() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    let hook = env.path("remote.git/hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'custom refs are not allowed here' >&2\nexit 1\n",
    )
    .unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(&hook)
        .status()
        .unwrap();
    let start = Instant::now();
    let out = remote
        .cmd(&cwd)
        .args(["acquire", "s", "--repo", "o/r"])
        .run();
    let e = out.expect_error("store_unavailable");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let m = e["message"].as_str().unwrap();
    assert!(m.contains("refused") && m.contains("pre-receive"), "{m}");
    // Nothing was taken.
    std::fs::remove_file(&hook).unwrap();
    let s = remote
        .cmd(&cwd)
        .args(["status", "s", "--repo", "o/r"])
        .run();
    assert_eq!(s.expect(0, "status")["state"], "free");
}

#[test]
fn a_pid_recorded_by_another_machine_with_our_hostname_is_never_judged() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    // A dead pid of this machine, in a record from another boot that carries
    // this machine's hostname (two CI containers are both called "runner").
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let mut state = foreign_state(-600); // expires in 10 minutes
    state["record"]["host"] = "runner".into();
    state["record"]["owner_pid"] = dead.into();
    plant(&env.path("remote.git"), "s@o__r", &state);
    let here = |c: Cmd| c.env("SKILL_LOCK_HOST", "runner");
    let s = here(remote.cmd(&cwd))
        .args(["status", "s", "--repo", "o/r"])
        .run();
    assert_eq!(s.expect(0, "status")["state"], "held", "{}", s.stdout);
    here(remote.cmd(&cwd))
        .args(["acquire", "s", "--repo", "o/r"])
        .run()
        .expect(3, "already_running");
    // A renewal by another run keeps the recorded owner pid.
    here(remote.cmd(&cwd))
        .args(["renew", "s", "--repo", "o/r"])
        .run()
        .expect(0, "renewed");
    let tip = git_out(
        &env.path("remote.git"),
        &["show", "refs/skill-lock/s@o__r:lock.json"],
    );
    let tip: Value = serde_json::from_str(&tip).unwrap();
    assert_eq!(tip["record"]["owner_pid"], dead);
}

#[test]
fn a_server_that_drops_connections_when_busy_is_retried_within_the_deadline() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let served = env.dir("served");
    bare_repo(&served.join("locks.git"));
    // Two connections at a time: the others are reset by the daemon.
    let d = Daemon::start_with(&served, 24400, &["--max-connections=2"]);
    let remote = Remote {
        url: format!("git:{}", d.url("locks.git")),
        cache: env.path("cache"),
        _daemon: None,
    };
    let outs = race(&remote, &cwd, 16);
    one_winner(&outs, "16 racers, 2 connections");
    drop(d);
}

#[test]
fn a_server_without_atomic_pushes_still_rolls_over() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Remote::file(&env);
    git_out(
        &env.path("remote.git"),
        &["config", "receive.advertiseAtomic", "false"],
    );
    for f in 1..=4u64 {
        let a = remote
            .cmd(&cwd)
            .env("SKILL_LOCK_GIT_HISTORY_DEPTH", "2")
            .args(["acquire", "s", "--repo", "o/r"])
            .run();
        assert_eq!(a.expect(0, "acquired")["fence"], f);
        remote
            .cmd(&cwd)
            .env("SKILL_LOCK_GIT_HISTORY_DEPTH", "2")
            .args(["release", "s", "--repo", "o/r"])
            .run()
            .expect(0, "released");
    }
    let archives = git_out(
        &env.path("remote.git"),
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/skill-lock-archive/",
        ],
    );
    assert_eq!(archives.lines().count(), 3, "{archives}");
}
