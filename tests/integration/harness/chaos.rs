//! The chaos kit the stress, nemesis, linearizability and etcd fault tests
//! share: a seeded random source whose seed is printed (and printed again
//! on failure) so a mix can be replayed; the binary run as a client that
//! can be SIGKILLed mid-call and is bounded in time; counters; a witness
//! (who wrote under which fence, believing its lease valid until when,
//! checked for two holders at once); a TCP proxy that passes, cuts, hangs,
//! slows or severs; and a 3-member etcd cluster on loopback whose members
//! can be killed, stopped and restarted.
//!
//! Ports: the clusters of these tests live in 33000-33999, each test in a
//! hundred of its own; that range is inside Linux's ephemeral ports, so a
//! cluster takes the first block of its hundred that nothing holds now (a
//! client socket of another process, say). Proxies listen on free ports.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::Out;
use super::verbs::Reply;

// ---------------------------------------------------------------- random

/// A seeded generator (fastrand's wyrand): the same seed, the same mix.
pub struct Rng(fastrand::Rng);

impl Rng {
    /// A generator replaying `seed`.
    pub fn new(seed: u64) -> Self {
        Self(fastrand::Rng::with_seed(seed))
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        self.0.u64(lo..=hi)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// Any number (a seed for another generator).
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }

    /// An index into a slice of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        self.0.usize(..len)
    }

    /// Shuffles `items` in place.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        self.0.shuffle(items);
    }
}

/// The seed of one run: from `var` when set (a replay), else from the
/// clock. Printed when drawn, and again if the test fails, with the way to
/// replay it; timing is not replayed, the mix is.
pub struct Seed {
    pub value: u64,
    var: &'static str,
}

impl Seed {
    /// The seed of the run `what`, from `var` or the clock.
    pub fn from_env(what: &str, var: &'static str) -> Self {
        let value = env_u64(var).unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            nanos ^ u64::from(std::process::id()).rotate_left(32)
        });
        eprintln!("{what}: seed {value} (replay the mix with {var}={value})");
        Self { value, var }
    }

    /// The generator of stream `n` (one per worker, fault thread...).
    pub fn rng(&self, n: u64) -> Rng {
        Rng::new(self.value ^ (n + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "FAILED with seed {0}: replay with {1}={0}",
                self.value, self.var
            );
        }
    }
}

/// A whole number from the environment (`None`: unset or empty).
#[track_caller]
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().filter(|s| !s.is_empty()).map(|s| {
        s.parse()
            .unwrap_or_else(|_| panic!("{name}={s:?}: give a whole number"))
    })
}

// ----------------------------------------------------------------- stats

/// Named counters, shared by every thread of a run, printed in the order
/// they were declared.
pub struct Stats {
    names: &'static [&'static str],
    counts: Vec<AtomicU64>,
}

