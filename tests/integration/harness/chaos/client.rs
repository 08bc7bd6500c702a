//! The binary run as a chaos client: bounded in time, SIGKILLable mid-call
//! from another thread, timed on the lease clock ([`boot_ns`]); and the
//! small helpers of a fault thread (a nap that stops early, signals).

use crate::harness::Out;
use crate::harness::Reply;
use std::io::ErrorKind;
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Duration;
use std::time::Instant;

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
