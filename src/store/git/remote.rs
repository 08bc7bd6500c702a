//! The git store's talk with the remote: the cache repository it works in,
//! `ls-remote`, `fetch` and the compare-and-swap `push`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::cmd::{
    Feed, Flow, Output, STDOUT_CAP, git_command, jitter, run, run_feeding, run_streaming, transient,
};
use super::config::{ARCHIVE_PREFIX, GitConfig, REF_PREFIX, REMOTE_NAME, is_local_path, redact};
use super::os::{CacheOs, Os};
use crate::error::{Error, Result};
use crate::key::LockKey;

/// The most of `git ls-remote`'s answer read: 32 MiB, some 200,000 lock
/// refs (a remote that lists more is refused, never read whole).
const MAX_LS_REMOTE: usize = 32 << 20;
/// Deadline of a local git command (in the cache).
const LOCAL_TIMEOUT: Duration = Duration::from_secs(30);
use crate::record::random_suffix;

/// Is `s` an object id (SHA-1 or SHA-256, lowercase hex)?
pub(super) fn is_oid(s: &str) -> bool {
    matches!(s.len(), 40 | 64)
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// How a push ended.
pub(super) enum Pushed {
    /// The ref now points at our commit.
    Done,
    /// The ref was not what we read: read again and decide again.
    Lost,
    /// The remote refused for another reason.
    Refused(String),
    /// Unknown: settle by reading back.
    Unknown(String),
}

/// The remote a git store works with, through its cache repository: the
/// settings, and what is learnt of git and the cache once, on first use.
#[derive(Debug, Clone)]
pub(super) struct Remote {
    pub(super) config: GitConfig,
    /// Whether ssh needs `BatchMode` from us (decided once, on first use).
    batch_ssh: std::sync::OnceLock<bool>,
    /// Whether the cache names objects by SHA-1 (read once, on first write).
    pub(super) sha1: std::sync::OnceLock<bool>,
    /// This git's `fetch` has no `--porcelain` (older than 2.41): a change
    /// reads the ref with `ls-remote` first.
    pub(super) no_porcelain: std::sync::OnceLock<()>,
}

impl Remote {
    /// The remote `config` names (already resolved); nothing is run yet.
    pub(super) fn new(config: GitConfig) -> Self {
        Self {
            config,
            batch_ssh: std::sync::OnceLock::new(),
            sha1: std::sync::OnceLock::new(),
            no_porcelain: std::sync::OnceLock::new(),
        }
    }

    pub(super) fn ns_prefix(&self, base: &str) -> String {
        match &self.config.namespace {
            Some(ns) => format!("{base}{ns}/"),
            None => base.to_owned(),
        }
    }

    pub(super) fn lock_ref(&self, key: &LockKey) -> String {
        format!("{}{}", self.ns_prefix(REF_PREFIX), key.ref_stem())
    }

    pub(super) fn archive_ref(&self, name: &str, slot: u64) -> String {
        format!("{}{name}/{slot}", self.ns_prefix(ARCHIVE_PREFIX))
    }

    /// The local ref a fetched lock ref is kept under in the cache (so later
    /// fetches only bring what is new).
    pub(super) fn cache_ref(&self, remote_ref: &str) -> String {
        let h = crate::record::hash_token(&self.config.remote);
        format!("refs/cache/{}/{remote_ref}", &h[..16])
    }

    pub(super) fn unavailable(&self, what: &str) -> Error {
        Error::StoreUnavailable(redact(&format!(
            "git remote {} ({}): {what}; check that it is reachable and that git can push to it without a prompt (ssh agent, credential helper), or raise SKILL_LOCK_GIT_TIMEOUT (now {} s)",
            self.config.url,
            self.config.remote,
            self.config.timeout.as_secs_f64()
        )))
    }

    pub(super) fn cache_error(&self, what: &str) -> Error {
        Error::Io {
            action: "use the git cache repository",
            path: self.config.cache.clone(),
            source: std::io::Error::other(redact(what)),
        }
    }

    /// A git command in the cache repository (created on first use), with
    /// the remote as [`REMOTE_NAME`]: its URL reaches git through the
    /// environment (`GIT_CONFIG_COUNT`), never through the arguments, so
    /// credentials in it never show in a process list.
    pub(super) fn in_cache(&self) -> Result<Command> {
        self.ensure_cache()?;
        let mut cmd = git_command();
        cmd.arg("--git-dir").arg(&self.config.cache);
        let n = self.config.config_count;
        cmd.env("GIT_CONFIG_COUNT", (n + 1).to_string())
            .env(
                format!("GIT_CONFIG_KEY_{n}"),
                format!("remote.{REMOTE_NAME}.url"),
            )
            .env(format!("GIT_CONFIG_VALUE_{n}"), &self.config.remote);
        cmd.current_dir(self.config.cache.parent().unwrap_or(Path::new("/")));
        if *self.batch_ssh.get_or_init(|| self.needs_batch_ssh()) {
            cmd.env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        }
        Ok(cmd)
    }

    /// ssh without a user-chosen command gets BatchMode (never a password prompt).
    pub(super) fn needs_batch_ssh(&self) -> bool {
        let r = &self.config.remote;
        let ssh = r.starts_with("ssh://")
            || r.starts_with("git+ssh://")
            || !is_local_path(r) && !r.contains("://");
        ssh && !self.config.user_ssh && !self.user_ssh_command()
    }

    pub(super) fn user_ssh_command(&self) -> bool {
        let mut cmd = git_command();
        cmd.arg("--git-dir")
            .arg(&self.config.cache)
            .args(["config", "--get", "core.sshCommand"]);
        matches!(run(&mut cmd, None, Instant::now() + Duration::from_secs(5), STDOUT_CAP), Ok(Some(o)) if o.ok())
    }

    pub(super) fn ensure_cache(&self) -> Result<()> {
        let dir = &self.config.cache;
        if dir.join("HEAD").is_file() {
            return Ok(());
        }
        let parent = dir.parent().unwrap_or(Path::new("/"));
        Os::private(std::fs::DirBuilder::new().recursive(true))
            .create(parent)
            .map_err(|e| Error::io("create", parent, e))?;
        // Under a shared temporary directory, only a directory of our own will do.
        if parent.starts_with(std::env::temp_dir())
            && !Os::ours_alone(parent).map_err(|e| Error::io("inspect", parent, e))?
        {
            return Err(self.cache_error(&format!(
                "{} belongs to someone else or is writable by others; set SKILL_LOCK_GIT_CACHE to a directory of your own",
                parent.display()
            )));
        }
        let tmp = parent.join(format!(".git-init-{}", random_suffix()));
        let mut cmd = git_command();
        cmd.args(["init", "--bare", "-q", "--"]).arg(&tmp);
        let ok = matches!(run(&mut cmd, None, Instant::now() + Duration::from_secs(10), STDOUT_CAP), Ok(Some(o)) if o.ok());
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
            let _ = run(
                &mut c,
                None,
                Instant::now() + Duration::from_secs(5),
                STDOUT_CAP,
            );
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

    /// Runs a local git command in the cache (its stdout bounded by [`STDOUT_CAP`]).
    pub(super) fn local(&self, args: &[&str], input: Option<&[u8]>) -> Result<Output> {
        self.local_capped(args, input, STDOUT_CAP)
    }

    /// Runs a local git command in the cache, keeping at most `cap` bytes of
    /// its stdout (more is an overflow: not `ok`).
    pub(super) fn local_capped(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
        cap: usize,
    ) -> Result<Output> {
        let mut cmd = self.in_cache()?;
        cmd.args(args);
        let out = run(&mut cmd, input, Instant::now() + LOCAL_TIMEOUT, cap);
        self.local_done(args, out)
    }

    /// Runs a local git command in the cache, its stdout handed to `sink`.
    pub(super) fn local_streaming(
        &self,
        args: &[&str],
        input: Option<&[u8]>,
        sink: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<Output> {
        let mut cmd = self.in_cache()?;
        cmd.args(args);
        let out = run_streaming(&mut cmd, input, Instant::now() + LOCAL_TIMEOUT, sink);
        self.local_done(args, out)
    }

    /// Runs a local git command in the cache, its stdin fed from `feed` as
    /// it comes, its stdout handed to `sink`.
    pub(super) fn local_feeding(
        &self,
        args: &[&str],
        feed: Feed<'_>,
        sink: &mut dyn FnMut(&[u8]) -> Flow,
    ) -> Result<Output> {
        let mut cmd = self.in_cache()?;
        cmd.args(args);
        let out = run_feeding(&mut cmd, Some(feed), Instant::now() + LOCAL_TIMEOUT, sink);
        self.local_done(args, out)
    }

    fn local_done(&self, args: &[&str], out: std::io::Result<Option<Output>>) -> Result<Output> {
        match out {
            Ok(Some(o)) => Ok(o),
            Ok(None) => Err(self.cache_error(&format!(
                "git {} did not finish in {} s",
                args.first().copied().unwrap_or("?"),
                LOCAL_TIMEOUT.as_secs()
            ))),
            Err(e) => Err(self.cache_error(&format!("cannot run git: {e}"))),
        }
    }

    /// Runs a network git command, killed at `deadline`, keeping at most
    /// `cap` bytes of its stdout.
    pub(super) fn remote_cmd(
        &self,
        args: &[&str],
        deadline: Instant,
        cap: usize,
    ) -> Result<Option<Output>> {
        let mut cmd = self.in_cache()?;
        cmd.args(args);
        run(&mut cmd, None, deadline, cap)
            .map_err(|e| self.cache_error(&format!("cannot run git: {e}")))
    }

    /// `git ls-remote` of `patterns`: ref -> oid, for refs starting with `prefix`.
    pub(super) fn ls_remote(
        &self,
        patterns: &[String],
        prefix: &str,
        deadline: Instant,
    ) -> Result<HashMap<String, String>> {
        let mut args = vec!["ls-remote", "--refs", "--", REMOTE_NAME];
        args.extend(patterns.iter().map(String::as_str));
        let mut pause = Duration::from_millis(20);
        let out = loop {
            let Some(out) = self.remote_cmd(&args, deadline, MAX_LS_REMOTE)? else {
                return Err(self.unavailable("no answer in time"));
            };
            if out.overflow {
                return Err(self.unavailable(&format!(
                    "the remote lists more than {} MiB of refs under {prefix}; a lock store holds far fewer",
                    MAX_LS_REMOTE >> 20
                )));
            }
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
            // Only an object id is ever passed on to git: whatever else a
            // remote might send is never read as an argument.
            if let Some((oid, name)) = line.split_once('\t')
                && name.starts_with(prefix)
                && is_oid(oid)
            {
                refs.insert(name.to_owned(), oid.to_owned());
            }
        }
        Ok(refs)
    }

    /// Fetches `refs` (names, or one `PREFIX*` pattern) into the cache, in
    /// one git process. `Some(why)`: git failed (the caller checks whether
    /// the objects it needs arrived anyway: concurrent fetches may only
    /// fail to update the cache ref).
    pub(super) fn fetch(&self, refs: &[String], deadline: Instant) -> Result<Option<String>> {
        if refs.is_empty() {
            return Ok(None);
        }
        let specs: Vec<String> = refs
            .iter()
            .map(|r| format!("+{r}:{}", self.cache_ref(r)))
            .collect();
        let mut args = vec![
            "fetch",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
            "-q",
            "--",
            REMOTE_NAME,
        ];
        args.extend(specs.iter().map(String::as_str));
        match self.remote_cmd(&args, deadline, STDOUT_CAP)? {
            None => Err(self.unavailable("no answer in time")),
            Some(out) if out.ok() => Ok(None),
            Some(out) => Ok(Some(out.stderr.trim().to_owned())),
        }
    }

    /// Fetches lock ref `r` into the cache and says what it pointed at, in
    /// one git process and one connection (`fetch --porcelain -v`, which
    /// prints the remote's value even when the cache has it). `Ok(None)`:
    /// no such ref. `Err(None)`: this git's fetch has no `--porcelain`.
    pub(super) fn fetch_tip(
        &self,
        r: &str,
        deadline: Instant,
    ) -> std::result::Result<Option<String>, Option<Error>> {
        let dst = self.cache_ref(r);
        let spec = format!("+{r}:{dst}");
        let args = [
            "fetch",
            "--porcelain",
            "-v",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
            "--",
            REMOTE_NAME,
            spec.as_str(),
        ];
        let mut pause = Duration::from_millis(20);
        loop {
            let Some(out) = self.remote_cmd(&args, deadline, STDOUT_CAP)? else {
                return Err(Some(self.unavailable("no answer in time")));
            };
            // `FLAG OLD NEW LOCAL-REF`; NEW is the remote's value (also
            // when the cache ref could not be updated: the objects are here).
            let text = String::from_utf8_lossy(&out.stdout);
            // (FLAG is one character, a space for a fast-forward.)
            let tip = text.lines().find_map(|l| {
                let mut p = l.rsplitn(4, ' ');
                let (local, new) = (p.next()?, p.next()?);
                (local == dst && is_oid(new)).then(|| new.to_owned())
            });
            if tip.is_some() {
                return Ok(tip);
            }
            let why = out.stderr.trim().to_owned();
            if why.contains("couldn't find remote ref") {
                return Ok(None);
            }
            if why.contains("porcelain") {
                return Err(None);
            }
            let wait = jitter(pause);
            if !transient(&why) || Instant::now() + wait >= deadline {
                return Err(Some(self.unavailable(&format!("git fetch failed: {why}"))));
            }
            std::thread::sleep(wait);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// Pushes `commit` to `r` if the ref is still `expect` (None: absent),
    /// and the old chain to the archive ref after a roll-over.
    pub(super) fn push(
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
            args.extend(["--", REMOTE_NAME, main.as_str(), extra.as_str()]);
        } else {
            args.extend(["--", REMOTE_NAME, main.as_str()]);
        }
        let Some(out) = self.remote_cmd(&args, deadline, STDOUT_CAP)? else {
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
                    &["push", "--quiet", "--no-verify", "--", REMOTE_NAME, &spec],
                    deadline,
                    STDOUT_CAP,
                );
            }
            return Ok(pushed);
        }
        Ok(pushed(&out, r))
    }
}

/// What `git push --porcelain` says of the update of `r`.
fn pushed(out: &Output, r: &str) -> Pushed {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut ours = None;
    let mut reasons = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, '\t');
        let (Some(flag), Some(spec), Some(summary)) = (parts.next(), parts.next(), parts.next())
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
    match ours {
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
    }
}

/// A rejection that means another push won the race (the lock changed).
fn contention(s: &str) -> bool {
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
}
