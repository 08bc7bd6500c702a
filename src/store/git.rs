//! git store (SPEC §8): locks shared by every clone of a repository, with no
//! server to run.
//!
//! A lock is the ref `refs/skill-lock/[NAMESPACE/]<skill>@<owner>__<name>` on
//! the remote. It points at a commit whose tree holds one file, `lock.json`:
//!
//! ```text
//! {"format":1,"state":"held","fence":7,"depth":12,"epoch":0,"record":{...owner record...}}
//! {"format":1,"state":"free","fence":7,"depth":13,"epoch":0}
//! ```
//!
//! and whose parent is the previous state, so a release is a commit (never a
//! ref deletion) and the fence carried in the file keeps growing. The commit
//! message holds the history events of the change, one JSON object a line,
//! so `git log` of the ref is the lock's history. After [`ROLL_DEPTH`]
//! commits (`SKILL_LOCK_GIT_HISTORY_DEPTH`) a change starts a new root commit
//! carrying the fence and the chain number (`epoch`), and the same atomic
//! push keeps the old chain as `refs/skill-lock-archive/[NAMESPACE/]<name>/<epoch
//! mod ARCHIVE_SLOTS>`: a lock keeps its last 10,000 to 11,000 events, and a
//! read fetches one short chain.
//!
//! Every change is one `git push --force-with-lease=<ref>:<oid as read>`: the
//! client checks the lease against the ref it is told in the same
//! connection, and sends that old value with the update, which the server's
//! ref transaction checks under its ref lock. That is the compare-and-swap: a
//! rejected push means the lock changed after it was read, so it is read
//! again and decided again. A push whose outcome is unknown (timeout,
//! dropped connection) is settled by reading the ref back: our commit there,
//! or under a later one, means it was applied.
//!
//! Objects are made in a private bare repository (the cache, see
//! [`GitConfig::parse`]) with `git hash-object`, `mktree` and `commit-tree`,
//! which are safe for concurrent processes, and pushed from there. A read is
//! one `git ls-remote`, plus a `git fetch` only when the commit is not in the
//! cache yet (a lock this host changed last is never fetched). A change on a
//! lock this host wrote last is first decided on what it wrote and pushed with
//! that as the lease, saving the read; a wrong guess is rejected by the
//! server, and a guess that changes nothing is never trusted.
//!
//! Expiry is judged by this host's wall clock (a record from this boot of
//! this host: by its boot-time clock, as in the file store), and a record
//! judged by the wall clock is shown to the engine with `expires` moved later
//! by the clock-skew allowance (`SKILL_LOCK_CLOCK_SKEW`, default
//! [`DEFAULT_CLOCK_SKEW`] seconds), so a takeover from another host waits
//! that long past `expires`. git runs with every prompt disabled and a
//! deadline (`SKILL_LOCK_GIT_TIMEOUT`, default 10 s), after which its whole
//! process group is killed and the command answers `store_unavailable`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;
use crate::record::{OwnerRecord, random_suffix};
use crate::store::{Change, Committed, Current, Decision, Listed, Listing, Store};

/// Default deadline of one command's git work.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default clock-skew allowance, seconds.
pub const DEFAULT_CLOCK_SKEW: u64 = 30;
/// Largest clock-skew allowance accepted, seconds (it must stay well inside
/// the slack that tells an impossible lease from a long one).
pub const MAX_CLOCK_SKEW: u64 = 120;
/// Commits in a lock's chain before a change starts a new root commit
/// (default of `SKILL_LOCK_GIT_HISTORY_DEPTH`).
pub const ROLL_DEPTH: u64 = 1000;
/// Where lock refs live on the remote.
pub const REF_PREFIX: &str = "refs/skill-lock/";
/// Where a lock's previous chain is kept after a roll-over.
pub const ARCHIVE_PREFIX: &str = "refs/skill-lock-archive/";
/// Archived chains kept per lock (`<archive prefix><name>/<epoch mod this>`).
pub const ARCHIVE_SLOTS: u64 = 10;
const STATE_FILE: &str = "lock.json";
const STATE_FORMAT: u32 = 1;

/// Settings of a git store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitConfig {
    /// The URL as given (`git:origin#team`), for `list` and hints.
    pub url: String,
    /// What `git push`/`ls-remote`/`fetch` are given (a remote name resolved
    /// to its URL, a relative path made absolute).
    pub remote: String,
    /// Optional namespace under `refs/skill-lock/`.
    pub namespace: Option<String>,
    /// Deadline of one command's git work (`SKILL_LOCK_GIT_TIMEOUT`, seconds).
    pub timeout: Duration,
    /// Clock-skew allowance, seconds (`SKILL_LOCK_CLOCK_SKEW`).
    pub clock_skew: u64,
    /// The private bare repository objects are made in and fetched into.
    pub cache: PathBuf,
    /// Commits in a lock's chain before a new root (`SKILL_LOCK_GIT_HISTORY_DEPTH`).
    pub history_depth: u64,
}