impl Stats {
    /// Counters `names`, all zero.
    pub fn new(names: &'static [&'static str]) -> Self {
        Self {
            names,
            counts: names.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[track_caller]
    fn slot(&self, name: &str) -> &AtomicU64 {
        let i = self.names.iter().position(|n| *n == name);
        &self.counts[i.unwrap_or_else(|| panic!("no counter {name:?}"))]
    }

    /// Adds one to `name`.
    #[track_caller]
    pub fn bump(&self, name: &str) {
        self.add(name, 1);
    }

    /// Adds `n` to `name`.
    #[track_caller]
    pub fn add(&self, name: &str, n: u64) {
        self.slot(name).fetch_add(n, Ordering::Relaxed);
    }

    /// Raises `name` to `v` if below; its value before.
    #[track_caller]
    pub fn max(&self, name: &str, v: u64) -> u64 {
        self.slot(name).fetch_max(v, Ordering::Relaxed)
    }

    /// The value of `name` now.
    #[track_caller]
    pub fn count(&self, name: &str) -> u64 {
        self.slot(name).load(Ordering::Relaxed)
    }

    /// Adds every counter of `other` (the same names) to this one.
    pub fn merge(&self, other: &Self) {
        for name in other.names {
            self.add(name, other.count(name));
        }
    }

    /// `name=value` of every counter, in order.
    pub fn line(&self) -> String {
        self.names
            .iter()
            .map(|n| format!("{n}={}", self.count(n)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Violations of one run, each printed as it is found.
pub struct Violations {
    tag: &'static str,
    found: Mutex<Vec<String>>,
}

impl Violations {
    /// None yet; each is printed after `tag`.
    pub fn new(tag: &'static str) -> Self {
        Self {
            tag,
            found: Mutex::new(Vec::new()),
        }
    }

    /// Records (and prints) one.
    pub fn add(&self, what: String) {
        eprintln!("{}: VIOLATION: {what}", self.tag);
        self.found.lock().unwrap().push(what);
    }

    /// Every one so far, leaving none.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.found.lock().unwrap())
    }
}

/// Fails with the first `n` violations, naming the seed, when there are any.
#[track_caller]
pub fn assert_none(violations: &[String], n: usize, seed: u64, what: &str) {
    assert!(
        violations.is_empty(),
        "{what} (seed {seed}): {} violations; first ones:\n{}",
        violations.len(),
        violations
            .iter()
            .take(n)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ----------------------------------------------------------------- time

/// The lease clock in nanoseconds (Linux `CLOCK_BOOTTIME`, elsewhere
/// `CLOCK_MONOTONIC`): one clock for every process of this machine, and
/// the one same-boot lease deadlines (`deadline_boot_ms`) are kept on.
pub fn boot_ns() -> u64 {
    #[cfg(target_os = "linux")]
    const CLOCK: libc::clockid_t = libc::CLOCK_BOOTTIME;
    #[cfg(not(target_os = "linux"))]
    const CLOCK: libc::clockid_t = libc::CLOCK_MONOTONIC;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write into.
    let rc = unsafe { libc::clock_gettime(CLOCK, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    u64::try_from(ts.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap()
}

/// Sleeps `d`, in small steps, returning early once `stop` is set.
pub fn nap(d: Duration, stop: &AtomicBool) {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

/// Sets `stop` when dropped, so that a panic never leaves threads looping.
pub struct StopOnDrop<'a>(pub &'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// kill(2) of a process (or, negative, a process group) this test started.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) of a child of this test.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

// --------------------------------------------------------------- clients

/// The running client of one worker, which another thread may SIGKILL
/// mid-call: its pid while it is not reaped (so a kill never reaches a
/// reused pid).
pub type Slot = Mutex<Option<u32>>;

/// SIGKILLs the client in `slot`, if one runs (not merely waits to be
/// reaped); whether one did.
pub fn kill_in(slot: &Slot) -> bool {
    let g = slot.lock().unwrap();
    g.is_some_and(|pid| {
        !ended(pid, libc::WNOHANG) && {
            // SAFETY: the pid is not reaped while it is in the slot.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) == 0 }
        }
    })
}

/// How a client is run.
#[derive(Default, Clone, Copy)]
pub struct Invoke<'a> {
    /// SIGKILL it this long after it started.
    pub kill_after: Option<Duration>,
    /// It leads a session and process group of its own, and kills go to the group.
    pub group: bool,
    /// SIGKILL it if it has not ended after this long (it `hung`).
    pub hard: Option<Duration>,
    /// Where another thread may find it to SIGKILL it.
    pub slot: Option<&'a Slot>,
}

/// One finished invocation: what it printed, and when it ran on [`boot_ns`].
pub struct Ran {
    pub out: Out,
    pub pid: u32,
    pub t0: u64,
    pub t1: u64,
    /// SIGKILL ended it.
    pub killed: bool,
    /// It outlived [`Invoke::hard`] and was killed.
    pub hung: bool,
    /// Something it started still held its output open 30 s after it ended.
    pub outlived: bool,
}

impl Ran {
    /// How long it ran.
    pub fn took(&self) -> Duration {
        Duration::from_nanos(self.t1.saturating_sub(self.t0))
    }

    /// Its one JSON object on stdout, typed (None: none, or not a known reply).
    pub fn reply(&self) -> Option<Reply> {
        serde_json::from_str(self.out.stdout.trim_end()).ok()
    }

    /// `run`'s object, the last line of its stderr, typed.
    pub fn run_reply(&self) -> Option<Reply> {
        serde_json::from_str(self.out.stderr.lines().last().unwrap_or("")).ok()
    }

    /// Whether it answered `store_unavailable` (on stdout).
    pub fn unavailable(&self) -> bool {
        matches!(self.reply(), Some(Reply::Error { error, .. }) if error == "store_unavailable")
    }

    /// Pid, exit status and output, for a violation's message.
    pub fn describe(&self) -> String {
        format!(
            "pid {} exit {}: {} {}",
            self.pid,
            self.out.code,
            self.out.stdout.trim_end(),
            self.out.stderr.trim_end()
        )
    }
}

/// Reads a pipe to its end on a thread of its own.
fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

/// Has `pid` ended? Reaps nothing (`WNOWAIT`); with `WNOHANG` answers at
/// once, else waits until it has.
fn ended(pid: u32, flags: i32) -> bool {
    loop {
        // SAFETY: siginfo is plain data to write into; WNOWAIT leaves the child unreaped.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid,
                &raw mut info,
                libc::WEXITED | libc::WNOWAIT | flags,
            )
        };
        if rc == 0 {
            // With WNOHANG and no change, the pid field stays zero.
            // SAFETY: waitid filled it in.
            return unsafe { info.si_pid() } != 0;
        }
        if std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            return true;
        }
    }
}

/// Waits on a thread of its own, without reaping it, until `pid` has ended
/// (so its pid stays ours).
fn exited(pid: u32) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        ended(pid, 0);
        let _ = tx.send(());
    });
    rx
}

/// Runs `cmd` (stdin empty, output captured) as `how` says.
pub fn invoke(mut cmd: Command, how: Invoke<'_>) -> Ran {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if how.group {
        // SAFETY: only setsid (async-signal-safe) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    }
    let t0 = boot_ns();
    let mut child = cmd.spawn().expect("the binary starts");
    let pid = child.id();
    let target = if how.group { -(pid as i32) } else { pid as i32 } as u32;
    if let Some(slot) = how.slot {
        *slot.lock().unwrap() = Some(pid);
    }
    let (stdout, stderr) = (drain(child.stdout.take()), drain(child.stderr.take()));
    if let Some(d) = how.kill_after {
        std::thread::sleep(d);
        signal(target, libc::SIGKILL);
    }
    let ended = exited(pid);
    let hung = match how.hard {
        Some(hard) => ended
            .recv_timeout(hard.saturating_sub(Duration::from_nanos(boot_ns() - t0)))
            .is_err(),
        None => false,
    };
    if hung {
        signal(target, libc::SIGKILL);
    }
    let _ = ended.recv();
    let t1 = boot_ns();
    if let Some(slot) = how.slot {
        *slot.lock().unwrap() = None;
    }
    let status = child.wait().expect("the child is reaped");
    // Its output ends when the last process holding it does: bounded, so a
    // process that outlives the client fails the run instead of hanging it.
    let bound = Instant::now() + Duration::from_secs(30);
    let mut outlived = false;
    let mut collect = |rx: mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(bound.saturating_duration_since(Instant::now()))
            .unwrap_or_else(|_| {
                outlived = true;
                Vec::new()
            })
    };
    let output = std::process::Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    };
    Ran {
        out: Out::from(output),
        pid,
        t0,
        t1,
        killed: status.signal() == Some(libc::SIGKILL),
        hung,
        outlived,
    }
}

// --------------------------------------------------------------- witness

/// One write a holder made believing it held `lock` under `fence`, from
/// `enter` to `exit` ([`boot_ns`]), its lease valid (as far as it could be
/// sure) until `believed` ([`Mark::UNCHECKED`] for a writer that never checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub lock: usize,
    pub fence: u64,
    pub holder: usize,
    pub enter: u64,
    pub exit: u64,
    pub believed: u64,
}

