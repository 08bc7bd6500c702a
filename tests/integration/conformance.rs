//! One conformance suite for every store (SPEC §8: "the same behaviour as the
//! file store in every section"). Each test runs against a file store and the
//! git store (on a `file://` bare repository and on a loopback `git daemon`,
//! ports 24450-24499) always, and against etcd when `SKILL_LOCK_TEST_ETCD` names a reachable cluster
//! (`host:port[,host:port]`); without it the etcd half is skipped visibly, and
//! `SKILL_LOCK_TEST_ETCD_REQUIRED=1` (set by CI) turns the skip into a failure.
//!
//! Covers: SPEC §2, §2.1, §2.4, §7, §8.

use crate::common;

use common::verbs::{Lock, Reply};
use common::{Cmd, TestEnv, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static PREFIX_SEQ: AtomicU32 = AtomicU32::new(0);

/// A store under test: its URL, fresh for each test.
struct Backend {
    url: String,
    etcd: bool,
    /// The git store: its cache, and the daemon serving it (if any).
    git: Option<(std::path::PathBuf, Option<common::gitd::Daemon>)>,
}

fn backends(env: &TestEnv) -> Vec<Backend> {
    let mut out = vec![Backend {
        url: format!("file:{}", env.path("store").display()),
        etcd: false,
        git: None,
    }];
    // The git store, on a file:// remote and on a loopback git daemon.
    let served = env.dir("served");
    common::gitd::bare_repo(&served.join("locks.git"));
    let daemon = common::gitd::Daemon::start(&served, 24450);
    out.push(Backend {
        url: format!("git:file://{}", served.join("locks.git").display()),
        etcd: false,
        git: Some((env.path("git-cache"), None)),
    });
    out.push(Backend {
        url: format!("git:{}#conformance", daemon.url("locks.git")),
        etcd: false,
        git: Some((env.path("git-cache"), Some(daemon))),
    });
    if let Some(eps) = common::etcd_endpoints("the etcd half of the conformance suite") {
        let n = PREFIX_SEQ.fetch_add(1, Ordering::SeqCst);
        let unique = format!(
            "{}-{}-{n}",
            std::process::id(),
            env.root.file_name().unwrap().to_string_lossy()
        );
        out.push(Backend {
            url: format!("etcd://{eps}/conformance/{unique}/"),
            etcd: true,
            git: None,
        });
    }
    out
}

impl Backend {
    fn cmd(&self, cwd: &Path) -> Cmd {
        let cmd = Cmd::new(cwd).env("SKILL_LOCK_STORE", &self.url);
        match &self.git {
            // Every run here is on one host: no clock-skew allowance.
            Some((cache, _)) => cmd
                .env("SKILL_LOCK_GIT_CACHE", cache)
                .env("SKILL_LOCK_CLOCK_SKEW", "0"),
            None => cmd,
        }
    }
    /// The lock (`skill`, `repo`) in this store, as the typed verbs reach it.
    fn lock(&self, cwd: &Path, skill: &str, repo: &str) -> Lock {
        let lock = Lock::new(cwd, skill, repo).with_env("SKILL_LOCK_STORE", &self.url);
        match &self.git {
            Some((cache, _)) => lock
                .with_env("SKILL_LOCK_GIT_CACHE", cache)
                .with_env("SKILL_LOCK_CLOCK_SKEW", "0"),
            None => lock,
        }
    }

    /// The shortest ttl both stores grant exactly (etcd's minimum is 2 s by default).
    fn short_ttl(&self) -> &'static str {
        "2"
    }
}

fn acquire(b: &Backend, cwd: &Path, extra: &[&str]) -> common::Out {
    b.cmd(cwd)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .args(extra)
        .run()
}

fn token(v: &Value) -> String {
    v["token"].as_str().unwrap().to_owned()
}

