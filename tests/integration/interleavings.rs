//! Forced interleavings of the file store (SPEC §7, docs/design.md "Each
//! interleaving"): the test takes a lock's guard itself
//! (`run/keys/<name>.guard`, an exclusive `flock`), starts real processes of
//! the binary, which queue on that flock (seen in `/proc/locks`), changes the
//! state or not, and lets them go by releasing the guard.
//!
//! `flock` does not wake waiters in FIFO order, so tests with two or more
//! queued processes assert which *pairs of outcomes* are allowed and that
//! there is exactly one winner, never an order. The tests with one queued
//! process are fully deterministic.
//!
//! Covers: SPEC §7.

use crate::common;

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Cmd, Out, TestEnv, Value};

const REPO: &str = "o/r";

/// One git repository and helpers around its locks.
struct Lab {
    _env: TestEnv,
    repo: PathBuf,
}

impl Lab {
    fn new() -> Self {
        let env = TestEnv::new();
        let repo = env.git_repo("repo");
        Self { _env: env, repo }
    }

    fn run_dir(&self) -> PathBuf {
        self.repo.join(".git/apache-magpie/run")
    }

    fn guard_path(&self, skill: &str) -> PathBuf {
        self.run_dir()
            .join("keys")
            .join(format!("{skill}@o__r.guard"))
    }

    fn lock_dir(&self, skill: &str) -> PathBuf {
        self.run_dir()
            .join("locks")
            .join(format!("{skill}@o__r.lock"))
    }

    fn run(&self, args: &[&str]) -> Out {
        Cmd::new(&self.repo).args(args).run()
    }

    fn spawn(&self, args: &[&str]) -> Child {
        Cmd::new(&self.repo)
            .args(args)
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts")
    }

    /// Acquires `skill` with `ttl`; returns (token, fence).
    fn acquire(&self, skill: &str, ttl: u64) -> (String, u64) {
        let ttl = ttl.to_string();
        let out = self.run(&["acquire", skill, "--repo", REPO, "--ttl", &ttl]);
        let v = out.expect(0, "acquired");
        (v["token"].as_str().unwrap().to_owned(), fence(v))
    }

    fn status(&self, skill: &str) -> Value {
        self.run(&["status", skill, "--repo", REPO])
            .expect(0, "status")
            .clone()
    }

