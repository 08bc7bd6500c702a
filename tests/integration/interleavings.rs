//! Forced interleavings of the file store (SPEC §7, docs/safety.md "Each
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

use crate::harness;

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::{Cmd, Out, TestEnv};
use harness::{Lock, Reply};
use harness::{Record, json_bytes, read_json};

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

    /// The lock `skill` of `o/r`.
    fn lock(&self, skill: &str) -> Lock {
        Lock::new(&self.repo, skill, REPO)
    }

    /// `acquire --ttl 60` of `skill`, to be spawned.
    fn acquire_cmd(&self, skill: &str) -> Cmd {
        self.lock(skill).op("acquire").ttl(60)
    }

    /// Acquires `skill` with `ttl`; returns (token, fence).
    fn acquire(&self, skill: &str, ttl: u64) -> (String, u64) {
        let r = self
            .lock(skill)
            .op("acquire")
            .ttl(ttl)
            .reply()
            .is("acquired");
        (r.token().to_owned(), r.must_fence())
    }

    fn status(&self, skill: &str) -> Reply {
        self.lock(skill).status()
    }

    /// Waits until the lock is stale because its lease ran out.
    fn wait_expired(&self, skill: &str) {
        let start = Instant::now();
        loop {
            let v = self.status(skill);
            if v.state() == "stale" {
                assert_eq!(v.stale_reason(), Some("expired"), "{v:?}");
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "never expired: {v:?}"
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

    /// Rewrites the `started` time of `skill`'s record under its guard, as
    /// the store writes a record (a temporary file renamed into place).
    fn set_started(&self, skill: &str, started: &str) {
        let record = self.lock_dir(skill).join("owner.json");
        let mut v: Record = read_json(&record);
        v.started = started.to_owned();
        let mut guard = self.hold(skill);
        let tmp = self.lock_dir(skill).join("owner.json.test");
        std::fs::write(&tmp, json_bytes(&v)).unwrap();
        std::fs::rename(&tmp, &record).unwrap();
        guard.release();
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
fn finish(child: Child) -> Out {
    harness::finish(child, Duration::from_secs(20))
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

/// Asserts `r` is the reply named `result`, and returns it.
#[track_caller]
fn is(r: Reply, result: &str, all: &str) -> Reply {
    assert_eq!(r.result(), result, "{all}");
    r
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
        let a = lab.acquire_cmd(skill).spawn();
        let b = lab.acquire_cmd(skill).spawn();
        guard.wait_queued(&[&a, &b]);
        guard.release();
        let (a, b) = (finish(a), finish(b));
        let all = show(&[("a", &a), ("b", &b)]);
        let (win, lose) = match (a.code, b.code) {
            (0, 3) => (&a, &b),
            (3, 0) => (&b, &a),
            _ => panic!("{skill}: not exactly one winner:\n{all}"),
        };
        let w = is(win.reply(), "acquired", &all);
        assert_eq!(
            w.took_over_from(),
            Some(("expired", Some(*old_fence))),
            "{all}"
        );
        assert!(w.must_fence() > *old_fence, "{all}");
        let l = is(lose.reply(), "already_running", &all);
        assert_eq!(
            l.holder().fence,
            w.must_fence(),
            "the loser saw another holder:\n{all}"
        );
        let v = lab.status(skill);
        assert_eq!((v.state(), v.holder().fence), ("held", w.must_fence()));
        let lock = lab.lock(skill);
        is(lock.check(old_token), "not_owner", &all);
        is(lock.check(w.token()), "held", &all);
    }
}

/// Runs `rounds` forced races of an acquire against an operation of the old
/// holder (`old_op`, given the lock and the old token) on a lock whose lease
/// ran out; the acquire is queued first, the other after a pause. Returns
/// how often each allowed pair of outcomes happened; `judge` panics on any
/// other.
fn takeover_against(
    rounds: usize,
    name: &str,
    old_op: &dyn Fn(&Lock, &str) -> Cmd,
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
        let op = || old_op(&lab.lock(skill), old_token).spawn();
        let mut guard = lab.hold(skill);
        // Even rounds queue the acquire first, odd ones the old holder's op
        // (the kernel tends to wake the first waiter; nothing relies on it).
        let (acq, other) = if round.is_multiple_of(2) {
            let acq = lab.acquire_cmd(skill).spawn();
            guard.wait_queued(&[&acq]);
            std::thread::sleep(Duration::from_millis(20));
            (acq, op())
        } else {
            let other = op();
            guard.wait_queued(&[&other]);
            std::thread::sleep(Duration::from_millis(20));
            (lab.acquire_cmd(skill).spawn(), other)
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
        &|lock, token| lock.op("renew").token(token),
        &|lab, skill, old_fence, acq, renew| {
            let all = show(&[("acquire", acq), ("renew", renew)]);
            let v = lab.status(skill);
            let (a, r) = (acq.reply(), renew.reply());
            match (&a, &r) {
                // The renew went first: the old lease lives again, with a
                // new fence (a revival, SPEC §2.2).
                (Reply::AlreadyRunning { .. }, Reply::Renewed { was_expired, .. }) => {
                    let revived = r.must_fence();
                    assert!(*was_expired && revived > old_fence, "{all}");
                    assert_eq!(a.holder().fence, revived, "{all}");
                    assert_eq!((v.state(), v.holder().fence), ("held", revived));
                    "renew first"
                }
                // The takeover went first: the old token is powerless.
                (Reply::Acquired { .. }, Reply::NotOwner { .. }) => {
                    assert_eq!(
                        a.took_over_from(),
                        Some(("expired", Some(old_fence))),
                        "{all}"
                    );
                    assert_eq!(r.holder().fence, a.must_fence(), "{all}");
                    assert_eq!((v.state(), v.holder().fence), ("held", a.must_fence()));
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
        &|lock, token| lock.op("release").token(token),
        &|lab, skill, old_fence, acq, release| {
            let all = show(&[("acquire", acq), ("release", release)]);
            let a = is(acq.reply(), "acquired", &all);
            let v = lab.status(skill);
            assert_eq!(
                (v.state(), v.holder().fence),
                ("held", a.must_fence()),
                "{all}"
            );
            assert!(a.must_fence() > old_fence, "{all}");
            let r = release.reply();
            match &r {
                // The release went first: the acquire found the lock free.
                Reply::Released { .. } => {
                    assert_eq!(r.holder().fence, old_fence, "released a newer lock:\n{all}");
                    assert_eq!(a.took_over(), None, "{all}");
                    "release first"
                }
                // The takeover went first: the release is refused.
                Reply::Refused { .. } => {
                    assert_eq!(r.holder().fence, a.must_fence(), "{all}");
                    assert_eq!(
                        a.took_over_from(),
                        Some(("expired", Some(old_fence))),
                        "{all}"
                    );
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
    let lock = lab.lock(skill);
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..ROUNDS {
        let (token, old_fence) = lab.acquire(skill, 60);
        let release = || lock.op("release").token(&token).spawn();
        let mut guard = lab.hold(skill);
        // Alternate which one queues first; the assertions hold either way.
        let (rel, acq) = if round.is_multiple_of(2) {
            let rel = release();
            guard.wait_queued(&[&rel]);
            (rel, lab.acquire_cmd(skill).spawn())
        } else {
            let acq = lab.acquire_cmd(skill).spawn();
            guard.wait_queued(&[&acq]);
            (release(), acq)
        };
        guard.wait_queued(&[&rel, &acq]);
        guard.release();
        let (rel, acq) = (finish(rel), finish(acq));
        let all = show(&[("release", &rel), ("acquire", &acq)]);
        // The release always removes the old holder's lock, whatever the order.
        let r = is(rel.reply(), "released", &all);
        assert_eq!(r.holder().fence, old_fence, "{all}");
        let v = lab.status(skill);
        let a = acq.reply();
        let kind = match &a {
            Reply::Acquired { .. } => {
                assert_eq!(a.took_over(), None, "{all}");
                assert!(a.must_fence() > old_fence, "{all}");
                assert_eq!((v.state(), v.holder().fence), ("held", a.must_fence()));
                "release first"
            }
            Reply::AlreadyRunning { .. } => {
                assert_eq!(a.holder().fence, old_fence, "{all}");
                assert_eq!(v.state(), "free", "{all}\n{v:?}");
                "acquire first"
            }
            _ => panic!("outcomes not allowed together:\n{all}"),
        };
        *seen.entry(kind).or_insert(0) += 1;
        lock.op("release").reply();
    }
    eprintln!("release vs acquire: {seen:?}");
}

#[test]
fn create_racing_create_has_one_winner() {
    const ROUNDS: usize = 10;
    const RACERS: usize = 4;
    let lab = Lab::new();
    let skill = "create";
    let lock = lab.lock(skill);
    // Creates the layout and the guard file; the lock is free afterwards.
    let (token, mut last) = lab.acquire(skill, 60);
    is(lock.release(&token), "released", "");
    for round in 0..ROUNDS {
        let mut guard = lab.hold(skill);
        let racers: Vec<Child> = (0..RACERS)
            .map(|_| lab.acquire_cmd(skill).spawn())
            .collect();
        guard.wait_queued(&racers.iter().collect::<Vec<_>>());
        guard.release();
        let outs: Vec<Out> = racers.into_iter().map(finish).collect();
        let all = show(&outs.iter().map(|o| ("acquire", o)).collect::<Vec<_>>());
        let replies: Vec<Reply> = outs.iter().map(Out::reply).collect();
        let winners: Vec<&Reply> = replies
            .iter()
            .filter(|r| matches!(r, Reply::Acquired { .. }))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: not one winner:\n{all}");
        let w = winners[0];
        assert_eq!(w.took_over(), None, "{all}");
        assert_eq!(w.must_fence(), last + 1, "round {round}:\n{all}");
        last = w.must_fence();
        for r in replies.iter().filter(|r| r.result() != "acquired") {
            assert_eq!(
                is(r.clone(), "already_running", &all).holder().fence,
                last,
                "{all}"
            );
        }
        is(lock.op("release").reply(), "released", &all);
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
    let mut a = lab.acquire_cmd(skill).spawn();
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
    assert_eq!((v.state(), v.holder().fence), ("stale", old_fence), "{v:?}");

    guard.release();
    let got = is(finish(a).reply(), "acquired", "");
    assert_eq!(
        got.took_over_from(),
        Some(("expired", Some(old_fence))),
        "{got:?}"
    );
    assert_eq!(got.must_fence(), old_fence + 1, "{got:?}");
    is(lab.lock(skill).check(&old_token), "not_owner", "");
}

/// Fully deterministic: the test changes the lock while it holds the guard
/// (as a holder of the guard may), and the queued process decides on the
/// state it reads once it has the guard, never on one it saw before.
#[test]
fn a_queued_process_decides_on_the_state_it_reads_under_the_guard() {
    let lab = Lab::new();
    let skill = "decide";
    let lock = lab.lock(skill);
    let stash = lab.run_dir().join("stash");
    // A live record with a known token, kept aside; the lock is then free.
    let (token, f1) = lab.acquire(skill, 600);
    std::fs::rename(lab.lock_dir(skill), &stash).unwrap();
    assert_eq!(lock.state(), "free");

    // 1. Free when A queued; published under the guard; A must see it held.
    let mut guard = lab.hold(skill);
    let a = lab.acquire_cmd(skill).spawn();
    guard.wait_queued(&[&a]);
    std::fs::rename(&stash, lab.lock_dir(skill)).unwrap();
    guard.release();
    let got = is(finish(a).reply(), "already_running", "");
    assert_eq!(got.holder().fence, f1, "{got:?}");

    // 2. Held when B queued; removed under the guard (as a release does:
    //    renamed away); B must find it free and take the next fence.
    let mut guard = lab.hold(skill);
    let b = lab.acquire_cmd(skill).spawn();
    guard.wait_queued(&[&b]);
    std::fs::rename(lab.lock_dir(skill), &stash).unwrap();
    guard.release();
    let got = is(finish(b).reply(), "acquired", "");
    assert_eq!(got.took_over(), None, "{got:?}");
    assert_eq!(got.must_fence(), f1 + 1, "{got:?}");

    // 3. A renew with the stashed token queued while B holds the lock: the
    //    record it reads under the guard is B's, so it is not_owner.
    let mut guard = lab.hold(skill);
    let r = lock.op("renew").token(&token).spawn();
    guard.wait_queued(&[&r]);
    guard.release();
    let got = is(finish(r).reply(), "not_owner", "");
    assert_eq!(got.holder().fence, f1 + 1);
}

/// Readers (`status`, `check`, `list`, `history`) take no guard: they answer
/// at once while the guard is held, and see a complete state.
#[test]
fn readers_do_not_block_on_the_guard_and_see_a_complete_state() {
    let lab = Lab::new();
    let skill = "readers";
    let lock = lab.lock(skill);
    let (token, f) = lab.acquire(skill, 600);
    let mut guard = lab.hold(skill);
    // A writer queued behind the test proves the guard really is held.
    let writer = lock.op("renew").token(&token).spawn();
    guard.wait_queued(&[&writer]);

    let t = Instant::now();
    let status = finish(lock.op("status").spawn());
    // Every field of the holder is on the wire, `null` or a value: its typed
    // mirror requires each (`renewed`, `note` and `owner_pid` too).
    let v = status.reply();
    assert_eq!(v.state(), "held", "{v:?}");
    let h = v.holder();
    assert_eq!(
        (h.skill.as_str(), h.repo.as_str(), h.fence),
        (skill, REPO, f)
    );
    let check = finish(lock.op("check").token(&token).spawn()).reply();
    assert_eq!(is(check, "held", "").must_fence(), f);
    let list = finish(lock.store_op("list").spawn()).reply();
    let Reply::List { locks, .. } = &list else {
        panic!("not a list: {list:?}");
    };
    assert_eq!(locks.len(), 1, "{list:?}");
    assert_eq!(locks[0].state, "held", "{list:?}");
    let history = finish(lock.op("history").spawn()).reply();
    let Reply::History { events, .. } = &history else {
        panic!("not a history: {history:?}");
    };
    assert_eq!(
        events.first().map(|e| e.event.as_str()),
        Some("acquired"),
        "{history:?}"
    );
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
    let got = is(finish(writer).reply(), "renewed", "");
    assert_eq!(got.must_fence(), f);
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
    use skill_lock::clock::Now;
    use skill_lock::engine::{self, AcquireRequest, Clock, Context};
    use skill_lock::key::LockKey;
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
    let lock = lab.lock(skill);
    let (token, _) = lab.acquire(skill, 60);
    is(lock.release(&token), "released", "");
    let mut guard = lab.hold(skill);
    let a = lock.op("acquire").ttl(1).spawn();
    guard.wait_queued(&[&a]);
    std::thread::sleep(Duration::from_millis(2_100));
    guard.release();
    let got = is(finish(a).reply(), "acquired", "");
    // Right after `acquired` with --ttl 1, the lease must still be live.
    let check = lock.check(got.token());
    assert_eq!(
        check.result(),
        "held",
        "acquired {got:?}\nthen check: {check:?}"
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
    let lock = lab.lock(skill);
    let (token, _f) = lab.acquire(skill, 600);
    // A valid RFC 3339 time: one minute past midnight of year 0 in +00:01.
    lab.set_started(skill, "0000-01-01T00:00:00+00:01");
    let before = lock.status();
    assert_eq!(
        (before.state(), before.stale_reason()),
        ("stale", Some("corrupt")),
        "{before:?}"
    );
    let renew = lock.renew(&token);
    assert!(matches!(renew, Reply::NotHeld { .. }), "{renew:?}");
    let after = lock.status();
    assert_eq!(after.stale_reason(), Some("corrupt"), "{after:?}");
    let taken = lock.acquire().is("acquired");
    assert_eq!(
        taken.took_over_from().map(|(reason, _)| reason),
        Some("corrupt"),
        "{taken:?}"
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
    let lock = lab.lock(skill);
    lab.acquire(skill, 600);
    lab.set_started(skill, "9999-12-31T23:59:59-00:01");
    let got = lock.status();
    assert_eq!(got.stale_reason(), Some("corrupt"), "{got:?}");
    let taken = lock.acquire().is("acquired");
    assert_eq!(
        taken.took_over_from().map(|(reason, _)| reason),
        Some("corrupt"),
        "{taken:?}"
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
