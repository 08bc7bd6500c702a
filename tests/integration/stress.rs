//! Stress harness for the file store (SPEC §6, §7; the properties and how
//! to read a failure are in `docs/stress.md`).
//!
//! At least 32 worker threads each run the real binary over and over, on
//! three locks, in random mixes of: acquire (short and longer leases), renew,
//! release with their own token, release without a token (rare), check,
//! status, abandoning a lease so that it is taken over when it expires, and
//! SIGKILL of in-flight acquire/renew/release processes at a random moment.
//! A worker that holds a lock runs `check --token` before each "write" and
//! only then "writes", appending `lock fence worker enter exit deadline` to a
//! shared `O_APPEND` witness file (the chaos kit's); times are
//! `CLOCK_BOOTTIME`, the clock the tool measures same-boot leases on, so
//! witness times and lease deadlines compare exactly.
//!
//! After the run every invariant is checked from the witness file, the
//! results the workers saw, and the store's own history; the run ends with a
//! summary line. `STRESS_SEED` replays a mix; `stress_long` (ignored) runs
//! `STRESS_SECS` (default 600) as back-to-back verified episodes.
//! `STRESS_BIN` runs another build of the binary instead (only to show that
//! the harness catches a deliberately broken one).
//!
//! Covers: SPEC §6, §7.

use crate::harness;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use harness::chaos::{
    self, Invoke, Mark, Pen, Ran, Rng, Seed, Stats, Violations, Witness, boot_ns,
};
use harness::{Cmd, TestEnv};
use harness::{Lock, Reply, TookOver};
use skill_lock::history::{Event, EventKind};
use skill_lock::record::OwnerRecord;

/// (skill, repo as given): three locks, one repo spelled with capitals.
const LOCKS: [(&str, &str); 3] = [
    ("stress", "o/one"),
    ("stress", "Acme/Two"),
    ("other-skill", "o/one"),
];
const WORKERS: usize = 32;
/// The longest ttl any operation asks for (acquire or renew).
const MAX_TTL: u64 = 4;
/// Seconds of load in the default (short) mode.
const SHORT_SECS: u64 = 12;

const COUNTERS: &[&str] = &[
    "episodes",
    "operations",
    "processes",
    "kills",
    "kill_attempts",
    "acquired",
    "already_running",
    "takeovers",
    "renewed",
    "renewed_expired",
    "released",
    "released_tokenless",
    "checks_held",
    "checks_expired",
    "lost",
    "abandoned",
    "sections",
    "excused_overlaps",
    "history_events",
    "reader_corrupt",
    "violations",
];

fn lock_name(i: usize) -> String {
    let (skill, repo) = LOCKS[i];
    let repo = repo.to_ascii_lowercase();
    let (owner, name) = repo.split_once('/').unwrap();
    format!("{skill}@{owner}__{name}")
}

fn env_secs(name: &str, default: u64) -> u64 {
    chaos::env_u64(name).unwrap_or(default)
}

/// The binary under test, or `STRESS_BIN` instead (only to prove the
/// harness catches a deliberately broken build).
fn program(cmd: Cmd) -> Command {
    let cmd = cmd.into_command();
    let Some(bin) = std::env::var_os("STRESS_BIN") else {
        return cmd;
    };
    let mut other = Command::new(bin);
    other.env_clear().args(cmd.get_args());
    if let Some(dir) = cmd.get_current_dir() {
        other.current_dir(dir);
    }
    other
}

/// What one episode shares between its threads.
struct World {
    repo: PathBuf,
    run: PathBuf,
    witness: Witness,
    deadline: Instant,
    stats: Stats,
    violations: Violations,
    /// Sightings of `corrupt` by readers (status/check/list), with what was seen.
    reader_corrupt: Mutex<Vec<String>>,
    /// Pids of the invocations that SIGKILL ended: only they may leave a tombstone.
    killed: Mutex<HashSet<u32>>,
}

impl World {
    fn violation(&self, what: String) {
        self.violations.add(what);
    }

    fn reader_saw_corrupt(&self, what: String) {
        self.stats.bump("reader_corrupt");
        self.reader_corrupt.lock().unwrap().push(what);
    }

    fn lock(&self, i: usize) -> Lock {
        let (skill, repo) = LOCKS[i];
        Lock::new(&self.repo, skill, repo)
    }

    /// Runs `verb` on lock `i`; with `kill_after_us`, SIGKILLs it that long after spawning.
    fn call(&self, i: usize, verb: &str, extra: &[&str], kill_after_us: Option<u64>) -> Ran {
        self.invoke(self.lock(i).op(verb).args(extra), kill_after_us)
    }

    /// `list`, never killed.
    fn list(&self) -> Ran {
        self.invoke(self.lock(0).store_op("list"), None)
    }

    fn invoke(&self, cmd: Cmd, kill_after_us: Option<u64>) -> Ran {
        self.stats.bump("operations");
        self.stats.bump("processes");
        if kill_after_us.is_some() {
            self.stats.bump("kill_attempts");
        }
        let how = Invoke {
            kill_after: kill_after_us.map(Duration::from_micros),
            ..Invoke::default()
        };
        let ran = chaos::invoke(program(cmd), how);
        if ran.killed {
            self.stats.bump("kills");
            self.killed.lock().unwrap().insert(ran.pid);
        }
        ran
    }

    fn record_path(&self, lock: usize) -> PathBuf {
        self.run
            .join("locks")
            .join(format!("{}.lock", lock_name(lock)))
            .join("owner.json")
    }

    /// The exact lease deadline (ms, boot clock) of `h` in its record, if
    /// the record is still its.
    fn deadline_ms(&self, h: &Held) -> Option<u64> {
        std::fs::read(self.record_path(h.lock))
            .ok()
            .and_then(|b| OwnerRecord::parse(&b).ok())
            .filter(|r| r.token_matches(&h.token))
            .and_then(|r| r.holder.deadline_boot_ms)
    }
}

/// A successful acquisition a worker saw.
#[derive(Debug, Clone)]
struct Acq {
    lock: usize,
    fence: u64,
    pid: u32,
    t0: u64,
    t1: u64,
}

impl Acq {
    /// The acquire call as a witness mark: believed from its start to its end.
    fn mark(&self) -> Mark {
        Mark {
            lock: self.lock,
            fence: self.fence,
            holder: self.pid as usize,
            enter: self.t0,
            exit: self.t1,
            believed: Mark::UNCHECKED,
        }
    }
}

/// A successful operation with a token (check held, renewed, released).
#[derive(Debug, Clone)]
struct TokenOp {
    what: &'static str,
    lock: usize,
    fence: u64,
    t0: u64,
}

/// A witnessed critical section, as the worker kept it: its mark (the
/// lease deadline in the record right after the check as `believed`) and
/// when the check that allowed it started.
#[derive(Debug, Clone)]
struct Section {
    mark: Mark,
    check_t0: u64,
}

impl AsRef<Mark> for Section {
    fn as_ref(&self) -> &Mark {
        &self.mark
    }
}

/// A release without a token (never killed, so its effect is in the history).
#[derive(Debug, Clone)]
struct TokenlessRelease {
    pid: u32,
    t0: u64,
}

