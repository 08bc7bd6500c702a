//! The git store (SPEC §8 `git:`) against real remotes started here: a
//! `file://` bare repository and a `git daemon` on loopback (ports
//! 24400-24449). Races, the witnessed loop, clones contending through
//! `git:origin`, refs hidden from plain clones, the clock-skew allowance,
//! unknown push outcomes, and remotes that hang or refuse.
//!
//! Covers: SPEC §8.

use crate::harness;

use harness::GitState;
use harness::gitd::bare_repo;
use harness::stores::Store;
use harness::{Lock, Reply};
use harness::{TestEnv, Value};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

fn race(remote: &Store, cwd: &Path, n: usize) -> Vec<harness::Out> {
    // Four "machines", four processes each: fetches and cache creation race too.
    let kids: Vec<_> = (0..n)
        .map(|i| race_lock(remote, cwd, i % 4).op("acquire").ttl(60).spawn())
        .collect();
    kids.into_iter()
        .map(|k| k.wait_with_output().unwrap().into())
        .collect()
}

/// The lock `race` of `o/r` as machine `machine` sees it.
fn race_lock(remote: &Store, cwd: &Path, machine: usize) -> Lock {
    remote.lock_as(machine, cwd, "race", "o/r")
}

fn one_winner(outs: &[harness::Out], what: &str) -> Reply {
    let winners: Vec<&harness::Out> = outs.iter().filter(|o| o.code == 0).collect();
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
    winners[0].reply().is("acquired")
}

#[test]
fn sixteen_racers_on_a_free_and_on_a_stale_lock_one_winner_each() {
    let daemon = |env: &TestEnv| Store::git(env, Some((24400, &[])));
    let file = |env: &TestEnv| Store::git(env, None);
    for make in [daemon, file] {
        let env = TestEnv::new();
        let cwd = env.dir("w");
        let remote = make(&env);
        let first = one_winner(&race(&remote, &cwd, 16), &remote.url);
        assert!(first.took_over().is_none());
        // Make it stale: a 1 s lease, renewed by its own token, then let it run out.
        let renew = race_lock(&remote, &cwd, 9).op("renew").ttl(1);
        renew.token(first.token()).expect(0, "renewed");
        std::thread::sleep(Duration::from_millis(2100));
        let second = one_winner(&race(&remote, &cwd, 16), &remote.url);
        let took = second.took_over().map(|t| t.reason.as_str());
        assert_eq!(took, Some("expired"), "{}", remote.url);
        assert_eq!(second.fence(), first.fence().map(|f| f + 1));
    }
}

#[test]
fn witnessed_loop_never_overlaps_and_fences_strictly_increase() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Arc::new(Store::git(&env, Some((24400, &[]))));
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
                    let lock = remote.lock_as(w, &cwd, "loop", "o/r");
                    let a = lock.op("acquire").ttl(60).wait(60).expect(0, "acquired");
                    let me = format!("worker {w} fence {}", a.must_fence());
                    let before = std::fs::read_to_string(&witness).unwrap();
                    assert_eq!(before, "", "{me} entered while {before} held it");
                    std::fs::write(&witness, &me).unwrap();
                    fences.lock().unwrap().push(a.must_fence());
                    std::thread::sleep(Duration::from_millis(30));
                    assert_eq!(std::fs::read_to_string(&witness).unwrap(), me);
                    std::fs::write(&witness, "").unwrap();
                    lock.release(a.token()).is("released");
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
    let h = remote.lock(&cwd, "loop", "o/r").op("history").limit(100);
    let h = h.expect(0, "history");
    let acquired: Vec<u64> = h
        .events()
        .iter()
        .filter(|e| e.event == "acquired")
        .map(|e| e.fence.unwrap())
        .collect();
    assert_eq!(acquired, *fences);
    assert_eq!(
        h.event_kinds().iter().filter(|k| **k == "released").count(),
        20
    );
}