    /// Waits until the lock is stale because its lease ran out.
    fn wait_expired(&self, skill: &str) {
        let start = Instant::now();
        loop {
            let v = self.status(skill);
            if v["state"] == "stale" {
                assert_eq!(v["stale_reason"], "expired", "{v}");
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "never expired: {v}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes the guard of `skill` the way the tool does (exclusive flock).
    fn hold(&self, skill: &str) -> Held {
        let path = self.guard_path(skill);
        let file = File::options()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        file.lock().unwrap();
        let inode = file.metadata().unwrap().ino();
        Held {
            file: Some(file),
            inode,
        }
    }
}

/// The test's hold on a guard; dropping it (or `release`) lets the waiters go.
struct Held {
    file: Option<File>,
    inode: u64,
}

impl Held {
    fn release(&mut self) {
        self.file.take();
    }

    /// Waits until every one of `children` is queued on this guard's flock.
    fn wait_queued(&self, children: &[&Child]) {
        let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
        let start = Instant::now();
        loop {
            let Ok(text) = std::fs::read_to_string("/proc/locks") else {
                // No /proc/locks: a generous pause instead.
                std::thread::sleep(Duration::from_millis(500));
                return;
            };
            let waiting = waiters(&text, self.inode);
            if pids.iter().all(|p| waiting.contains(p)) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "processes {pids:?} never queued on the guard (waiters {waiting:?})"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Pids blocked (`->` lines of /proc/locks) on the file with this inode.
fn waiters(proc_locks: &str, inode: u64) -> Vec<u32> {
    let suffix = format!(":{inode}");
    proc_locks
        .lines()
        .filter_map(|line| {
            let t: Vec<&str> = line.split_whitespace().collect();
            let at = t.iter().position(|&x| x == "->")?;
            let pid = t.get(at + 4)?.parse().ok()?;
            t.get(at + 5)?.ends_with(&suffix).then_some(pid)
        })
        .collect()
}

/// Waits (bounded) for a child and decodes its one JSON object.
fn finish(mut child: Child) -> Out {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().ok();
            panic!("process {} did not finish", child.id());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Out::from(child.wait_with_output().unwrap())
}

fn fence(v: &Value) -> u64 {
    v["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no fence: {v}"))
}

fn holder_fence(v: &Value) -> u64 {
    v["holder"]["fence"]
        .as_u64()
        .unwrap_or_else(|| panic!("no holder fence: {v}"))
}

fn show(outs: &[(&str, &Out)]) -> String {
    outs.iter()
        .map(|(what, o)| format!("{what}: exit {} {}", o.code, o.stdout.trim_end()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn wchan(child: &Child) -> String {
    std::fs::read_to_string(format!("/proc/{}/wchan", child.id())).unwrap_or_default()
}

#[test]
fn two_takeovers_of_one_stale_lock_exactly_one_wins() {
    const ROUNDS: usize = 20;
    let lab = Lab::new();
    let skills: Vec<String> = (0..ROUNDS).map(|i| format!("takeover{i}")).collect();
    // All the old leases run out together; then one forced race per lock.
    let old: Vec<(String, u64)> = skills.iter().map(|s| lab.acquire(s, 1)).collect();
    for s in &skills {
        lab.wait_expired(s);
    }
    for (skill, (old_token, old_fence)) in skills.iter().zip(&old) {
        let mut guard = lab.hold(skill);
        let a = lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "60"]);
        let b = lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "60"]);
        guard.wait_queued(&[&a, &b]);
        guard.release();
        let (a, b) = (finish(a), finish(b));
        let all = show(&[("a", &a), ("b", &b)]);
        let (win, lose) = match (a.code, b.code) {
            (0, 3) => (&a, &b),
            (3, 0) => (&b, &a),
            _ => panic!("{skill}: not exactly one winner:\n{all}"),
        };
        let w = win.expect(0, "acquired");
        assert_eq!(w["took_over"]["reason"], "expired", "{all}");
        assert_eq!(holder_fence(&w["took_over"]), *old_fence, "{all}");
        assert!(fence(w) > *old_fence, "{all}");
        let l = lose.expect(3, "already_running");
        assert_eq!(
            holder_fence(l),
            fence(w),
            "the loser saw another holder:\n{all}"
        );
        let v = lab.status(skill);
        assert_eq!(
            (v["state"].as_str(), holder_fence(&v)),
            (Some("held"), fence(w))
        );
        lab.run(&["check", skill, "--repo", REPO, "--token", old_token])
            .expect(4, "not_owner");
        let token = w["token"].as_str().unwrap();
        lab.run(&["check", skill, "--repo", REPO, "--token", token])
            .expect(0, "held");
    }
}

/// Runs `rounds` forced races of an acquire against an operation of the old
/// holder (`old_op`, given the old token) on a lock whose lease ran out; the
/// acquire is queued first, the other after a pause. Returns how often each
/// allowed pair of outcomes happened; `judge` panics on any other.
fn takeover_against(
    rounds: usize,
    name: &str,
    old_op: &dyn Fn(&str, &str) -> Vec<String>,
    judge: &dyn Fn(&Lab, &str, u64, &Out, &Out) -> &'static str,
) -> std::collections::BTreeMap<&'static str, usize> {
    let lab = Lab::new();
    let skills: Vec<String> = (0..rounds).map(|i| format!("{name}{i}")).collect();
    let old: Vec<(String, u64)> = skills.iter().map(|s| lab.acquire(s, 1)).collect();
    for s in &skills {
        lab.wait_expired(s);
    }
    let mut seen = std::collections::BTreeMap::new();
    for (round, (skill, (old_token, old_fence))) in skills.iter().zip(&old).enumerate() {
        let args = old_op(skill, old_token);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let acquire = ["acquire", skill.as_str(), "--repo", REPO, "--ttl", "60"];
        let mut guard = lab.hold(skill);
        // Even rounds queue the acquire first, odd ones the old holder's op
        // (the kernel tends to wake the first waiter; nothing relies on it).
        let (acq, other) = if round.is_multiple_of(2) {
            let acq = lab.spawn(&acquire);
            guard.wait_queued(&[&acq]);
            std::thread::sleep(Duration::from_millis(20));
            (acq, lab.spawn(&args))
        } else {
            let other = lab.spawn(&args);
            guard.wait_queued(&[&other]);
            std::thread::sleep(Duration::from_millis(20));
            (lab.spawn(&acquire), other)
        };
        guard.wait_queued(&[&acq, &other]);
        guard.release();
        let (acq, other) = (finish(acq), finish(other));
        *seen
            .entry(judge(&lab, skill, *old_fence, &acq, &other))
            .or_default() += 1;
    }
    seen
}

#[test]
fn takeover_racing_a_renew_by_the_old_holder() {
    let seen = takeover_against(
        10,
        "renewrace",
        &|skill, token| {
            ["renew", skill, "--repo", REPO, "--token", token]
                .map(str::to_owned)
                .to_vec()
        },
        &|lab, skill, old_fence, acq, renew| {
            let all = show(&[("acquire", acq), ("renew", renew)]);
            let v = lab.status(skill);
            match (acq.code, renew.code) {
                // The renew went first: the old lease lives again.
                (3, 0) => {
                    let r = renew.expect(0, "renewed");
                    assert_eq!(
                        (r["was_expired"].as_bool(), fence(r)),
                        (Some(true), old_fence),
                        "{all}"
                    );
                    assert_eq!(
                        holder_fence(acq.expect(3, "already_running")),
                        old_fence,
                        "{all}"
                    );
                    assert_eq!(
                        (v["state"].as_str(), holder_fence(&v)),
                        (Some("held"), old_fence)
                    );
                    "renew first"
                }
                // The takeover went first: the old token is powerless.
                (0, 4) => {
                    let a = acq.expect(0, "acquired");
                    assert_eq!(a["took_over"]["reason"], "expired", "{all}");
                    assert_eq!(holder_fence(&a["took_over"]), old_fence, "{all}");
                    let r = renew.expect(4, "not_owner");
                    assert_eq!(holder_fence(r), fence(a), "{all}");
                    assert_eq!(
                        (v["state"].as_str(), holder_fence(&v)),
                        (Some("held"), fence(a))
                    );
                    "takeover first"
                }
                _ => panic!("{skill}: outcomes not allowed together:\n{all}"),
            }
        },
    );
    eprintln!("takeover vs renew: {seen:?}");
}

#[test]
fn takeover_racing_a_token_release_by_the_old_holder() {
    let seen = takeover_against(
        10,
        "releaserace",
        &|skill, token| {
            ["release", skill, "--repo", REPO, "--token", token]
                .map(str::to_owned)
                .to_vec()
        },
        &|lab, skill, old_fence, acq, release| {
            let all = show(&[("acquire", acq), ("release", release)]);
            let a = acq.expect(0, "acquired");
            let v = lab.status(skill);
            assert_eq!(
                (v["state"].as_str(), holder_fence(&v)),
                (Some("held"), fence(a)),
                "{all}"
            );
            assert!(fence(a) > old_fence, "{all}");
            match release.code {
                // The release went first: the acquire found the lock free.
                0 => {
                    let r = release.expect(0, "released");
                    assert_eq!(holder_fence(r), old_fence, "released a newer lock:\n{all}");
                    assert!(a["took_over"].is_null(), "{all}");
                    "release first"
                }
                // The takeover went first: the release is refused.
                4 => {
                    let r = release.expect(4, "refused");
                    assert_eq!(holder_fence(r), fence(a), "{all}");
                    assert_eq!(a["took_over"]["reason"], "expired", "{all}");
                    assert_eq!(holder_fence(&a["took_over"]), old_fence, "{all}");
                    "takeover first"
                }
                _ => panic!("{skill}: outcomes not allowed together:\n{all}"),
            }
        },
    );
    eprintln!("takeover vs release: {seen:?}");
}

#[test]
fn release_racing_acquire() {
    const ROUNDS: usize = 10;
    let lab = Lab::new();
    let skill = "relacq";
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..ROUNDS {
        let (token, old_fence) = lab.acquire(skill, 60);
        let release = ["release", skill, "--repo", REPO, "--token", &token];
        let acquire = ["acquire", skill, "--repo", REPO, "--ttl", "60"];
        let mut guard = lab.hold(skill);
        // Alternate which one queues first; the assertions hold either way.
        let (rel, acq) = if round.is_multiple_of(2) {
            let rel = lab.spawn(&release);
            guard.wait_queued(&[&rel]);
            (rel, lab.spawn(&acquire))
        } else {
            let acq = lab.spawn(&acquire);
            guard.wait_queued(&[&acq]);
            (lab.spawn(&release), acq)
        };
        guard.wait_queued(&[&rel, &acq]);
        guard.release();
        let (rel, acq) = (finish(rel), finish(acq));
        let all = show(&[("release", &rel), ("acquire", &acq)]);
        // The release always removes the old holder's lock, whatever the order.
        assert_eq!(holder_fence(rel.expect(0, "released")), old_fence, "{all}");
        let v = lab.status(skill);
        let kind = match acq.code {
            0 => {
                let a = acq.expect(0, "acquired");
                assert!(a["took_over"].is_null(), "{all}");
                assert!(fence(a) > old_fence, "{all}");
                assert_eq!(
                    (v["state"].as_str(), holder_fence(&v)),
                    (Some("held"), fence(a))
                );
                "release first"
            }
            3 => {
                assert_eq!(
                    holder_fence(acq.expect(3, "already_running")),
                    old_fence,
                    "{all}"
                );
                assert_eq!(v["state"], "free", "{all}\n{v}");
                "acquire first"
            }
            _ => panic!("outcomes not allowed together:\n{all}"),
        };
        *seen.entry(kind).or_insert(0) += 1;
        lab.run(&["release", skill, "--repo", REPO]);
    }
    eprintln!("release vs acquire: {seen:?}");
}

#[test]
fn create_racing_create_has_one_winner() {
    const ROUNDS: usize = 10;
    const RACERS: usize = 4;
    let lab = Lab::new();
    let skill = "create";
    // Creates the layout and the guard file; the lock is free afterwards.
    let (token, mut last) = lab.acquire(skill, 60);
    lab.run(&["release", skill, "--repo", REPO, "--token", &token])
        .expect(0, "released");
    for round in 0..ROUNDS {
        let mut guard = lab.hold(skill);
        let racers: Vec<Child> = (0..RACERS)
            .map(|_| lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "60"]))
            .collect();
        guard.wait_queued(&racers.iter().collect::<Vec<_>>());
        guard.release();
        let outs: Vec<Out> = racers.into_iter().map(finish).collect();
        let all = show(&outs.iter().map(|o| ("acquire", o)).collect::<Vec<_>>());
        let winners: Vec<&Out> = outs.iter().filter(|o| o.code == 0).collect();
        assert_eq!(winners.len(), 1, "round {round}: not one winner:\n{all}");
        let w = winners[0].expect(0, "acquired");
        assert!(w["took_over"].is_null(), "{all}");
        assert_eq!(fence(w), last + 1, "round {round}:\n{all}");
        last = fence(w);
        for o in outs.iter().filter(|o| o.code != 0) {
            assert_eq!(holder_fence(o.expect(3, "already_running")), last, "{all}");
        }
        lab.run(&["release", skill, "--repo", REPO])
            .expect(0, "released");
    }
}

/// Fully deterministic: one queued acquirer, observed blocked, then let go.
#[test]
fn a_queued_acquirer_blocks_until_the_guard_is_released() {
    let lab = Lab::new();
    let skill = "blocked";
    let (old_token, old_fence) = lab.acquire(skill, 1);
    lab.wait_expired(skill);

    let mut guard = lab.hold(skill);
    let mut a = lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "60"]);
    guard.wait_queued(&[&a]);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        a.try_wait().unwrap().is_none(),
        "A finished while the guard was held"
    );
    // Informational: where the kernel has A sleeping (e.g. locks_lock_inode_wait).
    eprintln!("A (pid {}) waits in {:?}", a.id(), wchan(&a).trim());
    // Nothing changed meanwhile: the old lease is still the stale one.
    let v = lab.status(skill);
    assert_eq!(
        (v["state"].as_str(), holder_fence(&v)),
        (Some("stale"), old_fence),
        "{v}"
    );

    guard.release();
    let out = finish(a);
    let got = out.expect(0, "acquired");
    assert_eq!(got["took_over"]["reason"], "expired", "{got}");
    assert_eq!(holder_fence(&got["took_over"]), old_fence, "{got}");
    assert_eq!(fence(got), old_fence + 1, "{got}");
    lab.run(&["check", skill, "--repo", REPO, "--token", &old_token])
        .expect(4, "not_owner");
}