impl Mark {
    /// `believed` of a writer that never checks (`run`'s command): only the
    /// tool keeps it from writing unprotected, so its writes always count.
    pub const UNCHECKED: u64 = u64::MAX;

    /// Its line in the witness file.
    pub fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {}\n",
            self.lock, self.fence, self.holder, self.enter, self.exit, self.believed
        )
    }

    /// A line of the witness file read back.
    pub fn parse(line: &str) -> Option<Self> {
        let f: Vec<u64> = line
            .split(' ')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [lock, fence, holder, enter, exit, believed] = f[..] else {
            return None;
        };
        Some(Self {
            lock: usize::try_from(lock).ok()?,
            fence,
            holder: usize::try_from(holder).ok()?,
            enter,
            exit,
            believed,
        })
    }

    /// Did the write end while its writer still believed its lease valid?
    pub fn believed_valid(&self) -> bool {
        self.exit <= self.believed
    }
}

impl AsRef<Self> for Mark {
    fn as_ref(&self) -> &Self {
        self
    }
}

/// The witness file: one `O_APPEND` line per write, from every process.
pub struct Witness {
    path: PathBuf,
}

impl Witness {
    /// An empty witness file at `path`.
    pub fn create(path: PathBuf) -> Self {
        File::create(&path).expect("witness file");
        Self { path }
    }