fn env(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

/// Is `s` a local path rather than a URL or an scp-like `host:path`?
fn is_local_path(s: &str) -> bool {
    if s.contains("://") {
        return false;
    }
    match (s.find(':'), s.find('/')) {
        (None, _) => true,
        (Some(c), Some(sl)) => sl < c,
        (Some(_), None) => false,
    }
}

/// Hides the user-info part of URLs (`https://user:secret@host/`) in `text`.
#[must_use]
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        if let Some(at) = authority.rfind('@') {
            out.push_str("***@");
            out.push_str(&authority[at + 1..]);
        } else {
            out.push_str(authority);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn validate_namespace(ns: &str, url: &str) -> Result<()> {
    let ok = ns.split('/').all(|seg| {
        !seg.is_empty()
            && seg.len() <= 64
            && !seg.starts_with('.')
            && !seg.to_ascii_lowercase().ends_with(".lock")
            && !seg.contains("..")
            && seg
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Usage(format!(
            "store {url:?}: the namespace after '#' is 1-64 of [A-Za-z0-9._-] per '/'-separated part, e.g. git:origin#team"
        )))
    }
}

fn parse_seconds(var: &str, max: f64) -> Result<Option<f64>> {
    match env(var) {
        None => Ok(None),
        Some(t) => t
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s <= max)
            .map(Some)
            .ok_or_else(|| Error::Usage(format!("{var}={t:?}: give seconds, 0 to {max}"))),
    }
}

/// The cache repository: `SKILL_LOCK_GIT_CACHE`, else the user's cache
/// directory, else a private directory under the temporary directory.
fn cache_dir() -> PathBuf {
    if let Some(d) = env("SKILL_LOCK_GIT_CACHE") {
        let d = PathBuf::from(d);
        return match std::env::current_dir() {
            Ok(cwd) if d.is_relative() => cwd.join(d),
            _ => d,
        };
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return Path::new(&d).join("skill-lock").join("git");
    }
    if let Some(h) = env("HOME") {
        return Path::new(&h).join(".cache").join("skill-lock").join("git");
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir()
        .join(format!("skill-lock-{uid}"))
        .join("git")
}

impl GitConfig {
    /// Parses `git:REMOTE[#NAMESPACE]`. A REMOTE that is the name of a remote
    /// of the checkout at `cwd` is resolved to its push URL (else its URL)
    /// with `git config`; a local path is made absolute. Timeout, skew and
    /// cache come from the environment.
    ///
    /// # Errors
    /// [`Error::Usage`] for a malformed URL, namespace or setting, or a name
    /// that is neither a remote of the checkout nor a URL or path.
    pub fn parse(url: &str, cwd: &Path) -> Result<Self> {
        let Some(rest) = url.strip_prefix("git:") else {
            return Err(Error::Usage(format!("{url:?} is not a git: store URL")));
        };
        let (remote, namespace) = match rest.rsplit_once('#') {
            Some((r, ns)) => {
                validate_namespace(ns, url)?;
                (r, Some(ns.to_owned()))
            }
            None => (rest, None),
        };
        if remote.is_empty() {
            return Err(Error::Usage(format!(
                "store {url:?}: name a remote, e.g. git:origin or git:file:///srv/coord.git"
            )));
        }
        let timeout = parse_seconds("SKILL_LOCK_GIT_TIMEOUT", 600.0)?
            .filter(|s| *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64);
        let clock_skew = parse_seconds("SKILL_LOCK_CLOCK_SKEW", 120.0)?.map_or(
            DEFAULT_CLOCK_SKEW,
            // Whole seconds, rounded up: rounding favours the holder.
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "parse_seconds bounds it to 0..=120"
            )]
            |s| s.ceil() as u64,
        );
        let history_depth = match env("SKILL_LOCK_GIT_HISTORY_DEPTH") {
            None => ROLL_DEPTH,
            Some(t) => t
                .parse::<u64>()
                .ok()
                .filter(|d| (2..=1_000_000).contains(d))
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "SKILL_LOCK_GIT_HISTORY_DEPTH={t:?}: give a whole number of commits, 2 to 1000000"
                    ))
                })?,
        };
        let remote = resolve_remote(remote, cwd, url)?;
        Ok(Self {
            history_depth,
            url: url.to_owned(),
            remote,
            namespace,
            timeout,
            clock_skew: clock_skew.min(MAX_CLOCK_SKEW),
            cache: cache_dir(),
        })
    }
}

fn resolve_remote(remote: &str, cwd: &Path, url: &str) -> Result<String> {
    // Remote names may hold '/', never ':'; a path starting with '.' or '/' is a path.
    let looks_like_name = !remote.contains([':', '\\']) && !remote.starts_with(['.', '/', '~']);
    if looks_like_name {
        // `git remote get-url --push`: the push URL, else the URL, rewritten
        // by the user's insteadOf rules; an error when there is no such remote.
        let mut cmd = git_command();
        cmd.current_dir(cwd)
            .args(["remote", "get-url", "--push", "--", remote]);
        if let Ok(Some(out)) = run(&mut cmd, None, Instant::now() + Duration::from_secs(5))
            && out.ok()
        {
            let v = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if !v.is_empty() {
                if is_local_path(&v) && Path::new(&v).is_relative() {
                    // Relative to the checkout's top, as git reads it.
                    let top = toplevel(cwd).unwrap_or_else(|| cwd.to_path_buf());
                    return Ok(absolute_if_local(&v, &top));
                }
                return Ok(v);
            }
        }
        if !cwd.join(remote).exists() {
            return Err(Error::Usage(format!(
                "store {url:?}: {remote:?} is not a remote of the checkout at {} (see `git remote -v`), nor a URL or path; use git:URL, e.g. git:file:///srv/coord.git",
                cwd.display()
            )));
        }
    }
    Ok(absolute_if_local(remote, cwd))
}

fn toplevel(cwd: &Path) -> Option<PathBuf> {
    let mut cmd = git_command();
    cmd.current_dir(cwd).args(["rev-parse", "--show-toplevel"]);
    let out = run(&mut cmd, None, Instant::now() + Duration::from_secs(5))
        .ok()
        .flatten()?;
    (out.code == Some(0))
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|p| p.is_absolute())
}

fn absolute_if_local(remote: &str, base: &Path) -> String {
    if is_local_path(remote) && !Path::new(remote).is_absolute() {
        base.join(remote).to_string_lossy().into_owned()
    } else {
        remote.to_owned()
    }
}

/// What one git process did.
#[derive(Debug)]
struct Output {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
}