/// Fully deterministic: the test changes the lock while it holds the guard
/// (as a holder of the guard may), and the queued process decides on the
/// state it reads once it has the guard, never on one it saw before.
#[test]
fn a_queued_process_decides_on_the_state_it_reads_under_the_guard() {
    let lab = Lab::new();
    let skill = "decide";
    let stash = lab.run_dir().join("stash");
    // A live record with a known token, kept aside; the lock is then free.
    let (token, f1) = lab.acquire(skill, 600);
    std::fs::rename(lab.lock_dir(skill), &stash).unwrap();
    assert_eq!(lab.status(skill)["state"], "free");

    // 1. Free when A queued; published under the guard; A must see it held.
    let mut guard = lab.hold(skill);
    let a = lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "60"]);
    guard.wait_queued(&[&a]);
    std::fs::rename(&stash, lab.lock_dir(skill)).unwrap();
    guard.release();
    let out = finish(a);
    assert_eq!(
        holder_fence(out.expect(3, "already_running")),
        f1,
        "{}",
        out.stdout
    );

    // 2. Held when B queued; removed under the guard (as a release does:
    //    renamed away); B must find it free and take the next fence.
    let mut guard = lab.hold(skill);
    let b = lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "60"]);
    guard.wait_queued(&[&b]);
    std::fs::rename(lab.lock_dir(skill), &stash).unwrap();
    guard.release();
    let out = finish(b);
    let got = out.expect(0, "acquired");
    assert!(got["took_over"].is_null(), "{got}");
    assert_eq!(fence(got), f1 + 1, "{got}");

    // 3. A renew with the stashed token queued while B holds the lock: the
    //    record it reads under the guard is B's, so it is not_owner.
    let mut guard = lab.hold(skill);
    let r = lab.spawn(&["renew", skill, "--repo", REPO, "--token", &token]);
    guard.wait_queued(&[&r]);
    guard.release();
    let out = finish(r);
    assert_eq!(holder_fence(out.expect(4, "not_owner")), f1 + 1);
}