    /// Where it is (for a writer in another process).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A writer's own handle (append mode: whole lines never interleave).
    pub fn pen(&self) -> Pen {
        Pen::append(&self.path)
    }

    /// Every line, in write order.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .expect("witness file")
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Every mark, and the lines that are none (numbered from 1).
    pub fn marks(&self) -> (Vec<Mark>, Vec<String>) {
        let mut bad = Vec::new();
        let mut marks = Vec::new();
        for (n, line) in self.lines().iter().enumerate() {
            match Mark::parse(line) {
                Some(m) => marks.push(m),
                None => bad.push(format!("witness line {} unreadable: {line:?}", n + 1)),
            }
        }
        (marks, bad)
    }

    /// Its size in bytes (to see whether anything still writes).
    pub fn len(&self) -> u64 {
        std::fs::metadata(&self.path).map_or(0, |m| m.len())
    }
}

/// One writer's handle on the witness file.
pub struct Pen(File);

impl Pen {
    /// The witness file at `path` opened for appending (by a writer in
    /// another process too).
    pub fn append(path: &Path) -> Self {
        Self(
            OpenOptions::new()
                .append(true)
                .open(path)
                .expect("witness file"),
        )
    }

    /// Appends `m`'s line.
    pub fn write(&mut self, m: &Mark) {
        self.raw(&m.line());
    }

    /// Appends a line of another shape (a shell writer's, say).
    pub fn raw(&mut self, line: &str) {
        self.0.write_all(line.as_bytes()).expect("witness write");
    }
}

/// Writes of one lock by two holders (fence or holder differ) in flight at
/// once, as (the one entered first, the other): the candidates for two
/// holders at once, for the test to judge.
pub fn overlaps<T: AsRef<Mark>>(writes: &[T]) -> Vec<(&T, &T)> {
    let mut sorted: Vec<&T> = writes.iter().collect();
    sorted.sort_by_key(|w| (w.as_ref().lock, w.as_ref().enter));
    let mut out = Vec::new();
    let mut active: Vec<&T> = Vec::new();
    for b in sorted {
        let m = b.as_ref();
        active.retain(|a| a.as_ref().lock == m.lock && a.as_ref().exit > m.enter);
        for a in &active {
            let n = a.as_ref();
            if (n.fence, n.holder) != (m.fence, m.holder) {
                out.push((*a, b));
            }
        }
        active.push(b);
    }
    out
}

/// Writes of one lock that began after a write of a later fence had ended,
/// as (that write of the latest such fence, the write): in write order
/// fences went backwards.
pub fn regressions(writes: &[Mark]) -> Vec<(Mark, Mark)> {
    let mut per_lock: BTreeMap<usize, Vec<Mark>> = BTreeMap::new();
    for w in writes {
        per_lock.entry(w.lock).or_default().push(*w);
    }
    let mut out = Vec::new();
    for mut ws in per_lock.into_values() {
        ws.sort_by_key(|w| w.enter);
        let mut by_exit = ws.clone();
        by_exit.sort_by_key(|w| w.exit);
        let (mut done, mut max) = (0, None::<Mark>);
        for b in &ws {
            while done < by_exit.len() && by_exit[done].exit <= b.enter {
                if max.is_none_or(|m| by_exit[done].fence > m.fence) {
                    max = Some(by_exit[done]);
                }
                done += 1;
            }
            if let Some(m) = max.filter(|m| m.fence > b.fence) {
                out.push((m, *b));
            }
        }
    }
    out
}

// ----------------------------------------------------------------- proxy

/// What a [`Proxy`] does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passes them.
    Pass,
    /// Closes every connection and refuses new ones.
    Cut,
    /// Holds them, both ways (delivered late once healed): what a
    /// SIGSTOPped peer looks like.
    Hang,
    /// Delays every chunk this many milliseconds.
    Slow(u64),
}