#[test]
fn the_whole_cycle() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        let a = acquire(&b, &cwd, &["--note", "one", "--ttl", "600"]);
        let a = a.expect(0, "acquired").clone();
        let t = token(&a);
        assert_eq!(
            (a["ttl"].as_u64(), a["took_over"].is_null()),
            (Some(600), true),
            "{}",
            b.url
        );
        let held = acquire(&b, &cwd, &[]);
        let h = held.expect(3, "already_running");
        assert_eq!(h["holder"]["note"], "one");
        assert!(h["holder"].get("token_sha256").is_none());
        assert!(h["hint"].as_str().unwrap().contains("--force"));
        assert!(h["expires_in"].as_u64().unwrap() > 590);
        let s = b
            .cmd(&cwd)
            .args(["status", "issue-triage", "--repo", "Apache/Airflow"])
            .run();
        assert_eq!(s.expect(0, "status")["state"], "held");
        b.cmd(&cwd)
            .args([
                "check",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &t,
            ])
            .run()
            .expect(0, "held");
        b.cmd(&cwd)
            .args([
                "check",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                "ff",
            ])
            .run()
            .expect(4, "not_owner");
        let r = b
            .cmd(&cwd)
            .args([
                "renew",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &t,
                "--ttl",
                "900",
            ])
            .run();
        let r = r.expect(0, "renewed");
        assert_eq!(
            (r["ttl"].as_u64(), r["fence"].as_u64()),
            (Some(900), a["fence"].as_u64())
        );
        b.cmd(&cwd)
            .args([
                "renew",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                "ff",
            ])
            .run()
            .expect(4, "not_owner");
        b.cmd(&cwd)
            .args([
                "release",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                "ff",
            ])
            .run()
            .expect(4, "refused");
        let l = b.cmd(&cwd).arg("list").run();
        let l = l.expect(0, "list");
        assert_eq!(l["locks"].as_array().unwrap().len(), 1);
        assert_eq!(l["locks"][0]["holder"]["fence"], a["fence"]);
        let rel = b
            .cmd(&cwd)
            .args([
                "release",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &t,
            ])
            .run();
        assert_eq!(rel.expect(0, "released")["forced"], false);
        b.cmd(&cwd)
            .args(["release", "issue-triage", "--repo", "apache/airflow"])
            .run()
            .expect(0, "not_held");
        b.cmd(&cwd)
            .args([
                "check",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &t,
            ])
            .run()
            .expect(4, "not_held");
        b.cmd(&cwd)
            .args(["renew", "issue-triage", "--repo", "apache/airflow"])
            .run()
            .expect(4, "not_held");
        let again = acquire(&b, &cwd, &[]);
        assert!(
            again.expect(0, "acquired")["fence"].as_u64() > a["fence"].as_u64(),
            "fence grows across release"
        );
        let f = b
            .cmd(&cwd)
            .args([
                "release",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &t,
                "--force",
            ])
            .run();
        assert_eq!(f.expect(0, "released")["forced"], true);
        let h = b
            .cmd(&cwd)
            .args(["history", "issue-triage", "--repo", "apache/airflow"])
            .run();
        let kinds: Vec<String> = h.expect(0, "history")["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["event"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            kinds,
            [
                "acquired",
                "renewed",
                "refused",
                "refused",
                "released",
                "acquired",
                "forced_release"
            ],
            "{}",
            b.url
        );
    }
}

#[test]
fn expiry_takeover_and_the_old_token_is_powerless() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        let old = acquire(&b, &cwd, &["--ttl", b.short_ttl(), "--note", "old"]);
        let old = old.expect(0, "acquired").clone();
        let ot = token(&old);
        std::thread::sleep(Duration::from_millis(3200));
        b.cmd(&cwd)
            .args([
                "check",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &ot,
            ])
            .run();
        let new = acquire(&b, &cwd, &["--note", "new"]);
        let new = new.expect(0, "acquired").clone();
        // The file store shows the takeover; etcd usually deleted the expired key already.
        let took = &new["took_over"];
        assert!(
            took.is_null() || took["reason"] == "expired",
            "{}: {took}",
            b.url
        );
        if !b.etcd {
            assert_eq!(took["reason"], "expired");
        }
        assert!(new["fence"].as_u64() > old["fence"].as_u64());
        let r = b
            .cmd(&cwd)
            .args([
                "renew",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &ot,
            ])
            .run();
        assert_eq!(r.expect(4, "not_owner")["holder"]["note"], "new");
        b.cmd(&cwd)
            .args([
                "release",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &ot,
            ])
            .run()
            .expect(4, "refused");
        b.cmd(&cwd)
            .args([
                "check",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &ot,
            ])
            .run()
            .expect(4, "not_owner");
        b.cmd(&cwd)
            .args([
                "check",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--token",
                &token(&new),
            ])
            .run()
            .expect(0, "held");
    }
}