/// Readers (`status`, `check`, `list`, `history`) take no guard: they answer
/// at once while the guard is held, and see a complete state.
#[test]
fn readers_do_not_block_on_the_guard_and_see_a_complete_state() {
    let lab = Lab::new();
    let skill = "readers";
    let (token, f) = lab.acquire(skill, 600);
    let mut guard = lab.hold(skill);
    // A writer queued behind the test proves the guard really is held.
    let writer = lab.spawn(&["renew", skill, "--repo", REPO, "--token", &token]);
    guard.wait_queued(&[&writer]);

    let t = Instant::now();
    let status = finish(lab.spawn(&["status", skill, "--repo", REPO]));
    let v = status.expect(0, "status");
    assert_eq!(v["state"], "held", "{v}");
    let h = &v["holder"];
    for field in [
        "skill",
        "repo",
        "started",
        "expires",
        "renewed",
        "ttl",
        "note",
        "host",
        "owner_pid",
        "fence",
    ] {
        assert!(h.get(field).is_some(), "holder lacks {field}: {h}");
    }
    assert_eq!(
        (h["skill"].as_str(), h["repo"].as_str(), holder_fence(v)),
        (Some(skill), Some(REPO), f)
    );
    let check = finish(lab.spawn(&["check", skill, "--repo", REPO, "--token", &token]));
    assert_eq!(fence(check.expect(0, "held")), f);
    let list = finish(lab.spawn(&["list"]));
    let l = list.expect(0, "list");
    assert_eq!(l["locks"].as_array().map(Vec::len), Some(1), "{l}");
    assert_eq!(l["locks"][0]["state"], "held", "{l}");
    let history = finish(lab.spawn(&["history", skill, "--repo", REPO]));
    let ev = history.expect(0, "history");
    assert_eq!(ev["events"][0]["event"], "acquired", "{ev}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "readers took {:?} with the guard held",
        t.elapsed()
    );

    let mut writer = writer;
    assert!(
        writer.try_wait().unwrap().is_none(),
        "the writer did not wait for the guard"
    );
    guard.release();
    let out = finish(writer);
    assert_eq!(fence(out.expect(0, "renewed")), f);
}