#[test]
fn two_clones_contend_through_origin_and_plain_clones_never_see_lock_refs() {
    let env = TestEnv::new();
    // A remote name must answer a network URL (SPEC §8): the origin is
    // served by a git daemon on loopback, as a forge serves it.
    let served = env.dir("served");
    let origin = bare_repo(&served.join("origin.git"));
    let daemon = crate::harness::gitd::Daemon::start(&served, 26400);
    let origin_url = daemon.url("origin.git");
    let seed = env.git_repo("seed");
    git_out(&seed, &["push", "-q", origin.to_str().unwrap(), "main"]);
    let clone = |name: &str| {
        git_out(&env.root, &["clone", "-q", &origin_url, name]);
        env.path(name)
    };
    let laptop = clone("laptop");
    let ci = clone("ci");
    let cache = env.path("cache");
    let at = |dir: &Path| {
        Lock::new(dir, "issue-triage", "apache/airflow")
            .with_env("SKILL_LOCK_STORE", "git:origin")
            .with_env("SKILL_LOCK_GIT_CACHE", &cache)
    };
    let a = at(&laptop).acquire().is("acquired");
    let other = at(&ci).on_host("ci-runner").acquire().is("already_running");
    assert_eq!(Some(other.holder().fence), a.fence());
    assert!(other.hint().contains("git:origin"), "{other:?}");
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
    at(&ci).release(a.token()).is("released");
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

/// A lock state "another host" wrote (`laptop`, owner pid 4242, fence 41),
/// its lease ended `expires_ago` seconds ago (negative: still to come).
pub(crate) fn foreign_state(expires_ago: i64) -> Value {
    foreign_state_of(expires_ago, "laptop", 4242)
}

/// As [`foreign_state`], recorded by `host` for the owner `owner_pid`.
pub(crate) fn foreign_state_of(expires_ago: i64, host: &str, owner_pid: u32) -> Value {
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
            "note": "laptop", "host": host, "owner_pid": owner_pid, "fence": 41,
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
    let remote = Store::git(&env, None);
    let dir = remote.remote_dir();
    plant(dir, "s@o__r", &foreign_state(5));
    // Expired 5 s ago by this clock, inside the 30 s allowance: still held.
    let lock = remote.lock(&cwd, "s", "o/r");
    let held = lock.acquire().is("already_running");
    let left = held.expires_in().unwrap();
    assert!((20..=26).contains(&left), "{held:?}");
    assert_eq!(held.clock_skew(), Some(30), "the allowance is reported");
    let s = lock.status();
    assert_eq!(s.state(), "held");
    // Its pid is another machine's: never looked up here.
    assert_ne!(s.stale_reason(), Some("owner_dead"));
    // A smaller allowance lets it go, and the fence continues from the record.
    let took = lock.op("acquire").env("SKILL_LOCK_CLOCK_SKEW", "2").reply();
    let took = took.is("acquired");
    let over = took.took_over().unwrap();
    assert_eq!(over.reason, "expired");
    assert_eq!(took.clock_skew(), Some(2));
    assert_eq!(
        over.holder.as_ref().unwrap().note.as_deref(),
        Some("laptop")
    );
    assert_eq!(took.fence(), Some(42));
    // Past the default allowance, the default takes over too.
    plant(dir, "s@o__r", &foreign_state(31));
    let took = lock.acquire().is("acquired");
    assert_eq!(took.took_over().unwrap().reason, "expired");
}

#[test]
fn a_corrupt_state_is_taken_over_with_a_fence_above_its_history() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    let dir = remote.remote_dir();
    plant(dir, "s@o__r", &foreign_state(100));
    let lock = remote.lock(&cwd, "s", "o/r");
    assert_eq!(lock.acquire().is("acquired").fence(), Some(42));
    // An admin pushes junk on top of it (a commit whose lock.json is not a state).
    let tmp = env.path("junk");
    git_out(
        &env.root,
        &["clone", "-q", "--bare", dir.to_str().unwrap(), "junk"],
    );
    let tree = git_out(&tmp, &["hash-object", "-t", "tree", "-w", "/dev/null"]);
    let tree = tree.trim();
    let tip = git_out(dir, &["rev-parse", "refs/skill-lock/s@o__r"]);
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
    assert_eq!(lock.status().stale_reason(), Some("corrupt"));
    let again = lock.acquire().is("acquired");
    assert_eq!(again.took_over().unwrap().reason, "corrupt");
    assert_eq!(
        again.fence(),
        Some(43),
        "a fence above every readable state"
    );
}

