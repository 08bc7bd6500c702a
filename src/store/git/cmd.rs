//! Running git: every prompt disabled, an environment that cannot redirect
//! it, its own process group killed at a deadline.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::group::{Group, Platform as _};
use crate::record::random_suffix;

/// What one git process did.
#[derive(Debug)]
pub(super) struct Output {
    pub(super) code: Option<i32>,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: String,
    /// Its stdout outgrew the bound it was read with: the process was
    /// stopped there and `stdout` is not all of it.
    pub(super) overflow: bool,
}

impl Output {
    pub(super) fn ok(&self) -> bool {
        self.code == Some(0) && !self.overflow
    }
}

/// The most of a git process's stderr kept (the rest is read and dropped).
const STDERR_CAP: usize = 64 * 1024;
/// The most of git's stdout any caller keeps unless it says otherwise.
pub(super) const STDOUT_CAP: usize = 1 << 20;

/// What a reader of git's stdout wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    More,
    /// Enough (or too much): stop the process.
    Stop,
}

/// `git` with every prompt disabled and an environment that cannot redirect
/// it to another repository.
pub(super) fn git_command() -> Command {
    let mut cmd = Command::new("git");
    cmd.args([
        "-c",
        "credential.interactive=never",
        "-c",
        "core.askPass=",
        "-c",
        "commit.gpgSign=false",
        "-c",
        "push.gpgSign=false",
        "-c",
        "gc.auto=0",
        // Fetched objects stay in one pack, which appears whole: a process
        // sharing the cache never sees a commit without its tree and blob.
        // (Only fetches: a file:// remote receiving a push unpacks it as
        // git does by default, rather than keep a pack per change.)
        "-c",
        "fetch.unpackLimit=1",
        "-c",
        "maintenance.auto=false",
        // Blobs past 1 MiB are streamed, never held whole, by every git this
        // starts (index-pack of a fetch, cat-file, pack-objects): a remote's
        // huge record costs git no memory (SPEC §8: read bounded).
        "-c",
        "core.bigFileThreshold=1m",
        // Transports that run commands are never used, whatever a URL says.
        "-c",
        "protocol.ext.allow=never",
        "-c",
        "protocol.fd.allow=never",
    ]);
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_CEILING_DIRECTORIES",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "")
        .env("SSH_ASKPASS", "")
        .env("SSH_ASKPASS_REQUIRE", "never")
        .env("GCM_INTERACTIVE", "never")
        .env("LC_ALL", "C")
        .env_remove("LANGUAGE");
    // Commits are made by the tool, whoever runs it (the record says who holds).
    for who in ["AUTHOR", "COMMITTER"] {
        cmd.env(format!("GIT_{who}_NAME"), "skill-lock")
            .env(format!("GIT_{who}_EMAIL"), "skill-lock@localhost");
    }
    cmd
}

/// Runs `cmd` in its own process group, feeding `input`; kills the whole
/// group at `deadline`. At most `cap` bytes of its stdout are kept: past
/// them the process is stopped and the output says `overflow`.
/// `Ok(None)`: it overran the deadline and was killed.
pub(super) fn run(
    cmd: &mut Command,
    input: Option<&[u8]>,
    deadline: Instant,
    cap: usize,
) -> std::io::Result<Option<Output>> {
    let mut stdout = Vec::new();
    let mut overflow = false;
    let out = run_streaming(cmd, input, deadline, &mut |chunk| {
        if stdout.len() + chunk.len() > cap {
            overflow = true;
            return Flow::Stop;
        }
        stdout.extend_from_slice(chunk);
        Flow::More
    })?;
    Ok(out.map(|o| Output {
        stdout,
        overflow,
        ..o
    }))
}

/// What the threads around a running git report.
enum Heard {
    Out(Vec<u8>),
    OutEnd,
    Exited(std::io::Result<std::process::ExitStatus>),
}

/// Runs `cmd` as [`run`] does, handing its stdout to `sink` piece by piece
/// as it comes (so that nothing bounds it but what `sink` keeps); `sink`
/// answering [`Flow::Stop`] stops the process. The output's `stdout` is
/// empty, and `code` is `None` when the process was stopped.
pub(super) fn run_streaming(
    cmd: &mut Command,
    input: Option<&[u8]>,
    deadline: Instant,
    sink: &mut dyn FnMut(&[u8]) -> Flow,
) -> std::io::Result<Option<Output>> {
    run_feeding(cmd, input.map(Feed::Bytes), deadline, sink)
}

/// What a git process is fed on its stdin.
pub(super) enum Feed<'a> {
    /// These bytes, then the end.
    Bytes(&'a [u8]),
    /// Whatever arrives on this channel, in order, as it arrives (a
    /// conversation: `cat-file --batch` asked for the next object once the
    /// last one is read); the end once every sender is gone.
    Channel(mpsc::Receiver<Vec<u8>>),
}

