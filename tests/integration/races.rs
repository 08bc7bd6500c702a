//! Concurrency proofs of SPEC §6 and §7 for the file store: many real
//! processes of the binary racing over one lock in a temporary git repository.
//!
//! Racers are released together through a gate: each is started as
//! `bash -c 'read -r _ < FIFO; exec skill-lock ...'`, and the test, which holds
//! the FIFO open for reading and writing, writes one line per racer once all
//! are started, so they all run `skill-lock` at the same moment.
//!
//! Covers: SPEC §6, §7.

use crate::common;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{BIN, Cmd, Out, Rng, TestEnv, Value, must_fence, must_holder_fence};

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

    fn spawn(&self, repo: &Path, args: &[String]) -> Child {
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(r#"IFS= read -r _ < "$0" || exit 97; exec "$@""#)
            .arg(&self.path)
            .arg(BIN)
            .args(args)
            .current_dir(repo)
            .env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash runs")
    }

    /// Starts every command, lets them all go at once, returns their outputs in order.
    fn race(&mut self, repo: &Path, cmds: &[Vec<String>]) -> Vec<Out> {
        let children: Vec<Child> = cmds.iter().map(|a| self.spawn(repo, a)).collect();
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

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn acquire_args(ttl: u64) -> Vec<String> {
    strings(&["acquire", SKILL, "--repo", REPO, "--ttl", &ttl.to_string()])
}

fn run(repo: &Path, args: &[&str]) -> Out {
    Cmd::new(repo).args(args).run()
}

fn acquire(repo: &Path, extra: &[&str]) -> Out {
    let mut args = vec!["acquire", SKILL, "--repo", REPO];
    args.extend_from_slice(extra);
    run(repo, &args)
}

fn status(repo: &Path) -> Out {
    run(repo, &["status", SKILL, "--repo", REPO])
}

#[track_caller]
fn token_of(v: &Value) -> String {
    v["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token in {v}"))
        .to_owned()
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
fn wait_stale(repo: &Path, reason: &str) -> Value {
    let start = Instant::now();
    loop {
        let out = status(repo);
        let v = out.expect(0, "status").clone();
        match v["state"].as_str() {
            Some("stale") => {
                assert_eq!(v["stale_reason"], reason, "{v}");
                return v;
            }
            Some("held") => {}
            _ => panic!("lock neither held nor stale while waiting for its lease to end: {v}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "lock still held 15 s after being taken with a short lease: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts a holder record is complete (SPEC §4).
#[track_caller]
fn assert_complete_holder(h: &Value, context: &str) {
    assert_eq!(h["skill"], SKILL, "{context}: {h}");
    assert_eq!(h["repo"], REPO, "{context}: {h}");
    for f in ["started", "expires"] {
        assert!(
            h[f].as_str().is_some_and(|s| s.ends_with('Z')),
            "{context}: {f} missing in {h}"
        );
    }
    assert!(
        h["ttl"].as_u64().is_some_and(|t| t > 0),
        "{context}: ttl missing in {h}"
    );
    assert!(
        h["fence"].as_u64().is_some_and(|f| f > 0),
        "{context}: fence missing in {h}"
    );
    assert!(
        h.get("token").is_none() && h.get("token_sha256").is_none(),
        "{context}: {h}"
    );
}

/// Splits a race of acquirers into the one winner and the losers, asserting
/// that every racer either acquired (0) or found the lock held (3).
#[track_caller]
fn one_winner(outs: &[Out], round: usize) -> Value {
    let mut winners = Vec::new();
    for o in outs {
        match o.code {
            0 => winners.push(o.expect(0, "acquired").clone()),
            3 => {
                o.expect(3, "already_running");
            }
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
    for o in outs.iter().filter(|o| o.code == 3) {
        assert_eq!(
            must_holder_fence(&o.json),
            must_fence(&w),
            "round {round}: loser saw another holder: {}",
            o.stdout
        );
        assert_complete_holder(&o.json["holder"], "already_running");
    }
    w
}

#[track_caller]
fn release_token(repo: &Path, token: &str, fence: u64) {
    let out = run(repo, &["release", SKILL, "--repo", REPO, "--token", token]);
    let v = out.expect(0, "released");
    assert_eq!(must_holder_fence(v), fence, "{v}");
    assert_eq!(v["forced"], false, "{v}");
}

#[test]
fn twenty_processes_one_free_lock_one_winner() {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let mut gate = Gate::new(&env, "gate");
    let cmds: Vec<Vec<String>> = (0..24).map(|_| acquire_args(60)).collect();
    let mut last_fence = 0;
    for round in 0..15 {
        let outs = gate.race(&repo, &cmds);
        let w = one_winner(&outs, round);
        assert!(w["took_over"].is_null(), "a free lock was taken over: {w}");
        let fence = must_fence(&w);
        assert!(
            fence > last_fence,
            "round {round}: fence {fence} after {last_fence}"
        );
        last_fence = fence;
        let v = status(&repo).expect(0, "status").clone();
        assert_eq!(
            (v["state"].as_str(), must_holder_fence(&v)),
            (Some("held"), fence),
            "{v}"
        );
        release_token(&repo, &token_of(&w), fence);
        assert_eq!(status(&repo).expect(0, "status")["state"], "free");
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
    let cmds: Vec<Vec<String>> = (0..racers).map(|_| acquire_args(60)).collect();
    let mut last_fence = 0;
    for round in 0..rounds {
        let stale_fence = make_stale(&repo);
        assert!(
            stale_fence > last_fence,
            "round {round}: fence {stale_fence} after {last_fence}"
        );
        let v = wait_stale(&repo, reason);
        assert_eq!(must_holder_fence(&v), stale_fence, "{v}");

        let outs = gate.race(&repo, &cmds);
        let w = one_winner(&outs, round);
        assert_eq!(w["took_over"]["reason"], reason, "round {round}: {w}");
        assert_eq!(
            must_holder_fence(&w["took_over"]),
            stale_fence,
            "round {round}: {w}"
        );
        let fence = must_fence(&w);
        assert!(
            fence > stale_fence,
            "round {round}: takeover fence {fence} after {stale_fence}"
        );
        last_fence = fence;

        let v = status(&repo).expect(0, "status").clone();
        assert_eq!(
            (v["state"].as_str(), must_holder_fence(&v)),
            (Some("held"), fence),
            "{v}"
        );
        let token = token_of(&w);
        run(&repo, &["check", SKILL, "--repo", REPO, "--token", &token]).expect(0, "held");
        release_token(&repo, &token, fence);
    }
}

#[test]
fn sixteen_takeovers_of_one_stale_lock_one_winner() {
    takeover_rounds(10, 16, "expired", |repo| {
        must_fence(acquire(repo, &["--ttl", "1"]).expect(0, "acquired"))
    });
}

#[test]
fn sixteen_takeovers_of_a_dead_owners_lock_one_winner() {
    takeover_rounds(8, 16, "owner_dead", |repo| {
        let mut owner = Command::new("sleep").arg("30").spawn().expect("sleep runs");
        let pid = owner.id().to_string();
        let out = acquire(repo, &["--ttl", "60", "--owner-pid", &pid]);
        let v = out.expect(0, "acquired").clone();
        assert_eq!(v["owner_pid"].as_u64(), Some(u64::from(owner.id())), "{v}");
        assert_eq!(
            status(repo).expect(0, "status")["state"],
            "held",
            "live owner"
        );
        owner.kill().unwrap();
        owner.wait().unwrap();
        must_fence(&v)
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

    std::thread::scope(|s| {
        for id in 0..WORKERS {
            let (repo, witness, acquired) = (&repo, &witness, &acquired);
            s.spawn(move || {
                let mut rng = Rng::seeded(id as u64 + 1);
                let mut log = OpenOptions::new().append(true).open(witness).unwrap();
                let mut attempts = 0;
                for _ in 0..ITERATIONS {
                    let (token, fence) = loop {
                        attempts += 1;
                        assert!(
                            attempts < 20_000,
                            "worker {id}: starved after {attempts} attempts"
                        );
                        let out = acquire(repo, &["--ttl", "30"]);
                        if out.code == 3 {
                            out.expect(3, "already_running");
                            std::thread::sleep(Duration::from_micros(1_000 + rng.below(7_000)));
                            continue;
                        }
                        let v = out.expect(0, "acquired");
                        assert!(
                            v["took_over"].is_null(),
                            "a ttl-30 lock was taken over: {v}"
                        );
                        break (token_of(v), must_fence(v));
                    };
                    acquired.fetch_add(1, Ordering::SeqCst);
                    // One write(2) per line on an O_APPEND file: lines never interleave.
                    log.write_all(format!("enter {id} {fence}\n").as_bytes())
                        .unwrap();
                    let out = run(repo, &["check", SKILL, "--repo", REPO, "--token", &token]);
                    assert_eq!(must_fence(out.expect(0, "held")), fence);
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
    assert_eq!(status(&repo).expect(0, "status")["state"], "free");
}

#[test]
fn sigkill_during_acquire_never_leaves_half_a_record() {
    const ROUNDS: usize = 200;
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let run_dir = repo.join(".git/apache-magpie/run");
    let mut rng = Rng::seeded(0xC0FFEE);
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

        let mut cmd = Cmd::new(&repo)
            .args(["acquire", SKILL, "--repo", REPO, "--ttl", "2"])
            .command();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(delay_us));
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: the child is not yet reaped, so the pid is still ours.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let how = child.wait().unwrap();
        let killed = how.signal() == Some(libc::SIGKILL);

        let out = status(&repo);
        let v = out.expect(0, "status").clone();
        let state = v["state"].as_str().unwrap_or_default().to_owned();
        match state.as_str() {
            "free" => {}
            "held" => assert_complete_holder(&v["holder"], "held after SIGKILL"),
            "stale" => {
                assert_ne!(
                    v["stale_reason"], "corrupt",
                    "round {round}: a killed acquire left a half-written record: {v}"
                );
                assert_eq!(v["stale_reason"], "expired", "{v}");
                assert_complete_holder(&v["holder"], "stale after SIGKILL");
            }
            _ => panic!("round {round}: unexpected state: {v}"),
        }
        let kind = format!("{state}/{}", if killed { "killed" } else { "exited" });
        *seen.entry(kind).or_default() += 1;
        if state != "free" {
            let f = must_holder_fence(&v);
            assert!(
                f > max_fence,
                "round {round}: fence {f} not above {max_fence}: {v}"
            );
            max_fence = f;
        }

        if state == "held" && killed && !lease_checked {
            // Crash safety: the killed holder's lease runs out; it never sticks.
            lease_checked = true;
            let stale = wait_stale(&repo, "expired");
            assert_eq!(must_holder_fence(&stale), max_fence, "{stale}");
            let out = acquire(&repo, &["--ttl", "60"]);
            let w = out.expect(0, "acquired");
            assert_eq!(w["took_over"]["reason"], "expired", "{w}");
            assert_eq!(must_holder_fence(&w["took_over"]), max_fence, "{w}");
            assert!(must_fence(w) > max_fence, "{w}");
            max_fence = must_fence(w);
        }

        // Reset (a release without a token always works on a free or held lock).
        let out = run(&repo, &["release", SKILL, "--repo", REPO]);
        assert!(
            matches!(
                (out.code, out.json["result"].as_str()),
                (0, Some("released" | "not_held"))
            ),
            "round {round}: reset failed: {} {}",
            out.stdout,
            out.stderr
        );
    }
    eprintln!("sigkill outcomes over {round} rounds: {seen:?}");

    // A normal cycle: fence above everything seen, and it leaves no leftovers
    // of the killed runs in tmp/ or tombs/.
    let out = acquire(&repo, &["--ttl", "60"]);
    let w = out.expect(0, "acquired").clone();
    assert!(w["took_over"].is_null(), "{w}");
    assert!(
        must_fence(&w) > max_fence,
        "fence {} not above {max_fence}",
        must_fence(&w)
    );
    release_token(&repo, &token_of(&w), must_fence(&w));
    for sub in ["tmp", "tombs"] {
        let left = common::tree(&run_dir.join(sub));
        assert!(
            left.is_empty(),
            "run/{sub} not empty after a normal cycle: {left:?}"
        );
    }
    let v = run(&repo, &["list"]).expect(0, "list").clone();
    assert_eq!(v["tombstones"], 0, "{v}");
    assert_eq!(v["locks"].as_array().map(Vec::len), Some(0), "{v}");
}

#[test]
fn takeover_never_tombstones_a_fresh_lock() {
    const ROUNDS: usize = 10;
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let mut gate = Gate::new(&env, "gate");
    let mut last_fence = 0;
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    let mut rng = Rng::seeded(0xABA);

    for round in 0..ROUNDS {
        let out = acquire(&repo, &["--ttl", "1"]);
        let old = out.expect(0, "acquired").clone();
        let (old_token, old_fence) = (token_of(&old), must_fence(&old));
        assert!(
            old_fence > last_fence,
            "round {round}: fence {old_fence} after {last_fence}"
        );
        wait_stale(&repo, "expired");

        let mut cmds: Vec<Vec<String>> = Vec::new();
        for i in 0..16 {
            cmds.push(match i % 4 {
                0 => strings(&["release", SKILL, "--repo", REPO, "--token", &old_token]),
                2 => strings(&["renew", SKILL, "--repo", REPO, "--token", &old_token]),
                _ => acquire_args(60),
            });
        }
        // A fresh order each round, so no kind of racer always goes first.
        for i in (1..cmds.len()).rev() {
            cmds.swap(i, usize::try_from(rng.below(i as u64 + 1)).unwrap());
        }
        let outs = gate.race(&repo, &cmds);
        let all = describe(&outs);

        let mut winner: Option<Value> = None;
        let mut released = 0;
        let mut freed_seen = false; // a not_held answer: the lock was free at some point
        for (cmd, o) in cmds.iter().zip(&outs) {
            let result = o.json["result"].as_str().unwrap_or("?");
            *outcomes.entry(format!("{} {result}", cmd[0])).or_default() += 1;
            match (cmd[0].as_str(), o.code, result) {
                ("acquire", 0, "acquired") => {
                    assert!(winner.is_none(), "round {round}: two winners:\n{all}");
                    let how = if o.json["took_over"].is_null() {
                        "of a free lock"
                    } else {
                        "by takeover"
                    };
                    *outcomes
                        .entry(format!("acquire acquired {how}"))
                        .or_default() += 1;
                    winner = Some(o.json.clone());
                }
                ("acquire", 3, "already_running") => {}
                ("release", 0, "released") => {
                    assert_eq!(
                        must_holder_fence(&o.json),
                        old_fence,
                        "round {round}: old token released a newer lock:\n{all}"
                    );
                    released += 1;
                }
                ("release", 0, "not_held") | ("renew", 4, "not_held") => freed_seen = true,
                ("release", 4, "refused") | ("renew", 4, "not_owner") => {
                    assert_ne!(
                        must_holder_fence(&o.json),
                        old_fence,
                        "round {round}: refused its own lock:\n{all}"
                    );
                }
                ("renew", 0, "renewed") => {
                    assert_eq!(
                        must_fence(&o.json),
                        old_fence,
                        "round {round}: old token renewed a newer lock:\n{all}"
                    );
                }
                _ => panic!("round {round}: unexpected answer to {}:\n{all}", cmd[0]),
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

        let v = status(&repo).expect(0, "status").clone();
        if let Some(w) = &winner {
            let fence = must_fence(w);
            assert!(fence > old_fence, "{w}");
            match w["took_over"].as_object() {
                Some(t) => {
                    assert_eq!(t["reason"], "expired", "{w}");
                    assert_eq!(t["holder"]["fence"].as_u64(), Some(old_fence), "{w}");
                }
                None => assert_eq!(
                    released, 1,
                    "round {round}: acquired a free lock never released:\n{all}"
                ),
            }
            // Every other answer naming a newer holder names the winner.
            for (cmd, o) in cmds.iter().zip(&outs) {
                if let Some(f) = o.json["holder"]["fence"].as_u64()
                    && f != old_fence
                {
                    assert_eq!(
                        f, fence,
                        "round {round}: {} saw a third holder:\n{all}",
                        cmd[0]
                    );
                }
            }
            assert_eq!(
                (v["state"].as_str(), must_holder_fence(&v)),
                (Some("held"), fence),
                "round {round}: the winner's lock is gone:\n{v}\n{all}"
            );
            let token = token_of(w);
            let c = run(&repo, &["check", SKILL, "--repo", REPO, "--token", &token]);
            assert_eq!(must_fence(c.expect(0, "held")), fence);
            let c = run(
                &repo,
                &["check", SKILL, "--repo", REPO, "--token", &old_token],
            );
            c.expect(4, "not_owner");
            last_fence = fence;
        } else {
            // No winner: the old lock was renewed (then maybe released), so
            // every acquirer found it live.
            for (cmd, o) in cmds.iter().zip(&outs) {
                if cmd[0] == "acquire" {
                    assert_eq!(
                        must_holder_fence(&o.json),
                        old_fence,
                        "round {round}:\n{all}"
                    );
                }
            }
            match v["state"].as_str() {
                Some("free") => assert_eq!(released, 1, "{v}"),
                Some("held" | "stale") => assert_eq!(must_holder_fence(&v), old_fence, "{v}"),
                _ => panic!("{v}"),
            }
            last_fence = old_fence;
        }
        let out = run(&repo, &["release", SKILL, "--repo", REPO]);
        assert!(
            matches!(out.json["result"].as_str(), Some("released" | "not_held")) && out.code == 0,
            "{}",
            out.stdout
        );
    }
    eprintln!("aba outcomes over {ROUNDS} rounds: {outcomes:?}");
}