impl Output {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

/// `git` with every prompt disabled and an environment that cannot redirect
/// it to another repository.
fn git_command() -> Command {
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
fn run(
    cmd: &mut Command,
    input: Option<&[u8]>,
    deadline: Instant,
) -> std::io::Result<Option<Output>> {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let pgid = libc::pid_t::try_from(child.id()).unwrap_or(0);
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

/// The file a lock's commit holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StateFile {
    format: u32,
    state: String,
    fence: u64,
    depth: u64,
    /// Roll-overs so far: the chain's number, for ordering archived chains.
    #[serde(default)]
    epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    record: Option<serde_json::Value>,
}

/// A lock's ref as read.
#[derive(Debug, Clone)]
struct Seen {
    /// The commit the ref points at (None: no ref).
    oid: Option<String>,
    /// The state, as stored (not shifted by the skew allowance).
    current: Current,
    /// The last fence, when it is known.
    fence: Option<u64>,
    /// Commits in the chain up to `oid`.
    depth: u64,
    /// The chain's number (roll-overs before it).
    epoch: u64,
    /// `oid` is a readable commit a new state may name as its parent.
    chainable: bool,
}

/// How a push ended.
enum Pushed {
    /// The ref now points at our commit.
    Done,
    /// The ref was not what we read: read again and decide again.
    Lost,
    /// The remote refused for another reason.
    Refused(String),
    /// Unknown: settle by reading back.
    Unknown(String),
}

/// The git store.
#[derive(Debug, Clone)]
pub struct GitStore {
    config: GitConfig,
    /// Whether ssh needs `BatchMode` from us (decided once, on first use).
    batch_ssh: std::sync::OnceLock<bool>,
}

impl GitStore {
    /// A store for `git:REMOTE[#NAMESPACE]`, remote names resolved in `cwd`.
    ///
    /// # Errors
    /// See [`GitConfig::parse`].
    pub fn new(url: &str, cwd: &Path) -> Result<Self> {
        Ok(Self::from_config(GitConfig::parse(url, cwd)?))
    }

    /// The store for a parsed configuration.
    #[must_use]
    pub fn from_config(config: GitConfig) -> Self {
        Self {
            config,
            batch_ssh: std::sync::OnceLock::new(),
        }
    }

    fn ns_prefix(&self, base: &str) -> String {
        match &self.config.namespace {
            Some(ns) => format!("{base}{ns}/"),
            None => base.to_owned(),
        }
    }

    fn lock_ref(&self, key: &LockKey) -> String {
        format!("{}{}", self.ns_prefix(REF_PREFIX), key.name())
    }

    fn archive_ref(&self, name: &str, slot: u64) -> String {
        format!("{}{name}/{slot}", self.ns_prefix(ARCHIVE_PREFIX))
    }

    /// The local ref a fetched lock ref is kept under in the cache (so later
    /// fetches only bring what is new).
    fn cache_ref(&self, remote_ref: &str) -> String {
        let h = crate::record::hash_token(&self.config.remote);
        format!("refs/cache/{}/{remote_ref}", &h[..16])
    }

    fn unavailable(&self, what: &str) -> Error {
        Error::StoreUnavailable(redact(&format!(
            "git remote {} ({}): {what}; check that it is reachable and that git can push to it without a prompt (ssh agent, credential helper), or raise SKILL_LOCK_GIT_TIMEOUT (now {} s)",
            self.config.url,
            self.config.remote,
            self.config.timeout.as_secs_f64()
        )))
    }

    fn cache_error(&self, what: &str) -> Error {
        Error::Io {
            action: "use the git cache repository",
            path: self.config.cache.clone(),
            source: std::io::Error::other(redact(what)),
        }
    }

    /// A git command in the cache repository (created on first use).
    fn in_cache(&self) -> Result<Command> {
        self.ensure_cache()?;
        let mut cmd = git_command();
        cmd.arg("--git-dir").arg(&self.config.cache);
        cmd.current_dir(self.config.cache.parent().unwrap_or(Path::new("/")));
        if *self.batch_ssh.get_or_init(|| self.needs_batch_ssh()) {
            cmd.env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        }
        Ok(cmd)
    }

    /// ssh without a user-chosen command gets BatchMode (never a password prompt).
    fn needs_batch_ssh(&self) -> bool {
        let r = &self.config.remote;
        let ssh = r.starts_with("ssh://")
            || r.starts_with("git+ssh://")
            || !is_local_path(r) && !r.contains("://");
        ssh && std::env::var_os("GIT_SSH_COMMAND").is_none()
            && std::env::var_os("GIT_SSH").is_none()
            && !self.user_ssh_command()
    }

    fn user_ssh_command(&self) -> bool {
        let mut cmd = git_command();
        cmd.arg("--git-dir")
            .arg(&self.config.cache)
            .args(["config", "--get", "core.sshCommand"]);
        matches!(run(&mut cmd, None, Instant::now() + Duration::from_secs(5)), Ok(Some(o)) if o.ok())
    }

    fn ensure_cache(&self) -> Result<()> {
        let dir = &self.config.cache;
        if dir.join("HEAD").is_file() {
            return Ok(());
        }
        let parent = dir.parent().unwrap_or(Path::new("/"));
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode_0700()
            .create(parent)
            .map_err(|e| Error::io("create", parent, e))?;
        // Under a shared temporary directory, only a directory of our own will do.
        if parent.starts_with(std::env::temp_dir()) {
            use std::os::unix::fs::MetadataExt;
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            let meta = std::fs::metadata(parent).map_err(|e| Error::io("inspect", parent, e))?;
            if meta.uid() != uid || meta.mode() & 0o022 != 0 {
                return Err(self.cache_error(&format!(
                    "{} belongs to someone else or is writable by others; set SKILL_LOCK_GIT_CACHE to a directory of your own",
                    parent.display()
                )));
            }
        }
        let tmp = parent.join(format!(".git-init-{}", random_suffix()));
        let mut cmd = git_command();
        cmd.args(["init", "--bare", "-q"]).arg(&tmp);
        let ok = matches!(run(&mut cmd, None, Instant::now() + Duration::from_secs(10)), Ok(Some(o)) if o.ok());
        if !ok {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(self.cache_error("git init --bare failed; is git installed?"));
        }
        for (k, v) in [
            ("gc.auto", "0"),
            ("maintenance.auto", "false"),
            ("core.logAllRefUpdates", "false"),
        ] {
            let mut c = git_command();
            c.arg("--git-dir").arg(&tmp).args(["config", k, v]);
            let _ = run(&mut c, None, Instant::now() + Duration::from_secs(5));
        }
        // Another process may have made it first: theirs wins, ours goes.
        if let Err(e) = std::fs::rename(&tmp, dir) {
            let _ = std::fs::remove_dir_all(&tmp);
            if !dir.join("HEAD").is_file() {
                return Err(Error::io("create", dir, e));
            }
        }
        Ok(())
    }

    /// Runs a local git command in the cache.
    fn local(&self, args: &[&str], input: Option<&[u8]>) -> Result<Output> {
        let mut cmd = self.in_cache()?;
        cmd.args(args);
        match run(&mut cmd, input, Instant::now() + Duration::from_secs(30)) {
            Ok(Some(o)) => Ok(o),
            Ok(None) => Err(self.cache_error(&format!("git {} did not finish in 30 s", args[0]))),
            Err(e) => Err(self.cache_error(&format!("cannot run git: {e}"))),
        }
    }

    /// Runs a network git command, killed at `deadline`.
    fn remote_cmd(&self, args: &[&str], deadline: Instant) -> Result<Option<Output>> {
        let mut cmd = self.in_cache()?;
        cmd.args(args);
        run(&mut cmd, None, deadline).map_err(|e| self.cache_error(&format!("cannot run git: {e}")))
    }

    /// `git ls-remote` of `patterns`: ref -> oid, for refs starting with `prefix`.
    fn ls_remote(
        &self,
        patterns: &[String],
        prefix: &str,
        deadline: Instant,
    ) -> Result<HashMap<String, String>> {
        let mut args = vec!["ls-remote", "--refs", self.config.remote.as_str()];
        args.extend(patterns.iter().map(String::as_str));
        let mut pause = Duration::from_millis(20);
        let out = loop {
            let Some(out) = self.remote_cmd(&args, deadline)? else {
                return Err(self.unavailable("no answer in time"));
            };
            if out.ok() {
                break out;
            }
            // A busy server drops connections (git daemon serves 32 at once):
            // try again within the deadline; any other failure is final.
            let why = out.stderr.trim().to_owned();
            let wait = jitter(pause);
            if !transient(&why) || Instant::now() + wait >= deadline {
                return Err(self.unavailable(&format!("git ls-remote failed: {why}")));
            }
            std::thread::sleep(wait);
            pause = (pause * 2).min(Duration::from_millis(500));
        };
        let mut refs = HashMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((oid, name)) = line.split_once('\t')
                && name.starts_with(prefix)
            {
                refs.insert(name.to_owned(), oid.to_owned());
            }
        }
        Ok(refs)
    }

    /// Fetches `refs` into the cache. `Some(why)`: git failed (the caller
    /// checks whether the objects it needs arrived anyway: concurrent fetches
    /// may only fail to update the cache ref).
    fn fetch(&self, wanted: &[(String, String)], deadline: Instant) -> Result<Option<String>> {
        if wanted.is_empty() {
            return Ok(None);
        }
        let specs: Vec<String> = wanted
            .iter()
            .map(|(r, _)| format!("+{r}:{}", self.cache_ref(r)))
            .collect();
        let mut args = vec![
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
            "-q",
            self.config.remote.as_str(),
        ];
        args.extend(specs.iter().map(String::as_str));
        match self.remote_cmd(&args, deadline)? {
            None => Err(self.unavailable("no answer in time")),
            Some(out) if out.ok() => Ok(None),
            Some(out) => Ok(Some(out.stderr.trim().to_owned())),
        }
    }

    /// Reads `lock.json` of each commit (None: no such commit or file here).
    fn read_states(&self, oids: &[&str]) -> Result<Vec<Option<Vec<u8>>>> {
        if oids.is_empty() {
            return Ok(Vec::new());
        }
        let mut input = String::new();
        for oid in oids {
            let _ = writeln!(input, "{oid}:{STATE_FILE}");
        }
        let out = self.local(&["cat-file", "--batch"], Some(input.as_bytes()))?;
        if !out.ok() {
            return Err(self.cache_error(&format!("git cat-file failed: {}", out.stderr.trim())));
        }
        let mut res = Vec::with_capacity(oids.len());
        let mut rest: &[u8] = &out.stdout;
        for _ in oids {
            let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
                res.push(None);
                continue;
            };
            let header = String::from_utf8_lossy(&rest[..nl]).into_owned();
            rest = &rest[nl + 1..];
            let parts: Vec<&str> = header.split(' ').collect();
            if parts.len() == 3
                && let Ok(size) = parts[2].parse::<usize>()
                && rest.len() > size
            {
                let body = rest[..size].to_vec();
                rest = &rest[size + 1..];
                res.push((parts[1] == "blob").then_some(body));
            } else {
                res.push(None);
            }
        }
        Ok(res)
    }