#[test]
fn a_push_whose_answer_never_comes_but_that_landed_reports_acquired() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    // The ref is updated before post-receive runs; the client waits for the
    // hook, so its push times out with the lock already taken.
    let hook = remote.remote_dir().join("hooks/post-receive");
    std::fs::write(&hook, "#!/bin/sh\nsleep 20\n").unwrap();
    Command::new("chmod")
        .arg("755")
        .arg(&hook)
        .status()
        .unwrap();
    let start = Instant::now();
    let lock = remote.lock(&cwd, "s", "o/r");
    let a = lock
        .op("acquire")
        .env("SKILL_LOCK_GIT_TIMEOUT", "3")
        .reply();
    let took = start.elapsed();
    a.token();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    std::fs::remove_file(&hook).unwrap();
    lock.check(a.token()).is("held");
}

#[test]
fn a_remote_that_hangs_or_refuses_is_store_unavailable_within_the_bound() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    // Accepts connections and never answers.
    let port = harness::gitd::free_port(24400);
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
        let out = Lock::new(&cwd, "s", "o/r")
            .with_env("SKILL_LOCK_STORE", &url)
            .with_env("SKILL_LOCK_GIT_CACHE", env.path("cache"))
            .with_env("SKILL_LOCK_GIT_TIMEOUT", bound.to_string())
            .op("acquire")
            .run();
        let took = start.elapsed();
        let message = out.error_message("store_unavailable");
        assert!(
            !out.stdout.contains("s3cret") && !out.stderr.contains("s3cret"),
            "a credential was printed: {}",
            out.stdout
        );
        assert!(
            took < Duration::from_secs_f64(bound + 2.0),
            "{url}: took {took:?}"
        );
        assert!(message.contains("SKILL_LOCK_GIT_TIMEOUT"), "{message}");
    }
    // Default bound: 10 s.
    let start = Instant::now();
    Lock::new(&cwd, "s", "o/r")
        .with_env(
            "SKILL_LOCK_STORE",
            format!("git:git://127.0.0.1:{port}/x.git"),
        )
        .with_env("SKILL_LOCK_GIT_CACHE", env.path("cache"))
        .op("status")
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
        let lock = Lock::new(&cwd, "s", "o/r").with_env("SKILL_LOCK_STORE", url);
        lock.op("status").run().expect_error("usage");
    }
}

#[test]
fn what_this_host_last_wrote_never_decides_once_another_host_changed_the_lock() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, Some((24400, &[])));
    let (one, two) = (
        remote.lock_as(1, &cwd, "s", "o/r"),
        remote.lock_as(2, &cwd, "s", "o/r"),
    );
    let mine = one.acquire().is("acquired");
    let t = mine.token();
    // Another machine forces it away and takes it.
    two.force_release().is("released");
    let theirs = two.acquire().is("acquired");
    // This machine still remembers its own commit as the tip: no effect.
    let r = one.renew(t).is("not_owner");
    assert_eq!(Some(r.holder().fence), theirs.fence());
    one.release(t).is("refused");
    one.acquire().is("already_running");
    two.check(theirs.token()).is("held");
    // The holder's own renew and release still work (and use what it wrote).
    two.renew(theirs.token()).is("renewed");
    two.release(theirs.token()).is("released");
    assert!(one.acquire().is("acquired").fence() > theirs.fence());
}

