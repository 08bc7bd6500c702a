//! The harness shared by the integration tests, reached by one name
//! (`crate::harness`): a temporary world with real git/svn-like fixtures
//! ([`TestEnv`]), the one way to run the binary ([`Cmd`], in `cmd.rs`) and
//! what it printed ([`Out`]), the typed mirrors of its replies ([`Reply`],
//! `reply.rs`), the verbs of one lock ([`Lock`], `verbs.rs`), the records a
//! store keeps (`records.rs`), witnesses and leftovers of real processes
//! (`leftovers.rs`); and kits reached by module: `chaos`, `stores`, `gitd`,
//! `mcp`, `doctor`, `etcdctl`, `http2`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use serde_json::Value;

pub mod chaos;
mod cmd;
mod leftovers;
mod records;
mod reply;
mod verbs;
pub use cmd::{BIN, Cmd, Out, finish, finish_output};
// Some are used only by the Linux-only modules (run_edges, run_tree).
#[cfg_attr(not(target_os = "linux"), allow(unused_imports))]
pub use leftovers::{FenceLog, KillOnDrop, kill_leftover, names};
pub use records::{
    GitState, Record, edit_json_file, json_bytes, json_file_field, read_json, set_field, typed,
};
#[cfg_attr(not(target_os = "linux"), allow(unused_imports))]
pub use reply::{HistoryEvent, Holder, Reply, TookOver, reply_line};
pub use verbs::Lock;

/// `doctor`'s object, typed.
pub mod doctor;
/// What `etcdctl` says about a cluster, asked by name.
pub mod etcdctl;
pub mod gitd;
pub mod http2;
/// `skill-lock mcp` driven by the Python client and in raw JSON-RPC.
pub mod mcp;
/// Every store a conformance test runs on, and the macro that runs it there.
#[macro_use]
pub mod stores;

/// A temporary world for one test.
pub struct TestEnv {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
}

impl TestEnv {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical tempdir");
        Self { _dir: dir, root }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// A real git repository made by `git init` (the tool itself never runs git).
    pub fn git_repo(&self, rel: &str) -> PathBuf {
        let dir = self.path(rel);
        std::fs::create_dir_all(&dir).unwrap();
        git(&dir, &["init", "-q", "-b", "main"]);
        git(
            &dir,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "init",
            ],
        );
        dir
    }

    /// A linked worktree of `repo` at `rel`.
    pub fn worktree(&self, repo: &Path, rel: &str) -> PathBuf {
        let dir = self.path(rel);
        git(
            repo,
            &["worktree", "add", "-q", "-b", rel, dir.to_str().unwrap()],
        );
        dir
    }

    /// A folder that looks like an svn checkout.
    pub fn svn_dir(&self, rel: &str) -> PathBuf {
        let dir = self.path(rel);
        std::fs::create_dir_all(dir.join(".svn")).unwrap();
        dir
    }

    pub fn dir(&self, rel: &str) -> PathBuf {
        let dir = self.path(rel);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

pub fn git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .stdout(Stdio::null())
        .status()
        .expect("git runs");
    assert!(st.success(), "git {args:?} failed");
}

/// Every file and directory below `dir`, relative, sorted.
pub fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let p = e.path();
                out.push(p.strip_prefix(base).unwrap().display().to_string());
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(base, &p, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Is an etcd run required (`SKILL_LOCK_TEST_ETCD_REQUIRED`, set by CI)?
/// Then a test that would skip for want of etcd fails instead.
pub fn etcd_required() -> bool {
    std::env::var_os("SKILL_LOCK_TEST_ETCD_REQUIRED").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The etcd endpoints the etcd halves run against (`SKILL_LOCK_TEST_ETCD`,
/// `host:port[,host:port...]`), or `None`: the test is skipped, visibly,
/// unless [`etcd_required`] makes that a failure.
pub fn etcd_endpoints(test: &str) -> Option<String> {
    match std::env::var("SKILL_LOCK_TEST_ETCD") {
        Ok(e) if !e.is_empty() => Some(e),
        _ => {
            assert!(
                !etcd_required(),
                "{test}: SKILL_LOCK_TEST_ETCD_REQUIRED is set but SKILL_LOCK_TEST_ETCD is not"
            );
            eprintln!("SKIPPED: {test} needs etcd (set SKILL_LOCK_TEST_ETCD=host:port)");
            None
        }
    }
}

/// The first of [`etcd_endpoints`].
pub fn etcd_endpoint(test: &str) -> Option<String> {
    etcd_endpoints(test).map(|e| e.split(',').next().unwrap_or(&e).to_owned())
}

/// Are the programs installed (each `(program, argument)` exits when run)?
/// A test that starts its own etcd is skipped, visibly, without them,
/// unless [`etcd_required`] makes that a failure.
pub fn have_programs(test: &str, programs: &[(&str, &str)]) -> bool {
    let missing: Vec<&str> = programs
        .iter()
        .filter(|(p, arg)| {
            Command::new(p)
                .arg(arg)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_err()
        })
        .map(|(p, _)| *p)
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        !etcd_required(),
        "{test}: {missing:?} required (SKILL_LOCK_TEST_ETCD_REQUIRED) but not installed"
    );
    eprintln!(
        "SKIPPED: {test} (not installed: {missing:?}; apt-get install etcd-server etcd-client openssl)"
    );
    false
}

/// A fresh etcd key prefix under `/tag/` per call, so tests never see each
/// other's locks.
pub fn etcd_prefix(env: &TestEnv, tag: &str) -> String {
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "/{tag}/{}-{}-{}/",
        std::process::id(),
        env.root.file_name().unwrap().to_string_lossy(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

/// The wall clock, milliseconds since the epoch (what `expires` is compared with).
pub fn wall_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Is `pid` gone (no such process, or a zombie nobody has reaped yet: an
/// orphan's new parent may not reap it at once, but a zombie has stopped)?
/// Zombies are seen through Linux's `/proc`; elsewhere only the first half holds.
pub fn gone(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// The path of the real `git` on PATH (as `command -v git` prints it, with
/// its newline), for a wrapper that logs or counts calls and then runs it.
pub fn real_git() -> String {
    String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v git"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
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
