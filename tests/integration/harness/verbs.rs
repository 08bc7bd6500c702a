//! A harness that speaks in verbs: `lock.acquire()`, `lock.check(&token)`,
//! each returning a typed mirror of the wire object (unknown fields refused,
//! so a field added or renamed on the wire fails the tests that read it).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Cmd, Out};

/// A field that is always on the wire, `null` or a value: a missing one is
/// refused (serde alone would read a missing `Option` as `None`).
fn nullable<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d)
}

/// The `holder` object (SPEC §4).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    pub skill: String,
    pub repo: String,
    pub started: String,
    pub expires: String,
    pub renewed: Option<String>,
    pub ttl: u64,
    pub note: Option<String>,
    pub host: String,
    pub owner_pid: Option<u32>,
    pub fence: u64,
    pub boot_id: Option<String>,
    pub owner_start: Option<u64>,
    pub deadline_boot_ms: Option<u64>,
    pub machine: Option<String>,
    pub pid_ns: Option<u64>,
    pub pid_ns_start: Option<u64>,
    pub time_ns: Option<u64>,
    pub owner_pgid: Option<u32>,
    pub group_start: Option<u64>,
    pub format: u32,
}

/// A `took_over` object.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TookOver {
    pub reason: String,
    pub holder: Option<Holder>,
}

/// One lock in a `list` reply; `state` is `held` or `stale`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListEntry {
    pub skill: String,
    pub repo: String,
    pub state: String,
    #[serde(default)]
    pub holder: Option<Holder>,
    #[serde(default)]
    pub expires_in: Option<u64>,
    #[serde(default)]
    pub stale_reason: Option<String>,
    pub lock: String,
    #[serde(default)]
    pub clock_skew: Option<u64>,
}

/// One event of a `history` reply (SPEC §2.8).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryEvent {
    pub time: String,
    pub event: String,
    pub lock: String,
    pub skill: String,
    pub repo: String,
    pub fence: Option<u64>,
    pub host: String,
    pub pid: u32,
    pub owner_pid: Option<u32>,
    pub note: Option<String>,
    pub reason: Option<String>,
    pub expires: Option<String>,
    pub previous: Option<Holder>,
}

/// Every wire object this harness reads, tagged by `result` (the command
/// decides between the shapes that share a name, e.g. `not_owner`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Acquired {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        token: String,
        started: String,
        expires: String,
        ttl: u64,
        note: Option<String>,
        owner_pid: Option<u32>,
        fence: u64,
        took_over: Option<TookOver>,
        /// `--since`'s answer; `null` without `--since`.
        #[serde(deserialize_with = "nullable")]
        others_since: Option<bool>,
    },
    AlreadyRunning {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        holder: Holder,
        expires_in: u64,
        hint: String,
    },
    Renewed {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        expires: String,
        renewed: String,
        ttl: u64,
        fence: u64,
        was_expired: bool,
        expires_in: u64,
    },
    Released {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        forced: bool,
        holder: Option<Holder>,
    },
    Refused {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        holder: Option<Holder>,
    },
    Held {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        expires: String,
        fence: u64,
        expires_in: u64,
    },
    NotOwner {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        holder: Option<Holder>,
        #[serde(default)]
        expires_in: Option<u64>,
    },
    NotHeld {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        #[serde(default)]
        stale_reason: Option<String>,
    },
    Expired {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        expires: String,
        fence: u64,
        stale_reason: String,
    },
    /// `status` (SPEC §2.4): `state` is `held`, `stale` or `free`.
    Status {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        /// The latest acquisition's fence, held or not; `null`: none known.
        #[serde(deserialize_with = "nullable")]
        fence: Option<u64>,
        state: String,
        #[serde(default)]
        holder: Option<Holder>,
        #[serde(default)]
        expires_in: Option<u64>,
        #[serde(default)]
        stale_reason: Option<String>,
    },
    /// `list` (SPEC §2.5).
    List {
        store: String,
        locks: Vec<ListEntry>,
        tombstones: u64,
        /// Locks an older version left in a working tree's
        /// `.apache-magpie-local/` (present only when there are some).
        #[serde(default)]
        legacy: Vec<ListEntry>,
    },
    /// `history` (SPEC §2.8): of one lock (`skill`...) or of the store.
    History {
        #[serde(default)]
        skill: Option<String>,
        #[serde(default)]
        repo: Option<String>,
        #[serde(default)]
        lock: Option<String>,
        #[serde(default)]
        clock_skew: Option<u64>,
        #[serde(default)]
        store: Option<String>,
        events: Vec<HistoryEvent>,
    },
    /// `ran` (SPEC §2.7, on stderr).
    Ran {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        fence: u64,
        #[serde(deserialize_with = "nullable")]
        others_since: Option<bool>,
        exit_status: u8,
        signal: Option<i32>,
        lost: bool,
        renewals: u64,
        released: bool,
    },
    /// `interrupted` (SPEC §2.7, on stderr).
    Interrupted {
        skill: String,
        repo: String,
        lock: String,
        #[serde(default)]
        clock_skew: Option<u64>,
        signal: i32,
        message: String,
    },
    Error {
        error: String,
        message: String,
        #[serde(default)]
        skill: Option<String>,
        #[serde(default)]
        repo: Option<String>,
    },
}