/// A host that never saw a lock believes it absent and pushes leased on the
/// empty value, with no read (issue 38). Right, it takes a lock never taken
/// (fence 1); wrong, the server rejects the push and nothing changes, and
/// what it answers after reading is what a read would have decided: the
/// refusal, the next fence, `others_since` from the fence it replaced.
#[test]
fn a_lock_never_seen_here_is_believed_absent_and_a_wrong_belief_changes_nothing() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    let host = |n: usize| remote.lock_as(n, &cwd, "s", "o/r");
    let first = host(1).op("acquire").since(None).reply().is("acquired");
    assert_eq!(first.fence(), Some(1));
    assert_eq!(first.others_since(), Some(false));
    // Held by another host: refused, and its holder still holds it.
    host(2).acquire().is("already_running");
    host(1).check(first.token()).is("held");
    host(1).release(first.token()).is("released");
    // Free, but taken once: the next fence, and nobody since fence 1 ...
    let third = host(3).op("acquire").since(Some(1)).reply().is("acquired");
    assert_eq!(third.fence(), Some(2));
    assert_eq!(third.others_since(), Some(false));
    host(3).release(third.token()).is("released");
    // ... while a run that saw no fence learns that someone was there.
    let fourth = host(4).op("acquire").since(None).reply().is("acquired");
    assert_eq!(fourth.fence(), Some(3));
    assert_eq!(fourth.others_since(), Some(true));
    host(2).acquire().is("already_running");
    host(4).release(fourth.token()).is("released");
    // The host whose belief was wrong now decides on what it read.
    assert_eq!(host(2).acquire().is("acquired").fence(), Some(4));
}

/// A host that only listed a lock decides a change on what `list` saw and
/// pushes leased on that commit, with no read (issue 38). Right, the
/// decision stands; wrong (the lock changed since the list), the server
/// rejects the push and nothing changes, and what it answers after reading
/// is what a read would have decided: the next fence, `others_since` from
/// the fence it replaced. A refusal changes nothing, so it is never
/// trusted on that belief: it is decided again on a read.
#[test]
fn a_lock_only_listed_here_is_decided_on_what_list_saw_and_a_wrong_belief_changes_nothing() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    let host = |n: usize| remote.lock_as(n, &cwd, "s", "o/r");
    let first = host(1).acquire().is("acquired");
    assert_eq!(first.fence(), Some(1));
    // Host 2 lists the lock held, and is refused (after a read).
    host(2).list().is("list");
    host(2).acquire().is("already_running");
    host(1).check(first.token()).is("held");
    host(1).release(first.token()).is("released");
    // Host 3 lists it free; host 4 takes and releases it since.
    host(3).list().is("list");
    let fourth = host(4).acquire().is("acquired");
    assert_eq!(fourth.fence(), Some(2));
    host(4).release(fourth.token()).is("released");
    // Host 3's belief (free at fence 1) is wrong: rejected, read, decided
    // again: the fence after host 4's, and someone was there since fence 1.
    let third = host(3).op("acquire").since(Some(1)).reply().is("acquired");
    assert_eq!(third.fence(), Some(3));
    assert_eq!(third.others_since(), Some(true));
    // Host 5 lists it held by host 3, which releases; host 5's belief
    // (held, a refusal) is not trusted: after the read it takes the lock.
    host(5).list().is("list");
    host(3).release(third.token()).is("released");
    let fifth = host(5).acquire().is("acquired");
    assert_eq!(fifth.fence(), Some(4));
    // Host 6 lists it held and is refused; host 5 still holds it.
    host(6).list().is("list");
    host(6).acquire().is("already_running");
    host(5).check(fifth.token()).is("held");
}