    fn is_commit(&self, oid: &str) -> Result<bool> {
        Ok(self
            .local(&["cat-file", "-e", &format!("{oid}^{{commit}}")], None)?
            .ok())
    }

    /// Interprets a state file.
    /// `None`: the commit's objects are not all in the cache (yet); never
    /// judged corrupt for that.
    fn interpret(&self, oid: &str, body: Option<Vec<u8>>) -> Result<Option<Seen>> {
        let corrupt = |why: String, fence: Option<u64>, depth: u64| {
            Some(Seen {
                oid: Some(oid.to_owned()),
                current: Current::Corrupt(why),
                fence,
                depth,
                epoch: 0,
                chainable: fence.is_some(),
            })
        };
        let Some(body) = body else {
            if !self.is_commit(oid)? {
                return Ok(None);
            }
            // The state file is absent only if the tree is readable and lacks it.
            let tree = self.local(&["ls-tree", "--name-only", oid], None)?;
            let listed = String::from_utf8_lossy(&tree.stdout)
                .lines()
                .any(|l| l == STATE_FILE);
            if !tree.ok() || listed {
                return Ok(None);
            }
            let fence = self.recover_fence(oid)?;
            return Ok(corrupt(
                format!("the lock ref's commit {oid} holds no {STATE_FILE}"),
                fence,
                0,
            ));
        };
        let state: StateFile = match serde_json::from_slice(&body) {
            Ok(s) => s,
            Err(e) => {
                let fence = self.recover_fence(oid)?;
                return Ok(corrupt(format!("unreadable {STATE_FILE}: {e}"), fence, 0));
            }
        };
        if state.format != STATE_FORMAT {
            return Ok(corrupt(
                format!("unknown state format {}", state.format),
                Some(state.fence),
                state.depth,
            ));
        }
        let current = match (state.state.as_str(), &state.record) {
            ("free", _) => Current::Free,
            ("held", Some(rec)) => {
                let bytes = serde_json::to_vec(rec).unwrap_or_default();
                match OwnerRecord::parse(&bytes) {
                    Ok(mut r) => {
                        r.holder.fence = state.fence;
                        Current::Held(r)
                    }
                    Err(why) => Current::Corrupt(why),
                }
            }
            (other, _) => Current::Corrupt(format!("unknown lock state {other:?}")),
        };
        Ok(Some(Seen {
            oid: Some(oid.to_owned()),
            current,
            fence: Some(state.fence),
            depth: state.depth,
            epoch: state.epoch,
            chainable: true,
        }))
    }

