//! Concurrency proofs of SPEC §6 and §7 for the file store: many real
//! processes of the binary racing over one lock in a temporary git repository.
//!
//! Racers are released together through a gate: each is started as
//! `bash -c 'read -r _ < FIFO; exec skill-lock ...'`, and the test, which holds
//! the FIFO open for reading and writing, writes one line per racer once all
//! are started, so they all run `skill-lock` at the same moment.
//!
//! Covers: SPEC §6, §7.

use crate::harness;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use harness::chaos::Seed;
use harness::{Cmd, Out, TestEnv};
use harness::{Holder, Lock, Reply};

const SKILL: &str = "race";
const REPO: &str = "o/r";

/// The start line of a race (see the module comment).
struct Gate {
    path: PathBuf,
    fifo: File,
}

impl Gate {
    fn new(env: &TestEnv, name: &str) -> Self {
        let path = env.path(name);
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(
            rc,
            0,
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        // Read-write: opening never blocks, and the racers never see EOF.
        let fifo = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        Self { path, fifo }
    }

    /// `cmd` (its program, arguments, directory and environment), started
    /// behind the gate.
    fn spawn(&self, cmd: Cmd) -> Child {
        let script = OsStr::new(r#"IFS= read -r _ < "$0" || exit 97; exec "$@""#);
        cmd.through("bash", &[OsStr::new("-c"), script, self.path.as_os_str()])
            .spawn()
    }

    /// Starts every command, lets them all go at once, returns their outputs in order.
    fn race(&mut self, cmds: Vec<Cmd>) -> Vec<Out> {
        let children: Vec<Child> = cmds.into_iter().map(|c| self.spawn(c)).collect();
        // Give the shells a moment to reach the gate (not required for correctness).
        std::thread::sleep(Duration::from_millis(30));
        self.fifo
            .write_all("\n".repeat(children.len()).as_bytes())
            .unwrap();
        children
            .into_iter()
            .map(|c| Out::from(c.wait_with_output().expect("racer ends")))
            .collect()
    }
}

/// The lock every race here is about.
fn lock(repo: &Path) -> Lock {
    Lock::new(repo, SKILL, REPO)
}

/// `n` acquires of the lock with a `ttl` lease.
fn acquires(repo: &Path, n: usize, ttl: u64) -> Vec<Cmd> {
    (0..n).map(|_| lock(repo).op("acquire").ttl(ttl)).collect()
}

fn describe(outs: &[Out]) -> String {
    outs.iter()
        .map(|o| {
            format!(
                "  exit {}: {}{}",
                o.code,
                o.stdout.trim_end(),
                o.stderr.trim_end()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `status` until the lock is stale (a ttl-1 lease runs out within 2 s).
#[track_caller]
fn wait_stale(repo: &Path, reason: &str) -> Reply {
    let start = Instant::now();
    loop {
        let v = lock(repo).status();
        match v.state() {
            "stale" => {
                assert_eq!(v.stale_reason(), Some(reason), "{v:?}");
                return v;
            }
            "held" => {}
            _ => panic!("lock neither held nor stale while waiting for its lease to end: {v:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "lock still held 15 s after being taken with a short lease: {v:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts a holder record is complete (SPEC §4). Its typed mirror has
/// every field and refuses any other (`token`, `token_sha256`...).
#[track_caller]
fn assert_complete_holder(h: &Holder, context: &str) {
    assert_eq!(
        (h.skill.as_str(), h.repo.as_str()),
        (SKILL, REPO),
        "{context}: {h:?}"
    );
    for (f, t) in [("started", &h.started), ("expires", &h.expires)] {
        assert!(t.ends_with('Z'), "{context}: {f} not UTC in {h:?}");
    }
    assert!(h.ttl > 0, "{context}: ttl missing in {h:?}");
    assert!(h.fence > 0, "{context}: fence missing in {h:?}");
}

/// Splits a race of acquirers into the one winner and the losers, asserting
/// that every racer either acquired (0) or found the lock held (3).
#[track_caller]
fn one_winner(outs: &[Out], round: usize) -> Reply {
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for o in outs {
        match o.reply() {
            w @ Reply::Acquired { .. } => winners.push(w),
            l @ Reply::AlreadyRunning { .. } => losers.push(l),
            _ => panic!(
                "round {round}: racer neither acquired nor found it held:\n{}",
                describe(outs)
            ),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "round {round}: expected exactly one winner:\n{}",
        describe(outs)
    );
    let w = winners.pop().unwrap();
    // Every loser saw the winner's lock, not some other record.
    for l in &losers {
        assert_eq!(
            l.holder().fence,
            w.must_fence(),
            "round {round}: loser saw another holder: {l:?}"
        );
        assert_complete_holder(l.holder(), "already_running");
    }
    w
}

#[track_caller]
fn release_token(repo: &Path, token: &str, fence: u64) {
    let v = lock(repo).release(token);
    assert!(matches!(v, Reply::Released { forced: false, .. }), "{v:?}");
    assert_eq!(v.holder().fence, fence, "{v:?}");
}

/// A release without a token (it always works on a free or held lock):
/// `released` or `not_held`, exit 0.
#[track_caller]
fn reset(repo: &Path, round: usize) {
    let out = lock(repo).op("release").run();
    let r = out.reply();
    assert!(
        out.code == 0 && matches!(r, Reply::Released { .. } | Reply::NotHeld { .. }),
        "round {round}: reset failed: {} {}",
        out.stdout,
        out.stderr
    );
}

#[test]
fn twenty_processes_one_free_lock_one_winner() {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let mut gate = Gate::new(&env, "gate");
    let mut last_fence = 0;
    for round in 0..15 {
        let outs = gate.race(acquires(&repo, 24, 60));
        let w = one_winner(&outs, round);
        assert_eq!(w.took_over(), None, "a free lock was taken over: {w:?}");
        let fence = w.must_fence();
        assert!(
            fence > last_fence,
            "round {round}: fence {fence} after {last_fence}"
        );
        last_fence = fence;
        let v = lock(&repo).status();
        assert_eq!((v.state(), v.holder().fence), ("held", fence), "{v:?}");
        release_token(&repo, w.token(), fence);
        assert_eq!(lock(&repo).state(), "free");
    }
}

/// Rounds of: make the lock stale (`make_stale` returns its fence), let
/// `racers` acquirers take it over at once, check exactly one did, release.
fn takeover_rounds(
    rounds: usize,
    racers: usize,
    reason: &str,
    mut make_stale: impl FnMut(&Path) -> u64,
) {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let mut gate = Gate::new(&env, "gate");
    let mut last_fence = 0;
    for round in 0..rounds {
        let stale_fence = make_stale(&repo);
        assert!(
            stale_fence > last_fence,
            "round {round}: fence {stale_fence} after {last_fence}"
        );
        let v = wait_stale(&repo, reason);
        assert_eq!(v.holder().fence, stale_fence, "{v:?}");

        let outs = gate.race(acquires(&repo, racers, 60));
        let w = one_winner(&outs, round);
        assert_eq!(
            w.took_over_from(),
            Some((reason, Some(stale_fence))),
            "round {round}: {w:?}"
        );
        let fence = w.must_fence();
        assert!(
            fence > stale_fence,
            "round {round}: takeover fence {fence} after {stale_fence}"
        );
        last_fence = fence;

        let v = lock(&repo).status();
        assert_eq!((v.state(), v.holder().fence), ("held", fence), "{v:?}");
        let c = lock(&repo).check(w.token());
        assert_eq!(c.result(), "held", "{c:?}");
        release_token(&repo, w.token(), fence);
    }
}

#[test]
fn sixteen_takeovers_of_one_stale_lock_one_winner() {
    takeover_rounds(10, 16, "expired", |repo| {
        lock(repo)
            .op("acquire")
            .ttl(1)
            .reply()
            .is("acquired")
            .must_fence()
    });
}

#[test]
fn sixteen_takeovers_of_a_dead_owners_lock_one_winner() {
    takeover_rounds(8, 16, "owner_dead", |repo| {
        let mut owner = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let v = lock(repo)
            .op("acquire")
            .ttl(60)
            .owner_pid(owner.id())
            .reply()
            .is("acquired");
        assert!(
            matches!(v, Reply::Acquired { owner_pid: Some(p), .. } if p == owner.id()),
            "{v:?}"
        );
        assert_eq!(lock(repo).state(), "held");
        owner.kill().unwrap();
        owner.wait().unwrap();
        v.must_fence()
    });
}

#[test]
fn witness_never_sees_two_holders() {
    const WORKERS: usize = 8;
    const ITERATIONS: usize = 40;
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let witness = env.path("witness.log");
    File::create(&witness).unwrap();
    let acquired = AtomicUsize::new(0);

    let seed = Seed::from_env("racing workers", "RACES_SEED");
    std::thread::scope(|s| {
        for id in 0..WORKERS {
            let (repo, witness, acquired) = (&repo, &witness, &acquired);
            let mut rng = seed.rng(id as u64);
            s.spawn(move || {
                let lock = lock(repo);
                let mut log = OpenOptions::new().append(true).open(witness).unwrap();
                let mut attempts = 0;
                for _ in 0..ITERATIONS {
                    let (token, fence) = loop {
                        attempts += 1;
                        assert!(
                            attempts < 20_000,
                            "worker {id}: starved after {attempts} attempts"
                        );
                        let v = lock.op("acquire").ttl(30).reply();
                        match &v {
                            Reply::AlreadyRunning { .. } => {
                                std::thread::sleep(Duration::from_micros(1_000 + rng.below(7_000)));
                                continue;
                            }
                            Reply::Acquired { took_over, .. } => {
                                assert!(took_over.is_none(), "a ttl-30 lock was taken over: {v:?}");
                            }
                            _ => panic!("worker {id}: {v:?}"),
                        }
                        break (v.token().to_owned(), v.must_fence());
                    };
                    acquired.fetch_add(1, Ordering::SeqCst);
                    // One write(2) per line on an O_APPEND file: lines never interleave.
                    log.write_all(format!("enter {id} {fence}\n").as_bytes())
                        .unwrap();
                    let c = lock.check(&token);
                    assert!(
                        matches!(c, Reply::Held { fence: f, .. } if f == fence),
                        "{c:?}"
                    );
                    std::thread::sleep(Duration::from_micros(500 + rng.below(2_500)));
                    log.write_all(format!("exit {id}\n").as_bytes()).unwrap();
                    release_token(repo, &token, fence);
                }
            });
        }
    });

    let text = std::fs::read_to_string(&witness).unwrap();
    let mut inside: Option<(String, u64)> = None;
    let mut last_fence = 0;
    let mut enters = 0;
    let mut per_worker: BTreeMap<String, usize> = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let parts: Vec<&str> = line.split(' ').collect();
        match (parts.as_slice(), &inside) {
            (["enter", id, fence], None) => {
                let fence: u64 = fence.parse().unwrap();
                assert!(
                    fence > last_fence,
                    "line {}: fence {fence} after {last_fence}",
                    n + 1
                );
                last_fence = fence;
                enters += 1;
                *per_worker.entry((*id).to_owned()).or_default() += 1;
                inside = Some(((*id).to_owned(), fence));
            }
            (["enter", id, _], Some((holder, _))) => {
                panic!(
                    "line {}: worker {id} entered while worker {holder} held the lock",
                    n + 1
                )
            }
            (["exit", id], Some((holder, _))) => {
                assert_eq!(
                    id,
                    holder,
                    "line {}: exit of a worker that did not enter",
                    n + 1
                );
                inside = None;
            }
            _ => panic!("line {}: unexpected {line:?} (inside: {inside:?})", n + 1),
        }
    }
    assert!(inside.is_none(), "witness ends inside the critical section");
    assert_eq!(enters, acquired.load(Ordering::SeqCst));
    assert_eq!(enters, WORKERS * ITERATIONS);
    assert!(
        per_worker.values().all(|&c| c == ITERATIONS),
        "{per_worker:?}"
    );
    assert_eq!(lock(&repo).state(), "free");
}

#[test]
fn sigkill_during_acquire_never_leaves_half_a_record() {
    const ROUNDS: usize = 200;
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let run_dir = repo.join(".git/apache-magpie/run");
    let seed = Seed::from_env("acquire kills", "RACES_SEED");
    let mut rng = seed.rng(0);
    let mut max_fence = 0;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut lease_checked = false;

    let mut round = 0;
    while round < ROUNDS || !lease_checked {
        assert!(
            round < ROUNDS + 300,
            "no SIGKILL left the lock held: cannot check its lease runs out"
        );
        // After the planned rounds, longer delays until one kill lands after publishing.
        let delay_us = if round < ROUNDS {
            rng.below(3_000)
        } else {
            2_000 + rng.below(20_000)
        };
        round += 1;

        let mut child = lock(&repo).op("acquire").ttl(2).quiet().spawn();
        std::thread::sleep(Duration::from_micros(delay_us));
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: the child is not yet reaped, so the pid is still ours.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let how = child.wait().unwrap();
        let killed = how.signal() == Some(libc::SIGKILL);

        let v = lock(&repo).status();
        let state = v.state().to_owned();
        match state.as_str() {
            "free" => {}
            "held" => assert_complete_holder(v.holder(), "held after SIGKILL"),
            "stale" => {
                assert_ne!(
                    v.stale_reason(),
                    Some("corrupt"),
                    "round {round}: a killed acquire left a half-written record: {v:?}"
                );
                assert_eq!(v.stale_reason(), Some("expired"), "{v:?}");
                assert_complete_holder(v.holder(), "stale after SIGKILL");
            }
            _ => panic!("round {round}: unexpected state: {v:?}"),
        }
        let kind = format!("{state}/{}", if killed { "killed" } else { "exited" });
        *seen.entry(kind).or_default() += 1;
        if state != "free" {
            let f = v.holder().fence;
            assert!(
                f > max_fence,
                "round {round}: fence {f} not above {max_fence}: {v:?}"
            );
            max_fence = f;
        }

        if state == "held" && killed && !lease_checked {
            // Crash safety: the killed holder's lease runs out; it never sticks.
            lease_checked = true;
            let stale = wait_stale(&repo, "expired");
            assert_eq!(stale.holder().fence, max_fence, "{stale:?}");
            let w = lock(&repo).op("acquire").ttl(60).reply().is("acquired");
            assert_eq!(
                w.took_over_from(),
                Some(("expired", Some(max_fence))),
                "{w:?}"
            );
            assert!(w.must_fence() > max_fence, "{w:?}");
            max_fence = w.must_fence();
        }

        reset(&repo, round);
    }
    eprintln!("sigkill outcomes over {round} rounds: {seen:?}");

    // A normal cycle: fence above everything seen, and it leaves no leftovers
    // of the killed runs in tmp/ or tombs/.
    let w = lock(&repo).op("acquire").ttl(60).reply().is("acquired");
    assert_eq!(w.took_over(), None, "{w:?}");
    assert!(
        w.must_fence() > max_fence,
        "fence {} not above {max_fence}",
        w.must_fence()
    );
    release_token(&repo, w.token(), w.must_fence());
    for sub in ["tmp", "tombs"] {
        let left = harness::tree(&run_dir.join(sub));
        assert!(
            left.is_empty(),
            "run/{sub} not empty after a normal cycle: {left:?}"
        );
    }
    let v = lock(&repo).store_op("list").run().reply();
    assert!(
        matches!(&v, Reply::List { tombstones: 0, locks, .. } if locks.is_empty()),
        "{v:?}"
    );
}

#[test]
fn takeover_never_tombstones_a_fresh_lock() {
    const ROUNDS: usize = 10;
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let lock = lock(&repo);
    let mut gate = Gate::new(&env, "gate");
    let mut last_fence = 0;
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let seed = Seed::from_env("ABA rounds", "RACES_SEED");
    let mut rng = seed.rng(0);

    for round in 0..ROUNDS {
        let old = lock.op("acquire").ttl(1).reply().is("acquired");
        let (old_token, old_fence) = (old.token(), old.must_fence());
        assert!(
            old_fence > last_fence,
            "round {round}: fence {old_fence} after {last_fence}"
        );
        wait_stale(&repo, "expired");

        let mut verbs: Vec<&str> = (0..16)
            .map(|i| match i % 4 {
                0 => "release",
                2 => "renew",
                _ => "acquire",
            })
            .collect();
        // A fresh order each round, so no kind of racer always goes first.
        rng.shuffle(&mut verbs);
        let cmds = verbs
            .iter()
            .map(|&verb| match verb {
                "acquire" => lock.op(verb).ttl(60),
                _ => lock.op(verb).token(old_token),
            })
            .collect();
        let outs = gate.race(cmds);
        let all = describe(&outs);
        let replies: Vec<Reply> = outs.iter().map(Out::reply).collect();

        // The old token's renew may revive its expired lease, once: a new
        // fence (SPEC §2.2), which is the old token's lease from then on.
        let revivals: std::collections::BTreeSet<u64> = verbs
            .iter()
            .zip(&replies)
            .filter(|(v, r)| **v == "renew" && r.result() == "renewed")
            .map(|(_, r)| r.must_fence())
            .filter(|f| *f != old_fence)
            .collect();
        assert!(revivals.len() <= 1, "round {round}: revived twice:\n{all}");
        let revived = revivals.first().copied();
        if let Some(f) = revived {
            assert!(f > old_fence, "round {round}: revived below:\n{all}");
        }
        let ours = |f: u64| f == old_fence || Some(f) == revived;
        let mut winner: Option<&Reply> = None;
        let mut released = 0;
        let mut freed_seen = false; // a not_held answer: the lock was free at some point
        for (&verb, (o, r)) in verbs.iter().zip(outs.iter().zip(&replies)) {
            let result = r.result();
            *outcomes.entry(format!("{verb} {result}")).or_default() += 1;
            match (verb, o.code, result) {
                ("acquire", 0, "acquired") => {
                    assert!(winner.is_none(), "round {round}: two winners:\n{all}");
                    let how = if r.took_over().is_none() {
                        "of a free lock"
                    } else {
                        "by takeover"
                    };
                    *outcomes
                        .entry(format!("acquire acquired {how}"))
                        .or_default() += 1;
                    winner = Some(r);
                }
                ("acquire", 3, "already_running") => {}
                ("release", 0, "released") => {
                    assert!(
                        ours(r.holder().fence),
                        "round {round}: old token released a newer lock:\n{all}"
                    );
                    released += 1;
                }
                ("release", 0, "not_held") | ("renew", 4, "not_held") => freed_seen = true,
                ("release", 4, "refused") | ("renew", 4, "not_owner") => {
                    assert!(
                        !ours(r.holder().fence),
                        "round {round}: refused its own lock:\n{all}"
                    );
                }
                ("renew", 0, "renewed") => {
                    assert!(
                        ours(r.must_fence()),
                        "round {round}: old token renewed a newer lock:\n{all}"
                    );
                }
                _ => panic!("round {round}: unexpected answer to {verb}:\n{all}"),
            }
        }
        assert!(
            released <= 1,
            "round {round}: one record released twice:\n{all}"
        );
        assert!(
            !freed_seen || released == 1,
            "round {round}: lock found free though never released:\n{all}"
        );

        let v = lock.status();
        if let Some(w) = winner {
            let fence = w.must_fence();
            assert!(fence > revived.unwrap_or(old_fence), "{w:?}");
            match w.took_over_from() {
                Some((why, Some(from))) if why == "expired" && ours(from) => {}
                Some(from) => panic!("round {round}: took over {from:?}: {w:?}"),
                None => assert_eq!(
                    released, 1,
                    "round {round}: acquired a free lock never released:\n{all}"
                ),
            }
            // Every other answer naming a newer holder names the winner.
            for (verb, r) in verbs.iter().zip(&replies) {
                if let Some(f) = r.any_holder().map(|h| h.fence)
                    && !ours(f)
                {
                    assert_eq!(f, fence, "round {round}: {verb} saw a third holder:\n{all}");
                }
            }
            assert_eq!(
                (v.state(), v.holder().fence),
                ("held", fence),
                "round {round}: the winner's lock is gone:\n{v:?}\n{all}"
            );
            let c = lock.check(w.token());
            assert!(
                matches!(c, Reply::Held { fence: f, .. } if f == fence),
                "{c:?}"
            );
            let c = lock.check(old_token);
            assert!(matches!(c, Reply::NotOwner { .. }), "{c:?}");
            last_fence = fence;
        } else {
            // No winner: the old lock was renewed (then maybe released), so
            // every acquirer found it live.
            for (&verb, r) in verbs.iter().zip(&replies) {
                if verb == "acquire" {
                    assert!(ours(r.holder().fence), "round {round}:\n{all}");
                }
            }
            match v.state() {
                "free" => assert_eq!(released, 1, "{v:?}"),
                "held" | "stale" => assert!(ours(v.holder().fence), "{v:?}"),
                _ => panic!("{v:?}"),
            }
            last_fence = revived.unwrap_or(old_fence);
        }
        reset(&repo, round);
    }
    eprintln!("aba outcomes over {ROUNDS} rounds: {outcomes:?}");
}