impl Reply {
    /// The token of an `acquired` reply.
    #[track_caller]
    pub fn token(&self) -> &str {
        match self {
            Self::Acquired { token, .. } => token,
            other => panic!("not acquired: {other:?}"),
        }
    }

    /// `others_since` of an `acquired` or `ran` reply.
    #[track_caller]
    pub fn others_since(&self) -> Option<bool> {
        match self {
            Self::Acquired { others_since, .. } | Self::Ran { others_since, .. } => *others_since,
            other => panic!("not acquired: {other:?}"),
        }
    }

    /// The fence of a reply that carries one.
    pub fn fence(&self) -> Option<u64> {
        match self {
            Self::Acquired { fence, .. }
            | Self::Renewed { fence, .. }
            | Self::Held { fence, .. }
            | Self::Ran { fence, .. }
            | Self::Expired { fence, .. } => Some(*fence),
            Self::Status { fence, .. } => *fence,
            _ => None,
        }
    }
}

/// One lock, reached from one directory: the verbs of SPEC §2.
pub struct Lock {
    cwd: PathBuf,
    skill: String,
    repo: String,
    global: Vec<String>,
    env: Vec<(String, std::ffi::OsString)>,
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

    /// The command `verb` on this lock, with `extra` arguments.
    pub fn cmd(&self, verb: &str, extra: &[&str]) -> Cmd {
        let cmd = Cmd::new(&self.cwd)
            .args([verb, self.skill.as_str(), "--repo", self.repo.as_str()])
            .args(extra)
            .args(&self.global);
        self.env
            .iter()
            .fold(cmd, |cmd, (name, value)| cmd.env(name, value))
    }

    /// A command about no one lock (`list`, `history` of the store), in the
    /// same directory, store and environment.
    pub fn store_cmd(&self, args: &[&str]) -> Cmd {
        let cmd = Cmd::new(&self.cwd).args(args).args(&self.global);
        self.env
            .iter()
            .fold(cmd, |cmd, (name, value)| cmd.env(name, value))
    }

    /// Runs `verb` and reads its reply, checking that the exit status is
    /// the one its result means.
    #[track_caller]
    pub fn call(&self, verb: &str, extra: &[&str]) -> Reply {
        let out = self.cmd(verb, extra).run();
        reply(&out)
    }

    #[track_caller]
    pub fn acquire(&self) -> Reply {
        self.call("acquire", &[])
    }

    #[track_caller]
    pub fn acquire_with(&self, extra: &[&str]) -> Reply {
        self.call("acquire", extra)
    }

    /// `acquire --since FENCE` (with `extra` arguments).
    #[track_caller]
    pub fn acquire_since(&self, fence: Option<u64>, extra: &[&str]) -> Reply {
        let since = fence.map_or_else(|| "null".to_owned(), |f| f.to_string());
        let mut args = vec!["--since", since.as_str()];
        args.extend_from_slice(extra);
        self.call("acquire", &args)
    }

    #[track_caller]
    pub fn status(&self) -> Reply {
        self.call("status", &[])
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
        self.call("check", &["--token", token])
    }

    #[track_caller]
    pub fn renew(&self, token: &str) -> Reply {
        self.call("renew", &["--token", token])
    }

    #[track_caller]
    pub fn release(&self, token: &str) -> Reply {
        self.call("release", &["--token", token])
    }

    #[track_caller]
    pub fn force_release(&self) -> Reply {
        self.call("release", &["--force"])
    }
}

/// The typed reply of one invocation; its exit status must match its result.
#[track_caller]
pub fn reply(out: &Out) -> Reply {
    parse(out, out.stdout.trim_end())
}

/// The typed reply of an object already read (`out.json`, which a test may
/// have taken from stderr), checked against `out`'s exit status.
#[track_caller]
pub fn reply_of(out: &Out, v: &serde_json::Value) -> Reply {
    parse(out, &v.to_string())
}

/// The typed reply of `run`, which prints its object as the last line of
/// stderr (CMD owns stdout).
#[track_caller]
pub fn run_reply(out: &Out) -> Reply {
    parse(out, out.stderr.lines().last().unwrap_or(""))
}

#[track_caller]
fn parse(out: &Out, text: &str) -> Reply {
    let r: Reply = serde_json::from_str(text).unwrap_or_else(|e| {
        panic!(
            "not a known reply ({e}):\nstdout: {}\nstderr: {}",
            out.stdout, out.stderr
        )
    });
    let want = match &r {
        Reply::Acquired { .. }
        | Reply::Renewed { .. }
        | Reply::Released { .. }
        | Reply::Held { .. }
        | Reply::Status { .. }
        | Reply::List { .. }
        | Reply::History { .. } => 0,
        // `run` exits with CMD's status, or 128+signal.
        Reply::Ran { .. } | Reply::Interrupted { .. } => out.code,
        Reply::NotHeld { .. } => out.code, // 0 for release, 4 for renew/check
        Reply::AlreadyRunning { .. } => 3,
        Reply::Refused { .. } | Reply::NotOwner { .. } | Reply::Expired { .. } => 4,
        Reply::Error { .. } => 2,
    };
    assert_eq!(out.code, want, "exit status of {r:?}");
    r
}