/// What a [`Sink`] asks of the proxy once the bytes it saw are forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Nothing: carry on.
    Go,
    /// Do this fault to every connection from now on (a member that froze
    /// right after it received a given request).
    Fault(Fault),
    /// Drop every answer on this connection from now on, passing the rest:
    /// the request landed, its answer never comes.
    Deafen,
}

/// What sees every byte one connection's client sends, once forwarded.
pub type Sink = Box<dyn FnMut(&[u8]) -> Then + Send>;

/// Makes a fresh [`Sink`] per connection.
pub type Tap = Box<dyn Fn() -> Sink + Send + Sync>;

struct Shared {
    fault: Mutex<Fault>,
    generation: AtomicU64,
    stop: AtomicBool,
    tap: Option<Tap>,
}

impl Shared {
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }

    fn gone(&self, born: u64) -> bool {
        self.stop.load(Ordering::Relaxed)
            || self.generation.load(Ordering::SeqCst) != born
            || self.fault() == Fault::Cut
    }
}

/// A TCP proxy on loopback in front of one upstream, with faults on demand.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to `upstream` (`host:port`) on a free port.
    pub fn start(upstream: &str) -> Self {
        Self::build(0, upstream, None)
    }

    /// A proxy to `upstream` on a free port whose every connection hands the
    /// client's bytes to a tap of its own, made by `tap`.
    pub fn tapped(upstream: &str, tap: Tap) -> Self {
        Self::build(0, upstream, Some(tap))
    }

    fn build(port: u16, upstream: &str, tap: Option<Tap>) -> Self {
        let up = upstream
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("upstream {upstream:?} resolves"));
        let first = TcpListener::bind(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("proxy binds port {port}: {e}"));
        let addr = first.local_addr().unwrap();
        first.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            fault: Mutex::new(Fault::Pass),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            tap,
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || accept(first, addr, up, &s));
        Self {
            addr,
            shared,
            thread: Some(thread),
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// From now on, does `fault` to every connection.
    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
    }

    /// Holds every byte for `d`, then lets them through.
    pub fn freeze(&self, d: Duration) {
        self.set(Fault::Hang);
        std::thread::sleep(d);
        self.set(Fault::Pass);
    }

    /// Closes every connection open now (new ones are accepted).
    pub fn sever(&self) {
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts until the proxy stops; while cut, listens on nothing.
fn accept(first: TcpListener, addr: SocketAddr, up: SocketAddr, s: &Arc<Shared>) {
    let mut listener = Some(first);
    while !s.stop.load(Ordering::Relaxed) {
        if s.fault() == Fault::Cut {
            listener = None;
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
                let s = s.clone();
                std::thread::spawn(move || connect(client, up, &s));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn connect(client: TcpStream, up: SocketAddr, s: &Arc<Shared>) {
    let born = s.generation.load(Ordering::SeqCst);
    let _ = client.set_nonblocking(false);
    // A dead upstream: the client sees its connection closed at once.
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
    let (s_back, deaf) = (s.clone(), Arc::new(AtomicBool::new(false)));
    let deaf_back = deaf.clone();
    let back = std::thread::spawn(move || pump(s2, c2, &s_back, born, Side::Back(&deaf_back)));
    let tap = s.tap.as_ref().map(|make| make());
    pump(client, server, s, born, Side::Forth(tap, &deaf));
    let _ = back.join();
}

/// Which way a [`pump`] copies: the client's bytes, shown to the tap, or
/// the answers, dropped once the connection is deaf.
enum Side<'a> {
    Forth(Option<Sink>, &'a AtomicBool),
    Back(&'a AtomicBool),
}

/// Copies `from` to `to` as the fault says, until either end closes, the
/// connection is severed or cut, or the proxy stops.
fn pump(mut from: TcpStream, mut to: TcpStream, s: &Shared, born: u64, mut side: Side<'_>) {
    let mut buf = vec![0u8; 16 * 1024];
    while !s.gone(born) {
        if s.fault() == Fault::Hang {
            // Read nothing: the kernel's buffers fill and the peer stalls.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(_) => break,
        };
        // Bytes read as a hang began are held, and delivered late.
        while s.fault() == Fault::Hang && !s.gone(born) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Fault::Slow(ms) = s.fault() {
            std::thread::sleep(Duration::from_millis(ms));
        }
        if s.gone(born) {
            break;
        }
        if matches!(side, Side::Back(deaf) if deaf.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if let Side::Forth(Some(tap), deaf) = &mut side {
            match tap(&buf[..n]) {
                Then::Go => {}
                Then::Fault(fault) => *s.fault.lock().unwrap() = fault,
                Then::Deafen => deaf.store(true, Ordering::SeqCst),
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

// --------------------------------------------------------------- cluster

/// The first `base` of `hundred, hundred + 20, ...` (below `hundred + 100`)
/// where every `base + offset` can be listened on now.
pub fn free_block(hundred: u16, offsets: &[u16]) -> u16 {
    (hundred..hundred + 100)
        .step_by(20)
        .find(|base| {
            offsets
                .iter()
                .all(|o| TcpListener::bind(("127.0.0.1", base + o)).is_ok())
        })
        .unwrap_or_else(|| panic!("no free block of ports in {hundred}..{}", hundred + 100))
}

/// Are `etcd` and `etcdctl` installed? (Skipped visibly without them,
/// unless `SKILL_LOCK_TEST_ETCD_REQUIRED` makes that a failure.)
pub fn have_etcd(test: &str) -> bool {
    super::have_programs(test, &[("etcd", "--version"), ("etcdctl", "version")])
}

/// How fast an etcd test cluster notices a lost leader.
#[derive(Clone, Copy)]
pub struct Tuning {
    /// `--heartbeat-interval`, milliseconds.
    pub heartbeat_ms: u32,
    /// `--election-timeout`, milliseconds.
    pub election_ms: u32,
}

/// Member `i` of an etcd cluster on loopback whose members listen for
/// clients on `clients[k]` (a URL, `http://` or `https://`) and for peers
/// on `127.0.0.1:peers[k]`, named `n0`, `n1`, ... with data under `dir`.
/// The caller adds what else it needs (TLS files) and spawns it.
pub fn member(dir: &Path, i: usize, clients: &[String], peers: &[u16], t: Tuning) -> Command {
    let initial = peers
        .iter()
        .enumerate()
        .map(|(k, p)| format!("n{k}=http://127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let peer = format!("http://127.0.0.1:{}", peers[i]);
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", &format!("n{i}")])
        .arg("--data-dir")
        .arg(dir.join(format!("n{i}")))
        .args(["--listen-client-urls", &clients[i]])
        .args(["--advertise-client-urls", &clients[i]])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &initial])
        .args(["--initial-cluster-state", "new"])
        .args(["--initial-cluster-token", &format!("t{}", peers[0])])
        .args(["--heartbeat-interval", &t.heartbeat_ms.to_string()])
        .args(["--election-timeout", &t.election_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// A 3-member etcd cluster on loopback: clients on `base+1..=base+3`,
/// peers on `base+11..=base+13`; a member may be killed (`None` until
/// restarted), stopped and continued. Every member is stopped when dropped.
pub struct Cluster {
    dir: PathBuf,
    base: u16,
    tuning: Tuning,
    members: Mutex<Vec<Option<Child>>>,
    /// Member ids, as `endpoint status` names them.
    ids: Vec<u64>,
}

impl Cluster {
    /// Starts the members, data under `dir`, on the first free block of
    /// `hundred..hundred + 100`, and waits (30 s at most) until each
    /// answers and they elected a leader.
    pub fn start(dir: &Path, hundred: u16, tuning: Tuning) -> Self {
        let mut c = Self {
            dir: dir.to_owned(),
            base: free_block(hundred, &[1, 2, 3, 11, 12, 13]),
            tuning,
            members: Mutex::new(Vec::new()),
            ids: Vec::new(),
        };
        *c.members.lock().unwrap() = (0..3).map(|i| Some(c.spawn(i))).collect();
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

    fn spawn(&self, i: usize) -> Child {
        let clients: Vec<String> = (0..3)
            .map(|k| format!("http://127.0.0.1:{}", self.client_port(k)))
            .collect();
        let peers: Vec<u16> = (0..3).map(|k| self.base + 11 + k as u16).collect();
        member(&self.dir, i, &clients, &peers, self.tuning)
            .spawn()
            .expect("etcd starts")
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.base + 1 + i as u16
    }

    /// `etcd://` every member, under `/prefix/`.
    pub fn url(&self, prefix: &str) -> String {
        let eps: Vec<String> = (0..3)
            .map(|i| format!("127.0.0.1:{}", self.client_port(i)))
            .collect();
        format!("etcd://{}/{prefix}/", eps.join(","))
    }

    /// (member id, leader id) from member `i` itself.
    fn status(&self, i: usize) -> Option<(u64, u64)> {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &format!("127.0.0.1:{}", self.client_port(i))])
            .args(["--dial-timeout", "1s", "--command-timeout", "1s"])
            .args(["endpoint", "status", "-w", "json"])
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let s = &v.as_array()?.first()?["Status"];
        Some((s["header"]["member_id"].as_u64()?, s["leader"].as_u64()?))
    }

    /// Index of the leader, as the first running member that knows one sees it.
    pub fn leader(&self) -> Option<usize> {
        (0..3).find_map(|i| {
            let (_, leader) = self.status(i).filter(|s| s.1 != 0)?;
            self.ids.iter().position(|&id| id == leader)
        })
    }

    /// Member `i`'s pid, unless it is killed.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members.lock().unwrap()[i].as_ref().map(Child::id)
    }

    /// Sends `sig` to member `i` (SIGSTOP, SIGCONT...), unless it is killed.
    pub fn signal(&self, i: usize, sig: i32) {
        if let Some(pid) = self.pid(i) {
            signal(pid, sig);
        }
    }

    /// SIGKILLs member `i`.
    pub fn kill(&self, i: usize) {
        if let Some(mut c) = self.members.lock().unwrap()[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data, if it was killed.
    pub fn restart(&self, i: usize) {
        let mut m = self.members.lock().unwrap();
        if m[i].is_none() {
            m[i] = Some(self.spawn(i));
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

#[test]
fn the_witness_finds_two_holders_at_once_and_fences_going_back() {
    let m = |lock, fence, holder, enter, exit| Mark {
        lock,
        fence,
        holder,
        enter,
        exit,
        believed: Mark::UNCHECKED,
    };
    // Overlapping writes of two holders of lock 0; one holder's own writes
    // and another lock's never count.
    let writes = [
        m(0, 1, 0, 0, 10),
        m(0, 2, 1, 5, 15),
        m(0, 2, 1, 12, 20),
        m(1, 7, 2, 0, 30),
    ];
    let pairs: Vec<(u64, u64)> = overlaps(&writes)
        .iter()
        .map(|(a, b)| (a.enter, b.enter))
        .collect();
    assert_eq!(pairs, [(0, 5)]);
    // Fence 1 written after fence 2 had finished: backwards.
    let back = [m(0, 2, 0, 0, 10), m(0, 1, 1, 20, 30), m(0, 3, 1, 40, 50)];
    let found: Vec<(u64, u64)> = regressions(&back)
        .iter()
        .map(|(later, b)| (later.fence, b.fence))
        .collect();
    assert_eq!(found, [(2, 1)]);
}

#[test]
fn the_proxy_passes_severs_and_cuts() {
    let echo = TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = echo.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in echo.incoming().flatten() {
            std::thread::spawn(move || {
                let (mut r, mut w) = (c.try_clone().unwrap(), c);
                let _ = std::io::copy(&mut r, &mut w);
            });
        }
    });
    let proxy = Proxy::start(&upstream);
    let round_trip = |c: &mut TcpStream| {
        c.write_all(b"ping").is_ok() && {
            let mut b = [0u8; 4];
            c.read_exact(&mut b).is_ok() && &b == b"ping"
        }
    };
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(round_trip(&mut c));
    proxy.sever();
    assert!(
        !round_trip(&mut c),
        "a severed connection still carries bytes"
    );
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(round_trip(&mut c), "a new connection after a sever works");
    proxy.set(Fault::Cut);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        TcpStream::connect(proxy.addr()).is_err(),
        "a cut proxy accepts"
    );
    proxy.set(Fault::Pass);
    std::thread::sleep(Duration::from_millis(100));
    let mut c = TcpStream::connect(proxy.addr()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(round_trip(&mut c), "a healed proxy passes");
}