/// Was BUG-1 (docs/stress.md), fixed: a reader takes no guard and reads a lock in two
/// looks (is the directory there? then its record). A takeover renames the
/// old directory away and the new one into place between those looks, so
/// the reader finds the directory without a record and reports `corrupt`
/// (status: stale/corrupt, check: not_owner with a null holder, list).
/// A takeover now rewrites the record in place, so the reader must not see
/// the lock free either (a release's first look answered `not_held` in the
/// old gap). Driven in-process through the library with a clock moved ahead
/// so that every acquire is a takeover.
#[test]
fn a_reader_never_sees_corrupt_during_a_takeover() {
    use skill_lock::engine::{self, AcquireRequest, Clock, Context};
    use skill_lock::key::LockKey;
    use skill_lock::lease::Now;
    use skill_lock::store::fs::FileStore;
    use skill_lock::store::{Current, Store};

    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::new(dir.path());
    let key = LockKey::new("reader", REPO).unwrap();
    let req = AcquireRequest {
        ttl: 1,
        note: None,
        owner_pid: None,
        owner_pgid: None,
        since: None,
    };
    let stop = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    let corrupt: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut takeovers = 0i64;
    let takeovers_seen = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    // Read before the lock is looked at: once the first
                    // acquire has returned, the lock must never look free.
                    let lock_existed = takeovers_seen.load(Ordering::SeqCst);
                    match store.read(&key).unwrap() {
                        Current::Corrupt(why) => {
                            corrupt.lock().unwrap().push(why);
                            stop.store(true, Ordering::Relaxed);
                        }
                        Current::Free if lock_existed => {
                            corrupt.lock().unwrap().push("free".to_owned());
                            stop.store(true, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let base = Context::here();
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(5) {
            let mut ctx = base.clone();
            // Two seconds later each time: the previous 1 s lease has run out.
            // The clock is pinned (`Clock::Fixed`), or the decision would read
            // the real one and find the lease live.
            ctx.now = Now {
                wall_ms: base.now.wall_ms + takeovers * 2000,
                boot: None,
            };
            ctx.clock = Clock::Fixed(ctx.now.clone());
            let got = engine::acquire(&store, &key, &req, &ctx).unwrap();
            // Every acquire but the first must be a takeover, or the test proves nothing.
            let took_over = matches!(
                got,
                engine::Acquire::Acquired {
                    took_over: Some(_),
                    ..
                }
            );
            assert!(took_over || takeovers == 0, "not a takeover: {got:?}");
            takeovers += 1;
            takeovers_seen.store(true, Ordering::SeqCst);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let corrupt = corrupt.into_inner().unwrap();
    eprintln!(
        "{takeovers} takeovers, {} reads",
        reads.load(Ordering::Relaxed)
    );
    assert!(
        corrupt.is_empty(),
        "after {takeovers} takeovers and {} reads, a reader saw: {corrupt:?}",
        reads.load(Ordering::Relaxed)
    );
    assert!(takeovers > 100, "only {takeovers} takeovers");
}

/// Was BUG-2 (docs/stress.md), fixed: an acquire reads the clock before it waits for
/// the guard and computes the lease from that reading, so the time spent
/// queued is taken off the lease: it can report `acquired` with a lease that
/// has already run out, and the next acquirer takes it over at once.
#[test]
fn a_lease_is_never_shorter_than_asked_when_the_guard_was_busy() {
    let lab = Lab::new();
    let skill = "shortened";
    let (token, _) = lab.acquire(skill, 60);
    lab.run(&["release", skill, "--repo", REPO, "--token", &token])
        .expect(0, "released");
    let mut guard = lab.hold(skill);
    let a = lab.spawn(&["acquire", skill, "--repo", REPO, "--ttl", "1"]);
    guard.wait_queued(&[&a]);
    std::thread::sleep(Duration::from_millis(2_100));
    guard.release();
    let out = finish(a);
    let got = out.expect(0, "acquired").clone();
    let token = got["token"].as_str().unwrap();
    // Right after `acquired` with --ttl 1, the lease must still be live.
    let check = lab.run(&["check", skill, "--repo", REPO, "--token", token]);
    assert_eq!(
        (check.code, check.json["result"].as_str()),
        (0, Some("held")),
        "acquired {got}\nthen check: {}",
        check.stdout
    );
}

/// Was BUG-3 (docs/stress.md, found by `fuzz/` target `record_parse`), fixed:
/// a record whose time, normalized to UTC, falls outside years 0000..=9999
/// used to parse, but was written back in a form that does not parse, so a
/// renewal turned a held lock unreadable. Now such a time is refused when the
/// record is read: the lock is `corrupt` from the start and stays so, renew
/// refuses it (`not_held`, exit 4) and the next acquire takes it over.
#[test]
fn a_record_with_an_unwritable_time_is_corrupt_consistently() {
    let lab = Lab::new();
    let skill = "roundtrip";
    let (token, _f) = lab.acquire(skill, 600);
    let record = lab.lock_dir(skill).join("owner.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    // A valid RFC 3339 time: one minute past midnight of year 0 in +00:01.
    v["started"] = Value::from("0000-01-01T00:00:00+00:01");
    let mut guard = lab.hold(skill);
    let tmp = lab.lock_dir(skill).join("owner.json.test");
    std::fs::write(&tmp, serde_json::to_vec(&v).unwrap()).unwrap();
    std::fs::rename(&tmp, &record).unwrap();
    guard.release();
    let before = lab.status(skill);
    assert_eq!(
        (before["state"].as_str(), before["stale_reason"].as_str()),
        (Some("stale"), Some("corrupt")),
        "{before}"
    );
    let renew = lab.run(&["renew", skill, "--repo", REPO, "--token", &token]);
    renew.expect(4, "not_held");
    let after = lab.status(skill);
    assert_eq!(after["stale_reason"], "corrupt", "{after}");
    let taken = lab.run(&["acquire", skill, "--repo", REPO]);
    assert_eq!(
        taken.expect(0, "acquired")["took_over"]["reason"],
        "corrupt"
    );
}

/// Was BUG-4 (docs/stress.md; a regression of the first BUG-3 fix), fixed:
/// `Timestamp::parse` converted the parsed time to UTC with
/// `OffsetDateTime::to_offset`, which panics when the UTC form is past year
/// 9999 (`9999-12-31T23:59:59-00:01` is 10000-01-01T00:00:59Z). Every command
/// that read such a record died with a panic (exit 101, no JSON), acquire
/// and `release --force` included, so the lock was stuck until someone
/// deleted it by hand. Expected: the record is corrupt (stale), and the next
/// acquire takes it over.
#[test]
fn a_record_with_a_time_past_year_9999_in_utc_is_corrupt_not_a_crash() {
    let lab = Lab::new();
    let skill = "year10000";
    lab.acquire(skill, 600);
    let record = lab.lock_dir(skill).join("owner.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    v["started"] = Value::from("9999-12-31T23:59:59-00:01");
    let mut guard = lab.hold(skill);
    let tmp = lab.lock_dir(skill).join("owner.json.test");
    std::fs::write(&tmp, serde_json::to_vec(&v).unwrap()).unwrap();
    std::fs::rename(&tmp, &record).unwrap();
    guard.release();
    let status = lab.run(&["status", skill, "--repo", REPO]);
    let got = status.expect(0, "status");
    assert_eq!(got["stale_reason"], "corrupt", "{got}");
    let taken = lab.run(&["acquire", skill, "--repo", REPO]);
    assert_eq!(
        taken.expect(0, "acquired")["took_over"]["reason"],
        "corrupt"
    );
}

#[test]
fn waiters_parses_proc_locks() {
    let text = "1: FLOCK  ADVISORY  WRITE 1844 fe:00:10215610 0 EOF\n\
                1: -> FLOCK  ADVISORY  WRITE 1848 fe:00:10215610 0 EOF\n\
                1:  -> FLOCK  ADVISORY  WRITE 1850 fe:00:10215610 0 EOF\n\
                2: -> FLOCK  ADVISORY  WRITE 1851 fe:00:10215611 0 EOF\n";
    assert_eq!(waiters(text, 10_215_610), vec![1848, 1850]);
}
