//! Verbs for the tests of `run`, of races and of stores, beside
//! [`super::verbs`]: a few more fields of a typed [`Reply`], `run` of a shell
//! script ([`Call::sh`]), the binary spawned (its forwarded signals at their
//! defaults), wrapped in another program and finished into an [`Out`],
//! and typed reads of the records a test plants or edits in a store.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::verbs::{Call, Reply};
use super::{Cmd, Out};

/// Fields of a typed reply that [`super::verbs`] has no accessor for.
impl Reply {
    /// `took_over` of an `acquired` reply as (`reason`, `holder.fence`).
    #[track_caller]
    pub fn took_over_from(&self) -> Option<(&str, Option<u64>)> {
        self.took_over()
            .map(|t| (t.reason.as_str(), t.holder.as_ref().map(|h| h.fence)))
    }

    /// `signal` of a `ran` (`None`: CMD exited) or an `interrupted` reply.
    #[track_caller]
    pub fn signal(&self) -> Option<i32> {
        match self {
            Self::Ran { signal, .. } => *signal,
            Self::Interrupted { signal, .. } => Some(*signal),
            other => panic!("no `signal` in {other:?}"),
        }
    }
}

impl Call {
    /// `-- sh -c SCRIPT sh ARGS...` (`run`; ARGS are `$1`...).
    pub fn sh(self, script: &str, args: &[&str]) -> Self {
        self.command([&["sh", "-c", script, "sh"][..], args].concat())
    }
}

/// Starts `cmd` with stdin closed and stdout/stderr captured.
#[track_caller]
pub fn spawn(cmd: impl Into<Cmd>) -> Child {
    cmd.into()
        .command()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

/// Waits for `child` and its output, at most `limit`; kills it and fails
/// the test when it takes longer.
#[track_caller]
pub fn finish_output(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("wait for the binary"),
        Err(_) => {
            if let Ok(pid) = i32::try_from(pid) {
                // SAFETY: kill(2) of a child this test started and has not reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("pid {pid} still running after {limit:?}");
        }
    }
}

/// [`finish_output`], read as one invocation's [`Out`].
#[track_caller]
pub fn finish(child: Child, limit: Duration) -> Out {
    Out::from(finish_output(child, limit))
}

/// Polls `f` every 20 ms until it gives a value; fails after `limit`.
#[track_caller]
pub fn until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "not {what} after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The typed reply of one line a process printed (`run`'s object, read
/// line by line from its stderr), or `None` when the line is not one. The
/// exit status is not known yet, so it is not checked.
pub fn reply_line(line: &str) -> Option<Reply> {
    serde_json::from_str(line).ok()
}

/// `cmd` run through another program: `program PRE... BIN ARGS...`, in
/// `cmd`'s directory with only `cmd`'s environment (a start gate, a fresh
/// namespace: something that then `exec`s the binary).
pub fn wrapped(cmd: impl Into<Cmd>, program: &str, pre: &[&OsStr]) -> Command {
    let inner = cmd.into().command();
    let mut outer = Command::new(program);
    outer
        .args(pre)
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear();
    if let Some(dir) = inner.get_current_dir() {
        outer.current_dir(dir);
    }
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            outer.env(k, v);
        }
    }
    outer
}

/// The parts of a stored lock record (the file store's `owner.json`, the
/// `record` of the git store's `lock.json`) that tests read or change; the
/// rest is kept as it is.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct Record {
    pub skill: String,
    pub started: String,
    pub expires: String,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// A state as the git store keeps it (`lock.json`): its `record` typed,
/// the rest kept as it is.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct GitState {
    pub record: Record,
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// `v` (an object a test plants) with `field` set to `to`.
#[track_caller]
pub fn set_field(v: &mut serde_json::Value, field: &str, to: impl Into<serde_json::Value>) {
    v.as_object_mut()
        .expect("a JSON object")
        .insert(field.to_owned(), to.into());
}

impl Record {
    /// Its `owner_pid`, if it has one.
    pub fn owner_pid(&self) -> Option<u64> {
        self.rest
            .get("owner_pid")
            .and_then(serde_json::Value::as_u64)
    }
}