#[test]
fn a_dead_owner_pid_on_this_host_is_stale_elsewhere_not_judged() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        acquire(&b, &cwd, &["--owner-pid", &child.id().to_string()]).expect(0, "acquired");
        acquire(&b, &cwd, &[]).expect(3, "already_running");
        child.kill().unwrap();
        child.wait().unwrap();
        let s = b
            .cmd(&cwd)
            .args(["status", "issue-triage", "--repo", "apache/airflow"])
            .run();
        assert_eq!(
            s.expect(0, "status")["stale_reason"],
            "owner_dead",
            "{}",
            b.url
        );
        let t = acquire(&b, &cwd, &[]);
        assert_eq!(t.expect(0, "acquired")["took_over"]["reason"], "owner_dead");
        b.cmd(&cwd)
            .args(["release", "issue-triage", "--repo", "apache/airflow"])
            .run()
            .expect(0, "released");

        // Recorded by another host: its pid means nothing here.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        b.cmd(&cwd)
            .env("SKILL_LOCK_HOST", "ci-runner-7")
            .args([
                "acquire",
                "issue-triage",
                "--repo",
                "apache/airflow",
                "--owner-pid",
                &child.id().to_string(),
            ])
            .run()
            .expect(0, "acquired");
        child.kill().unwrap();
        child.wait().unwrap();
        let held = acquire(&b, &cwd, &[]);
        assert_eq!(
            held.expect(3, "already_running")["holder"]["host"],
            "ci-runner-7"
        );
    }
}

#[test]
fn twenty_racers_one_winner_per_round() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        let mut last_fence = 0;
        for round in 0..4 {
            let kids: Vec<_> = (0..20)
                .map(|_| {
                    b.cmd(&cwd)
                        .args(["acquire", "race", "--repo", "o/r", "--ttl", "60"])
                        .command()
                        .stdout(std::process::Stdio::piped())
                        .spawn()
                        .unwrap()
                })
                .collect();
            let outs: Vec<common::Out> = kids
                .into_iter()
                .map(|k| k.wait_with_output().unwrap().into())
                .collect();
            let winners: Vec<&common::Out> = outs.iter().filter(|o| o.code == 0).collect();
            assert_eq!(
                winners.len(),
                1,
                "{} round {round}: {:?}",
                b.url,
                outs.iter().map(|o| &o.stdout).collect::<Vec<_>>()
            );
            assert!(
                outs.iter()
                    .all(|o| o.code == 0 || o.json["result"] == "already_running")
            );
            let fence = winners[0].json["fence"].as_u64().unwrap();
            assert!(fence > last_fence);
            last_fence = fence;
            b.cmd(&cwd)
                .args(["release", "race", "--repo", "o/r"])
                .run()
                .expect(0, "released");
        }
    }
}

#[test]
fn wait_and_run_behave_the_same() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        acquire(&b, &cwd, &["--ttl", b.short_ttl()]).expect(0, "acquired");
        let waited = acquire(&b, &cwd, &["--wait", "15"]);
        waited.expect(0, "acquired");
        let out = b
            .cmd(&cwd)
            .args([
                "run",
                "job",
                "--repo",
                "o/r",
                "--ttl",
                "3",
                "--",
                "sh",
                "-c",
                "echo hi; sleep 2.5; exit 3",
            ])
            .run();
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (3, "hi\n"),
            "{}: {}",
            b.url,
            out.stderr
        );
        let last: Value = serde_json::from_str(out.stderr.lines().last().unwrap()).unwrap();
        assert_eq!(
            (last["result"].as_str(), last["released"].as_bool()),
            (Some("ran"), Some(true))
        );
        assert!(last["renewals"].as_u64().unwrap() >= 1);
        let s = b.cmd(&cwd).args(["status", "job", "--repo", "o/r"]).run();
        assert_eq!(s.expect(0, "status")["state"], "free");
    }
}

