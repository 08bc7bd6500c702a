//! The typed mirrors of the wire objects (SPEC §3, §4): every command's
//! reply as [`Reply`], unknown fields refused, so a field added or renamed
//! on the wire fails the tests that read it; typed reads of its fields, so
//! a test never indexes the JSON; and the check that a reply's exit status
//! is the one its result means.

use serde::Deserialize;

use super::Out;

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

/// Fields of `run`'s replies and of a takeover.
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

/// The typed reply of one line a process printed (`run`'s object, read
/// line by line from its stderr), or `None` when the line is not one. The
/// exit status is not known yet, so it is not checked.
pub fn reply_line(line: &str) -> Option<Reply> {
    serde_json::from_str(line).ok()
}

#[track_caller]
pub(super) fn parse(out: &Out, text: &str) -> Reply {
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
