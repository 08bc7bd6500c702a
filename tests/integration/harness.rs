//! A small harness shared by the integration tests: a temporary directory,
//! real git/svn-like fixtures, and the real binary run with a cleared
//! environment, its one JSON object decoded.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub use serde_json::Value;

pub mod chaos;
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

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_skill-lock");

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

    /// The binary, to be run in `cwd`.
    pub fn cmd(&self, cwd: &Path) -> Cmd {
        Cmd::new(cwd)
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

/// One invocation of the binary, built fluently.
pub struct Cmd {
    inner: Command,
}

impl Cmd {
    pub fn new(cwd: &Path) -> Self {
        let mut inner = Command::new(BIN);
        inner.current_dir(cwd).env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            inner.env("PATH", path);
        }
        Self { inner }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.inner.arg(a);
        self
    }

    pub fn args<I, S>(mut self, a: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.inner.args(a);
        self
    }

    pub fn env(mut self, k: &str, v: impl AsRef<OsStr>) -> Self {
        self.inner.env(k, v);
        self
    }

    pub fn command(self) -> Command {
        self.inner
    }

    pub fn run(mut self) -> Out {
        let out = self
            .inner
            .stdin(Stdio::null())
            .output()
            .expect("binary runs");
        Out::from(out)
    }
}

/// What one invocation printed.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

impl From<std::process::Output> for Out {
    fn from(out: std::process::Output) -> Self {
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let json = if stdout.ends_with('\n') && stdout.matches('\n').count() == 1 {
            serde_json::from_str(&stdout).unwrap_or(Value::Null)
        } else {
            Value::Null
        };
        Self {
            code: out.status.code().unwrap_or(-1),
            stdout,
            stderr,
            json,
        }
    }
}

impl Out {
    /// Asserts the exit status and the `result`, and returns the JSON. The
    /// object must also read as its typed mirror ([`verbs::Reply`]: every
    /// field known, of the right type, the exit status the one its result
    /// means), so no test passes on an object the contract does not define.
    #[track_caller]
    pub fn expect(&self, code: i32, result: &str) -> &Value {
        assert_eq!(
            (self.code, self.json["result"].as_str()),
            (code, Some(result)),
            "stdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        verbs::reply_of(self, &self.json);
        &self.json
    }

    /// Asserts the exit status and the `result`, and returns the typed reply.
    #[track_caller]
    pub fn expect_reply(&self, code: i32, result: &str) -> verbs::Reply {
        self.expect(code, result);
        verbs::reply(self)
    }

    /// Asserts an error object with this code and exit status 2, and
    /// returns its message.
    #[track_caller]
    pub fn error_message(&self, code: &str) -> String {
        self.expect_error(code);
        verbs::reply(self).message().to_owned()
    }

    /// The typed reply on stdout (the default way to read a result).
    #[track_caller]
    pub fn reply(&self) -> verbs::Reply {
        verbs::reply(self)
    }

    /// Did it print one JSON object on one line (what every command but
    /// `run` prints)?
    pub fn is_one_object(&self) -> bool {
        self.json.is_object()
    }

    /// Asserts an error object with this code and exit status 2.
    #[track_caller]
    pub fn expect_error(&self, code: &str) -> &Value {
        let v = self.expect(2, "error");
        assert_eq!(v["error"], code, "{}", self.stdout);
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
        v
    }
}

/// One field of a JSON object file (an owner record a store wrote), for a
/// test about what is on disk rather than about a reply.
#[track_caller]
pub fn json_file_field(path: &Path, field: &str) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v.get(field).cloned().unwrap_or(Value::Null)
}

/// Sets fields of a JSON object file, as a hand or another version would.
#[track_caller]
pub fn edit_json_file(path: &Path, fields: &[(&str, Value)]) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    for (name, value) in fields {
        v[*name] = value.clone();
    }
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
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

/// Verbs of `run`, races and stores beyond [`verbs`].
pub mod run_verbs;
/// A harness that speaks in verbs: `lock.acquire()`, `lock.check(&token)`,
/// each returning a typed mirror of the wire object.
pub mod verbs;

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