#[test]
fn two_projects_sharing_one_etcd_contend() {
    let env = TestEnv::new();
    let Some(b) = backends(&env).into_iter().find(|b| b.etcd) else {
        eprintln!("SKIPPED: two_projects_sharing_one_etcd_contend needs etcd");
        return;
    };
    let one = env.git_repo("laptop/airflow");
    let two = env.git_repo("ci/airflow");
    let a = b
        .cmd(&one)
        .args(["acquire", "issue-triage", "--repo", "apache/airflow"])
        .run();
    a.expect(0, "acquired");
    let other = b
        .cmd(&two)
        .env("SKILL_LOCK_HOST", "ci-runner")
        .args([
            "--root",
            two.to_str().unwrap(),
            "acquire",
            "issue-triage",
            "--repo",
            "apache/airflow",
        ])
        .run();
    assert_eq!(
        other.expect(3, "already_running")["holder"]["host"],
        hostname()
    );
    // Nothing was written into either checkout.
    assert!(!one.join(".git/apache-magpie").exists() && !two.join(".git/apache-magpie").exists());
}

fn hostname() -> String {
    let out = std::process::Command::new("hostname").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn an_unreachable_cluster_is_store_unavailable_in_bounded_time() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let start = std::time::Instant::now();
    let out = Cmd::new(&cwd)
        .env("SKILL_LOCK_ETCD_TIMEOUT", "1.5")
        .args([
            "acquire",
            "s",
            "--repo",
            "o/r",
            "--store",
            "etcd://127.0.0.1:1,127.0.0.1:2",
        ])
        .run();
    out.expect_error("store_unavailable");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(
        out.stdout.contains("127.0.0.1:1") || out.stdout.contains("127.0.0.1:2"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_dead_first_endpoint_does_not_fail_the_command() {
    let env = TestEnv::new();
    let Some(eps) = common::etcd_endpoints("a_dead_first_endpoint_does_not_fail_the_command")
    else {
        return;
    };
    let cwd = env.dir("w");
    let url = format!("etcd://127.0.0.1:1,{eps}/failover-{}/", std::process::id());
    for _ in 0..10 {
        let a = Cmd::new(&cwd)
            .args(["acquire", "s", "--repo", "o/r", "--store", &url])
            .run();
        a.expect(0, "acquired");
        Cmd::new(&cwd)
            .args(["release", "s", "--repo", "o/r", "--store", &url])
            .run()
            .expect(0, "released");
    }
}

/// The fence of an `acquired` reply.
#[track_caller]
fn fence_of(r: &Reply) -> u64 {
    match r {
        Reply::Acquired { fence, .. } => *fence,
        other => panic!("not acquired: {other:?}"),
    }
}

/// `status` of a lock, split: its state and its fence.
#[track_caller]
fn status_of(lock: &Lock) -> (String, Option<u64>) {
    match lock.status() {
        Reply::Status { state, fence, .. } => (state, fence),
        other => panic!("not a status: {other:?}"),
    }
}

/// Acquires with `--since` the fence `status` shows now, after `between` ran.
#[track_caller]
fn since_status(lock: &Lock, between: impl FnOnce()) -> Reply {
    let since = lock.status_fence();
    between();
    lock.acquire_since(since, &[])
}

#[test]
fn status_shows_the_latest_fence_and_since_tells_of_others() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        let lock = b.lock(&cwd, "since", "o/r");
        let other = b.lock(&cwd, "since", "O/R");
        assert_eq!(status_of(&lock), ("free".into(), None), "{}", b.url);
        // Never acquired, status showed null: nobody since.
        let a = since_status(&lock, || {});
        assert_eq!(a.others_since(), Some(false), "{}", b.url);
        let f = fence_of(&a);
        assert_eq!(status_of(&lock), ("held".into(), Some(f)));
        lock.release(a.token());
        // Free, and still the fence of its latest acquisition.
        assert_eq!(status_of(&lock), ("free".into(), Some(f)), "{}", b.url);
        // Nobody in between.
        let a = since_status(&lock, || {});
        assert_eq!(a.others_since(), Some(false), "{}", b.url);
        lock.release(a.token());
        // Another run acquired and released in between.
        let a = since_status(&lock, || {
            let o = other.acquire();
            other.release(o.token());
        });
        assert_eq!(a.others_since(), Some(true), "{}", b.url);
        lock.release(a.token());
        // Without --since nothing is said, whatever happened.
        let a = lock.acquire();
        assert_eq!(a.others_since(), None);
        lock.release(a.token());
        // A fence above anything the store knows (its history was reset or
        // trimmed, or the fence came from elsewhere): it cannot tell.
        let known = lock.status_fence().unwrap();
        let a = lock.acquire_since(Some(known + 1000), &[]);
        assert_eq!(a.others_since(), Some(true), "{}", b.url);
        lock.release(a.token());
        // Status showed a stale lock (its owner died): taking it over says
        // nobody else came.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let dead = other.acquire_with(&["--owner-pid", &pid]);
        child.kill().unwrap();
        child.wait().unwrap();
        let (state, since) = status_of(&lock);
        assert_eq!((state.as_str(), since), ("stale", Some(fence_of(&dead))));
        let a = lock.acquire_since(since, &[]);
        assert!(
            matches!(
                &a,
                Reply::Acquired {
                    took_over: Some(_),
                    ..
                }
            ),
            "{a:?}"
        );
        assert_eq!(a.others_since(), Some(false), "{}", b.url);
        lock.release(a.token());
        // Another run took the lock and its lease ran out: taken over in
        // between, it still counts.
        let a = since_status(&lock, || {
            other.acquire_with(&["--ttl", b.short_ttl()]);
            std::thread::sleep(Duration::from_millis(3200));
        });
        assert_eq!(a.others_since(), Some(true), "{}", b.url);
        lock.release(a.token());
    }
}

#[test]
fn run_since_tells_cmd_and_its_result() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        // An outer run's answer in the environment never reaches this CMD.
        let lock = b
            .lock(&cwd, "since-run", "o/r")
            .with_env("SKILL_LOCK_OTHERS_SINCE", "inherited");
        let show = ["--", "sh", "-c", "echo \"[$SKILL_LOCK_OTHERS_SINCE]\""];
        let since = lock
            .status_fence()
            .map_or_else(|| "null".to_owned(), |f| f.to_string());
        let with_since: Vec<&str> = ["--since", since.as_str()]
            .into_iter()
            .chain(show)
            .collect();
        let out = lock.cmd("run", &with_since).run();
        let ran = common::verbs::run_reply(&out);
        assert_eq!(
            (out.stdout.as_str(), ran.others_since()),
            ("[false]\n", Some(false)),
            "{}: {}",
            b.url,
            out.stderr
        );
        let a = lock.acquire();
        lock.release(a.token());
        let out = lock.cmd("run", &with_since).run();
        let ran = common::verbs::run_reply(&out);
        assert_eq!(
            (out.stdout.as_str(), ran.others_since()),
            ("[true]\n", Some(true)),
            "{}",
            b.url
        );
        let out = lock.cmd("run", &show).run();
        let ran = common::verbs::run_reply(&out);
        assert_eq!((out.stdout.as_str(), ran.others_since()), ("[]\n", None));
    }
}