/// A JSON file read as `T`, failing the test naming the file.
#[track_caller]
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON value read as `T` (a state a test built, read typed).
#[track_caller]
pub fn typed<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

/// A [`Call`] is its command, to run or spawn as the test likes.
impl From<Call> for Cmd {
    fn from(call: Call) -> Self {
        call.cmd()
    }
}

/// `v` as JSON bytes, its keys in the order a `serde_json::Value` prints
/// them (sorted), whatever order its typed fields are declared in.
#[track_caller]
pub fn json_bytes(v: &impl Serialize) -> Vec<u8> {
    let value = serde_json::to_value(v).unwrap_or_else(|e| panic!("{e}"));
    serde_json::to_vec(&value).unwrap_or_else(|e| panic!("{e}"))
}

/// `cmd` ready to spawn, the signals `run` forwards (INT, TERM, HUP) at
/// their default disposition in the child, so that a harness started with
/// SIGINT ignored (a background job of a non-interactive shell) does not
/// make CMD ignore it too; in a session of its own when `own_session`.
pub fn run_command(cmd: impl Into<Cmd>, own_session: bool) -> Command {
    let mut cmd = cmd.into().command();
    // SAFETY: only async-signal-safe calls (signal, setsid) between fork
    // and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            if own_session {
                libc::setsid();
            }
            Ok(())
        });
    }
    cmd
}

// ------------------------------------------------ witnesses and leftovers

/// A witness file of fences, one line per write: CMD's writers append
/// `$SKILL_LOCK_FENCE`, the next holder appends its own, and any older
/// fence written after the next holder's first line is two writers at once.
pub struct FenceLog<'a>(pub &'a Path);

impl FenceLog<'_> {
    /// The next holder (fence `fence`) writes twice, 300 ms apart, as the
    /// old one would.
    pub fn write_as(&self, fence: u64) {
        for _ in 0..2 {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(self.0)
                .unwrap();
            std::io::Write::write_all(&mut f, format!("{fence}\n").as_bytes()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The writes of an older fence that followed the first line of `fence`.
    #[track_caller]
    pub fn late_after(&self, fence: u64) -> Vec<u64> {
        let text = std::fs::read_to_string(self.0).unwrap();
        let fences: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        let first = fences
            .iter()
            .position(|f| *f == fence)
            .expect("the new holder wrote");
        fences[first..]
            .iter()
            .copied()
            .filter(|f| *f < fence)
            .collect()
    }

    /// Fails when a line of an older fence follows the first line of `fence`.
    #[track_caller]
    pub fn assert_no_older_write_after(&self, fence: u64) {
        let late = self.late_after(fence);
        assert!(
            late.is_empty(),
            "{} writes of fences {late:?} after fence {fence} took the lock: two writers overlapped",
            late.len()
        );
    }
}

/// Field 22 of `/proc/<pid>/stat` (Linux): when the process started.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Is `pid` a process of this test, its command line naming `marker` (the
/// test's directory, or its script)? Pids are reused (this VM's `pid_max`
/// is 32768): a stale kill could hit another test's process.
pub fn names(pid: i32, marker: &Path) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker.to_str().unwrap_or("\0")))
}

/// SIGKILLs `pid`, a process a failing test would leave behind, if it still
/// runs and `ours` (checked to be still the test's process).
pub fn kill_leftover(pid: i32, ours: bool) {
    if pid > 1 && ours && !super::gone(pid) {
        // SAFETY: kill(2) of a process this test made, checked by the caller.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// SIGKILLs `pid` when dropped (see [`kill_leftover`]), if it is still the
/// process that ran when the guard was made (same start time).
pub struct KillOnDrop(i32, Option<u64>);

impl KillOnDrop {
    /// A guard of `pid`, which runs now.
    pub fn new(pid: i32) -> Self {
        Self(pid, start_time(pid))
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let same = match self.1 {
            Some(t) => start_time(self.0) == Some(t),
            None => std::thread::panicking(),
        };
        kill_leftover(self.0, same);
    }
}