#[derive(Default)]
struct WorkerLog {
    acquisitions: Vec<Acq>,
    token_ops: Vec<TokenOp>,
    sections: Vec<Section>,
    tokenless: Vec<TokenlessRelease>,
}

struct Held {
    lock: usize,
    token: String,
    fence: u64,
    ttl: u64,
}

fn kill_delay(rng: &mut Rng, percent: u64) -> Option<u64> {
    rng.chance(percent).then(|| rng.below(3_001))
}

fn worker(world: &World, id: usize, mut rng: Rng) -> WorkerLog {
    let rng = &mut rng;
    let mut log = WorkerLog::default();
    let mut pen = world.witness.pen();
    let mut held: Option<Held> = None;
    while Instant::now() < world.deadline {
        let roll = rng.below(1000);
        if roll < 4 {
            tokenless_release(world, rng, &mut log);
        } else if roll < 30 {
            read_only(world, rng);
        } else if let Some(h) = held.take() {
            held = holding(world, rng, &mut log, &mut pen, id, h, None);
        } else {
            held = try_acquire(world, rng, &mut log);
        }
    }
    log
}

fn tokenless_release(world: &World, rng: &mut Rng, log: &mut WorkerLog) {
    let ran = world.call(rng.index(LOCKS.len()), "release", &[], None);
    match (ran.out.code, ran.reply()) {
        (0, Some(Reply::Released { holder, .. })) => {
            world.stats.bump("released_tokenless");
            if holder.is_none() {
                world.reader_saw_corrupt(format!(
                    "tokenless release removed a corrupt lock: {}",
                    ran.describe()
                ));
            }
            log.tokenless.push(TokenlessRelease {
                pid: ran.pid,
                t0: ran.t0,
            });
        }
        (0, Some(Reply::NotHeld { .. })) => {}
        _ => world.violation(format!("release without token: {}", ran.describe())),
    }
}

fn read_only(world: &World, rng: &mut Rng) {
    let lock = rng.index(LOCKS.len());
    if rng.chance(50) {
        let ran = world.call(lock, "status", &[], None);
        match (ran.out.code, ran.reply()) {
            (
                0,
                Some(Reply::Status {
                    state,
                    stale_reason,
                    ..
                }),
            ) => match state.as_str() {
                "held" | "free" => {}
                "stale" if stale_reason.as_deref() != Some("corrupt") => {}
                "stale" => world.reader_saw_corrupt(format!("status: {}", ran.describe())),
                _ => world.violation(format!("status: {}", ran.describe())),
            },
            _ => world.violation(format!("status: {}", ran.describe())),
        }
    } else {
        let ran = world.call(lock, "check", &["--token", &"0".repeat(32)], None);
        match (ran.out.code, ran.reply()) {
            (4, Some(Reply::NotHeld { .. })) => {}
            (4, Some(Reply::NotOwner { holder: None, .. })) => {
                world.reader_saw_corrupt(format!("check: {}", ran.describe()));
            }
            (4, Some(Reply::NotOwner { .. })) => {}
            _ => world.violation(format!("check with a foreign token: {}", ran.describe())),
        }
    }
}

/// A takeover the acquire at `ran` reported, judged: only of an expired
/// lease, of a lower fence, whose deadline had passed when it ended.
fn judge_takeover(world: &World, ran: &Ran, fence: u64, t: &TookOver) {
    world.stats.bump("takeovers");
    let prev = t.holder.as_ref();
    let prev_deadline = prev.and_then(|h| h.deadline_boot_ms);
    if t.reason != "expired" {
        world.violation(format!(
            "takeover not of an expired lease: {}",
            ran.describe()
        ));
    } else if prev.is_none_or(|h| h.fence >= fence) {
        world.violation(format!(
            "took over a fence not below its own: {}",
            ran.describe()
        ));
    } else if prev_deadline.is_none_or(|d| d * 1_000_000 > ran.t1) {
        world.violation(format!(
            "took over a lease whose deadline was still ahead when the acquire ended: {}",
            ran.describe()
        ));
    }
}

fn try_acquire(world: &World, rng: &mut Rng, log: &mut WorkerLog) -> Option<Held> {
    let lock = rng.index(LOCKS.len());
    let ttl = if rng.chance(70) {
        rng.range(1, 2)
    } else {
        rng.range(3, MAX_TTL)
    };
    let kill = kill_delay(rng, 12);
    let ran = world.call(lock, "acquire", &["--ttl", &ttl.to_string()], kill);
    if ran.killed {
        return None;
    }
    match (ran.out.code, ran.reply()) {
        (
            0,
            Some(Reply::Acquired {
                fence,
                token,
                took_over,
                ..
            }),
        ) => {
            world.stats.bump("acquired");
            if let Some(t) = &took_over {
                judge_takeover(world, &ran, fence, t);
            }
            log.acquisitions.push(Acq {
                lock,
                fence,
                pid: ran.pid,
                t0: ran.t0,
                t1: ran.t1,
            });
            Some(Held {
                lock,
                token,
                fence,
                ttl,
            })
        }
        (3, Some(Reply::AlreadyRunning { .. })) => {
            world.stats.bump("already_running");
            std::thread::sleep(Duration::from_millis(20 + rng.below(130)));
            None
        }
        _ => {
            world.violation(format!("acquire: {}", ran.describe()));
            None
        }
    }
}