#[test]
fn history_is_the_refs_log_bounded_by_new_roots_and_ten_archived_chains() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    let dir = remote.remote_dir();
    let mut fences = Vec::new();
    // 13 acquire/release cycles, 26 commits, chains of 2: 12 roll-overs.
    let shallow = remote
        .lock(&cwd, "s", "o/r")
        .with_env("SKILL_LOCK_GIT_HISTORY_DEPTH", "2");
    for _ in 0..13 {
        fences.push(shallow.acquire().is("acquired").must_fence());
        shallow.op("release").expect(0, "released");
    }
    assert_eq!(
        fences,
        (1..=13).collect::<Vec<u64>>(),
        "fences survive new roots"
    );
    let count = |r: &str| {
        git_out(dir, &["rev-list", "--count", r])
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    // A fetch of the lock brings its short chain only.
    assert_eq!(count("refs/skill-lock/s@o__r"), 2);
    let archives = git_out(
        dir,
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
    let h = remote.lock(&cwd, "s", "o/r").op("history").limit(100);
    let h = h.expect(0, "history");
    let seq: Vec<(String, u64)> = h
        .events()
        .iter()
        .map(|e| (e.event.clone(), e.fence.unwrap()))
        .collect();
    let want: Vec<(String, u64)> = (3..=13)
        .flat_map(|f| [("acquired".to_owned(), f), ("released".to_owned(), f)])
        .collect();
    assert_eq!(seq, want);
    // A fresh cache (another machine) reads the same history.
    let other = remote
        .lock_as(5, &cwd, "s", "o/r")
        .store_op("history")
        .limit(3);
    let other = other.expect(0, "history");
    let e = other.events();
    assert_eq!(e.len(), 3);
    assert_eq!((e[0].fence, e[2].fence), (Some(12), Some(13)));
}

#[test]
fn a_remote_that_refuses_lock_refs_says_so_at_once() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    let hook = remote.remote_dir().join("hooks/pre-receive");
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
    let lock = remote.lock(&cwd, "s", "o/r");
    let m = lock.op("acquire").run().error_message("store_unavailable");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(m.contains("refused") && m.contains("pre-receive"), "{m}");
    // Nothing was taken.
    std::fs::remove_file(&hook).unwrap();
    assert_eq!(lock.state(), "free");
}

#[test]
fn a_pid_recorded_by_another_machine_with_our_hostname_is_never_judged() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    // A dead pid of this machine, in a record from another boot that carries
    // this machine's hostname (two CI containers are both called "runner").
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let state = foreign_state_of(-600, "runner", dead); // expires in 10 minutes
    plant(remote.remote_dir(), "s@o__r", &state);
    let here = remote.lock(&cwd, "s", "o/r").on_host("runner");
    let s = here.status();
    assert_eq!(s.state(), "held", "{s:?}");
    here.acquire().is("already_running");
    // A renewal by another run keeps the recorded owner pid.
    here.op("renew").force().expect(0, "renewed");
    let tip = git_out(
        remote.remote_dir(),
        &["show", "refs/skill-lock/s@o__r:lock.json"],
    );
    let tip: GitState = serde_json::from_str(&tip).unwrap();
    assert_eq!(tip.record.owner_pid(), Some(u64::from(dead)));
}

#[test]
fn a_server_that_drops_connections_when_busy_is_retried_within_the_deadline() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    // Two connections at a time: the others are reset by the daemon.
    let remote = Store::git(&env, Some((24400, &["--max-connections=2"])));
    let outs = race(&remote, &cwd, 16);
    one_winner(&outs, "16 racers, 2 connections");
}

#[test]
fn a_server_without_atomic_pushes_still_rolls_over() {
    let env = TestEnv::new();
    let cwd = env.dir("w");
    let remote = Store::git(&env, None);
    git_out(
        remote.remote_dir(),
        &["config", "receive.advertiseAtomic", "false"],
    );
    let shallow = remote
        .lock(&cwd, "s", "o/r")
        .with_env("SKILL_LOCK_GIT_HISTORY_DEPTH", "2");
    for f in 1..=4u64 {
        assert_eq!(shallow.acquire().is("acquired").fence(), Some(f));
        shallow.op("release").expect(0, "released");
    }
    let archives = git_out(
        remote.remote_dir(),
        &[
            "for-each-ref",
            "--format=%(refname)",
            "refs/skill-lock-archive/",
        ],
    );
    assert_eq!(archives.lines().count(), 3, "{archives}");
}