/// Runs `cmd` as [`run_streaming`] does, its stdin fed from `input`. The
/// stdin is written by a thread of its own, so a `sink` that sends more
/// on a [`Feed::Channel`] never waits for git, nor git for it.
pub(super) fn run_feeding(
    cmd: &mut Command,
    input: Option<Feed<'_>>,
    deadline: Instant,
    sink: &mut dyn FnMut(&[u8]) -> Flow,
) -> std::io::Result<Option<Output>> {
    Group::prepare(cmd);
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    // Git and what it starts (ssh, credential helpers), the whole of which
    // is killed at the deadline.
    let group = Group::of(&child)?;
    let kill = || group.kill();
    match (input, child.stdin.take()) {
        (Some(Feed::Bytes(bytes)), Some(mut stdin)) => {
            let bytes = bytes.to_vec();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&bytes);
            });
        }
        (Some(Feed::Channel(rx)), Some(mut stdin)) => {
            std::thread::spawn(move || {
                for bytes in rx {
                    if stdin.write_all(&bytes).is_err() {
                        return;
                    }
                }
            });
        }
        _ => {}
    }
    // A few pieces in flight at most: git waits while the reader is busy.
    let (tx, rx) = mpsc::sync_channel(4);
    if let Some(o) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || pump(o, &tx));
    }
    let (tx_err, rx_err) = mpsc::channel();
    if let Some(mut e) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut e).take(STDERR_CAP as u64).read_to_end(&mut kept);
            // The rest is drained, so that git never blocks on it.
            let _ = std::io::copy(&mut e, &mut std::io::sink());
            let _ = tx_err.send(kept);
        });
    }
    // A waiter thread reaps the child; this one reads and watches the deadline.
    std::thread::spawn(move || {
        let _ = tx.send(Heard::Exited(child.wait()));
    });
    let Some((status, stopped)) = drive(&rx, deadline, sink, &kill) else {
        return Ok(None);
    };
    let status = status?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    let stderr =
        String::from_utf8_lossy(&rx_err.recv_timeout(left).unwrap_or_default()).into_owned();
    Ok(Some(Output {
        code: if stopped { None } else { status.code() },
        stdout: Vec::new(),
        stderr,
        overflow: false,
    }))
}

/// Copies a pipe to `tx` in pieces until its end (or until nobody listens).
fn pump(mut from: impl Read, tx: &mpsc::SyncSender<Heard>) {
    loop {
        let mut buf = vec![0u8; 64 * 1024];
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                buf.truncate(n);
                if tx.send(Heard::Out(buf)).is_err() {
                    return;
                }
            }
        }
    }
    let _ = tx.send(Heard::OutEnd);
}

/// Feeds stdout to `sink` until the process has exited and its stdout has
/// ended: `(exit status, stopped by sink)`, or `None` when the deadline
/// came first (the group is then killed, and reaped).
fn drive(
    rx: &mpsc::Receiver<Heard>,
    deadline: Instant,
    sink: &mut dyn FnMut(&[u8]) -> Flow,
    kill: &dyn Fn(),
) -> Option<(std::io::Result<std::process::ExitStatus>, bool)> {
    let mut status = None;
    let mut open = true;
    let mut stopped = false;
    while open || status.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        // Exited, but a helper left behind (an ssh control master) may hold
        // the pipe open: wait for it only until the deadline.
        let left = if status.is_some() {
            left.max(Duration::from_millis(100))
        } else {
            left
        };
        match rx.recv_timeout(left) {
            Ok(Heard::Out(chunk)) => {
                if !stopped && sink(&chunk) == Flow::Stop {
                    stopped = true;
                    kill();
                }
            }
            Ok(Heard::OutEnd) => open = false,
            Ok(Heard::Exited(s)) => status = Some(s),
            Err(_) if status.is_some() => break,
            Err(_) => {
                kill();
                // Reaped by the waiter: wait for it so no zombie is left.
                while let Ok(ev) = rx.recv() {
                    if matches!(ev, Heard::Exited(_)) {
                        break;
                    }
                }
                return None;
            }
        }
    }
    status.map(|s| (s, stopped))
}

/// Does git's complaint look like a dropped connection (worth another try)?
pub(super) fn transient(stderr: &str) -> bool {
    let definite = [
        "Permission denied",
        "not found",
        "access denied",
        "does not appear to be a git repository",
        "Host key verification failed",
        "Could not resolve",
        "No such file",
        "Authentication failed",
    ];
    if definite.iter().any(|m| stderr.contains(m)) {
        return false;
    }
    // A connection closed before git could say anything.
    if stderr.trim().is_empty() {
        return true;
    }
    [
        // What a git daemon over its connection limit leaves the client with.
        "Could not read from remote repository",
        "reset by peer",
        "early EOF",
        "unexpected disconnect",
        "hung up unexpectedly",
        "Broken pipe",
        "Connection timed out",
        "Operation timed out",
    ]
    .iter()
    .any(|m| stderr.contains(m))
}

/// `d` scaled by a random factor in [0.5, 1.5), so retries spread out.
pub(super) fn jitter(d: Duration) -> Duration {
    let r = random_suffix();
    let x = u32::from_str_radix(r.get(..4).unwrap_or("8000"), 16).unwrap_or(0x8000);
    d.mul_f64(0.5 + f64::from(x) / 65536.0)
}