fn holding(
    world: &World,
    rng: &mut Rng,
    log: &mut WorkerLog,
    pen: &mut Pen,
    id: usize,
    h: Held,
    forced: Option<u64>,
) -> Option<Held> {
    let token = ["--token", h.token.as_str()];
    let op = |what| TokenOp {
        what,
        lock: h.lock,
        fence: h.fence,
        t0: 0,
    };
    let roll = forced.unwrap_or_else(|| rng.below(100));
    if roll < 45 {
        // Check, then "write" inside the witnessed critical section.
        let ran = world.call(h.lock, "check", &token, None);
        match (ran.out.code, ran.reply()) {
            (0, Some(Reply::Held { fence, .. })) => {
                world.stats.bump("checks_held");
                if fence != h.fence {
                    world.violation(format!(
                        "check held names fence {fence}, not ours {}: {}",
                        h.fence,
                        ran.describe()
                    ));
                    return None;
                }
                log.token_ops.push(TokenOp {
                    t0: ran.t0,
                    ..op("check")
                });
                // The exact lease deadline, for judging overlaps (docs/stress.md).
                let Some(deadline_ms) = world.deadline_ms(&h) else {
                    world.stats.bump("lost");
                    return None;
                };
                let enter = boot_ns();
                std::thread::sleep(Duration::from_micros(rng.below(2_000)));
                let mark = Mark {
                    lock: h.lock,
                    fence: h.fence,
                    holder: id,
                    enter,
                    exit: boot_ns(),
                    believed: deadline_ms * 1_000_000,
                };
                pen.write(&mark);
                log.sections.push(Section {
                    mark,
                    check_t0: ran.t0,
                });
                Some(h)
            }
            (4, Some(Reply::Expired { .. })) => {
                world.stats.bump("checks_expired");
                Some(h) // maybe nobody took it over yet: a renew may still save it
            }
            (4, Some(Reply::NotOwner { holder: None, .. })) => {
                world.reader_saw_corrupt(format!("check with own token: {}", ran.describe()));
                world.stats.bump("lost");
                None
            }
            (
                4,
                Some(Reply::NotOwner {
                    holder: Some(o), ..
                }),
            ) if o.fence == h.fence => {
                world.violation(format!(
                    "not_owner naming our own fence: {}",
                    ran.describe()
                ));
                None
            }
            (4, Some(Reply::NotOwner { .. } | Reply::NotHeld { .. })) => {
                world.stats.bump("lost");
                None
            }
            _ => {
                world.violation(format!("check: {}", ran.describe()));
                None
            }
        }
    } else if roll < 60 {
        let ttl = (1 + rng.below(MAX_TTL)).to_string();
        let mut args = token.to_vec();
        if rng.chance(30) {
            args.extend(["--ttl", ttl.as_str()]);
        }
        let ran = world.call(h.lock, "renew", &args, kill_delay(rng, 20));
        if ran.killed {
            return Some(h);
        }
        match (ran.out.code, ran.reply()) {
            (
                0,
                Some(Reply::Renewed {
                    fence, was_expired, ..
                }),
            ) => {
                world.stats.bump("renewed");
                if was_expired {
                    world.stats.bump("renewed_expired");
                }
                // A revived lease takes a new fence (SPEC §2.2): always
                // when it had run out, and on a network store also when a
                // reader may already call it stale; never an older one.
                if (was_expired && fence <= h.fence) || fence < h.fence {
                    world.violation(format!(
                        "renewed names fence {fence}, ours was {} (was_expired: {was_expired}): {}",
                        h.fence,
                        ran.describe()
                    ));
                    return None;
                }
                let h = Held { fence, ..h };
                log.token_ops.push(TokenOp {
                    t0: ran.t0,
                    ..op("renew")
                });
                Some(h)
            }
            (
                4,
                Some(Reply::NotOwner {
                    holder: Some(o), ..
                }),
            ) if o.fence == h.fence => {
                world.violation(format!(
                    "renew: not_owner naming our own fence: {}",
                    ran.describe()
                ));
                None
            }
            (4, Some(Reply::NotOwner { .. } | Reply::NotHeld { .. })) => {
                world.stats.bump("lost");
                None
            }
            _ => {
                world.violation(format!("renew: {}", ran.describe()));
                None
            }
        }
    } else if roll < 88 {
        let ran = world.call(h.lock, "release", &token, kill_delay(rng, 20));
        if ran.killed {
            return None;
        }
        match (ran.out.code, ran.reply()) {
            (0, Some(Reply::Released { holder, forced, .. })) => {
                world.stats.bump("released");
                let removed = holder.map(|o| o.fence);
                if removed != Some(h.fence) || forced {
                    world.violation(format!(
                        "token release removed fence {removed:?}, not ours {}: {}",
                        h.fence,
                        ran.describe()
                    ));
                }
                log.token_ops.push(TokenOp {
                    t0: ran.t0,
                    ..op("release")
                });
            }
            (
                4,
                Some(Reply::Refused {
                    holder: Some(o), ..
                }),
            ) if o.fence == h.fence => {
                world.violation(format!("release refused our own fence: {}", ran.describe()));
            }
            (0, Some(Reply::NotHeld { .. })) | (4, Some(Reply::Refused { .. })) => {
                world.stats.bump("lost");
            }
            _ => world.violation(format!("release: {}", ran.describe())),
        }
        None
    } else if roll < 96 {
        // Walk away from a short lease: it runs out and the next acquirer takes it over.
        if h.ttl > 1 {
            return Some(h);
        }
        world.stats.bump("abandoned");
        None
    } else if roll < 98 {
        // At the edge: wait until just after the lease's deadline, then check
        // or renew, racing the acquirers that take it over.
        let Some(deadline_ms) = world.deadline_ms(&h) else {
            world.stats.bump("lost");
            return None;
        };
        let target = deadline_ms * 1_000_000 + rng.below(30_000_000);
        let wait = target
            .saturating_sub(boot_ns())
            .min((MAX_TTL + 1) * 1_000_000_000);
        std::thread::sleep(Duration::from_nanos(wait));
        let then = if rng.chance(50) { 0 } else { 50 };
        holding(world, rng, log, pen, id, h, Some(then))
    } else {
        // Dawdle: a short lease may run out meanwhile.
        std::thread::sleep(Duration::from_millis(100 + rng.below(1_900)));
        Some(h)
    }
}

/// Is `reply` a `status` calling the lock corrupt?
fn says_corrupt(reply: Option<&Reply>) -> bool {
    matches!(reply, Some(Reply::Status { stale_reason: Some(r), .. }) if r == "corrupt")
}