    /// The newest fence readable in the ancestors of an unreadable state.
    fn recover_fence(&self, oid: &str) -> Result<Option<u64>> {
        let out = self.local(&["rev-list", "--max-count=200", oid], None)?;
        if !out.ok() {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let oids: Vec<&str> = text.lines().collect();
        let bodies = self.read_states(&oids)?;
        Ok(bodies
            .into_iter()
            .flatten()
            .filter_map(|b| serde_json::from_slice::<StateFile>(&b).ok())
            .map(|s| s.fence)
            .max())
    }

    /// Reads one lock: one ls-remote, and a fetch only when the commit is new here.
    fn read_seen(&self, key: &LockKey, deadline: Instant) -> Result<Seen> {
        let r = self.lock_ref(key);
        let mut fetched = false;
        loop {
            let refs = self.ls_remote(std::slice::from_ref(&r), &r, deadline)?;
            let Some(oid) = refs.get(&r).cloned() else {
                return Ok(Seen {
                    oid: None,
                    current: Current::Free,
                    fence: Some(0),
                    depth: 0,
                    epoch: 0,
                    chainable: false,
                });
            };
            let mut body = self.read_states(&[oid.as_str()])?.pop().flatten();
            if body.is_none() && !self.is_commit(&oid)? {
                let failed = self.fetch(&[(r.clone(), oid.clone())], deadline)?;
                fetched = true;
                if !self.is_commit(&oid)? {
                    match failed {
                        Some(why) if transient(&why) => {
                            std::thread::sleep(jitter(Duration::from_millis(50)));
                        }
                        Some(why) if !why.contains("couldn't find remote ref") => {
                            return Err(self.unavailable(&format!("git fetch failed: {why}")));
                        }
                        _ => {}
                    }
                    // The ref moved between the two calls, or points at no commit.
                    if Instant::now() >= deadline {
                        return Err(
                            self.unavailable("the lock ref kept moving or points at no commit")
                        );
                    }
                    // Its type, read once (another process's fetch may have
                    // brought the commit since the check above).
                    let kind = self.local(&["cat-file", "-t", &oid], None)?;
                    let kind = String::from_utf8_lossy(&kind.stdout).trim().to_owned();
                    if !kind.is_empty() && kind != "commit" {
                        return Ok(Seen {
                            oid: Some(oid.clone()),
                            current: Current::Corrupt(format!(
                                "the lock ref points at {oid}, which is not a commit"
                            )),
                            fence: None,
                            depth: 0,
                            epoch: 0,
                            chainable: false,
                        });
                    }
                    if kind != "commit" {
                        continue;
                    }
                }
                body = self.read_states(&[oid.as_str()])?.pop().flatten();
            }
            if let Some(seen) = self.interpret(&oid, body)? {
                return Ok(seen);
            }
            // The commit is here but not all of its objects: another process
            // may still be writing them, or a killed fetch left them out.
            if Instant::now() >= deadline {
                return Err(self.unavailable(&format!(
                    "the objects of {oid} stay incomplete in the cache {}",
                    self.config.cache.display()
                )));
            }
            if fetched {
                std::thread::sleep(Duration::from_millis(20));
            } else {
                let _ = self.fetch(&[(r.clone(), oid.clone())], deadline)?;
            }
            fetched = !fetched;
        }
    }

    /// The state as the engine is shown it: a record judged by the wall
    /// clock expires [`GitConfig::clock_skew`] seconds later.
    ///
    /// An owner pid recorded in another boot (another machine, or this one
    /// before a reboot) is not shown to the engine either: on a store shared
    /// by machines, a hostname proves nothing, so such a lock is judged by its
    /// lease alone and a pid of another machine is never looked up here.
    fn view(&self, current: &Current) -> Current {
        match current {
            Current::Held(rec) => {
                let mut r = rec.clone();
                if !same_boot(rec) {
                    let skew = i64::try_from(self.config.clock_skew).unwrap_or(0);
                    r.holder.expires.0 = r.holder.expires.0.saturating_add(skew);
                }
                let ours = &crate::liveness::Origin::here().boot_id;
                if rec.holder.boot_id.is_none() || rec.holder.boot_id != *ours {
                    r.holder.owner_pid = None;
                    r.holder.owner_start = None;
                }
                Current::Held(r)
            }
            other => other.clone(),
        }
    }

    /// Writes the blob, tree and commit of a new state.
    fn make_commit(
        &self,
        state: &StateFile,
        parent: Option<&str>,
        message: &str,
    ) -> Result<String> {
        let body = serde_json::to_vec(state).map_err(|e| Error::Internal(e.to_string()))?;
        let blob = self.local(&["hash-object", "-w", "--stdin"], Some(&body))?;
        let blob = self.oid_of(&blob, "hash-object")?;
        let tree_in = format!("100644 blob {blob}\t{STATE_FILE}\n");
        let tree = self.local(&["mktree"], Some(tree_in.as_bytes()))?;
        let tree = self.oid_of(&tree, "mktree")?;
        let mut args = vec!["commit-tree", tree.as_str()];
        if let Some(p) = parent {
            args.extend(["-p", p]);
        }
        args.extend(["-F", "-"]);
        let commit = self.local(&args, Some(message.as_bytes()))?;
        self.oid_of(&commit, "commit-tree")
    }

    fn oid_of(&self, out: &Output, what: &str) -> Result<String> {
        let oid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if out.ok() && oid.len() >= 40 && oid.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(oid)
        } else {
            Err(self.cache_error(&format!("git {what} failed: {}", out.stderr.trim())))
        }
    }

