//! Running git: every prompt disabled, an environment that cannot redirect
//! it, its own process group killed at a deadline.

#![allow(clippy::wildcard_imports)]
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::record::random_suffix;

/// What one git process did.
#[derive(Debug)]
pub(super) struct Output {
    pub(super) code: Option<i32>,
    pub(super) stdout: Vec<u8>,
    pub(super) stderr: String,
}

impl Output {
    pub(super) fn ok(&self) -> bool {
        self.code == Some(0)
    }
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
        "-c",
        "fetch.unpackLimit=1",
        "-c",
        "transfer.unpackLimit=1",
        "-c",
        "maintenance.auto=false",
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
/// group at `deadline`. `Ok(None)`: it overran and was killed.
pub(super) fn run(
    cmd: &mut Command,
    input: Option<&[u8]>,
    deadline: Instant,
) -> std::io::Result<Option<Output>> {
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    #[cfg(unix)]
    let pgid = libc::pid_t::try_from(child.id()).unwrap_or(0);
    // Windows: git and what it starts (ssh, credential helpers) in a Job
    // Object, the whole of which is killed at the deadline.
    #[cfg(windows)]
    let job = crate::win::Job::new().and_then(|j| j.assign(child.id()).map(|()| j))?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        let bytes = bytes.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
    }
    let (tx_out, rx_out) = mpsc::channel();
    let (tx_err, rx_err) = mpsc::channel();
    if let Some(mut o) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = o.read_to_end(&mut v);
            let _ = tx_out.send(v);
        });
    }
    if let Some(mut e) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = e.read_to_end(&mut v);
            let _ = tx_err.send(v);
        });
    }
    #[cfg(windows)]
    let kill = || job.terminate(1);
    #[cfg(unix)]
    let kill = || {
        if pgid > 0 {
            // SAFETY: signals only the process group this call created.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    };
    // A waiter thread reaps the child; this one waits for it or the deadline.
    let (tx_done, rx_done) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx_done.send(child.wait());
    });
    let left = deadline.saturating_duration_since(Instant::now());
    let Ok(status) = rx_done.recv_timeout(left) else {
        kill();
        let _ = rx_done.recv();
        return Ok(None);
    };
    let status = status?;
    // A helper left behind (an ssh control master) may hold the pipes open:
    // wait for them only until the deadline.
    let wait = |rx: &mpsc::Receiver<Vec<u8>>| {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(100));
        rx.recv_timeout(left).unwrap_or_default()
    };
    let stdout = wait(&rx_out);
    let stderr = String::from_utf8_lossy(&wait(&rx_err)).into_owned();
    Ok(Some(Output {
        code: status.code(),
        stdout,
        stderr,
    }))
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

pub(super) trait Mode0700 {
    fn mode_0700(&mut self) -> &mut Self;
}

impl Mode0700 for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(self, 0o700);
        // Windows: the directory inherits its parent's ACL.
        self
    }
}