/// Reads status and list of every lock until the load stops; a corrupt
/// sighting is re-read at once to tell a transient one from a stuck one.
fn monitor(world: &World, stop: &AtomicBool) {
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        for lock in 0..LOCKS.len() {
            let ran = world.call(lock, "status", &[], None);
            let reply = ran.reply();
            if ran.out.code != 0 || !matches!(reply, Some(Reply::Status { .. })) {
                world.violation(format!("monitor status: {}", ran.describe()));
            } else if says_corrupt(reply.as_ref()) {
                world.reader_saw_corrupt(format!("monitor status: {}", ran.describe()));
                let stuck = (0..3).all(|_| {
                    std::thread::sleep(Duration::from_millis(5));
                    says_corrupt(world.call(lock, "status", &[], None).reply().as_ref())
                });
                if stuck {
                    world.violation(format!(
                        "lock {} stays corrupt: {}",
                        lock_name(lock),
                        ran.describe()
                    ));
                }
            }
        }
        if round.is_multiple_of(4) {
            let ran = world.list();
            match (ran.out.code, ran.reply()) {
                (0, Some(Reply::List { locks, .. })) => {
                    for l in locks {
                        if l.stale_reason.as_deref() == Some("corrupt") {
                            world.reader_saw_corrupt(format!("monitor list: {l:?}"));
                        }
                    }
                }
                _ => world.violation(format!("monitor list: {}", ran.describe())),
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the witness file back and matches it with the sections the workers kept.
fn read_witness(world: &World, logs: &[WorkerLog]) -> Vec<Section> {
    let (marks, unreadable) = world.witness.marks();
    unreadable.into_iter().for_each(|u| world.violation(u));
    let mut per_worker: BTreeMap<usize, Vec<Mark>> = BTreeMap::new();
    for m in marks {
        per_worker.entry(m.holder).or_default().push(m);
    }
    let mut sections = Vec::new();
    for (w, log) in logs.iter().enumerate() {
        let lines = per_worker.remove(&w).unwrap_or_default();
        let kept: Vec<Mark> = log.sections.iter().map(|s| s.mark).collect();
        if lines != kept {
            world.violation(format!(
                "worker {w}: witness file ({} lines) does not match its {} sections",
                lines.len(),
                kept.len()
            ));
        }
        sections.extend(log.sections.iter().cloned());
    }
    if !per_worker.is_empty() {
        world.violation("witness lines of unknown workers".into());
    }
    sections
}

/// Every line of the history, parsed; torn lines are violations (property e).
fn read_history(world: &World) -> (Vec<Event>, bool) {
    let mut events = Vec::new();
    let rotated = world.run.join("history.1.jsonl");
    let was_rotated = rotated.exists();
    for path in [rotated, world.run.join("history.jsonl")] {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        if !text.is_empty() && !text.ends_with('\n') {
            world.violation(format!("{} does not end with a newline", path.display()));
        }
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue; // padding: no event straddles a 4 KiB block
            }
            match serde_json::from_str::<Event>(line) {
                Ok(ev) => events.push(ev),
                Err(e) => world.violation(format!(
                    "{} line {}: torn or unreadable ({e}): {line:?}",
                    path.display(),
                    n + 1
                )),
            }
        }
    }
    (events, was_rotated)
}

/// Checks the properties of docs/stress.md; returns how many overlaps were excused.
fn verify(world: &World, logs: &[WorkerLog]) -> u64 {
    let sections = read_witness(world, logs);
    let acqs: Vec<&Acq> = logs.iter().flat_map(|l| &l.acquisitions).collect();
    let ops: Vec<&TokenOp> = logs.iter().flat_map(|l| &l.token_ops).collect();
    let tokenless: HashMap<u32, u64> = logs
        .iter()
        .flat_map(|l| &l.tokenless)
        .map(|t| (t.pid, t.t0))
        .collect();
    let (events, rotated) = read_history(world);

    // (b) History: per lock, `acquired` fences strictly increase in file order.
    // Also: takeovers only of expired leases; and (lock, fence) -> start of the
    // tokenless release that removed it.
    let mut removed_by_tokenless: HashMap<(String, u64), u64> = HashMap::new();
    let mut history_acq: HashMap<(String, u64), u32> = HashMap::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut first_fence: HashMap<String, u64> = HashMap::new();
    for ev in &events {
        match ev.event {
            EventKind::Acquired => {
                let f = ev.fence.unwrap_or(0);
                let prev = last.insert(ev.lock.clone(), f);
                first_fence.entry(ev.lock.clone()).or_insert(f);
                if prev.is_some_and(|p| p >= f) {
                    world.violation(format!(
                        "history: {} acquired fence {f} after {prev:?}",
                        ev.lock
                    ));
                }
                if history_acq.insert((ev.lock.clone(), f), ev.pid).is_some() {
                    world.violation(format!("history: {} fence {f} acquired twice", ev.lock));
                }
            }
            EventKind::TookOver => {
                if ev.reason.as_deref() != Some("expired") {
                    world.violation(format!("history: takeover for {:?}: {ev:?}", ev.reason));
                }
            }
            EventKind::Renewed => {
                let f = ev.fence.unwrap_or(0);
                if last.get(&ev.lock).is_some_and(|&l| f < l) {
                    world.violation(format!(
                        "history: {} renewed fence {f} after acquired {:?}",
                        ev.lock,
                        last.get(&ev.lock)
                    ));
                }
            }
            EventKind::Released => {
                if let (Some(&t0), Some(prev)) = (tokenless.get(&ev.pid), &ev.previous) {
                    removed_by_tokenless.insert((ev.lock.clone(), prev.fence), t0);
                }
            }
            EventKind::ForcedRelease => {
                world.violation(format!(
                    "history: a forced release nobody asked for: {ev:?}"
                ));
            }
            EventKind::Refused => {}
        }
    }
    // Every acquisition a worker saw is in the history, by the same process.
    for a in &acqs {
        let name = lock_name(a.lock);
        if rotated && first_fence.get(&name).is_none_or(|&f| a.fence < f) {
            continue; // rotated out
        }
        match history_acq.get(&(name.clone(), a.fence)) {
            Some(&pid) if pid == a.pid => {}
            other => world.violation(format!(
                "acquisition {name} fence {} by pid {}: history has {other:?}",
                a.fence, a.pid
            )),
        }
    }

    for lock in 0..LOCKS.len() {
        let name = lock_name(lock);
        let mut mine: Vec<&Acq> = acqs.iter().copied().filter(|a| a.lock == lock).collect();
        // Unique fences among the acquisitions the workers saw.
        mine.sort_by_key(|a| a.fence);
        for w in mine.windows(2) {
            if w[0].fence == w[1].fence {
                world.violation(format!(
                    "{name}: fence {} handed out twice: {:?}",
                    w[0].fence, w
                ));
            }
        }
        // Real-time order: an acquisition that ended before another began
        // has the lower fence.
        let marks: Vec<Mark> = mine.iter().map(|a| a.mark()).collect();
        for (before, b) in chaos::regressions(&marks) {
            world.violation(format!(
                "{name}: fence {} acquired after fence {} had been",
                b.fence, before.fence
            ));
        }
        // A token op of fence f never starts after an acquisition of a later fence ended.
        // mine is sorted by fence: suffix minimum of end times.
        let mut suffix_min = vec![u64::MAX; mine.len() + 1];
        for k in (0..mine.len()).rev() {
            suffix_min[k] = suffix_min[k + 1].min(mine[k].t1);
        }
        for op in ops.iter().filter(|o| o.lock == lock) {
            let k = mine.partition_point(|a| a.fence <= op.fence);
            if op.t0 >= suffix_min[k] {
                world.violation(format!(
                    "{name}: {} of fence {} succeeded though it started after a later fence was acquired",
                    op.what, op.fence
                ));
            }
        }
    }
    judge_overlaps(world, &sections, &removed_by_tokenless)
}

/// (a) The witness: overlapping sections of one lock are only possible
/// when the older one's lease had already been lost (its deadline, or the
/// start of the tokenless release that removed it); returns how many
/// overlaps were so excused.
fn judge_overlaps(
    world: &World,
    sections: &[Section],
    removed_by_tokenless: &HashMap<(String, u64), u64>,
) -> u64 {
    let mut excused = 0;
    for (a, b) in chaos::overlaps(sections) {
        let name = lock_name(a.mark.lock);
        let (old, new) = if a.mark.fence <= b.mark.fence {
            (a, b)
        } else {
            (b, a)
        };
        if old.mark.fence == new.mark.fence {
            world.violation(format!(
                "{name}: workers {} and {} overlap in fence {}: {a:?} {b:?}",
                a.mark.holder, b.mark.holder, a.mark.fence
            ));
            continue;
        }
        if old.check_t0 > new.mark.enter {
            world.violation(format!("{name}: {old:?} checked after {new:?} entered"));
        }
        let lost = old.mark.believed.min(
            removed_by_tokenless
                .get(&(name.clone(), old.mark.fence))
                .copied()
                .unwrap_or(u64::MAX),
        );
        if lost > new.mark.enter {
            world.violation(format!(
                "{name}: sections overlap while the older lease was live: {old:?} {new:?}"
            ));
        } else {
            excused += 1;
        }
    }
    excused
}

/// (d) After the longest lease: nothing held, then one clean cycle per lock
/// leaves no temporary of that lock and no tombstone.
fn settle(world: &World) {
    std::thread::sleep(Duration::from_millis(MAX_TTL * 1000 + 1_500));
    let ran = world.list();
    let Some(Reply::List { locks, .. }) = ran.reply() else {
        world.violation(format!("list after the load: {}", ran.describe()));
        return;
    };
    for l in locks {
        if l.state != "stale" || l.stale_reason.as_deref() != Some("expired") {
            world.violation(format!(
                "after the longest lease a lock is not stale/expired: {l:?}"
            ));
        }
    }
    for lock in 0..LOCKS.len() {
        let ran = world.call(lock, "acquire", &["--ttl", "60"], None);
        let (
            0,
            Some(Reply::Acquired {
                token, took_over, ..
            }),
        ) = (ran.out.code, ran.reply())
        else {
            world.violation(format!("final acquire: {}", ran.describe()));
            continue;
        };
        if took_over.is_some_and(|t| t.reason != "expired") {
            world.violation(format!(
                "final acquire took over a non-expired lock: {}",
                ran.describe()
            ));
        }
        let ran = world.call(lock, "release", &["--token", &token], None);
        if !matches!(
            (ran.out.code, ran.reply()),
            (0, Some(Reply::Released { .. }))
        ) {
            world.violation(format!("final release: {}", ran.describe()));
        }
        let name = lock_name(lock);
        let left: Vec<String> = harness::tree(&world.run.join("tmp"))
            .into_iter()
            .filter(|p| p.starts_with(&name))
            .collect();
        if !left.is_empty() {
            world.violation(format!("run/tmp holds leftovers of {name}: {left:?}"));
        }
    }
    let leftovers = tombstones_left(world);
    let ran = world.list();
    match ran.reply() {
        Some(Reply::List {
            locks, tombstones, ..
        }) if locks.is_empty() && tombstones == leftovers => {}
        _ => world.violation(format!(
            "final list is not empty or miscounts the {leftovers} leftover tombstone(s): {}",
            ran.describe()
        )),
    }
}

/// The tombstones left in `run/tombs`. Each run removes only the tombstone it
/// renamed (SPEC §5 Trust), so one may stay only where SIGKILL ended its
/// maker between the rename and the removal: its name must carry the pid of
/// a killed invocation.
fn tombstones_left(world: &World) -> u64 {
    let killed = world.killed.lock().unwrap();
    let mut left = 0;
    for entry in std::fs::read_dir(world.run.join("tombs"))
        .into_iter()
        .flatten()
    {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        left += 1;
        let pid = name.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
        if !pid.is_some_and(|p| killed.contains(&p)) {
            world.violation(format!(
                "run/tombs holds {name:?}, which no killed run made (killed: {})",
                killed.len()
            ));
        }
    }
    left
}

/// Whether a reader seeing `corrupt` fails the run: yes, unless
/// `STRESS_LAX_READERS=1` (then they are only counted). Lax was the default
/// while BUG-1 (docs/stress.md: a reader could see a lock directory between a
/// takeover's two renames and call it corrupt) was open.
fn strict_readers() -> bool {
    std::env::var("STRESS_LAX_READERS").map_or(true, |v| v != "1")
}

/// One verified episode of `secs` seconds of load; its counters are added
/// to `summary`.
fn episode(seed: &Seed, n: u64, secs: u64, summary: &Stats) -> Vec<String> {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let world = World {
        run: repo.join(".git/apache-magpie/run"),
        repo,
        witness: Witness::create(env.path("witness.log")),
        deadline: Instant::now() + Duration::from_secs(secs),
        stats: Stats::new(COUNTERS),
        violations: Violations::new("stress"),
        reader_corrupt: Mutex::new(Vec::new()),
        killed: Mutex::new(HashSet::new()),
    };
    let stop = AtomicBool::new(false);
    let logs: Vec<WorkerLog> = std::thread::scope(|s| {
        let m = s.spawn(|| monitor(&world, &stop));
        let handles: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (world, rng) = (&world, seed.rng(n * 1000 + id as u64));
                s.spawn(move || worker(world, id, rng))
            })
            .collect();
        let logs = handles.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        m.join().unwrap();
        logs
    });
    let excused = verify(&world, &logs);
    settle(&world);
    // (c) at the end: no lock is corrupt.
    for lock in 0..LOCKS.len() {
        let ran = world.call(lock, "status", &[], None);
        if !matches!(ran.reply(), Some(Reply::Status { state, .. }) if state == "free") {
            world.violation(format!(
                "{} not free at the end: {}",
                lock_name(lock),
                ran.describe()
            ));
        }
    }
    let (events, _) = read_history(&world);
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for ev in &events {
        *kinds.entry(format!("{:?}", ev.event)).or_default() += 1;
    }
    eprintln!("stress: history events by kind: {kinds:?}");

    let st = &world.stats;
    st.bump("episodes");
    st.add(
        "sections",
        logs.iter().map(|l| l.sections.len() as u64).sum(),
    );
    st.add("excused_overlaps", excused);
    st.add("history_events", events.len() as u64);
    let mut violations = world.violations.take();
    let corrupt = world.reader_corrupt.into_inner().unwrap();
    for c in corrupt.iter().take(5) {
        eprintln!("stress: a reader saw corrupt (cf. BUG-1 in docs/stress.md): {c}");
    }
    if strict_readers() {
        violations.extend(
            corrupt
                .into_iter()
                .map(|c| format!("reader saw corrupt: {c}")),
        );
    }
    st.add("violations", violations.len() as u64);
    summary.merge(st);
    violations
}