/// Runs that each read the lock's fence with `status` and then acquire with
/// `--since`, overlapping: a run must hear `true` exactly when another
/// acquisition came between its `status` and its own acquisition. Judged by
/// fences alone, which grow with every acquisition on every store (on etcd
/// they are revisions, so they are compared only with the fences the runs
/// were handed, never counted).
#[test]
fn overlapping_runs_hear_of_every_acquisition_since_their_status() {
    const RUNS: usize = 6;
    const ROUNDS: usize = 3;
    let env = TestEnv::new();
    let cwd = env.dir("w");
    for b in backends(&env) {
        let lock = b.lock(&cwd, "since-race", "o/r");
        let seen: Vec<(u64, u64, bool)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..RUNS)
                .map(|_| {
                    s.spawn(|| {
                        (0..ROUNDS)
                            .map(|_| {
                                let since = lock.status_fence();
                                let a = lock.acquire_since(since, &["--wait", "60"]);
                                let got = (since.unwrap_or(0), fence_of(&a), a.others_since());
                                lock.release(a.token());
                                (got.0, got.1, got.2.unwrap())
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        let fences: std::collections::BTreeSet<u64> = seen.iter().map(|r| r.1).collect();
        assert_eq!(fences.len(), RUNS * ROUNDS, "{}: fences repeat", b.url);
        let mut told = 0;
        for &(since, fence, others) in &seen {
            assert!(since < fence, "{}: {since} then {fence}", b.url);
            let between = fences.range(since + 1..fence).next().is_some();
            assert_eq!(
                others, between,
                "{}: status showed {since}, acquired {fence}, fences {fences:?}",
                b.url
            );
            told += usize::from(others);
        }
        eprintln!(
            "{}: {} acquisitions, {told} told of others since their status",
            b.url,
            seen.len()
        );
    }
}
