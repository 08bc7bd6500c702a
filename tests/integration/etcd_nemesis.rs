//! Nemesis test of the etcd store (SPEC §7, §8; issue 13 item 5; how to read
//! it and the long-mode figures are in `docs/stress.md`).
//!
//! A 3-member etcd cluster on loopback, each member behind a TCP proxy of
//! this test; clients reach the members only through the proxies, the members
//! talk to each other directly. At least 16 worker threads run the real
//! binary in a loop: acquire a lock (ttl 2-4 s), then "write" a few times,
//! each write preceded by `check --token` and none after a failed check, then
//! release with the token. A quarter of the workers go through `run ... --
//! <writer>` instead, where the writer is this test binary re-entered
//! (`run_writer`) and writes with `SKILL_LOCK_FENCE`, never checking: `run`
//! alone keeps it from writing unprotected. Every write is one line of an
//! `O_APPEND` witness file: lock, fence, worker, enter and exit on
//! `CLOCK_MONOTONIC` (one clock for every process of this machine), and the
//! end of the lease as its writer could be sure of it (the check's start
//! plus its `expires_in` less one second, since `expires_in` is rounded up;
//! no end for a `run` writer, which never checks). A quarter of the check
//! workers' turns write on until a check says the lease is gone (it is never
//! renewed), racing the next acquirer at the lease's end.
//!
//! Meanwhile a nemesis thread, seeded (the seed is printed first;
//! `SKILL_LOCK_NEMESIS_SEED` replays the fault mix, not the timing), injects
//! one fault at a time, each kind once per shuffled round: SIGKILL of the
//! leader and its restart, SIGSTOP and SIGCONT of a member, a proxy that cuts
//! (closes every connection and refuses new ones), hangs (accepts and
//! forwards nothing) or slows (delays every chunk), two members stopped at
//! once (quorum lost), and every proxy cut or hung (clients cut off). Then
//! everything heals and the workers stop.
//!
//! Checked: no two writes of one lock overlap while both writers believed
//! their lease valid; in write order fences never go backwards (a write
//! whose writer believed its lease valid never follows a write of a later
//! fence); time safety: a check worker's lease (never renewed) is not taken
//! over before its acquire's start plus the ttl granted, unless released;
//! fences follow real time; once healed and stopped, no lock is held under a
//! fence no worker was given (a ghost) or one its worker saw released, and
//! after every known token was released and the longest lease ran out,
//! nothing is held; every command answered within its bound (the store's
//! 5 s, plus its own 3 s to settle an unknown outcome and 1 s of clean-up,
//! plus 3 s of process start on a loaded machine; `store_unavailable` is an
//! answer, a hang is not; answers past 6 s are counted). A violation fails the test, naming the
//! workers, fences, times (ms since the start) and the faults at the time.
//!
//! Short mode (in `cargo test`): 25 s of load. Long mode:
//! `SKILL_LOCK_NEMESIS_SECS=300`. Skipped visibly without `etcd` on PATH;
//! `SKILL_LOCK_TEST_ETCD_REQUIRED=1` makes it mandatory. Ports 24500-24599
//! only: members' clients 24501-24503, peers 24511-24513, proxies
//! 24521-24523.
//!
//! Covers: SPEC §7, §8.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Cmd, Out, TestEnv, Value};

const BASE: u16 = 24500;
const LOCKS: [(&str, &str); 3] = [("nemesis", "o/a"), ("nemesis", "o/b"), ("other", "o/a")];
const WORKERS: usize = 16;
/// Every fourth worker goes through `run`.
const RUN_EVERY: usize = 4;
const MIN_TTL: u64 = 2;
const MAX_TTL: u64 = 4;
/// The store's deadline of one command (SKILL_LOCK_ETCD_TIMEOUT), seconds.
const STORE_TIMEOUT: u64 = 5;
/// What a command may take beyond the store's deadline: 3 s to settle an
/// unknown outcome and 1 s of clean-up after a commit (their own budgets in
/// `src/store/etcd`), and 3 s for process start and exit on a loaded
/// 2-core machine. Answers later than the deadline plus 1 s are counted.
const SLACK: Duration = Duration::from_secs(7);
/// A command still running after this long is killed and counted as a hang.
const HARD: Duration = Duration::from_secs(30);
const SHORT_SECS: u64 = 25;
/// Fault kinds: leader SIGKILL, member SIGSTOP, proxy cut, hang, slow,
/// two members SIGSTOPped (quorum lost), every proxy cut or hung.
const KINDS: u64 = 7;

// ---------------------------------------------------------------- helpers