fn stress(total_secs: u64, episode_secs: u64) {
    let seed = Seed::from_env("stress", "STRESS_SEED");
    eprintln!("stress: {WORKERS} workers, {total_secs} s");
    let summary = Stats::new(COUNTERS);
    let line = |start: Instant| {
        format!(
            "stress summary: seed={} secs={:.0} workers={WORKERS} {}",
            seed.value,
            start.elapsed().as_secs_f64(),
            summary.line()
        )
    };
    let mut all = Vec::new();
    let start = Instant::now();
    let mut n = 0;
    loop {
        let left = total_secs.saturating_sub(start.elapsed().as_secs());
        if left == 0 {
            break;
        }
        let secs = left.clamp(5, episode_secs.max(5));
        let v = episode(&seed, n, secs, &summary);
        eprintln!("stress: episode {n} ({secs} s): {}", line(start));
        all.extend(v);
        n += 1;
        if !all.is_empty() {
            break;
        }
    }
    eprintln!("{}", line(start));
    println!("{}", line(start));
    chaos::assert_none(&all, 20, seed.value, "stress");
    assert!(
        summary.count("acquired") > 0 && summary.count("sections") > 0,
        "no work was done"
    );
}

#[test]
fn stress_short() {
    let secs = env_secs("STRESS_SHORT_SECS", SHORT_SECS);
    stress(secs, secs);
}

