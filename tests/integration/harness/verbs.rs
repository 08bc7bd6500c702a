//! A harness that speaks in verbs: one lock seen from one directory
//! ([`Lock`]), whose `lock.op("acquire")` is the [`Cmd`] of that verb
//! (options typed: `.ttl(600).note("one").reply()`), with shortcuts for the
//! plain verbs (`lock.acquire()`, `lock.check(&token)`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Cmd, Reply};

/// One lock, reached from one directory: the verbs of SPEC §2.
pub struct Lock {
    cwd: PathBuf,
    skill: String,
    repo: String,
    global: Vec<String>,
    env: Vec<(String, OsString)>,
}

impl Lock {
    /// The lock (`skill`, `repo`) seen from `cwd`.
    pub fn new(cwd: &Path, skill: &str, repo: &str) -> Self {
        Self {
            cwd: cwd.to_path_buf(),
            skill: skill.to_owned(),
            repo: repo.to_owned(),
            global: Vec::new(),
            env: Vec::new(),
        }
    }

    /// The same lock in the store `url` (`--store`).
    pub fn in_store(mut self, url: &str) -> Self {
        self.global = vec!["--store".into(), url.into()];
        self
    }

    /// The same lock, every command run with `name=value` in its environment.
    pub fn with_env(mut self, name: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        self.env
            .push((name.to_owned(), value.as_ref().to_os_string()));
        self
    }

    /// The same lock, run as if on another host (`SKILL_LOCK_HOST`).
    pub fn on_host(self, name: &str) -> Self {
        self.with_env("SKILL_LOCK_HOST", name)
    }

    /// The verb `verb` in the lock's directory and environment.
    fn verb(&self, verb: &str) -> Cmd {
        let cmd = Cmd::new(&self.cwd).with_verb(verb);
        self.env
            .iter()
            .fold(cmd, |cmd, (name, value)| cmd.env(name, value))
    }

    /// The verb `verb` on this lock (`VERB SKILL --repo REPO`, in its
    /// store), its options to be added typed
    /// (`lock.op("acquire").ttl(60).reply()`).
    pub fn op(&self, verb: &str) -> Cmd {
        self.verb(verb)
            .args([self.skill.as_str(), "--repo", self.repo.as_str()])
            .args(&self.global)
    }

    /// A command about no one lock (`list`, `history` of the store), in the
    /// same directory, store and environment.
    pub fn store_op(&self, verb: &str) -> Cmd {
        self.verb(verb).args(&self.global)
    }

    /// `list` of the lock's store.
    #[track_caller]
    pub fn list(&self) -> Reply {
        self.store_op("list").reply()
    }

    /// `history` of this lock.
    #[track_caller]
    pub fn history(&self) -> Reply {
        self.op("history").reply()
    }

    /// `history` of the lock's whole store.
    #[track_caller]
    pub fn store_history(&self) -> Reply {
        self.store_op("history").reply()
    }

    /// The state `status` shows (`held`, `stale` or `free`).
    #[track_caller]
    pub fn state(&self) -> String {
        self.status().state().to_owned()
    }

    #[track_caller]
    pub fn acquire(&self) -> Reply {
        self.op("acquire").reply()
    }

    #[track_caller]
    pub fn status(&self) -> Reply {
        self.op("status").reply()
    }

    /// The fence `status` shows now (`None`: `null`).
    #[track_caller]
    pub fn status_fence(&self) -> Option<u64> {
        match self.status() {
            Reply::Status { fence, .. } => fence,
            other => panic!("not a status: {other:?}"),
        }
    }

    #[track_caller]
    pub fn check(&self, token: &str) -> Reply {
        self.op("check").token(token).reply()
    }

    #[track_caller]
    pub fn renew(&self, token: &str) -> Reply {
        self.op("renew").token(token).reply()
    }

    #[track_caller]
    pub fn release(&self, token: &str) -> Reply {
        self.op("release").token(token).reply()
    }

    #[track_caller]
    pub fn force_release(&self) -> Reply {
        self.op("release").force().reply()
    }
}
