//! One conformance suite for every store (SPEC §8: "the same behaviour as the
//! file store in every section"). Each test is written once with
//! `store_test!` (harness/stores.rs) and runs as `NAME::file`, `NAME::git`
//! (a `file://` bare remote), `NAME::git_daemon` (a loopback `git daemon`,
//! ports 24450-24499) and `NAME::etcd` (when `SKILL_LOCK_TEST_ETCD` names a
//! cluster; skipped visibly otherwise, a failure under
//! `SKILL_LOCK_TEST_ETCD_REQUIRED=1`). The objects of every command (§3) and
//! the holder they show (§4) are read typed, every field known.
//!
//! Covers: SPEC §2, §2.1, §2.4, §3, §4, §7, §8.

use crate::harness;

use harness::TestEnv;
use harness::{Lock, Reply};
use std::time::Duration;

/// Is `s` an RFC 3339 time to the second, in UTC (`2026-01-02T03:04:05Z`)?
fn is_rfc3339_second(s: &str) -> bool {
    s.len() == 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T'
}

/// A process that lives until killed, to stand for a run's owner.
fn sleeper() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap()
}

/// Kills and reaps an owner made by [`sleeper`].
fn kill(mut child: std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

store_test!(
    fn the_whole_cycle(store, env) {
        let cwd = env.dir("w");
        let url = &store.url;
        let lock = store.lock(&cwd, "issue-triage", "apache/airflow");
        let a = lock.op("acquire").note("run 1\tok").ttl(600).reply().is("acquired");
        let t = a.token().to_owned();
        assert_eq!(t.len(), 32, "{url}");
        assert!(t.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!((a.ttl(), a.note(), a.took_over()), (600, Some("run 1\tok"), None), "{url}");
        assert!(is_rfc3339_second(a.started()) && is_rfc3339_second(a.expires()));

        // A second run, spelling the repo differently, finds it held.
        let out = store.lock(&cwd, "issue-triage", "Apache/AIRFLOW").op("acquire").run();
        assert!(!out.stdout.contains(&t), "{url}: the token shown to another run");
        let held = out.reply().is("already_running");
        assert_eq!(held.holder().note.as_deref(), Some("run 1\tok"));
        assert_eq!(held.repo(), "Apache/AIRFLOW");
        let left = held.expires_in().unwrap();
        let least = if store.is_file() { 598 } else { 591 };
        assert!((least..=601).contains(&left), "{url}: {left}");
        // Not on PATH here: the hint names this program by its absolute path.
        let hint = held.hint();
        let want = format!("{} release issue-triage --repo Apache/AIRFLOW --force", harness::BIN);
        assert!(hint.starts_with(&want), "{hint}");
        let status = store.lock(&cwd, "issue-triage", "Apache/Airflow").status();
        assert_eq!(status.state(), "held");
        assert_eq!(status.holder().fence, a.must_fence());

        assert_eq!(lock.check(&t).fence(), a.fence());
        lock.check(&t).is("held");
        lock.check("ff").is("not_owner");
        let r = lock.op("renew").token(&t).ttl(900).reply().is("renewed");
        assert_eq!((r.ttl(), r.fence()), (900, a.fence()));
        lock.renew("ff").is("not_owner");
        lock.release("ff").is("refused");
        let l = lock.list();
        assert_eq!(l.locks().len(), 1, "{url}");
        assert_eq!(l.locks()[0].holder.as_ref().map(|h| h.fence), a.fence());

        // Other skill, other repo: no contention.
        store.lock(&cwd, "issue-stale-sweep", "apache/airflow").acquire().is("acquired");
        store.lock(&cwd, "issue-triage", "apache/other").acquire().is("acquired");

        let rel = lock.release(&t).is("released");
        assert!(!rel.forced());
        assert_eq!(rel.holder().fence, a.must_fence());
        lock.op("release").expect(0, "not_held");
        lock.op("check").token(&t).expect(4, "not_held");
        lock.op("renew").force().expect(4, "not_held");
        assert_eq!(lock.state(), "free");

        // The fence survives release.
        let again = lock.acquire().is("acquired");
        assert!(again.fence() > a.fence(), "{url}: fence grows across release");
        assert_eq!((again.ttl(), again.note()), (7200, None));
        let f = lock.op("release").token(&t).force().reply().is("released");
        assert!(f.forced());
        assert_eq!(
            lock.history().event_kinds(),
            [
                "acquired",
                "renewed",
                "refused",
                "refused",
                "released",
                "acquired",
                "forced_release"
            ],
            "{url}"
        );
    }
);

store_test!(
    fn expiry_takeover_and_the_old_token_is_powerless(store, env) {
        let cwd = env.dir("w");
        let url = &store.url;
        let lock = store.lock(&cwd, "issue-triage", "apache/airflow");
        let old = lock.op("acquire").ttl(store.short_ttl()).note("old").reply();
        let ot = old.token().to_owned();
        std::thread::sleep(Duration::from_millis(3200));
        // The file and git stores show the stale lock; etcd usually deleted
        // the expired key already.
        if store.is_etcd() {
            lock.check(&ot);
        } else {
            let s = lock.status();
            assert_eq!((s.state(), s.stale_reason()), ("stale", Some("expired")));
            lock.check(&ot).is("expired");
        }
        let new = lock.op("acquire").note("new").reply();
        let took = new.took_over();
        assert!(took.is_none_or(|t| t.reason == "expired"), "{url}: {took:?}");
        if !store.is_etcd() {
            let took = took.unwrap();
            assert_eq!(took.reason, "expired");
            assert_eq!(took.holder.as_ref().unwrap().note.as_deref(), Some("old"));
        }
        assert!(new.fence() > old.fence());

        // The taken-over run can neither renew, check nor release the new
        // holder's lock.
        let r = lock.renew(&ot).is("not_owner");
        assert_eq!(r.holder().note.as_deref(), Some("new"));
        let r = lock.release(&ot).is("refused");
        assert_eq!(r.holder().note.as_deref(), Some("new"));
        lock.check(&ot).is("not_owner");
        lock.check(new.token()).is("held");

        // The operator's override.
        let f = lock.op("release").token(&ot).force().reply().is("released");
        assert!(f.forced());
        assert_eq!(f.holder().note.as_deref(), Some("new"));
    }
);

// Not on etcd: its lease is gone once expired, nothing left to revive.
store_test!(
    fn renew_extends_and_may_revive_its_own_expired_lease(store, env) on [file, git, git_daemon] {
        let cwd = env.dir("w");
        let lock = store.lock(&cwd, "issue-triage", "apache/airflow");
        let a = lock.op("acquire").ttl(store.short_ttl()).reply();
        let token = a.token().to_owned();
        let r = lock.op("renew").token(&token).ttl(100).reply().is("renewed");
        assert_eq!((r.ttl(), r.was_expired(), r.fence()), (100, false, a.fence()));
        assert!(is_rfc3339_second(r.expires()) && is_rfc3339_second(r.renewed()));
        // Default ttl of renew is the lock's own ttl (now 100).
        assert_eq!(lock.op("renew").token(&token).reply().ttl(), 100);
        lock.op("renew").token(&token).ttl(store.short_ttl()).reply().is("renewed");
        std::thread::sleep(Duration::from_millis(3200));
        let r = lock.op("renew").token(&token).ttl(60).reply();
        assert!(r.was_expired(), "{r:?}");
        assert!(r.fence() > a.fence(), "a revived lease takes a new fence: {r:?}");
        assert_eq!(lock.check(&token).is("held").fence(), r.fence());
        lock.op("release").expect(0, "released");
        lock.op("renew").force().expect(4, "not_held");
    }
);

store_test!(
    fn a_dead_owner_pid_on_this_host_is_stale_elsewhere_not_judged(store, env) {
        let cwd = env.dir("w");
        let lock = store.lock(&cwd, "issue-triage", "apache/airflow");
        let child = sleeper();
        let a = lock.op("acquire").owner_pid(child.id()).reply();
        assert_eq!(a.owner_pid(), Some(child.id()));
        lock.acquire().is("already_running");
        kill(child);
        assert_eq!(lock.status().stale_reason(), Some("owner_dead"), "{}", store.url);
        let t = lock.acquire().is("acquired");
        let took = t.took_over().unwrap();
        assert_eq!(took.reason, "owner_dead");
        assert_eq!(took.holder.as_ref().unwrap().owner_pid, a.owner_pid());
        lock.op("release").expect(0, "released");

        // Recorded by another host: its pid means nothing here.
        let child = sleeper();
        let there = lock.op("acquire").host("ci-runner-7").owner_pid(child.id());
        there.reply().is("acquired");
        kill(child);
        let held = lock.acquire().is("already_running");
        assert_eq!(held.holder().host, "ci-runner-7");
    }
);

store_test!(
    fn twenty_racers_one_winner_per_round(store, env) {
        let cwd = env.dir("w");
        let lock = store.lock(&cwd, "race", "o/r");
        let mut last_fence = 0;
        for round in 0..4 {
            let kids: Vec<_> = (0..20)
                .map(|_| lock.op("acquire").ttl(60).spawn())
                .collect();
            let outs: Vec<harness::Out> = kids
                .into_iter()
                .map(|k| k.wait_with_output().unwrap().into())
                .collect();
            let replies: Vec<Reply> = outs.iter().map(harness::Out::reply).collect();
            let winners: Vec<&Reply> = replies.iter().filter(|r| r.result() == "acquired").collect();
            assert_eq!(winners.len(), 1, "{} round {round}: {replies:?}", store.url);
            assert!(
                replies
                    .iter()
                    .all(|r| matches!(r.result(), "acquired" | "already_running"))
            );
            let fence = winners[0].must_fence();
            assert!(fence > last_fence);
            last_fence = fence;
            lock.op("release").expect(0, "released");
        }
    }
);

store_test!(
    fn wait_and_run_behave_the_same(store, env) {
        let cwd = env.dir("w");
        let lock = store.lock(&cwd, "issue-triage", "apache/airflow");
        lock.op("acquire").ttl(store.short_ttl()).reply().is("acquired");
        lock.op("acquire").wait(15).reply().is("acquired");
        let job = store.lock(&cwd, "job", "o/r");
        let (out, ran) = job
            .op("run")
            .ttl(3)
            .command(["sh", "-c", "echo hi; sleep 2.5; exit 3"])
            .run_reply();
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (3, "hi\n"),
            "{}: {}",
            store.url,
            out.stderr
        );
        assert_eq!((ran.result(), ran.released()), ("ran", true));
        assert!(ran.renewals() >= 1);
        assert_eq!(job.state(), "free");
    }
);

store_test!(
    fn list_is_sorted_and_complete(store, env) {
        let cwd = env.dir("w");
        for (skill, r) in [
            ("pr-triage", "b/x"),
            ("issue-triage", "Zed/a"),
            ("issue-triage", "apache/b"),
            ("a1", "o/r"),
        ] {
            store.lock(&cwd, skill, r).acquire().is("acquired");
        }
        let list = store.lock(&cwd, "a1", "o/r").list();
        let want = [
            ("a1", "o/r"),
            ("issue-triage", "apache/b"),
            ("issue-triage", "Zed/a"),
            ("pr-triage", "b/x"),
        ];
        assert_eq!(
            list.lock_names(),
            want.map(|(a, b)| (a.to_owned(), b.to_owned())),
            "{}",
            store.url
        );
        for l in list.locks() {
            assert_eq!(l.state, "held");
            assert!(l.holder.is_some(), "{l:?}");
            assert!(l.expires_in.unwrap() > 7000);
        }
        assert_eq!(list.tombstones(), 0);
    }
);

#[test]
fn two_projects_sharing_one_etcd_contend() {
    let env = TestEnv::new();
    let test = "conformance::two_projects_sharing_one_etcd_contend";
    let Some(store) = harness::stores::Store::open("etcd", &env, test) else {
        return;
    };
    let one = env.git_repo("laptop/airflow");
    let two = env.git_repo("ci/airflow");
    store
        .lock(&one, "issue-triage", "apache/airflow")
        .acquire()
        .is("acquired");
    let other = store
        .lock(&two, "issue-triage", "apache/airflow")
        .op("acquire")
        .host("ci-runner")
        .root(&two)
        .reply();
    assert_eq!(other.is("already_running").holder().host, hostname());
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
    let out = Lock::new(&cwd, "s", "o/r")
        .in_store("etcd://127.0.0.1:1,127.0.0.1:2")
        .op("acquire")
        .env("SKILL_LOCK_ETCD_TIMEOUT", "1.5")
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
    let Some(eps) = harness::etcd_endpoints("a_dead_first_endpoint_does_not_fail_the_command")
    else {
        return;
    };
    let cwd = env.dir("w");
    let url = format!("etcd://127.0.0.1:1,{eps}/failover-{}/", std::process::id());
    let lock = Lock::new(&cwd, "s", "o/r").in_store(&url);
    for _ in 0..10 {
        lock.acquire().is("acquired");
        lock.op("release").expect(0, "released");
    }
}

/// Acquires with `--since` the fence `status` shows now, after `between` ran.
#[track_caller]
fn since_status(lock: &Lock, between: impl FnOnce()) -> Reply {
    let since = lock.status_fence();
    between();
    lock.op("acquire").since(since).reply()
}

/// `status` of a lock, split: its state and its fence.
#[track_caller]
fn status_of(lock: &Lock) -> (String, Option<u64>) {
    let s = lock.status();
    (s.state().to_owned(), s.fence())
}

store_test!(
    fn status_shows_the_latest_fence_and_since_tells_of_others(store, env) {
        let cwd = env.dir("w");
        let url = &store.url;
        let lock = store.lock(&cwd, "since", "o/r");
        let other = store.lock(&cwd, "since", "O/R");
        assert_eq!(status_of(&lock), ("free".into(), None), "{url}");
        // Never acquired, status showed null: nobody since.
        let a = since_status(&lock, || {});
        assert_eq!(a.others_since(), Some(false), "{url}");
        let f = a.must_fence();
        assert_eq!(status_of(&lock), ("held".into(), Some(f)));
        lock.release(a.token());
        // Free, and still the fence of its latest acquisition.
        assert_eq!(status_of(&lock), ("free".into(), Some(f)), "{url}");
        // Nobody in between.
        let a = since_status(&lock, || {});
        assert_eq!(a.others_since(), Some(false), "{url}");
        lock.release(a.token());
        // Another run acquired and released in between.
        let a = since_status(&lock, || {
            let o = other.acquire();
            other.release(o.token());
        });
        assert_eq!(a.others_since(), Some(true), "{url}");
        lock.release(a.token());
        // Without --since nothing is said, whatever happened.
        let a = lock.acquire();
        assert_eq!(a.others_since(), None);
        lock.release(a.token());
        // A fence above anything the store knows (its history was reset or
        // trimmed, or the fence came from elsewhere): it cannot tell.
        let known = lock.status_fence().unwrap();
        let a = lock.op("acquire").since(Some(known + 1000)).reply();
        assert_eq!(a.others_since(), Some(true), "{url}");
        lock.release(a.token());
        // Status showed a stale lock (its owner died): taking it over says
        // nobody else came.
        let child = sleeper();
        let dead = other.op("acquire").owner_pid(child.id()).reply();
        kill(child);
        let (state, since) = status_of(&lock);
        assert_eq!((state.as_str(), since), ("stale", Some(dead.must_fence())));
        let a = lock.op("acquire").since(since).reply();
        assert!(a.took_over().is_some(), "{a:?}");
        assert_eq!(a.others_since(), Some(false), "{url}");
        lock.release(a.token());
        // Another run took the lock and its lease ran out: taken over in
        // between, it still counts.
        let a = since_status(&lock, || {
            other.op("acquire").ttl(store.short_ttl()).reply().is("acquired");
            std::thread::sleep(Duration::from_millis(3200));
        });
        assert_eq!(a.others_since(), Some(true), "{url}");
        lock.release(a.token());
    }
);

store_test!(
    fn run_since_tells_cmd_and_its_result(store, env) {
        let cwd = env.dir("w");
        let url = &store.url;
        // An outer run's answer in the environment never reaches this CMD.
        let lock = store
            .lock(&cwd, "since-run", "o/r")
            .with_env("SKILL_LOCK_OTHERS_SINCE", "inherited");
        let show = ["sh", "-c", "echo \"[$SKILL_LOCK_OTHERS_SINCE]\""];
        let since = lock.status_fence();
        let (out, ran) = lock.op("run").since(since).command(show).run_reply();
        assert_eq!(
            (out.stdout.as_str(), ran.others_since()),
            ("[false]\n", Some(false)),
            "{url}: {}",
            out.stderr
        );
        let a = lock.acquire();
        lock.release(a.token());
        let (out, ran) = lock.op("run").since(since).command(show).run_reply();
        assert_eq!(
            (out.stdout.as_str(), ran.others_since()),
            ("[true]\n", Some(true)),
            "{url}"
        );
        let (out, ran) = lock.op("run").command(show).run_reply();
        assert_eq!((out.stdout.as_str(), ran.others_since()), ("[]\n", None));
    }
);

store_test!(
    /// Runs that each read the lock's fence with `status` and then acquire with
    /// `--since`, overlapping: a run must hear `true` exactly when another
    /// acquisition came between its `status` and its own acquisition. Judged by
    /// fences alone, which grow with every acquisition on every store (on etcd
    /// they are revisions, so they are compared only with the fences the runs
    /// were handed, never counted).
    fn overlapping_runs_hear_of_every_acquisition_since_their_status(store, env) {
        const RUNS: usize = 6;
        const ROUNDS: usize = 3;
        let cwd = env.dir("w");
        let url = &store.url;
        let lock = store.lock(&cwd, "since-race", "o/r");
        let seen: Vec<(u64, u64, bool)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..RUNS)
                .map(|_| {
                    s.spawn(|| {
                        (0..ROUNDS)
                            .map(|_| {
                                let since = lock.status_fence();
                                let a = lock.op("acquire").since(since).wait(60).reply();
                                lock.release(a.token());
                                (since.unwrap_or(0), a.must_fence(), a.others_since().unwrap())
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
        assert_eq!(fences.len(), RUNS * ROUNDS, "{url}: fences repeat");
        let mut told = 0;
        for &(since, fence, others) in &seen {
            assert!(since < fence, "{url}: {since} then {fence}");
            let between = fences.range(since + 1..fence).next().is_some();
            assert_eq!(
                others, between,
                "{url}: status showed {since}, acquired {fence}, fences {fences:?}"
            );
            told += usize::from(others);
        }
        eprintln!(
            "{url}: {} acquisitions, {told} told of others since their status",
            seen.len()
        );
    }
);