#[test]
#[ignore = "long mode: STRESS_SECS (default 600) of back-to-back verified episodes"]
fn stress_long() {
    let secs = env_secs("STRESS_SECS", 600);
    stress(secs, env_secs("STRESS_EPISODE_SECS", 60));
}

// ---------------------------------------------------------------------------
// Pid-namespace scenario (issue 12 item 3; SPEC §6): holders inside fresh pid
// namespaces (`unshare --pid --fork --mount-proc`, where the holder names
// itself `--owner-pid 1`) race outside workers (some naming short-lived
// owner pids) on one lock; the namespaces are SIGKILLed at random moments.
// Every takeover is checked against the record it replaced:
// - `owner_dead` only of a record from the judge's own pid namespace (the
//   outside one): a pid seen from another namespace is never judged;
// - `expired` never before the replaced lease's end on the boot clock.

/// How `unshare` may make a pid namespace here (None: not allowed).
fn unshare_pid_args() -> Option<Vec<&'static str>> {
    [
        vec!["--pid", "--fork", "--mount-proc"],
        vec!["-r", "--pid", "--fork", "--mount-proc"],
    ]
    .into_iter()
    .find(|args| {
        Command::new("unshare")
            .args(args)
            .arg("true")
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

const NS_COUNTERS: &[&str] = &[
    "operations",
    "kills",
    "acquired_inside",
    "acquired_outside",
    "took_over_expired",
    "took_over_owner_dead",
    "took_over_corrupt",
];

fn ns_inode_of_self() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").unwrap().ino()
}

/// Checks one `acquired` reply against the record it replaced. `judge_ns`
/// is the pid namespace the acquirer ran in (None: a fresh inner one);
/// `returned_ms` the boot clock when its process had ended (after the decision).
fn ns_verdict(
    v: &Reply,
    judge_ns: Option<u64>,
    outside_ns: u64,
    returned_ms: u64,
    stats: &Stats,
) -> Option<String> {
    let Reply::Acquired {
        took_over: Some(took),
        ..
    } = v
    else {
        return None;
    };
    let prev = took.holder.as_ref();
    match took.reason.as_str() {
        "owner_dead" => {
            stats.bump("took_over_owner_dead");
            let theirs = prev.and_then(|h| h.pid_ns);
            // An outside judge may judge only outside records. An inside
            // judge never judges an outside record; it may find an earlier
            // inside record "in its namespace" only because a dead
            // namespace's inode number was reused (inside holders run one at
            // a time, each killed before the next), and that owner is gone.
            let ok = match judge_ns {
                Some(ns) => ns == outside_ns && theirs == Some(outside_ns),
                None => theirs.is_some() && theirs != Some(outside_ns),
            };
            (!ok).then(|| {
                format!(
                    "owner_dead judged across pid namespaces ({theirs:?} from {judge_ns:?}): {v:?}"
                )
            })
        }
        "expired" => {
            stats.bump("took_over_expired");
            let end = prev?.deadline_boot_ms?;
            (returned_ms < end).then(|| {
                format!(
                    "taken over {} ms before the lease ended: {v:?}",
                    end - returned_ms
                )
            })
        }
        "corrupt" => {
            stats.bump("took_over_corrupt");
            Some(format!("a healthy record was judged corrupt: {v:?}"))
        }
        other => Some(format!("unknown takeover reason {other:?}: {v:?}")),
    }
}

/// Holders inside fresh pid namespaces, killed at random moments.
fn ns_inside(repo: &std::path::Path, unshare: &[&str], mut rng: Rng, w: &NsWorld) {
    let bin = harness::BIN;
    while !w.stop.load(Ordering::Relaxed) {
        let ttl = rng.range(1, 2);
        let script = format!(
            "{bin} acquire stress --repo o/ns --ttl {ttl} --owner-pid $$ --wait 3; sleep 5"
        );
        // --kill-child: SIGKILL of unshare ends the whole namespace.
        let mut cmd = Command::new("unshare");
        cmd.args(unshare)
            .arg("--kill-child")
            .args(["sh", "-c", &script])
            .current_dir(repo);
        let how = Invoke {
            kill_after: Some(Duration::from_millis(rng.range(500, 4499))),
            ..Invoke::default()
        };
        let ran = chaos::invoke(cmd, how);
        w.stats.bump("operations");
        if ran.killed {
            w.stats.bump("kills");
        }
        let returned_ms = boot_ns() / 1_000_000;
        std::thread::sleep(Duration::from_millis(rng.below(1500)));
        let first = ran.out.stdout.lines().next().unwrap_or("");
        let Ok(v) = serde_json::from_str::<Reply>(first) else {
            continue;
        };
        if let Reply::Acquired { owner_pid, .. } = &v {
            w.stats.bump("acquired_inside");
            if *owner_pid != Some(1) {
                w.violations.add(format!("not pid 1: {v:?}"));
            }
            if let Some(bad) = ns_verdict(&v, None, w.outside_ns, returned_ms, &w.stats) {
                w.violations.add(bad);
            }
        }
    }
}

/// Outside workers: some name a short-lived owner pid.
fn ns_outside(repo: &std::path::Path, mut rng: Rng, w: &NsWorld) {
    let lock = Lock::new(repo, "stress", "o/ns");
    while !w.stop.load(Ordering::Relaxed) {
        let mut owner = rng.chance(50).then(|| {
            Command::new("sleep")
                .arg(format!("0.{}", rng.range(1, 9)))
                .spawn()
                .unwrap()
        });
        let pid = owner.as_ref().map(|o| o.id().to_string());
        let mut args = vec!["--ttl", "1"];
        args.extend(pid.iter().flat_map(|p| ["--owner-pid", p.as_str()]));
        let ran = chaos::invoke(
            lock.op("acquire").args(&args).into_command(),
            Invoke::default(),
        );
        let returned_ms = boot_ns() / 1_000_000;
        w.stats.bump("operations");
        match ran.reply() {
            Some(v @ Reply::Acquired { .. }) => {
                w.stats.bump("acquired_outside");
                let judge = Some(w.outside_ns);
                if let Some(bad) = ns_verdict(&v, judge, w.outside_ns, returned_ms, &w.stats) {
                    w.violations.add(bad);
                }
                std::thread::sleep(Duration::from_millis(rng.below(300)));
                if rng.chance(50) {
                    lock.op("release").token(v.token()).run();
                    w.stats.bump("operations");
                }
            }
            _ if ran.out.code != 3 => w.violations.add(format!("unexpected: {}", ran.describe())),
            _ => std::thread::sleep(Duration::from_millis(rng.range(50, 349))),
        }
        if let Some(o) = owner.as_mut() {
            let _ = o.wait();
        }
    }
}

/// What the pid-namespace scenario's threads share.
struct NsWorld {
    outside_ns: u64,
    stats: Stats,
    violations: Violations,
    stop: AtomicBool,
}

fn pid_namespace_scenario(secs: u64) {
    let Some(unshare) = unshare_pid_args() else {
        eprintln!("SKIPPED: stress pid-namespace scenario: unshare --pid is not allowed here");
        return;
    };
    let seed = Seed::from_env("stress-ns", "STRESS_SEED");
    let env = TestEnv::new();
    let repo = env.git_repo("r");
    let w = NsWorld {
        outside_ns: ns_inode_of_self(),
        stats: Stats::new(NS_COUNTERS),
        violations: Violations::new("stress-ns"),
        stop: AtomicBool::new(false),
    };
    std::thread::scope(|s| {
        let (w, repo, unshare) = (&w, &repo, &unshare);
        let rng = seed.rng(0);
        s.spawn(move || ns_inside(repo, unshare, rng, w));
        for t in 0..3u64 {
            let rng = seed.rng(100 + t);
            s.spawn(move || ns_outside(repo, rng, w));
        }
        // At least `secs`, and on until both sides have acquired (a loaded
        // machine can starve the inside holder for a while), at most 4 x secs.
        let started = Instant::now();
        let both = || w.stats.count("acquired_inside") > 0 && w.stats.count("acquired_outside") > 0;
        while started.elapsed() < Duration::from_secs(secs)
            || !both() && started.elapsed() < Duration::from_secs(4 * secs)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        w.stop.store(true, Ordering::Relaxed);
    });
    let v = w.violations.take();
    let line = format!(
        "stress-ns: seed={} {secs} s: {}; {} violations",
        seed.value,
        w.stats.line(),
        v.len()
    );
    eprintln!("{line}");
    println!("{line}");
    chaos::assert_none(&v, 20, seed.value, "stress-ns");
    assert!(
        w.stats.count("acquired_inside") > 0 && w.stats.count("acquired_outside") > 0,
        "the scenario did no work"
    );
}

#[test]
fn stress_pid_namespace() {
    pid_namespace_scenario(env_secs("STRESS_NS_SECS", 15));
}

#[test]
#[ignore = "long mode of the pid-namespace scenario: STRESS_NS_SECS (default 300)"]
fn stress_pid_namespace_long() {
    pid_namespace_scenario(env_secs("STRESS_NS_SECS", 300));
}

// ------------------------------------------------------- `run` in the mix
//
// A second harness, over two locks of their own, mixes what the first cannot
// (its verifier expects only `expired` takeovers): `run` with commands whose
// background children write to the witness with no check at all (so their
// safety rests on the tool alone), wrappers SIGKILLed at random moments,
// commands that exit leaving their background writer behind, commands whose
// writer daemonizes (`setsid`: it leaves CMD's group and session), wrappers
// started in a session of their own whose whole process group is SIGKILLed
// (a CI cancel), `--wait`, and
// `acquire --owner-pid` holders whose owner is SIGKILLed instead of released
// (an `owner_dead` takeover). Every write is one `O_APPEND` line
// `<lock> <fence>`; the property is that per lock, in write order, fences
// never go down: a line of an older fence after a newer one is two writers
// overlapping. Then: the history's `acquired` fences strictly increase per
// lock, every lock can be acquired again once the load stops, and the
// witness stops growing (no writer outlives its run).

const RUN_LOCKS: [(&str, &str); 2] = [("runs", "o/one"), ("runs", "o/two")];
const RUN_WORKERS: usize = 12;
/// Seconds of the `run` mix in the default (short) mode.
const RUN_SHORT_SECS: u64 = 8;

const RUN_COUNTERS: &[&str] = &[
    "operations",
    "runs",
    "ran",
    "left_behind",
    "daemons",
    "lost",
    "already_running",
    "kills",
    "group_kills",
    "acquired",
    "owner_kills",
    "released",
];

struct RunWorld {
    repo: PathBuf,
    run: PathBuf,
    witness: Witness,
    deadline: Instant,
    stats: Stats,
    violations: Violations,
}

impl RunWorld {
    fn lock(&self, i: usize) -> Lock {
        let (skill, repo) = RUN_LOCKS[i];
        Lock::new(&self.repo, skill, repo)
    }

    /// Runs `verb` on lock `i` to its end; SIGKILLs it `kill_after_ms`
    /// after the start, with `group` its whole process group (it then
    /// leads a session of its own).
    fn call(
        &self,
        i: usize,
        verb: &str,
        extra: &[&str],
        kill_after_ms: Option<u64>,
        group: bool,
    ) -> Ran {
        self.stats.bump("operations");
        let how = Invoke {
            kill_after: kill_after_ms.map(Duration::from_millis),
            group,
            ..Invoke::default()
        };
        let ran = chaos::invoke(self.lock(i).op(verb).args(extra).into_command(), how);
        if ran.outlived {
            self.violations.add(format!(
                "{verb} {extra:?} still holds its output open 30 s after it ended: something outlived it"
            ));
        }
        if ran.killed {
            self.stats.bump("kills");
            if group {
                self.stats.bump("group_kills");
            }
        }
        ran
    }
}

/// `run` of a shell whose background child writes `<lock> <fence>` every
/// 10 ms, a third of the time as a daemon (`setsid`: out of CMD's group and
/// session); the shell then either stops its child and exits, or exits
/// leaving it running (for `run` to stop). Sometimes with `--wait`,
/// sometimes the wrapper is SIGKILLed at a random moment, half of those
/// times with its whole process group.
fn run_once(world: &RunWorld, rng: &mut Rng) {
    const SCRIPT: &str = r#"W='while :; do echo "$1 $SKILL_LOCK_FENCE" >> "$2"; sleep 0.01; done'
if [ "$5" = daemon ]; then setsid sh -c "$W" sh "$1" "$2" & else sh -c "$W" sh "$1" "$2" & fi
sleep "$3"
if [ "$4" = clean ]; then kill $!; wait; fi
exit 0"#;
    let lock = rng.index(RUN_LOCKS.len());
    let ttl = rng.range(1, 3).to_string();
    let mut args = vec!["--ttl", &ttl];
    if rng.chance(50) {
        args.extend(["--wait", "2"]);
    }
    let secs = format!("0.{:02}", rng.below(40));
    let mode = if rng.chance(50) { "clean" } else { "leave" };
    let how = if rng.chance(33) { "daemon" } else { "child" };
    let witness = world.witness.path().to_str().unwrap();
    let lock_arg = lock.to_string();
    let cmd = [
        "sh", "-c", SCRIPT, "sh", &lock_arg, witness, &secs, mode, how,
    ];
    args.push("--");
    args.extend(cmd);
    let kill = rng.chance(25).then(|| rng.below(1_500));
    let group = kill.is_some() && rng.chance(50);
    world.stats.bump("runs");
    if how == "daemon" {
        world.stats.bump("daemons");
    }
    let ran = world.call(lock, "run", &args, kill, group);
    if ran.killed {
        return;
    }
    match (ran.out.code, ran.run_reply()) {
        (0, Some(Reply::Ran { lost: false, .. })) => {
            world.stats.bump("ran");
            if mode == "leave" {
                world.stats.bump("left_behind");
            }
        }
        (3, Some(Reply::AlreadyRunning { .. })) => world.stats.bump("already_running"),
        (143 | 137, Some(Reply::Ran { lost: true, .. })) => world.stats.bump("lost"),
        _ => world.violations.add(format!("run: {}", ran.describe())),
    }
}

/// `acquire --owner-pid` of a `sleep` child (sometimes with `--wait`, the
/// acquire sometimes SIGKILLed), a few witnessed writes, then a token
/// release or the owner SIGKILLed (the lock is then `owner_dead`).
fn owner_hold(world: &RunWorld, rng: &mut Rng, pen: &mut Pen) {
    let mut owner = Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep starts");
    let lock = rng.index(RUN_LOCKS.len());
    let pid = owner.id().to_string();
    let mut args = vec!["--ttl", "60", "--owner-pid", &pid];
    if rng.chance(50) {
        args.extend(["--wait", "2"]);
    }
    let kill = rng.chance(10).then(|| rng.below(15));
    let ran = world.call(lock, "acquire", &args, kill, false);
    match (ran.out.code, ran.reply()) {
        _ if ran.killed => {}
        (0, Some(Reply::Acquired { fence, token, .. })) => {
            world.stats.bump("acquired");
            for _ in 0..=rng.below(3) {
                pen.raw(&format!("{lock} {fence}\n"));
                std::thread::sleep(Duration::from_millis(rng.range(5, 44)));
            }
            if rng.chance(50) {
                let ran = world.call(lock, "release", &["--token", &token], None, false);
                if !matches!(
                    (ran.out.code, ran.reply()),
                    (0, Some(Reply::Released { .. }))
                ) {
                    world
                        .violations
                        .add(format!("release of a held lock: {}", ran.describe()));
                }
                world.stats.bump("released");
            }
        }
        (3, Some(Reply::AlreadyRunning { .. })) => {}
        _ => world.violations.add(format!("acquire: {}", ran.describe())),
    }
    // The holder writes nothing more: its owner may die now.
    let _ = owner.kill();
    let _ = owner.wait();
    world.stats.bump("owner_kills");
}

fn run_worker(world: &RunWorld, mut rng: Rng) {
    let mut pen = world.witness.pen();
    while Instant::now() < world.deadline {
        if rng.chance(60) {
            run_once(world, &mut rng);
        } else {
            owner_hold(world, &mut rng, &mut pen);
        }
    }
}

/// Per lock, in write order, fences never go down; returns the number of
/// witnessed holders (distinct (lock, fence) runs of lines).
fn run_verify_witness(world: &RunWorld) -> u64 {
    // Each line is `<lock> <fence>`: its place in the file is its time.
    let mut marks = Vec::new();
    for (n, line) in world.witness.lines().iter().enumerate() {
        let Some((lock, fence)) = line
            .split_once(' ')
            .and_then(|(l, f)| Some((l.parse().ok()?, f.parse().ok()?)))
        else {
            world
                .violations
                .add(format!("witness line {} unreadable: {line:?}", n + 1));
            continue;
        };
        let at = n as u64;
        marks.push(Mark {
            lock,
            fence,
            holder: 0,
            enter: at,
            exit: at,
            believed: Mark::UNCHECKED,
        });
    }
    for (later, b) in chaos::regressions(&marks) {
        world.violations.add(format!(
            "witness line {}: lock {} fence {} wrote after fence {}: two writers overlapped",
            b.enter + 1,
            b.lock,
            b.fence,
            later.fence
        ));
    }
    let mut holders: Vec<(usize, u64)> = marks.iter().map(|m| (m.lock, m.fence)).collect();
    holders.sort_unstable();
    holders.dedup();
    holders.len() as u64
}

/// History: per lock, `acquired` fences strictly increase in file order;
/// returns the takeovers by reason.
fn run_verify_history(world: &RunWorld) -> BTreeMap<String, u64> {
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut takeovers = BTreeMap::new();
    for name in ["history.1.jsonl", "history.jsonl"] {
        let Ok(text) = std::fs::read_to_string(world.run.join(name)) else {
            continue;
        };
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(ev) = serde_json::from_str::<Event>(line) else {
                world
                    .violations
                    .add(format!("{name}: unreadable line {line:?}"));
                continue;
            };
            let lock = format!("{}@{}", ev.skill, ev.repo);
            match ev.event {
                EventKind::Acquired => {
                    let fence = ev.fence.unwrap_or(0);
                    let prev = last.insert(lock.clone(), fence).unwrap_or(0);
                    if fence <= prev {
                        world
                            .violations
                            .add(format!("{lock}: fence {fence} acquired after {prev}"));
                    }
                }
                EventKind::TookOver => {
                    *takeovers.entry(ev.reason.unwrap_or_default()).or_default() += 1;
                }
                _ => {}
            }
        }
    }
    takeovers
}