/// xorshift64*: a seed that can be replayed, no `rand` crate.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process here.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    u64::try_from(ts.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap()
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().filter(|s| !s.is_empty()).map(|s| {
        s.parse()
            .unwrap_or_else(|_| panic!("{name}={s:?}: give a whole number"))
    })
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) of a child of this test.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Sleeps `d`, in small steps, returning early once `stop` is set.
fn nap(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

// ------------------------------------------------------------------ proxy

const PASS: u8 = 0;
const CUT: u8 = 1;
const HANG: u8 = 2;
const SLOW: u8 = 3;

/// One TCP proxy in front of one member.
struct Proxy {
    mode: Arc<AtomicU8>,
    delay_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start(port: u16, upstream: u16) -> Self {
        let mode = Arc::new(AtomicU8::new(PASS));
        let delay_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let up: SocketAddr = ([127, 0, 0, 1], upstream).into();
        let first = TcpListener::bind(addr).unwrap_or_else(|e| panic!("proxy binds {addr}: {e}"));
        first.set_nonblocking(true).unwrap();
        let (m, d, s) = (mode.clone(), delay_ms.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut listener = Some(first);
            while !s.load(Ordering::Relaxed) {
                if m.load(Ordering::Relaxed) == CUT {
                    listener = None; // refuse new connections
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let Some(l) = listener.as_ref() else {
                    match TcpListener::bind(addr) {
                        Ok(l) => {
                            let _ = l.set_nonblocking(true);
                            listener = Some(l);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                    continue;
                };
                match l.accept() {
                    Ok((client, _)) => {
                        let (m, d, s) = (m.clone(), d.clone(), s.clone());
                        std::thread::spawn(move || connect(client, up, &m, &d, &s));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self {
            mode,
            delay_ms,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, mode: u8, delay_ms: u64) {
        self.delay_ms.store(delay_ms, Ordering::Relaxed);
        self.mode.store(mode, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn connect(
    client: TcpStream,
    up: SocketAddr,
    m: &Arc<AtomicU8>,
    d: &Arc<AtomicU64>,
    s: &Arc<AtomicBool>,
) {
    let _ = client.set_nonblocking(false);
    // A dead member: the client sees its connection closed at once.
    let Ok(server) = TcpStream::connect_timeout(&up, Duration::from_secs(1)) else {
        return;
    };
    for st in [&client, &server] {
        let _ = st.set_nodelay(true);
        let _ = st.set_read_timeout(Some(Duration::from_millis(20)));
        let _ = st.set_write_timeout(Some(Duration::from_secs(2)));
    }
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (m2, d2, st2) = (m.clone(), d.clone(), s.clone());
    let back = std::thread::spawn(move || pump(s2, c2, &m2, &d2, &st2));
    pump(client, server, m, d, s);
    let _ = back.join();
}

/// Copies `from` to `to` as the proxy's mode says, until either end closes,
/// the link is cut or the proxy stops.
fn pump(mut from: TcpStream, mut to: TcpStream, m: &AtomicU8, d: &AtomicU64, s: &AtomicBool) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mode = m.load(Ordering::Relaxed);
        if s.load(Ordering::Relaxed) || mode == CUT {
            break;
        }
        if mode == HANG {
            // Read nothing: the kernel's buffers fill and the peer stalls.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if m.load(Ordering::Relaxed) == SLOW {
                    std::thread::sleep(Duration::from_millis(d.load(Ordering::Relaxed)));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

// ---------------------------------------------------------------- cluster

fn have_etcd() -> bool {
    common::have_programs(
        "the etcd nemesis test",
        &[("etcd", "--version"), ("etcdctl", "version")],
    )
}

/// Three members; `None` while one is killed.
struct Cluster {
    dir: PathBuf,
    members: Mutex<Vec<Option<Child>>>,
    /// Member ids, as `endpoint status` names them.
    ids: Vec<u64>,
}

fn client_port(i: usize) -> u16 {
    BASE + 1 + i as u16
}

fn proxy_port(i: usize) -> u16 {
    BASE + 21 + i as u16
}

impl Cluster {
    fn spawn(dir: &Path, i: usize) -> Child {
        let clients: Vec<u16> = (0..3).map(client_port).collect();
        let peers: Vec<u16> = (0..3).map(|k| BASE + 11 + k as u16).collect();
        let tuning = common::EtcdTuning {
            heartbeat_ms: 50,
            election_ms: 500,
        };
        common::etcd_member(dir, i, &common::loopback_urls(&clients), &peers, tuning)
            .spawn()
            .expect("etcd starts")
    }

    fn start(dir: &Path) -> Self {
        let members = (0..3).map(|i| Some(Self::spawn(dir, i))).collect();
        let mut c = Self {
            dir: dir.to_owned(),
            members: Mutex::new(members),
            ids: Vec::new(),
        };
        let start = Instant::now();
        loop {
            if c.ids.len() < 3 {
                let ids: Vec<Option<u64>> = (0..3).map(|i| c.status(i).map(|s| s.0)).collect();
                if ids.iter().all(Option::is_some) {
                    c.ids = ids.into_iter().flatten().collect();
                }
            }
            if c.ids.len() == 3 && c.leader().is_some() {
                return c;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the 3-member cluster did not elect a leader in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// (member id, leader id) from member `i` itself, directly (no proxy).
    fn status(&self, i: usize) -> Option<(u64, u64)> {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &format!("127.0.0.1:{}", client_port(i))])
            .args(["--dial-timeout", "1s", "--command-timeout", "1s"])
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        let s = &v.as_array()?.first()?["Status"];
        Some((s["header"]["member_id"].as_u64()?, s["leader"].as_u64()?))
    }

    /// Index of the leader, as a running member sees it.
    fn leader(&self) -> Option<usize> {
        for i in 0..3 {
            if let Some((_, leader)) = self.status(i)
                && leader != 0
            {
                return self.ids.iter().position(|&id| id == leader);
            }
        }
        None
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.members.lock().unwrap()[i].as_ref().map(Child::id)
    }

    fn kill(&self, i: usize) {
        if let Some(mut c) = self.members.lock().unwrap()[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn restart(&self, i: usize) {
        let mut m = self.members.lock().unwrap();
        if m[i].is_none() {
            m[i] = Some(Self::spawn(&self.dir, i));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut m = self
            .members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in m.iter_mut().flatten() {
            signal(c.id(), libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ------------------------------------------------------------------ world

/// Counters of one run.
#[derive(Default)]
struct Stats {
    commands: AtomicU64,
    acquired: AtomicU64,
    takeovers: AtomicU64,
    already_running: AtomicU64,
    unavailable: AtomicU64,
    checks_held: AtomicU64,
    checks_lost: AtomicU64,
    released: AtomicU64,
    release_refused: AtomicU64,
    runs: AtomicU64,
    runs_lost: AtomicU64,
    over_bound: AtomicU64,
    past_deadline: AtomicU64,
    hangs: AtomicU64,
    max_ms: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// What became of an acquisition a worker was told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Acquired and not yet released (or the release did not answer).
    Held,
    /// `released`, `refused` or `not_held`: the worker no longer holds it.
    Gone,
}

#[derive(Debug)]
struct Known {
    lock: usize,
    fence: u64,
    worker: usize,
    token: Option<String>,
    fate: Fate,
    /// The acquire command's start and end (`CLOCK_MONOTONIC` ns).
    t0: u64,
    t1: u64,
    /// The ttl granted; `None` for `run`, which renews.
    ttl: Option<u64>,
    /// Start of the release that said `released` or did not answer.
    release_t0: Option<u64>,
    /// How it was acquired (`took_over` reason), for messages.
    how: String,
}

struct World {
    url: String,
    cwd: PathBuf,
    witness: PathBuf,
    t0: u64,
    stats: Stats,
    faults: Mutex<BTreeMap<&'static str, u64>>,
    known: Mutex<Vec<Known>>,
    /// The slowest bounded command and its answer.
    slowest: Mutex<String>,
    /// (start, end, what) of every fault injected.
    spans: Mutex<Vec<(u64, u64, String)>>,
    violations: Mutex<Vec<String>>,
    /// pid -> (deadline, command line) of every command in flight.
    inflight: Mutex<HashMap<u32, (Instant, String)>>,
}

/// One finished command.
struct Ran {
    out: Out,
    t0: u64,
    t1: u64,
}

impl World {
    fn ms(&self, ns: u64) -> f64 {
        (ns.saturating_sub(self.t0)) as f64 / 1e6
    }

    fn violation(&self, what: String) {
        eprintln!("VIOLATION {what}");
        self.violations.lock().unwrap().push(what);
    }

    fn fault(&self, kind: &'static str) {
        *self.faults.lock().unwrap().entry(kind).or_default() += 1;
    }

    /// Records a fault that lasted from `start` until now.
    fn span(&self, start: u64, what: String) {
        self.spans.lock().unwrap().push((start, mono_ns(), what));
    }

    /// The faults that overlapped [from, to], for a violation's message.
    fn faults_during(&self, from: u64, to: u64) -> String {
        let spans = self.spans.lock().unwrap();
        let hit: Vec<String> = spans
            .iter()
            .filter(|(s, e, _)| *s <= to && *e >= from)
            .map(|(s, e, w)| format!("{w} [{:.0}, {:.0}] ms", self.ms(*s), self.ms(*e)))
            .collect();
        if hit.is_empty() {
            "no fault".to_owned()
        } else {
            hit.join(", ")
        }
    }

    fn cmd(&self) -> Cmd {
        Cmd::new(&self.cwd)
            .env("SKILL_LOCK_STORE", &self.url)
            .env("SKILL_LOCK_ETCD_TIMEOUT", STORE_TIMEOUT.to_string())
    }

    /// Runs one command; `bound` is the time it must answer within (none for `run`).
    fn invoke(&self, cmd: Cmd, what: String, bound: Option<Duration>) -> Ran {
        bump(&self.stats.commands);
        let t0 = mono_ns();
        let start = Instant::now();
        let child = cmd
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary starts");
        let pid = child.id();
        self.inflight
            .lock()
            .unwrap()
            .insert(pid, (start + HARD, what.clone()));
        let output = child.wait_with_output().expect("wait for the binary");
        self.inflight.lock().unwrap().remove(&pid);
        let took = start.elapsed();
        let t1 = mono_ns();
        let out = Out::from(output);
        let ms = took.as_millis() as u64;
        if bound.is_some() && self.stats.max_ms.fetch_max(ms, Ordering::Relaxed) < ms {
            *self.slowest.lock().unwrap() =
                format!("`{what}` at {:.0} ms: {}", self.ms(t0), out.stdout.trim());
        }
        if bound.is_some() && took > Duration::from_secs(STORE_TIMEOUT + 1) {
            bump(&self.stats.past_deadline);
        }
        if took >= HARD {
            bump(&self.stats.hangs);
            self.violation(format!(
                "hang: `{what}` started at {:.0} ms had no answer after {:.1} s (killed)",
                self.ms(t0),
                took.as_secs_f64()
            ));
        } else if let Some(b) = bound
            && took > b
        {
            bump(&self.stats.over_bound);
            self.violation(format!(
                "slow answer: `{what}` started at {:.0} ms answered after {:.1} s (bound {:.0} s): {}",
                self.ms(t0),
                took.as_secs_f64(),
                b.as_secs_f64(),
                out.stdout.trim()
            ));
        }
        if out.json["error"] == "store_unavailable" {
            bump(&self.stats.unavailable);
        }
        Ran { out, t0, t1 }
    }

    fn lock_cmd(&self, verb: &str, lock: usize) -> (Cmd, String) {
        let (skill, repo) = LOCKS[lock];
        (
            self.cmd().args([verb, skill, "--repo", repo]),
            format!("{verb} {skill} --repo {repo}"),
        )
    }

    fn bound(&self) -> Option<Duration> {
        Some(Duration::from_secs(STORE_TIMEOUT) + SLACK)
    }

    fn remember(&self, k: Known) {
        self.known.lock().unwrap().push(k);
    }

    /// A release of (lock, fence) started at `t0` ended: `gone` when the
    /// worker no longer holds it, `released` when it may have released it.
    fn released(&self, lock: usize, fence: u64, t0: u64, gone: bool, released: bool) {
        for k in self.known.lock().unwrap().iter_mut() {
            if k.lock == lock && k.fence == fence {
                if gone {
                    k.fate = Fate::Gone;
                }
                if released && k.release_t0.is_none() {
                    k.release_t0 = Some(t0);
                }
            }
        }
    }
}

/// Kills commands that outlive [`HARD`] (each is then reported as a hang).
fn watchdog(world: &World, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        {
            let now = Instant::now();
            let map = world.inflight.lock().unwrap();
            for (&pid, (deadline, _)) in map.iter() {
                if now >= *deadline {
                    signal(pid, libc::SIGKILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn unexpected(world: &World, what: &str, ran: &Ran) {
    let o = &ran.out;
    if o.json["error"] != "store_unavailable" {
        world.violation(format!(
            "unexpected answer to {what} at {:.0} ms: exit {} {} {}",
            world.ms(ran.t0),
            o.code,
            o.stdout.trim(),
            o.stderr.trim()
        ));
    }
}

// ---------------------------------------------------------------- workers

fn witness_line(
    lock: usize,
    fence: u64,
    worker: usize,
    enter: u64,
    exit: u64,
    believed: u64,
) -> String {
    format!("{lock} {fence} {worker} {enter} {exit} {believed}\n")
}

/// A worker that checks before each write.
fn check_worker(world: &World, id: usize, seed: u64, stop: &AtomicBool) {
    let mut rng = Rng::new(seed);
    let mut witness = OpenOptions::new()
        .append(true)
        .open(&world.witness)
        .expect("witness file");
    while !stop.load(Ordering::Relaxed) {
        let lock = rng.below(LOCKS.len() as u64) as usize;
        let ttl = rng.range(MIN_TTL, MAX_TTL);
        let (c, what) = world.lock_cmd("acquire", lock);
        let ran = world.invoke(
            c.args(["--ttl", &ttl.to_string()]),
            what.clone(),
            world.bound(),
        );
        let v = &ran.out.json;
        let (token, fence) = match (ran.out.code, v["result"].as_str()) {
            (0, Some("acquired")) => {
                bump(&world.stats.acquired);
                if !v["took_over"].is_null() {
                    bump(&world.stats.takeovers);
                }
                let (Some(t), Some(f)) = (v["token"].as_str(), v["fence"].as_u64()) else {
                    world.violation(format!(
                        "acquired without token or fence: {}",
                        ran.out.stdout
                    ));
                    continue;
                };
                world.remember(Known {
                    lock,
                    fence: f,
                    worker: id,
                    token: Some(t.to_owned()),
                    fate: Fate::Held,
                    t0: ran.t0,
                    t1: ran.t1,
                    ttl: v["ttl"].as_u64(),
                    release_t0: None,
                    how: if v["took_over"].is_null() {
                        "free".to_owned()
                    } else {
                        format!("took over: {}", v["took_over"])
                    },
                });
                (t.to_owned(), f)
            }
            (3, Some("already_running")) => {
                bump(&world.stats.already_running);
                std::thread::sleep(Duration::from_millis(rng.range(30, 200)));
                continue;
            }
            _ => {
                unexpected(world, &what, &ran);
                std::thread::sleep(Duration::from_millis(rng.range(50, 300)));
                continue;
            }
        };
        // Mostly a few writes; sometimes write on until a check says the
        // lease is gone (it is never renewed), racing the next acquirer.
        let writes = if rng.chance(25) {
            u64::MAX
        } else {
            rng.range(1, 4)
        };
        for _ in 0..writes {
            if mono_ns() > ran.t0 + (ttl + 30) * 1_000_000_000 {
                world.violation(format!(
                    "worker {id}: fence {fence} (ttl {ttl} s, acquired at {:.0} ms, never renewed) still held at {:.0} ms",
                    world.ms(ran.t0),
                    world.ms(mono_ns())
                ));
                break;
            }
            let (c, what) = world.lock_cmd("check", lock);
            let ran = world.invoke(c.args(["--token", &token]), what.clone(), world.bound());
            let v = &ran.out.json;
            match (ran.out.code, v["result"].as_str()) {
                (0, Some("held")) => bump(&world.stats.checks_held),
                (4, Some(_)) => {
                    bump(&world.stats.checks_lost);
                    break;
                }
                _ => {
                    unexpected(world, &what, &ran);
                    break;
                }
            }
            if v["fence"].as_u64().is_some_and(|f| f != fence) {
                world.violation(format!(
                    "check held names fence {}, not {fence}",
                    v["fence"]
                ));
                break;
            }
            let Some(expires_in) = v["expires_in"].as_u64() else {
                world.violation(format!("check held without expires_in: {}", ran.out.stdout));
                break;
            };
            // expires_in is rounded up: the lease had more than
            // expires_in - 1 s left when the check began.
            let believed = ran.t0 + expires_in.saturating_sub(1) * 1_000_000_000;
            let enter = mono_ns();
            std::thread::sleep(Duration::from_micros(rng.range(200, 3_000)));
            let exit = mono_ns();
            witness
                .write_all(witness_line(lock, fence, id, enter, exit, believed).as_bytes())
                .expect("witness write");
            std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
        }
        let (c, what) = world.lock_cmd("release", lock);
        let ran = world.invoke(c.args(["--token", &token]), what.clone(), world.bound());
        match (ran.out.code, ran.out.json["result"].as_str()) {
            (0, Some("released")) => {
                bump(&world.stats.released);
                world.released(lock, fence, ran.t0, true, true);
            }
            (0, Some("not_held")) | (4, Some("refused")) => {
                bump(&world.stats.release_refused);
                world.released(lock, fence, ran.t0, true, false);
            }
            _ => {
                unexpected(world, &what, &ran);
                world.released(lock, fence, ran.t0, false, true);
            }
        }
        std::thread::sleep(Duration::from_millis(rng.range(0, 200)));
    }
}

/// A worker that wraps a writer in `run`.
fn run_worker(world: &World, id: usize, seed: u64, stop: &AtomicBool) {
    let mut rng = Rng::new(seed);
    let exe = std::env::current_exe().expect("the test binary's path");
    while !stop.load(Ordering::Relaxed) {
        let lock = rng.below(LOCKS.len() as u64) as usize;
        let ttl = rng.range(MIN_TTL, MAX_TTL);
        let writes = rng.range(2, 12);
        let (skill, repo) = LOCKS[lock];
        let c = world
            .cmd()
            .env("NEMESIS_WITNESS", &world.witness)
            .env("NEMESIS_LOCK", lock.to_string())
            .env("NEMESIS_WORKER", id.to_string())
            .env("NEMESIS_WRITES", writes.to_string())
            .env("NEMESIS_SEED", rng.next().to_string())
            .args([
                "run",
                skill,
                "--repo",
                repo,
                "--ttl",
                &ttl.to_string(),
                "--",
            ])
            .arg(&exe)
            .args([
                "--ignored",
                "--exact",
                "etcd_nemesis::run_writer",
                "--nocapture",
                "--test-threads=1",
                "-q",
            ]);
        let what = format!("run {skill} --repo {repo} --ttl {ttl} -- writer");
        let ran = world.invoke(c, what.clone(), None);
        // run's one JSON object is the last line of its standard error.
        let v: Value = ran
            .out
            .stderr
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .unwrap_or(Value::Null);
        match v["result"].as_str() {
            Some("ran") => {
                bump(&world.stats.runs);
                bump(&world.stats.acquired);
                if v["lost"] == true {
                    bump(&world.stats.runs_lost);
                }
                if let Some(f) = v["fence"].as_u64() {
                    world.remember(Known {
                        lock,
                        fence: f,
                        worker: id,
                        token: None,
                        fate: if v["released"] == true {
                            Fate::Gone
                        } else {
                            Fate::Held
                        },
                        t0: ran.t0,
                        t1: ran.t1,
                        ttl: None,
                        release_t0: None,
                        how: "run".to_owned(),
                    });
                }
                if v["exit_status"] != 0 && v["lost"] != true {
                    world.violation(format!(
                        "run's writer failed without a lost lease at {:.0} ms: {v} {}",
                        world.ms(ran.t0),
                        ran.out.stdout.trim()
                    ));
                }
            }
            Some("already_running") => {
                bump(&world.stats.already_running);
                std::thread::sleep(Duration::from_millis(rng.range(30, 200)));
            }
            _ => {
                if v["error"] == "store_unavailable" {
                    bump(&world.stats.unavailable);
                } else {
                    world.violation(format!(
                        "unexpected answer to {what} at {:.0} ms: exit {} {}",
                        world.ms(ran.t0),
                        ran.out.code,
                        ran.out.stderr.trim()
                    ));
                }
                std::thread::sleep(Duration::from_millis(rng.range(50, 300)));
            }
        }
    }
}

/// The command `run` workers wrap (this test binary re-entered, see
/// `run_worker`): it writes `NEMESIS_WRITES` times to the witness with the
/// fence `run` gave it, never checking. Outside a nemesis run it does nothing.
#[test]
#[ignore = "not a test: the writer that the nemesis test's `run` workers wrap"]
fn run_writer() {
    let Some(path) = std::env::var_os("NEMESIS_WITNESS") else {
        return;
    };
    let num = |k: &str| -> u64 {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} is set by the nemesis test"))
    };
    let (lock, worker, writes) = (
        num("NEMESIS_LOCK"),
        num("NEMESIS_WORKER"),
        num("NEMESIS_WRITES"),
    );
    let fence = num("SKILL_LOCK_FENCE");
    let mut rng = Rng::new(num("NEMESIS_SEED"));
    let mut witness = OpenOptions::new()
        .append(true)
        .open(path)
        .expect("witness file");
    for _ in 0..writes {
        let enter = mono_ns();
        std::thread::sleep(Duration::from_micros(rng.range(200, 3_000)));
        let exit = mono_ns();
        witness
            .write_all(
                witness_line(lock as usize, fence, worker as usize, enter, exit, u64::MAX)
                    .as_bytes(),
            )
            .expect("witness write");
        std::thread::sleep(Duration::from_millis(rng.range(50, 400)));
    }
}

// ---------------------------------------------------------------- nemesis

fn nemesis(world: &World, cluster: &Cluster, proxies: &[Proxy], seed: u64, stop: &AtomicBool) {
    let mut rng = Rng::new(seed);
    let log = |what: String| eprintln!("nemesis {:>8.0} ms: {what}", world.ms(mono_ns()));
    // Rounds of every kind in a shuffled order, so a short run sees each.
    let mut round: Vec<u64> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        nap(Duration::from_millis(rng.range(200, 1_200)), stop);
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if round.is_empty() {
            round = (0..KINDS).collect();
            for k in (1..round.len()).rev() {
                round.swap(k, rng.below(k as u64 + 1) as usize);
            }
        }
        let kind = round.pop().unwrap_or(0);
        // Outages of the whole cluster sometimes outlast a command's 5 s.
        let hold = Duration::from_millis(if kind >= 5 {
            rng.range(1_000, 7_000)
        } else {
            rng.range(500, 3_000)
        });
        match kind {
            0 => {
                let Some(l) = cluster.leader() else {
                    world.fault("no_leader_seen");
                    continue;
                };
                world.fault("leader_sigkill");
                log(format!("SIGKILL leader n{l} for {hold:?}"));
                let t = mono_ns();
                cluster.kill(l);
                nap(hold, stop);
                cluster.restart(l);
                world.span(t, format!("leader n{l} SIGKILLed"));
                log(format!("restarted n{l}"));
            }
            1 => {
                let i = if rng.chance(50) {
                    cluster.leader().unwrap_or(0)
                } else {
                    rng.below(3) as usize
                };
                let Some(pid) = cluster.pid(i) else { continue };
                world.fault("member_sigstop");
                log(format!("SIGSTOP n{i} for {hold:?}"));
                let t = mono_ns();
                signal(pid, libc::SIGSTOP);
                nap(hold, stop);
                signal(pid, libc::SIGCONT);
                world.span(t, format!("n{i} SIGSTOPped"));
                log(format!("SIGCONT n{i}"));
            }
            5 => {
                // Quorum lost: two members stopped at once.
                let i = rng.below(3) as usize;
                let j = (i + 1 + rng.below(2) as usize) % 3;
                let pids: Vec<u32> = [i, j].iter().filter_map(|&m| cluster.pid(m)).collect();
                world.fault("quorum_sigstop");
                log(format!("SIGSTOP n{i} and n{j} for {hold:?}"));
                let t = mono_ns();
                for &p in &pids {
                    signal(p, libc::SIGSTOP);
                }
                nap(hold, stop);
                for &p in &pids {
                    signal(p, libc::SIGCONT);
                }
                world.span(t, format!("n{i} and n{j} SIGSTOPped"));
                log(format!("SIGCONT n{i} and n{j}"));
            }
            6 => {
                // Clients cut off: every proxy cut or hung.
                let modes: Vec<u8> = (0..3)
                    .map(|_| if rng.chance(50) { CUT } else { HANG })
                    .collect();
                world.fault("all_proxies_down");
                log(format!("all proxies cut/hang {modes:?} for {hold:?}"));
                let t = mono_ns();
                for (p, &m) in proxies.iter().zip(&modes) {
                    p.set(m, 0);
                }
                nap(hold, stop);
                for p in proxies {
                    p.set(PASS, 0);
                }
                world.span(t, format!("all proxies down {modes:?}"));
                log("healed all proxies".to_owned());
            }
            k => {
                let i = rng.below(3) as usize;
                let (kind, mode, delay) = match k {
                    2 => ("proxy_cut", CUT, 0),
                    3 => ("proxy_hang", HANG, 0),
                    4 => ("proxy_slow", SLOW, rng.range(50, 1_500)),
                    _ => unreachable!("fault kind {k}"),
                };
                world.fault(kind);
                log(format!("{kind} p{i} for {hold:?} (delay {delay} ms)"));
                let t = mono_ns();
                proxies[i].set(mode, delay);
                nap(hold, stop);
                proxies[i].set(PASS, 0);
                world.span(t, format!("{kind} p{i} (delay {delay} ms)"));
                log(format!("healed p{i}"));
            }
        }
    }
    // Heal everything.
    for (i, p) in proxies.iter().enumerate() {
        p.set(PASS, 0);
        cluster.restart(i);
        if let Some(pid) = cluster.pid(i) {
            signal(pid, libc::SIGCONT);
        }
    }
}

// --------------------------------------------------------------- checking

#[derive(Debug, Clone, Copy)]
struct Write1 {
    lock: usize,
    fence: u64,
    worker: usize,
    enter: u64,
    exit: u64,
    /// End of the lease as its writer saw it (`u64::MAX` for `run`).
    believed: u64,
}

impl Write1 {
    fn valid(&self) -> bool {
        self.exit <= self.believed
    }
}

fn read_witness(world: &World) -> Vec<Write1> {
    let text = std::fs::read_to_string(&world.witness).expect("witness file");
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let f: Vec<u64> = line.split(' ').filter_map(|x| x.parse().ok()).collect();
        if f.len() != 6 {
            world.violation(format!("witness line {} unreadable: {line:?}", n + 1));
            continue;
        }
        out.push(Write1 {
            lock: f[0] as usize,
            fence: f[1],
            worker: f[2] as usize,
            enter: f[3],
            exit: f[4],
            believed: f[5],
        });
    }
    out
}

fn show(world: &World, w: &Write1) -> String {
    let believed = if w.believed == u64::MAX {
        "run".to_owned()
    } else {
        format!("lease seen to {:.0} ms", world.ms(w.believed))
    };
    format!(
        "worker {} fence {} [{:.1}, {:.1}] ms ({believed})",
        w.worker,
        w.fence,
        world.ms(w.enter),
        world.ms(w.exit)
    )
}

/// Overlap and fence order; returns (writes, excused overlaps).
fn check_witness(world: &World) -> (usize, u64) {
    let writes = read_witness(world);
    let mut excused = 0;
    for (lock, (skill, repo)) in LOCKS.iter().enumerate() {
        let name = format!("{skill}@{repo}");
        let mut ws: Vec<Write1> = writes.iter().filter(|w| w.lock == lock).copied().collect();
        ws.sort_by_key(|w| w.enter);
        // Overlap: writes in flight at once, of different holders.
        let mut active: Vec<Write1> = Vec::new();
        for b in &ws {
            active.retain(|a| a.exit > b.enter);
            for a in &active {
                if a.fence == b.fence && a.worker == b.worker {
                    continue;
                }
                if a.valid() && b.valid() {
                    world.violation(format!(
                        "{name}: overlapping writes while both leases looked valid: {} and {}; faults then: {}",
                        show(world, a),
                        show(world, b),
                        world.faults_during(a.enter.saturating_sub(5_000_000_000), b.exit)
                    ));
                } else {
                    excused += 1;
                }
            }
            active.push(*b);
        }
        // Fence order: a write believed valid never follows (entirely) a write of a later fence.
        let mut by_exit = ws.clone();
        by_exit.sort_by_key(|w| w.exit);
        let mut done = 0;
        let mut max: Option<Write1> = None;
        for b in &ws {
            while done < by_exit.len() && by_exit[done].exit <= b.enter {
                if max.is_none_or(|m| by_exit[done].fence > m.fence) {
                    max = Some(by_exit[done]);
                }
                done += 1;
            }
            if let Some(m) = max
                && m.fence > b.fence
            {
                if b.valid() {
                    world.violation(format!(
                        "{name}: fence went backwards: {} after {}; faults then: {}",
                        show(world, b),
                        show(world, &m),
                        world.faults_during(m.enter.saturating_sub(5_000_000_000), b.exit)
                    ));
                } else {
                    excused += 1;
                }
            }
        }
    }
    (writes.len(), excused)
}

/// Time safety (SPEC §7): a lease a check worker was granted (it never
/// renews) ends no earlier than its acquire's start plus the ttl; unless the
/// worker released it before, the next fence of that lock cannot be acquired
/// before then. Also: fences of one lock strictly increase with acquisitions
/// that do not overlap in time.
fn check_time_safety(world: &World) {
    let known = world.known.lock().unwrap();
    for (lock, (skill, repo)) in LOCKS.iter().enumerate() {
        let name = format!("{skill}@{repo}");
        let mut acq: Vec<&Known> = known.iter().filter(|k| k.lock == lock).collect();
        acq.sort_by_key(|k| k.fence);
        for pair in acq.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if a.fence == b.fence {
                world.violation(format!(
                    "{name}: fence {} given twice, to workers {} and {}",
                    a.fence, a.worker, b.worker
                ));
            }
            if b.t1 < a.t0 {
                world.violation(format!(
                    "{name}: fence {} (worker {}, acquired in [{:.0}, {:.0}] ms) is below fence {} acquired earlier (worker {}, [{:.0}, {:.0}] ms)",
                    a.fence, a.worker, world.ms(a.t0), world.ms(a.t1),
                    b.fence, b.worker, world.ms(b.t0), world.ms(b.t1)
                ));
            }
            let Some(ttl) = a.ttl else { continue };
            let earliest = a.t0 + ttl * 1_000_000_000;
            let released_before = a.release_t0.is_some_and(|r| r < b.t1);
            if !released_before && b.t1 < earliest {
                world.violation(format!(
                    "{name}: time safety: worker {} acquired fence {} in [{:.0}, {:.0}] ms ({}), {:.2} s before the lease of fence {} could end (worker {}, acquire began at {:.0} ms, ttl {ttl} s, so not before {:.0} ms; {}); faults then: {}",
                    b.worker,
                    b.fence,
                    world.ms(b.t0),
                    world.ms(b.t1),
                    b.how,
                    (earliest - b.t1) as f64 / 1e9,
                    a.fence,
                    a.worker,
                    world.ms(a.t0),
                    world.ms(earliest),
                    a.release_t0.map_or("no release before".to_owned(), |r| format!("release began at {:.0} ms", world.ms(r))),
                    world.faults_during(a.t0, b.t1)
                ));
            }
        }
    }
}

/// Status of a lock, retried while the store does not answer.
fn status(world: &World, lock: usize) -> Value {
    for _ in 0..10 {
        let (c, what) = world.lock_cmd("status", lock);
        let ran = world.invoke(c, what, world.bound());
        if ran.out.code == 0 {
            return ran.out.json;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    world.violation(format!(
        "status of lock {lock} never answered after the faults healed"
    ));
    Value::Null
}

/// After the faults healed and the workers stopped: no ghost locks.
fn check_ghosts(world: &World) {
    for (lock, (_, repo)) in LOCKS.iter().enumerate() {
        let v = status(world, lock);
        if v["state"] != "held" {
            continue;
        }
        let fence = v["holder"]["fence"].as_u64();
        let known = world.known.lock().unwrap();
        match known
            .iter()
            .find(|k| k.lock == lock && Some(k.fence) == fence)
        {
            None => world.violation(format!(
                "ghost lock {repo}: held under fence {fence:?} that no worker was given: {v}"
            )),
            Some(k) if k.fate == Fate::Gone => world.violation(format!(
                "lock {repo} still held under fence {fence:?} that worker {} saw released: {v}",
                k.worker
            )),
            Some(_) => {}
        }
    }
    // Release every token a worker may still hold, then outlive every lease.
    let tokens: Vec<(usize, String)> = world
        .known
        .lock()
        .unwrap()
        .iter()
        .filter(|k| k.fate == Fate::Held)
        .filter_map(|k| k.token.clone().map(|t| (k.lock, t)))
        .collect();
    for (lock, token) in tokens {
        let (c, what) = world.lock_cmd("release", lock);
        world.invoke(c.args(["--token", &token]), what, world.bound());
    }
    std::thread::sleep(Duration::from_secs(MAX_TTL + 1));
    for (lock, (_, repo)) in LOCKS.iter().enumerate() {
        let v = status(world, lock);
        if v["state"] == "held" {
            world.violation(format!(
                "ghost lock {repo}: still held {} s after every worker stopped and released: {v}",
                MAX_TTL + 1
            ));
        }
    }
}

// ------------------------------------------------------------------- main

/// Violations counted by kind, for the summary line.
fn by_kind(violations: &[String]) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for v in violations {
        let kind = [
            "time safety",
            "overlapping writes",
            "fence went backwards",
            "ghost lock",
            "still held",
            "slow answer",
            "hang",
            "unexpected answer",
        ]
        .into_iter()
        .find(|k| v.contains(k))
        .unwrap_or("other");
        *m.entry(kind).or_default() += 1;
    }
    m
}

/// Sets `stop` when dropped, so that a panic never leaves threads looping.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn etcd_nemesis() {
    if !have_etcd() {
        return;
    }
    let secs = env_u64("SKILL_LOCK_NEMESIS_SECS").unwrap_or(SHORT_SECS);
    let seed = env_u64("SKILL_LOCK_NEMESIS_SEED")
        .unwrap_or_else(|| mono_ns() ^ u64::from(std::process::id()).rotate_left(32));
    eprintln!(
        "etcd nemesis: seed {seed} (SKILL_LOCK_NEMESIS_SEED), {secs} s of load, {WORKERS} workers"
    );
    let env = TestEnv::new();
    let cwd = env.git_repo("w");
    let witness = env.path("witness.log");
    std::fs::File::create(&witness).unwrap();
    let cluster = Cluster::start(&env.path("etcd"));
    let proxies: Vec<Proxy> = (0..3)
        .map(|i| Proxy::start(proxy_port(i), client_port(i)))
        .collect();
    let url = format!(
        "etcd://{}/nemesis/",
        (0..3)
            .map(|i| format!("127.0.0.1:{}", proxy_port(i)))
            .collect::<Vec<_>>()
            .join(",")
    );
    let world = World {
        url,
        cwd,
        witness,
        t0: mono_ns(),
        stats: Stats::default(),
        faults: Mutex::default(),
        known: Mutex::default(),
        spans: Mutex::default(),
        slowest: Mutex::default(),
        violations: Mutex::default(),
        inflight: Mutex::default(),
    };
    let stop = AtomicBool::new(false);
    let stop_watchdog = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|s| {
        let _guard = StopOnDrop(&stop_watchdog);
        let _guard2 = StopOnDrop(&stop);
        s.spawn(|| watchdog(&world, &stop_watchdog));
        let mut rng = Rng::new(seed);
        let nemesis_seed = rng.next();
        let workers: Vec<_> = (0..WORKERS)
            .map(|id| {
                let (w, st, sd) = (&world, &stop, rng.next());
                s.spawn(move || {
                    if id % RUN_EVERY == RUN_EVERY - 1 {
                        run_worker(w, id, sd, st);
                    } else {
                        check_worker(w, id, sd, st);
                    }
                })
            })
            .collect();
        let (w, c, p, st) = (&world, &cluster, &proxies, &stop);
        let n = s.spawn(move || nemesis(w, c, p, nemesis_seed, st));
        nap(Duration::from_secs(secs), &AtomicBool::new(false));
        stop.store(true, Ordering::Relaxed);
        n.join().expect("nemesis thread");
        for w in workers {
            w.join().expect("worker thread");
        }
        stop_watchdog.store(true, Ordering::Relaxed);
    });
    let load = started.elapsed();
    // Give the healed cluster a moment to elect a leader before judging.
    let healed = Instant::now();
    while cluster.leader().is_none() && healed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (writes, excused) = check_witness(&world);
    check_time_safety(&world);
    check_ghosts(&world);
    let st = &world.stats;
    let faults = world.faults.lock().unwrap();
    let violations = world.violations.lock().unwrap();
    eprintln!(
        "etcd nemesis: seed {seed}, {:.0} s: {} commands, {} acquired ({} takeovers, {} through run, {} runs lost their lease), \
         {} already_running, {} store_unavailable, {} checks held, {} checks lost, {} released, {} release refused/not_held, \
         {writes} writes, {excused} overlaps excused (a lease already seen ended), slowest answer {} ms ({}), {} past the 5 s deadline + 1 s, {} over bound, {} hangs; \
         faults {faults:?}; {} violations {:?}",
        load.as_secs_f64(),
        get(&st.commands),
        get(&st.acquired),
        get(&st.takeovers),
        get(&st.runs),
        get(&st.runs_lost),
        get(&st.already_running),
        get(&st.unavailable),
        get(&st.checks_held),
        get(&st.checks_lost),
        get(&st.released),
        get(&st.release_refused),
        get(&st.max_ms),
        world.slowest.lock().unwrap(),
        get(&st.past_deadline),
        get(&st.over_bound),
        get(&st.hangs),
        violations.len(),
        by_kind(&violations)
    );
    assert!(
        violations.is_empty(),
        "etcd nemesis (seed {seed}): {} violations:\n{}",
        violations.len(),
        violations
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        get(&st.acquired) > 0 && writes > 0,
        "the workload never acquired or wrote: nothing was tested"
    );
}
