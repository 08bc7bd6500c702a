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
    /// `renewed`, `note` and `owner_pid` are always on the wire (SPEC §4),
    /// `null` when unset.
    #[serde(deserialize_with = "nullable")]
    pub renewed: Option<String>,
    pub ttl: u64,
    #[serde(deserialize_with = "nullable")]
    pub note: Option<String>,
    pub host: String,
    #[serde(deserialize_with = "nullable")]
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

/// An accessor of a field that several replies carry, of one type in all:
/// panics, naming the reply, on one without it.
macro_rules! field {
    ($(#[$doc:meta])* $name:ident -> $ty:ty = |$v:ident| $get:expr; $($variant:ident)|+) => {
        $(#[$doc])*
        #[track_caller]
        pub fn $name(&self) -> $ty {
            match self {
                $(Self::$variant { $name: $v, .. })|+ => $get,
                other => panic!(concat!("no `", stringify!($name), "` in {:?}"), other),
            }
        }
    };
}

/// Typed reads of a reply's fields, so a test never indexes the JSON: each
/// panics (naming the reply) when the reply has no such field.
impl Reply {
    /// The `result` tag, as on the wire.
    pub fn result(&self) -> &'static str {
        match self {
            Self::Acquired { .. } => "acquired",
            Self::AlreadyRunning { .. } => "already_running",
            Self::Renewed { .. } => "renewed",
            Self::Released { .. } => "released",
            Self::Refused { .. } => "refused",
            Self::Held { .. } => "held",
            Self::NotOwner { .. } => "not_owner",
            Self::NotHeld { .. } => "not_held",
            Self::Expired { .. } => "expired",
            Self::Status { .. } => "status",
            Self::List { .. } => "list",
            Self::History { .. } => "history",
            Self::Ran { .. } => "ran",
            Self::Interrupted { .. } => "interrupted",
            Self::Error { .. } => "error",
        }
    }

    /// Asserts the `result` tag and returns the reply.
    #[track_caller]
    pub fn is(self, result: &str) -> Self {
        assert_eq!(self.result(), result, "{self:?}");
        self
    }

    field!(
        /// The lock's path or key (`lock`).
        lock -> &str = |v| v;
        Acquired | AlreadyRunning | Renewed | Released | Refused | Held | NotOwner | NotHeld
            | Expired | Status | Ran | Interrupted
    );
    field!(
        /// The repository as the command spelled it (`repo`).
        repo -> &str = |v| v;
        Acquired | AlreadyRunning | Renewed | Released | Refused | Held | NotOwner | NotHeld
            | Expired | Status | Ran | Interrupted
    );
    field!(ttl -> u64 = |v| *v; Acquired | Renewed);
    field!(note -> Option<&str> = |v| v.as_deref(); Acquired);
    field!(owner_pid -> Option<u32> = |v| *v; Acquired);
    field!(started -> &str = |v| v; Acquired);
    field!(expires -> &str = |v| v; Acquired | Renewed | Held | Expired);
    field!(renewed -> &str = |v| v; Renewed);
    field!(took_over -> Option<&TookOver> = |v| v.as_ref(); Acquired);
    field!(hint -> &str = |v| v; AlreadyRunning);
    field!(forced -> bool = |v| *v; Released);
    field!(was_expired -> bool = |v| *v; Renewed);
    field!(state -> &str = |v| v; Status);
    field!(locks -> &[ListEntry] = |v| v; List);
    field!(legacy -> &[ListEntry] = |v| v; List);
    field!(tombstones -> u64 = |v| *v; List);
    field!(events -> &[HistoryEvent] = |v| v; History);
    field!(
        /// The error code (`error`).
        error -> &str = |v| v; Error
    );
    field!(message -> &str = |v| v; Error | Interrupted);
    field!(exit_status -> u8 = |v| *v; Ran);
    field!(renewals -> u64 = |v| *v; Ran);
    field!(released -> bool = |v| *v; Ran);
    field!(lost -> bool = |v| *v; Ran);
    field!(clock_skew -> Option<u64> = |v| *v;
        Acquired | AlreadyRunning | Renewed | Released | Refused | Held | NotOwner | NotHeld
            | Expired | Status | Ran | Interrupted | History);

    /// `store` of a `list`, or of a store's `history`.
    #[track_caller]
    pub fn store(&self) -> &str {
        match self {
            Self::List { store, .. } => store,
            Self::History {
                store: Some(store), ..
            } => store,
            other => panic!("no `store` in {other:?}"),
        }
    }

    /// The `holder` field of a reply that has one (`None`: it has none).
    fn holder_field(&self) -> Option<Option<&Holder>> {
        match self {
            Self::AlreadyRunning { holder, .. } => Some(Some(holder)),
            Self::Released { holder, .. }
            | Self::Refused { holder, .. }
            | Self::NotOwner { holder, .. }
            | Self::Status { holder, .. } => Some(holder.as_ref()),
            _ => None,
        }
    }

    /// The holder a reply shows, if any (`null` or absent: `None`).
    #[track_caller]
    pub fn holder_opt(&self) -> Option<&Holder> {
        self.holder_field()
            .unwrap_or_else(|| panic!("no `holder` in {self:?}"))
    }

    /// The holder a reply of any kind shows: `None` when it has none or
    /// shows `null` (for a look over the replies of a race).
    pub fn any_holder(&self) -> Option<&Holder> {
        self.holder_field().flatten()
    }

    /// The holder a reply must show.
    #[track_caller]
    pub fn holder(&self) -> &Holder {
        self.holder_opt()
            .unwrap_or_else(|| panic!("a null holder in {self:?}"))
    }

    /// `expires_in`, where the reply has it (`None`: absent or `null`).
    #[track_caller]
    pub fn expires_in(&self) -> Option<u64> {
        match self {
            Self::AlreadyRunning { expires_in, .. }
            | Self::Renewed { expires_in, .. }
            | Self::Held { expires_in, .. } => Some(*expires_in),
            Self::Status { expires_in, .. } | Self::NotOwner { expires_in, .. } => *expires_in,
            other => panic!("no `expires_in` in {other:?}"),
        }
    }

    /// `stale_reason`, where the reply has it (`None`: absent).
    #[track_caller]
    pub fn stale_reason(&self) -> Option<&str> {
        match self {
            Self::Status { stale_reason, .. } | Self::NotHeld { stale_reason, .. } => {
                stale_reason.as_deref()
            }
            Self::Expired { stale_reason, .. } => Some(stale_reason),
            other => panic!("no `stale_reason` in {other:?}"),
        }
    }

    /// The fence of a reply that must carry one.
    #[track_caller]
    pub fn must_fence(&self) -> u64 {
        self.fence()
            .unwrap_or_else(|| panic!("no fence in {self:?}"))
    }

    /// The `event` of every history event, in order.
    #[track_caller]
    pub fn event_kinds(&self) -> Vec<&str> {
        self.events().iter().map(|e| e.event.as_str()).collect()
    }

    /// (skill, repo) of every lock of a `list`, in order.
    #[track_caller]
    pub fn lock_names(&self) -> Vec<(String, String)> {
        self.locks()
            .iter()
            .map(|l| (l.skill.clone(), l.repo.clone()))
            .collect()
    }
}

/// One verb on a [`Lock`], its options typed:
/// `lock.op("acquire").ttl(600).note("one").reply()`.
pub struct Call {
    verb: String,
    cmd: Cmd,
}

impl Call {
    /// Appends raw arguments (for an option no typed method names).
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cmd = self.cmd.args(args);
        self
    }

    /// One option and its value.
    fn opt(self, name: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        let cmd = self.cmd.arg(name).arg(value);
        Self { cmd, ..self }
    }

    /// `--ttl SECS`.
    pub fn ttl(self, secs: u64) -> Self {
        self.opt("--ttl", secs.to_string())
    }

    /// `--note TEXT`.
    pub fn note(self, text: impl AsRef<std::ffi::OsStr>) -> Self {
        self.opt("--note", text)
    }

    /// `--owner-pid PID`.
    pub fn owner_pid(self, pid: u32) -> Self {
        self.opt("--owner-pid", pid.to_string())
    }

    /// `--token TOKEN`.
    pub fn token(self, token: &str) -> Self {
        self.opt("--token", token)
    }

    /// `--force`.
    pub fn force(self) -> Self {
        self.args(["--force"])
    }

    /// `--wait SECS` (a decimal number of seconds).
    pub fn wait(self, secs: impl std::fmt::Display) -> Self {
        self.opt("--wait", secs.to_string())
    }

    /// `--since FENCE` (`None`: `null`, the fence of a never-acquired lock).
    pub fn since(self, fence: Option<u64>) -> Self {
        self.opt(
            "--since",
            fence.map_or_else(|| "null".to_owned(), |f| f.to_string()),
        )
    }

    /// `--root DIR`.
    pub fn root(self, dir: impl AsRef<std::ffi::OsStr>) -> Self {
        self.opt("--root", dir)
    }

    /// `--limit N` (`history`).
    pub fn limit(self, n: u64) -> Self {
        self.opt("--limit", n.to_string())
    }

    /// `--store URL`.
    pub fn store(self, url: &str) -> Self {
        self.opt("--store", url)
    }

    /// `-- CMD...` (`run`): the command to run under the lock.
    pub fn command<I, S>(self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.args(["--"]).args(argv)
    }

    /// The environment variable `name=value` for this invocation.
    pub fn env(self, name: &str, value: impl AsRef<std::ffi::OsStr>) -> Self {
        let cmd = self.cmd.env(name, value);
        Self { cmd, ..self }
    }

    /// As if run on another host (`SKILL_LOCK_HOST`).
    pub fn host(self, name: &str) -> Self {
        self.env("SKILL_LOCK_HOST", name)
    }

    /// The verb.
    pub fn verb(&self) -> &str {
        &self.verb
    }

    /// The command, to run or spawn as the test likes.
    pub fn cmd(self) -> Cmd {
        self.cmd
    }

    /// Runs it and returns what it printed.
    pub fn run(self) -> Out {
        self.cmd.run()
    }

    /// Runs it and reads its reply (the exit status checked against the
    /// result, `not_held`'s by the verb: 0 for `release`, 4 otherwise).
    #[track_caller]
    pub fn reply(self) -> Reply {
        let verb = self.verb.clone();
        verb_reply(&verb, &self.cmd.run())
    }

    /// Runs it and asserts its exit status and result.
    #[track_caller]
    pub fn expect(self, code: i32, result: &str) -> Reply {
        let out = self.cmd.run();
        assert_eq!(
            (out.code, out.json["result"].as_str()),
            (code, Some(result)),
            "stdout: {}\nstderr: {}",
            out.stdout,
            out.stderr
        );
        reply(&out)
    }

    /// Runs `run` and reads its reply from the last line of stderr.
    #[track_caller]
    pub fn run_reply(self) -> (Out, Reply) {
        let out = self.cmd.run();
        let r = run_reply(&out);
        (out, r)
    }
}