/// After the load: every lock can be taken again within a lease and a
/// grace, and nothing writes to the witness any more.
fn run_settle(world: &RunWorld) {
    for lock in 0..RUN_LOCKS.len() {
        let args = ["--wait", "10", "--ttl", "5"];
        let ran = world.call(lock, "acquire", &args, None, false);
        let Some(Reply::Acquired { token, .. }) = ran.reply() else {
            world.violations.add(format!(
                "lock {lock} stuck after the load: {}",
                ran.describe()
            ));
            continue;
        };
        world.call(lock, "release", &["--token", &token], None, false);
    }
    let before = world.witness.len();
    std::thread::sleep(Duration::from_millis(500));
    if world.witness.len() != before {
        world.violations.add(
            "the witness still grows after every run ended: a writer outlived its lock".into(),
        );
    }
}

fn run_episode(seed: &Seed, secs: u64) -> (String, Vec<String>) {
    let env = TestEnv::new();
    let repo = env.git_repo("repo");
    let world = RunWorld {
        run: repo.join(".git/apache-magpie/run"),
        repo,
        witness: Witness::create(env.path("witness.log")),
        deadline: Instant::now() + Duration::from_secs(secs),
        stats: Stats::new(RUN_COUNTERS),
        violations: Violations::new("stress(run)"),
    };
    let started = Instant::now();
    std::thread::scope(|s| {
        for id in 0..RUN_WORKERS {
            let (world, rng) = (&world, seed.rng(id as u64));
            s.spawn(move || run_worker(world, rng));
        }
    });
    run_settle(&world);
    let holders = run_verify_witness(&world);
    let takeovers = run_verify_history(&world);
    let violations = world.violations.take();
    let line = format!(
        "stress(run) summary: seed={} secs={:.0} workers={RUN_WORKERS} {} \
         witnessed_holders={holders} takeovers={takeovers:?} violations={}",
        seed.value,
        started.elapsed().as_secs_f64(),
        world.stats.line(),
        violations.len()
    );
    (line, violations)
}

fn stress_run(secs: u64) {
    let seed = Seed::from_env("stress(run)", "STRESS_SEED");
    let (line, violations) = run_episode(&seed, secs);
    eprintln!("{line}");
    println!("{line}");
    chaos::assert_none(&violations, 20, seed.value, "stress(run)");
}

#[test]
fn stress_run_short() {
    stress_run(env_secs("STRESS_RUN_SHORT_SECS", RUN_SHORT_SECS));
}

#[test]
#[ignore = "long mode of the run mix: STRESS_SECS (default 600)"]
fn stress_run_long() {
    stress_run(env_secs("STRESS_SECS", 600));
}