    /// Pushes `commit` to `r` if the ref is still `expect` (None: absent),
    /// and the old chain to the archive ref after a roll-over.
    fn push(
        &self,
        r: &str,
        expect: Option<&str>,
        commit: &str,
        archive: Option<(&str, &str)>,
        deadline: Instant,
    ) -> Result<Pushed> {
        let lease = format!("--force-with-lease={r}:{}", expect.unwrap_or(""));
        let main = format!("{commit}:{r}");
        let mut args = vec![
            "push",
            "--porcelain",
            "--no-verify",
            "--no-recurse-submodules",
            lease.as_str(),
        ];
        let extra;
        if let Some((old, aref)) = archive {
            args.push("--atomic");
            extra = format!("+{old}:{aref}");
            args.extend([self.config.remote.as_str(), main.as_str(), extra.as_str()]);
        } else {
            args.extend([self.config.remote.as_str(), main.as_str()]);
        }
        let Some(out) = self.remote_cmd(&args, deadline)? else {
            return Ok(Pushed::Unknown("the push did not finish in time".into()));
        };
        if let Some((old, aref)) = archive
            && out.stderr.contains("support --atomic")
        {
            // A server without atomic pushes (nothing was sent): the lock
            // first, then the archive, which only history reads, at best effort.
            let pushed = self.push(r, expect, commit, None, deadline)?;
            if matches!(pushed, Pushed::Done) {
                let spec = format!("+{old}:{aref}");
                let _ = self.remote_cmd(
                    &[
                        "push",
                        "--quiet",
                        "--no-verify",
                        self.config.remote.as_str(),
                        &spec,
                    ],
                    deadline,
                );
            }
            return Ok(pushed);
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut ours = None;
        let mut reasons = Vec::new();
        for line in text.lines() {
            let mut parts = line.splitn(3, '\t');
            let (Some(flag), Some(spec), Some(summary)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if flag == "!" {
                reasons.push(summary.to_owned());
            }
            if spec.rsplit_once(':').is_some_and(|(_, to)| to == r) {
                ours = Some((flag.to_owned(), summary.to_owned()));
            }
        }
        let contention = |s: &str| {
            [
                "stale info",
                "fetch first",
                "non-fast-forward",
                "failed to update ref",
                "cannot lock ref",
                "failed to lock",
                "incorrect old value",
                "reference already exists",
                "atomic",
                "already exists",
            ]
            .iter()
            .any(|m| s.contains(m))
        };
        Ok(match ours {
            Some((flag, _)) if out.ok() && matches!(flag.as_str(), " " | "+" | "*") => Pushed::Done,
            Some((flag, _)) if flag == "!" => {
                if let Some(bad) = reasons.iter().find(|s| !contention(s)) {
                    Pushed::Refused(bad.clone())
                } else {
                    Pushed::Lost
                }
            }
            _ => Pushed::Unknown(format!(
                "git push ended with status {:?}: {}",
                out.code,
                out.stderr.trim()
            )),
        })
    }

    /// Is `ancestor` our commit, at the tip or under it?
    fn contains(&self, tip: &str, ancestor: &str) -> Result<bool> {
        if tip == ancestor {
            return Ok(true);
        }
        Ok(self
            .local(&["merge-base", "--is-ancestor", ancestor, tip], None)?
            .ok())
    }
}

/// Does git's complaint look like a dropped connection (worth another try)?
fn transient(stderr: &str) -> bool {
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
fn jitter(d: Duration) -> Duration {
    let r = random_suffix();
    let x = u32::from_str_radix(r.get(..4).unwrap_or("8000"), 16).unwrap_or(0x8000);
    d.mul_f64(0.5 + f64::from(x) / 65536.0)
}

fn message(key: &LockKey, change: &str, fence: u64, events: &[Event]) -> Result<String> {
    let mut m = format!("skill-lock: {change} {} (fence {fence})\n\n", key.name());
    for ev in events {
        let line = serde_json::to_string(ev).map_err(|e| Error::Internal(e.to_string()))?;
        m.push_str(&line);
        m.push('\n');
    }
    // Two identical changes must never make the same commit.
    let _ = write!(m, "\nnonce: {}\n", random_suffix());
    Ok(m)
}

/// An attempt whose push outcome was unknown, kept to recognise it later.
struct Pending<T> {
    commit: String,
    value: T,
    written: Option<OwnerRecord>,
}

impl Store for GitStore {
    fn describe(&self) -> String {
        redact(&self.config.url)
    }

    fn location(&self, key: &LockKey) -> String {
        self.lock_ref(key)
    }

    fn clock_skew(&self) -> Option<u64> {
        Some(self.config.clock_skew)
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let deadline = Instant::now() + self.config.timeout;
        Ok(self.view(&self.read_seen(key, deadline)?.current))
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        let start = Instant::now();
        let deadline = start + self.config.timeout;
        // Leave a quarter of the time to settle a push whose outcome is unknown.
        let push_deadline = start + self.config.timeout.mul_f64(0.75);
        let r = self.lock_ref(key);
        let mut pending: Vec<Pending<T>> = Vec::new();
        let mut unknown_why = None;
        // The ref as this host last wrote it: deciding on it and pushing with
        // it as the lease saves the read when nobody changed the lock since
        // (renew, release). A decision to change nothing is not trusted on
        // this view: it is made again on a fresh read.
        if let Some(seen) = self.remembered(&r)? {
            match self.attempt(key, &r, &seen, decide, push_deadline, true)? {
                Step::Done(c) => return Ok(c),
                Step::Again => {}
                Step::Unknown(p, why) => {
                    unknown_why = Some(why);
                    pending.push(p);
                }
            }
        }
        loop {
            let seen = match self.read_seen(key, deadline) {
                Ok(s) => s,
                Err(e) if pending.is_empty() => return Err(e),
                Err(e) => {
                    return Err(self.unavailable(&format!(
                        "a push's outcome is unknown ({}) and the ref could not be read back ({e}); run status to see whether this lock is held (its token is lost: if it is, release it with --force)",
                        unknown_why.unwrap_or_default()
                    )));
                }
            };
            if let Some(tip) = &seen.oid {
                for i in 0..pending.len() {
                    if self.contains(tip, &pending[i].commit)? {
                        let p = pending.swap_remove(i);
                        self.remember(&r, Some(&p.commit));
                        return Ok(Committed {
                            value: p.value,
                            written: p.written,
                        });
                    }
                }
            }
            let push_left = push_deadline.saturating_duration_since(Instant::now());
            if push_left.is_zero() {
                return Err(if pending.is_empty() {
                    self.unavailable("the lock kept changing under this command (lost every race until the deadline)")
                } else {
                    self.unavailable(&format!(
                        "a push's outcome is unknown ({}), and the lock does not show it",
                        unknown_why.unwrap_or_default()
                    ))
                });
            }
            match self.attempt(key, &r, &seen, decide, push_deadline, false)? {
                Step::Done(c) => return Ok(c),
                Step::Again => {}
                Step::Unknown(p, why) => {
                    unknown_why = Some(why);
                    pending.push(p);
                }
            }
        }
    }

    fn list(&self) -> Result<Listing> {
        let deadline = Instant::now() + self.config.timeout;
        let prefix = self.ns_prefix(REF_PREFIX);
        let refs = self.ls_remote(&[format!("{prefix}*")], &prefix, deadline)?;
        let mut named: Vec<(LockKey, String, String)> = refs
            .into_iter()
            .filter_map(|(r, oid)| {
                let name = r.strip_prefix(&prefix)?;
                let key = LockKey::from_name(name)?;
                Some((key, r, oid))
            })
            .collect();
        named.sort_by(|a, b| a.1.cmp(&b.1));
        self.fetch_missing(
            named
                .iter()
                .map(|(_, r, o)| (r.clone(), o.clone()))
                .collect(),
            deadline,
        )?;
        let oids: Vec<&str> = named.iter().map(|(_, _, o)| o.as_str()).collect();
        let bodies = self.read_states(&oids)?;
        let mut locks = Vec::new();
        for ((key, r, oid), body) in named.iter().zip(bodies) {
            let seen = match self.interpret(oid, body)? {
                Some(seen) => seen,
                None => self.read_seen(key, deadline)?,
            };
            if seen.current == Current::Free {
                continue;
            }
            locks.push(Listed::new(
                key.clone(),
                r.clone(),
                self.view(&seen.current),
            ));
        }
        Ok(Listing {
            locks,
            tombstones: 0,
        })
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let deadline = Instant::now() + self.config.timeout;
        let lock_prefix = self.ns_prefix(REF_PREFIX);
        let arch_prefix = self.ns_prefix(ARCHIVE_PREFIX);
        let patterns = match key {
            Some(k) => vec![self.lock_ref(k), format!("{arch_prefix}{}/*", k.name())],
            None => vec![format!("{lock_prefix}*"), format!("{arch_prefix}*")],
        };
        let refs = self.ls_remote(&patterns, "refs/", deadline)?;
        // Chains by lock name: the archived ones and the live one.
        let mut chains: std::collections::BTreeMap<String, (Vec<String>, Option<String>)> =
            std::collections::BTreeMap::new();
        for (r, oid) in &refs {
            if let Some(name) = r.strip_prefix(&lock_prefix) {
                if LockKey::from_name(name).is_some() {
                    chains.entry(name.to_owned()).or_default().1 = Some(oid.clone());
                }
            } else if let Some((name, slot)) = r
                .strip_prefix(&arch_prefix)
                .and_then(|rest| rest.rsplit_once('/'))
                && LockKey::from_name(name).is_some()
                && slot.bytes().all(|b| b.is_ascii_digit())
            {
                chains
                    .entry(name.to_owned())
                    .or_default()
                    .0
                    .push(oid.clone());
            }
        }
        let wanted: Vec<(String, String)> = refs
            .iter()
            .filter(|(r, _)| r.starts_with(&lock_prefix) || r.starts_with(&arch_prefix))
            .map(|(r, o)| (r.clone(), o.clone()))
            .collect();
        self.fetch_missing(wanted, deadline)?;
        let mut all = Vec::new();
        for (_, (mut archived, tip)) in chains {
            // Oldest chain first: by the epoch in each archived tip's state.
            let bodies =
                self.read_states(&archived.iter().map(String::as_str).collect::<Vec<_>>())?;
            let epochs: HashMap<String, u64> = archived
                .iter()
                .zip(bodies)
                .map(|(o, b)| {
                    let e = b
                        .and_then(|b| serde_json::from_slice::<StateFile>(&b).ok())
                        .map_or(0, |s| s.epoch);
                    (o.clone(), e)
                })
                .collect();
            archived.sort_by_key(|o| epochs.get(o).copied().unwrap_or(0));
            let mut events = Vec::new();
            for oid in tip.iter().chain(archived.iter().rev()) {
                if events.len() >= limit {
                    break;
                }
                let mut older = self.events_of(oid, limit - events.len())?;
                older.append(&mut events);
                events = older;
            }
            all.append(&mut events);
        }
        // Locks interleave by time; each lock's own order is kept.
        all.sort_by_key(|e| e.time);
        let skip = all.len().saturating_sub(limit);
        Ok(all.split_off(skip))
    }
}

/// What one decide-and-push attempt came to.
enum Step<T> {
    /// Applied (or nothing to apply).
    Done(Committed<T>),
    /// Lost a race (or a guess was wrong): read and decide again.
    Again,
    /// The push's outcome is unknown.
    Unknown(Pending<T>, String),
}

impl GitStore {
    /// The state this host last wrote to `r`, when it is still in the cache.
    fn remembered(&self, r: &str) -> Result<Option<Seen>> {
        let Some(oid) = std::fs::read_to_string(self.tip_file(r))
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| t.len() >= 40 && t.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return Ok(None);
        };
        let Some(body) = self.read_states(&[oid.as_str()])?.pop().flatten() else {
            return Ok(None);
        };
        let seen = self.interpret(&oid, Some(body))?;
        Ok(seen.filter(|s| matches!(s.current, Current::Free | Current::Held(_))))
    }

    fn tip_file(&self, r: &str) -> PathBuf {
        let h = crate::record::hash_token(&format!("{}\n{r}", self.config.remote));
        self.config.cache.join("skill-lock-tips").join(&h[..32])
    }

    /// Remembers (or forgets) the commit this host last pushed to `r`.
    /// Best effort: a lost note only costs the read it would have saved.
    fn remember(&self, r: &str, oid: Option<&str>) {
        let file = self.tip_file(r);
        let Some(oid) = oid else {
            let _ = std::fs::remove_file(&file);
            return;
        };
        let Some(dir) = file.parent() else { return };
        let _ = std::fs::create_dir_all(dir);
        let tmp = dir.join(format!(".{}", random_suffix()));
        if std::fs::write(&tmp, oid).is_ok() && std::fs::rename(&tmp, &file).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Decides on `seen` and pushes the change with `seen` as the lease.
    /// `guess`: `seen` was not read from the remote, so a decision to change
    /// nothing proves nothing and a lost race is no news.
    fn attempt<T>(
        &self,
        key: &LockKey,
        r: &str,
        seen: &Seen,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
        push_deadline: Instant,
        guess: bool,
    ) -> Result<Step<T>> {
        let view = self.view(&seen.current);
        let Decision {
            change,
            mut events,
            value,
        } = decide(&view)?;
        let raw_holder = match &seen.current {
            Current::Held(rec) => Some(rec.holder.clone()),
            _ => None,
        };
        let view_holder = match &view {
            Current::Held(rec) => Some(rec.holder.clone()),
            _ => None,
        };
        // History shows the holder as stored, not as shifted for judging.
        for ev in &mut events {
            if ev.previous.is_some() && ev.previous == view_holder {
                ev.previous.clone_from(&raw_holder);
            }
        }
        let known_fence = || {
            seen.fence.ok_or_else(|| {
                Error::Io {
                    action: "read the last fence of",
                    path: PathBuf::from(&r),
                    source: std::io::Error::other(format!(
                        "the lock's state ({}) and its recent history are unreadable, so a new fence could repeat one; remove the ref with `git push REMOTE :REF` as an operator",
                        match &seen.current {
                            Current::Corrupt(why) => why.as_str(),
                            _ => "?",
                        }
                    )),
                }
            })
        };
        let (state, written, what) = match change {
            Change::Keep => {
                // Only refusals carry events here; keep them when a record is there.
                let done = |value| {
                    Ok(if guess {
                        Step::Again
                    } else {
                        Step::Done(Committed {
                            value,
                            written: None,
                        })
                    })
                };
                let Current::Held(rec) = &seen.current else {
                    return done(value);
                };
                if events.is_empty() {
                    return done(value);
                }
                (
                    held_state(
                        rec,
                        seen.fence.unwrap_or(rec.holder.fence),
                        seen.depth,
                        seen.epoch,
                    )?,
                    None,
                    "refused",
                )
            }
            Change::Create(mut rec) | Change::Takeover(mut rec) => {
                let fence = known_fence()?
                    .checked_add(1)
                    .ok_or_else(|| Error::Internal("the fence would overflow".into()))?;
                rec.holder.fence = fence;
                for ev in &mut events {
                    if ev.fence.is_none() {
                        ev.fence = Some(fence);
                    }
                }
                (
                    held_state(&rec, fence, seen.depth, seen.epoch)?,
                    Some(rec),
                    "acquired",
                )
            }
            Change::Rewrite(mut rec) => {
                // A renewal keeps the owner the view did not show.
                if let Current::Held(raw) = &seen.current {
                    rec.holder.owner_pid = raw.holder.owner_pid;
                    rec.holder.owner_start = raw.holder.owner_start;
                }
                let fence = seen.fence.unwrap_or(rec.holder.fence);
                rec.holder.fence = fence;
                (
                    held_state(&rec, fence, seen.depth, seen.epoch)?,
                    Some(rec),
                    "renewed",
                )
            }
            Change::Delete => {
                let fence = known_fence()?;
                (
                    StateFile {
                        format: STATE_FORMAT,
                        state: "free".into(),
                        fence,
                        depth: seen.depth + 1,
                        epoch: seen.epoch,
                        record: None,
                    },
                    None,
                    "released",
                )
            }
        };
        let mut state = state;
        let roll = !seen.chainable || seen.depth >= self.config.history_depth;
        let parent = if roll { None } else { seen.oid.as_deref() };
        if roll {
            state.depth = 1;
            state.epoch = if seen.chainable {
                seen.epoch.saturating_add(1)
            } else {
                seen.epoch
            };
        }
        let msg = message(key, what, state.fence, &events)?;
        let commit = self.make_commit(&state, parent, &msg)?;
        let archive_ref = self.archive_ref(&key.name(), seen.epoch % ARCHIVE_SLOTS);
        let archive = match (&seen.oid, roll && seen.chainable) {
            (Some(old), true) => Some((old.as_str(), archive_ref.as_str())),
            _ => None,
        };
        match self.push(r, seen.oid.as_deref(), &commit, archive, push_deadline)? {
            Pushed::Done => {
                self.remember(r, Some(&commit));
                Ok(Step::Done(Committed { value, written }))
            }
            Pushed::Lost => {
                if guess {
                    self.remember(r, None);
                }
                Ok(Step::Again)
            }
            Pushed::Refused(why) => Err(self.unavailable(&format!(
                "the remote refused the update of {r}: {why}; check that you may push refs under {REF_PREFIX}"
            ))),
            Pushed::Unknown(why) => Ok(Step::Unknown(
                Pending {
                    commit,
                    value,
                    written,
                },
                why,
            )),
        }
    }
}

fn held_state(rec: &OwnerRecord, fence: u64, depth: u64, epoch: u64) -> Result<StateFile> {
    let mut rec = rec.clone();
    rec.holder.fence = fence;
    let value = serde_json::to_value(&rec).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(StateFile {
        format: STATE_FORMAT,
        state: "held".into(),
        fence,
        depth: depth + 1,
        epoch,
        record: Some(value),
    })
}

impl GitStore {
    fn fetch_missing(&self, refs: Vec<(String, String)>, deadline: Instant) -> Result<()> {
        let mut missing = Vec::new();
        for (r, oid) in refs {
            if !self.is_commit(&oid)? {
                missing.push((r, oid));
            }
        }
        // What did not arrive is read lock by lock, with its own error.
        let _ = self.fetch(&missing, deadline)?;
        Ok(())
    }

    /// The newest `limit` events in the chain ending at `tip`, oldest first.
    fn events_of(&self, tip: &str, limit: usize) -> Result<Vec<Event>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Each commit holds one to three events: read enough commits (git
        // takes a count up to i32::MAX; a chain is never longer).
        let n = format!(
            "--max-count={}",
            limit.min(usize::try_from(i32::MAX).unwrap_or(usize::MAX))
        );
        let out = self.local(&["log", &n, "--format=%x1e%B", tip], None)?;
        if !out.ok() {
            return Err(self.cache_error(&format!(
                "git log of the lock history failed: {}",
                out.stderr.trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut events = Vec::new();
        // Newest commit first; within a commit, events are in order.
        for commit in text
            .split('\u{1e}')
            .filter(|c| !c.trim().is_empty())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            for line in commit.lines().filter(|l| l.starts_with('{')) {
                if let Ok(ev) = serde_json::from_str::<Event>(line) {
                    events.push(ev);
                }
            }
        }
        let skip = events.len().saturating_sub(limit);
        Ok(events.split_off(skip))
    }
}

trait Mode0700 {
    fn mode_0700(&mut self) -> &mut Self;
}

impl Mode0700 for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

/// Was `rec` written in this boot, with a boot-clock deadline (judged on
/// that clock, so no clock-skew allowance applies)?
fn same_boot(rec: &OwnerRecord) -> bool {
    let ours = &crate::liveness::Origin::here().boot_id;
    rec.holder.deadline_boot_ms.is_some() && ours.is_some() && rec.holder.boot_id == *ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_namespaces() {
        let cwd = Path::new("/nonexistent-skill-lock-test");
        let c = GitConfig::parse("git:file:///srv/coord.git#team/a", cwd).unwrap();
        assert_eq!(c.remote, "file:///srv/coord.git");
        assert_eq!(c.namespace.as_deref(), Some("team/a"));
        let c = GitConfig::parse("git:git@github.com:org/coord.git", cwd).unwrap();
        assert_eq!(
            (c.remote.as_str(), c.namespace),
            ("git@github.com:org/coord.git", None)
        );
        let c = GitConfig::parse("git:../coord.git", Path::new("/w/x")).unwrap();
        assert_eq!(c.remote, "/w/x/../coord.git");
        for bad in [
            "git:",
            "git:#team",
            "git:/x#",
            "git:/x#a@b",
            "git:/x#a/../b",
            "git:/x#.a",
            "git:nosuchremote",
        ] {
            assert!(GitConfig::parse(bad, cwd).is_err(), "{bad}");
        }
    }

    #[test]
    fn redacts_user_info() {
        assert_eq!(
            redact("fatal: https://u:s3cret@example.com/r.git and ssh://git@h/x"),
            "fatal: https://***@example.com/r.git and ssh://***@h/x"
        );
        assert_eq!(redact("no url here"), "no url here");
    }

    #[test]
    fn local_paths() {
        assert!(is_local_path("/srv/x.git"));
        assert!(is_local_path("../x"));
        assert!(is_local_path("./a:b"));
        assert!(!is_local_path("host:x"));
        assert!(!is_local_path("git@h:o/r.git"));
        assert!(!is_local_path("file:///x"));
    }
}