/// The reply of `verb`, `not_held`'s exit status checked by the verb.
#[track_caller]
fn verb_reply(verb: &str, out: &Out) -> Reply {
    let r = reply(out);
    if matches!(r, Reply::NotHeld { .. }) {
        let want = if verb == "release" { 0 } else { 4 };
        assert_eq!(out.code, want, "exit status of {verb}'s {r:?}");
    }
    r
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
        verb_reply(verb, &out)
    }

    /// The verb `verb` on this lock, its options added typed
    /// (`lock.op("acquire").ttl(60).reply()`).
    pub fn op(&self, verb: &str) -> Call {
        Call {
            verb: verb.to_owned(),
            cmd: self.cmd(verb, &[]),
        }
    }

    /// A command about no one lock (`list`, `history`), its options typed.
    pub fn store_op(&self, verb: &str) -> Call {
        Call {
            verb: verb.to_owned(),
            cmd: self.store_cmd(&[verb]),
        }
    }

    /// The same lock, run as if on another host (`SKILL_LOCK_HOST`).
    pub fn on_host(self, name: &str) -> Self {
        self.with_env("SKILL_LOCK_HOST", name)
    }

    /// `list` of the lock's store.
    #[track_caller]
    pub fn list(&self) -> Reply {
        self.store_op("list").reply()
    }

    /// `history` of this lock.
    #[track_caller]
    pub fn history(&self) -> Reply {
        self.call("history", &[])
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

/// The typed reply of an invocation that must answer one object (on stdout,
/// or `on_stderr` as the last line, as `run` does), or `None` when it printed
/// no object the contract defines; its exit status checked when it did.
#[track_caller]
pub fn try_reply(out: &Out, on_stderr: bool) -> Option<Reply> {
    let text = if on_stderr {
        out.stderr.lines().last()?
    } else if out.json.is_object() {
        out.stdout.trim_end()
    } else {
        return None;
    };
    serde_json::from_str::<Reply>(text).ok()?;
    Some(parse(out, text))
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
