//! Output (SPEC §3): the JSON wire objects, their exit statuses, and the only
//! writer to stdout.
//!
//! Every invocation but `--help`/`--version`/`completions` prints exactly one
//! JSON object as one line. [`Report`] is one type per wire object, tagged by
//! `result`; fields appear in declaration order; a field that applies but has
//! no value is `null`. Each object knows its [`ExitStatus`], and the
//! conversions from engine outcomes to objects live here, beside them. The
//! `list` object is written entry by entry as the store hands the locks over
//! ([`ListPrinter`]), so its locks are never all in memory; after them come
//! `tombstones` and, only when an older version's layout still holds some,
//! `legacy`: the locks found in a working tree's `.apache-magpie-local/`.

use std::io::{BufWriter, Write};

use serde::Serialize;

use crate::engine::{self, Acquire, Check, Entry, Release, Renew, State, TookOver};
use crate::error::Error;
use crate::history::Event;
use crate::key::LockKey;
use crate::record::{Holder, Timestamp};
use crate::store::Place;

/// How an invocation exits (SPEC §2 "Exit status").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// 0: acquired, renewed, released or nothing to release, read, check holds.
    Success,
    /// 2: bad arguments or input, unreadable store, I/O failure.
    Error,
    /// 3: someone else holds the lock.
    AlreadyRunning,
    /// 4: a token that is not the live holder's, or no lock to renew/check.
    NotYours,
    /// `run`: the status of CMD (128+signal when a signal ended it).
    Ran(u8),
    /// `run --wait` ended by a signal before CMD started: 128+signal.
    Interrupted(u8),
    /// `run --conflict-exit-code N`: CMD was not run because the lock is
    /// held (SPEC §2 "Exit status"), N instead of 3.
    Conflict(u8),
}

impl ExitStatus {
    /// The process exit status.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Error => 2,
            Self::AlreadyRunning => 3,
            Self::NotYours => 4,
            Self::Ran(status) | Self::Interrupted(status) | Self::Conflict(status) => status,
        }
    }
}

impl From<ExitStatus> for std::process::ExitCode {
    fn from(status: ExitStatus) -> Self {
        Self::from(status.code())
    }
}

/// What every object about one lock carries: `skill`, `repo` (as given) and `lock`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct About {
    /// Skill, as given.
    pub skill: String,
    /// Repo, as given.
    pub repo: String,
    /// The lock's path (or key in a network store).
    pub lock: String,
    /// Seconds a takeover waits past `expires` for hosts' clocks to differ
    /// (the git store, SPEC §8); absent where the store needs none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_skew: Option<u64>,
}

impl About {
    /// The lock `key`, where its store says it is.
    #[must_use]
    pub(crate) fn new(key: &LockKey, location: Place) -> Self {
        Self {
            skill: key.skill().to_owned(),
            repo: key.repo().to_owned(),
            lock: location.lock,
            clock_skew: location.clock_skew,
        }
    }
}

/// A `took_over` object: why, and the holder replaced.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TookOverJson {
    /// `expired`, `owner_dead` or `corrupt`.
    pub reason: &'static str,
    /// The replaced holder, or null for a corrupt record.
    pub holder: Option<Holder>,
}

impl From<TookOver> for TookOverJson {
    fn from(t: TookOver) -> Self {
        Self {
            reason: t.reason.as_str(),
            holder: t.holder,
        }
    }
}

/// `acquired` (acquire, run): the lock is ours.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Acquired {
    #[serde(flatten)]
    about: About,
    token: String,
    started: Timestamp,
    expires: Timestamp,
    ttl: u64,
    note: Option<String>,
    owner_pid: Option<u32>,
    fence: u64,
    took_over: Option<TookOverJson>,
    /// With `--since`: another acquisition came in between (or the store
    /// cannot tell); `null` without it.
    others_since: Option<bool>,
}

/// `already_running` (acquire, run): someone else holds a live lease.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AlreadyRunning {
    #[serde(flatten)]
    about: About,
    holder: Holder,
    expires_in: u64,
    hint: String,
}

/// `ran` (run, on stderr): CMD ran while the lock was held.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Ran {
    #[serde(flatten)]
    about: About,
    fence: u64,
    /// As `acquired`'s (CMD had it as `SKILL_LOCK_OTHERS_SINCE`).
    others_since: Option<bool>,
    exit_status: u8,
    signal: Option<i32>,
    lost: bool,
    renewals: u64,
    released: bool,
}

/// `interrupted` (run, on stderr): a signal ended `run --wait` before CMD
/// started; nothing was acquired and nothing run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Interrupted {
    #[serde(flatten)]
    about: About,
    signal: i32,
    message: String,
}

/// `renewed` (renew).
#[derive(Debug, Clone, Serialize)]
#[allow(clippy::struct_field_names, reason = "the wire names its fields")]
pub(crate) struct Renewed {
    #[serde(flatten)]
    about: About,
    expires: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    renewed: Option<Timestamp>,
    ttl: u64,
    fence: u64,
    was_expired: bool,
    expires_in: u64,
}

/// `not_owner` of renew: another token holds the lock.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RenewNotOwner {
    #[serde(flatten)]
    about: About,
    holder: Holder,
    expires_in: u64,
}

/// `not_held` of renew: no lock, or only an unreadable one.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RenewNotHeld {
    #[serde(flatten)]
    about: About,
    #[serde(skip_serializing_if = "Option::is_none")]
    stale_reason: Option<&'static str>,
}

/// `released` (release).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Released {
    #[serde(flatten)]
    about: About,
    forced: bool,
    holder: Option<Holder>,
}

/// `refused` (release): the token does not hold the lock.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Refused {
    #[serde(flatten)]
    about: About,
    holder: Option<Holder>,
}

/// The state of one lock, as `status` and `list` show it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum LockState {
    /// A live lease.
    Held {
        /// Its holder.
        holder: Holder,
        /// Seconds left.
        expires_in: u64,
    },
    /// A lock the next acquire takes over.
    Stale {
        /// `expired`, `owner_dead` or `corrupt`.
        stale_reason: &'static str,
        /// Its holder, or null when unreadable.
        holder: Option<Holder>,
        /// Seconds left, or null when unreadable.
        expires_in: Option<u64>,
    },
    /// No lock.
    Free,
}

impl From<State> for LockState {
    fn from(state: State) -> Self {
        match state {
            State::Held { holder, expires_in } => Self::Held { holder, expires_in },
            State::Stale {
                reason,
                holder,
                expires_in,
            } => Self::Stale {
                stale_reason: reason.as_str(),
                holder,
                expires_in,
            },
            State::Free => Self::Free,
        }
    }
}

/// `status`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    #[serde(flatten)]
    about: About,
    /// The latest acquisition's fence, held or not; `null`: none known.
    fence: Option<u64>,
    #[serde(flatten)]
    state: LockState,
}

/// One lock in a `list` result.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ListEntry {
    /// Skill.
    pub skill: String,
    /// Repository (as recorded; lowercase when the record is unreadable).
    pub repo: String,
    /// Held or stale, with the holder.
    #[serde(flatten)]
    pub state: LockState,
    /// Where the lock is.
    pub lock: String,
}

impl From<Entry> for ListEntry {
    fn from(judged: Entry) -> Self {
        Self {
            skill: judged.key.skill().to_owned(),
            repo: judged.key.repo().to_owned(),
            state: LockState::from(judged.state),
            lock: judged.location,
        }
    }
}

/// `held` (check): the token holds a live lease.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Held {
    #[serde(flatten)]
    about: About,
    expires: Timestamp,
    fence: u64,
    expires_in: u64,
}

/// `not_owner` of check: another token holds it, or its record is unreadable.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckNotOwner {
    #[serde(flatten)]
    about: About,
    holder: Option<Holder>,
}

/// `expired` (check): the token's lease ran out or its owner died.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Expired {
    #[serde(flatten)]
    about: About,
    expires: Timestamp,
    fence: u64,
    stale_reason: &'static str,
}

/// `history`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct History {
    /// The lock asked about, if one was.
    #[serde(flatten)]
    about: Option<About>,
    /// Where it looked, when no lock was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<String>,
    events: Vec<Event>,
}

/// `error` (SPEC §3 "Errors").
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ErrorReport {
    error: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    skill: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
}

/// The one JSON object of an invocation, tagged by `result`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub(crate) enum Report {
    /// acquire, run: exit 0.
    Acquired(Acquired),
    /// acquire, run: exit 3.
    AlreadyRunning(AlreadyRunning),
    /// run: CMD's exit status.
    Ran(Ran),
    /// run --wait: 128+signal.
    Interrupted(Interrupted),
    /// renew: exit 0.
    Renewed(Renewed),
    /// renew: exit 4.
    #[serde(rename = "not_owner")]
    RenewNotOwner(RenewNotOwner),
    /// renew: exit 4.
    #[serde(rename = "not_held")]
    RenewNotHeld(RenewNotHeld),
    /// release: exit 0.
    Released(Released),
    /// release of a free lock: exit 0.
    #[serde(rename = "not_held")]
    ReleaseNotHeld(About),
    /// release: exit 4.
    Refused(Refused),
    /// status: exit 0.
    Status(Status),
    /// check: exit 0.
    Held(Held),
    /// check: exit 4.
    #[serde(rename = "not_owner")]
    CheckNotOwner(CheckNotOwner),
    /// check: exit 4.
    #[serde(rename = "not_held")]
    CheckNotHeld(About),
    /// check: exit 4.
    Expired(Expired),
    /// history: exit 0.
    History(History),
    /// Any command that could not reach an outcome: exit 2.
    Error(ErrorReport),
}

impl Report {
    /// The exit status this object means.
    #[must_use]
    pub(crate) fn exit_status(&self) -> ExitStatus {
        match self {
            Self::Acquired(_)
            | Self::Renewed(_)
            | Self::Released(_)
            | Self::ReleaseNotHeld(_)
            | Self::Status(_)
            | Self::Held(_)
            | Self::History(_) => ExitStatus::Success,
            Self::AlreadyRunning(_) => ExitStatus::AlreadyRunning,
            Self::Ran(r) => ExitStatus::Ran(r.exit_status),
            Self::Interrupted(r) => ExitStatus::Interrupted(crate::signals::exit_status(r.signal)),
            Self::RenewNotOwner(_)
            | Self::RenewNotHeld(_)
            | Self::Refused(_)
            | Self::CheckNotOwner(_)
            | Self::CheckNotHeld(_)
            | Self::Expired(_) => ExitStatus::NotYours,
            Self::Error(_) => ExitStatus::Error,
        }
    }

    /// The error object of SPEC §3; `lock` names the skill and repo as given.
    #[must_use]
    pub(crate) fn error(err: &Error, lock: Option<(String, String)>) -> Self {
        let (skill, repo) = lock.unzip();
        Self::Error(ErrorReport {
            error: err.code(),
            message: err.to_string(),
            skill,
            repo,
        })
    }

    /// The object of an acquire; `hint` is asked for only when the lock is held.
    pub(crate) fn acquire(outcome: Acquire, about: About, hint: impl FnOnce() -> String) -> Self {
        match outcome {
            Acquire::Acquired {
                token,
                holder,
                took_over,
                others_since,
            } => Self::Acquired(Acquired {
                about,
                token,
                started: holder.started,
                expires: holder.expires,
                ttl: holder.ttl,
                note: holder.note,
                owner_pid: holder.owner_pid,
                fence: holder.fence,
                took_over: took_over.map(TookOverJson::from),
                others_since,
            }),
            Acquire::AlreadyRunning { holder, expires_in } => {
                Self::AlreadyRunning(AlreadyRunning {
                    about,
                    holder,
                    expires_in,
                    hint: hint(),
                })
            }
        }
    }

    /// The object of a `run` that ran CMD.
    #[must_use]
    pub(crate) fn ran(
        about: About,
        fence: u64,
        others_since: Option<bool>,
        ran: &crate::run::Completion,
    ) -> Self {
        Self::Ran(Ran {
            about,
            fence,
            others_since,
            exit_status: ran.exit_status,
            signal: ran.signal,
            lost: ran.lost,
            renewals: ran.renewals,
            released: ran.released,
        })
    }

    /// The object of a `run --wait` that a signal ended before CMD started.
    #[must_use]
    pub(crate) fn interrupted(about: About, signal: i32) -> Self {
        Self::Interrupted(Interrupted {
            about,
            signal,
            message: format!(
                "{} arrived before the command started: nothing was run, and the lock is not held",
                crate::signals::name(signal)
            ),
        })
    }

    /// The object of a renew.
    #[must_use]
    pub(crate) fn renew(outcome: Renew, about: About) -> Self {
        match outcome {
            Renew::Renewed {
                holder,
                was_expired,
                expires_in,
            } => Self::Renewed(Renewed {
                about,
                expires: holder.expires,
                renewed: holder.renewed,
                ttl: holder.ttl,
                fence: holder.fence,
                was_expired,
                expires_in,
            }),
            Renew::NotOwner { holder, expires_in } => Self::RenewNotOwner(RenewNotOwner {
                about,
                holder,
                expires_in,
            }),
            Renew::NotHeld { corrupt } => Self::RenewNotHeld(RenewNotHeld {
                about,
                stale_reason: corrupt.then_some("corrupt"),
            }),
        }
    }

    /// The object of a release.
    #[must_use]
    pub(crate) fn release(outcome: Release, about: About) -> Self {
        match outcome {
            Release::Released { holder, forced } => Self::Released(Released {
                about,
                forced,
                holder,
            }),
            Release::NotHeld => Self::ReleaseNotHeld(about),
            Release::Refused { holder } => Self::Refused(Refused { about, holder }),
        }
    }

    /// The object of a status.
    #[must_use]
    pub(crate) fn status(status: engine::Status, about: About) -> Self {
        Self::Status(Status {
            about,
            fence: status.fence,
            state: LockState::from(status.state),
        })
    }

    /// The object of a check.
    #[must_use]
    pub(crate) fn check(outcome: Check, about: About) -> Self {
        match outcome {
            Check::Held { holder, expires_in } => Self::Held(Held {
                about,
                expires: holder.expires,
                fence: holder.fence,
                expires_in,
            }),
            Check::NotOwner { holder } => Self::CheckNotOwner(CheckNotOwner { about, holder }),
            Check::NotHeld => Self::CheckNotHeld(about),
            Check::Expired { reason, holder } => Self::Expired(Expired {
                about,
                expires: holder.expires,
                fence: holder.fence,
                stale_reason: reason.as_str(),
            }),
        }
    }

    /// The object of a history: of one lock (`about`), or of the whole `store`.
    #[must_use]
    pub(crate) fn history(about: Option<About>, store: String, events: Vec<Event>) -> Self {
        let store = about.is_none().then_some(store);
        Self::History(History {
            about,
            store,
            events,
        })
    }

    /// Serializes to one line ending in `\n`, with nothing in it that a
    /// terminal would act on ([`crate::visible::to_writer`]).
    #[must_use]
    pub(crate) fn to_line(&self) -> Vec<u8> {
        let mut v = Vec::new();
        if let Err(e) = crate::visible::to_writer(&mut v, self) {
            v = format!(
                r#"{{"result":"error","error":"internal","message":"cannot print result: {e}"}}"#
            )
            .into_bytes();
        }
        v.push(b'\n');
        v
    }

    /// The token of an `acquired` object (the only one that carries it).
    #[must_use]
    pub(crate) fn token(&self) -> Option<&str> {
        match self {
            Self::Acquired(a) => Some(&a.token),
            _ => None,
        }
    }

    /// The fence an object names as this acquisition's: `acquired`'s, and
    /// `renewed`'s (new when the lease was revived, SPEC §2.2).
    #[cfg(feature = "mcp")]
    #[must_use]
    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Self::Acquired(a) => Some(a.fence),
            Self::Renewed(r) => Some(r.fence),
            _ => None,
        }
    }

    /// What the object said, for a note on stderr when it could not be
    /// written: an error's message, else its `result`.
    #[must_use]
    pub(crate) fn gist(&self) -> String {
        match self {
            Self::Error(r) => format!("; it said: {}", r.message),
            other => serde_json::to_value(other)
                .ok()
                .and_then(|v| Some(format!("; it was: {}", v["result"].as_str()?)))
                .unwrap_or_default(),
        }
    }

    /// Writes the object on `channel`, in full, or says why it could not
    /// (a closed, full or broken standard output, SPEC §3).
    ///
    /// # Errors
    /// The write error; [`std::io::ErrorKind::BrokenPipe`] for a standard
    /// output that was closed when the process started.
    pub(crate) fn write(&self, channel: Channel) -> std::io::Result<()> {
        let line = self.to_line();
        match channel {
            Channel::Stderr => std::io::stderr().lock().write_all(&line),
            Channel::Stdout => {
                let mut out = open_stdout()?;
                out.write_all(&line).and_then(|()| out.flush())
            }
        }
    }

    /// Prints the object on `channel` and returns its exit status: a
    /// result that could not be written in full is a failure (2, said on
    /// standard error), SPEC §3.
    #[must_use = "the exit status is the process's"]
    pub(crate) fn emit(&self, channel: Channel) -> ExitStatus {
        match self.write(channel) {
            Ok(()) => self.exit_status(),
            Err(e) => {
                unwritten(&e, &self.gist());
                ExitStatus::Error
            }
        }
    }
}

/// Says on standard error that the result was not written (`what_then`:
/// what was done about it, e.g. "; the lock was released again").
pub(crate) fn unwritten(e: &dyn std::fmt::Display, what_then: &str) {
    let line = format!("the result could not be written to standard output ({e}){what_then}");
    let _ = writeln!(
        std::io::stderr(),
        "skill-lock: {}",
        crate::visible::visible(&line)
    );
}

/// Where an invocation's one object goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    /// Standard output: every command but `run`.
    Stdout,
    /// Standard error: `run`'s (CMD owns standard output, SPEC §2.7), and
    /// an error that arrives after part of a `list` reached standard output.
    Stderr,
}

impl Channel {
    /// The channel of an invocation whose command word is `command`: the
    /// one place that chooses.
    #[must_use]
    pub(crate) fn of_command(command: Option<&str>) -> Self {
        if command == Some("run") {
            Self::Stderr
        } else {
            Self::Stdout
        }
    }
}

/// Standard output: only this module writes to it.
#[allow(clippy::disallowed_methods, reason = "the one writer to stdout")]
fn stdout() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

/// Standard output, or an error when it was closed when the process
/// started: what is written there then reaches nobody (SPEC §3).
///
/// # Errors
/// [`std::io::ErrorKind::BrokenPipe`] when standard output was closed.
pub(crate) fn open_stdout() -> std::io::Result<std::io::StdoutLock<'static>> {
    if stdout_closed() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "standard output is closed",
        ));
    }
    Ok(stdout())
}

/// Was standard output closed when the process started (so that nothing
/// written there reaches anyone)?
#[must_use]
pub(crate) fn stdout_closed() -> bool {
    sys::stdout_closed()
}

/// Whether standard output was closed at start, per platform.
#[cfg(unix)]
mod sys {
    use std::os::fd::BorrowedFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    /// Was standard output closed when the process started? Rust's runtime
    /// puts `/dev/null`, opened read-write, on a standard stream that was
    /// closed (so that no file the process opens lands there, and writes
    /// "succeed"); a shell's `>/dev/null` opens it write-only. So `/dev/null`
    /// open read-write on fd 1 means "closed", and a result written there
    /// reaches nobody.
    pub(super) fn stdout_closed() -> bool {
        // SAFETY: fd 1 stays open for the whole process (the runtime made
        // sure of that); it is only borrowed for the two calls below.
        let fd = unsafe { BorrowedFd::borrow_raw(1) };
        let Ok(flags) = rustix::fs::fcntl_getfl(fd) else {
            return true; // no fd 1 at all
        };
        if flags & rustix::fs::OFlags::RWMODE != rustix::fs::OFlags::RDWR {
            return false;
        }
        let Ok(out) = fd.try_clone_to_owned().map(std::fs::File::from) else {
            return false;
        };
        let (Ok(out), Ok(null)) = (out.metadata(), std::fs::metadata("/dev/null")) else {
            return false;
        };
        out.file_type().is_char_device()
            && null.file_type().is_char_device()
            && out.rdev() == null.rdev()
    }
}

/// Whether standard output was closed at start, per platform.
#[cfg(windows)]
mod sys {
    use windows_sys::Win32::Foundation::INVALID_HANDLE_VALUE;
    use windows_sys::Win32::System::Console::{GetStdHandle, STD_OUTPUT_HANDLE};

    /// Was the process started without a standard output handle? (Rust's
    /// runtime then drops what is written there, as if it were written.)
    pub(super) fn stdout_closed() -> bool {
        // SAFETY: GetStdHandle has no preconditions.
        let h = unsafe { GetStdHandle(STD_OUTPUT_HANDLE) };
        h.is_null() || h == INVALID_HANDLE_VALUE
    }
}

/// Prints the completion script of `cmd` for `shell` on stdout (SPEC §2).
pub(crate) fn print_completions(
    cmd: &mut clap::Command,
    shell: clap_complete::Shell,
) -> ExitStatus {
    clap_complete::generate(shell, cmd, "skill-lock", &mut stdout());
    ExitStatus::Success
}

/// Writes a report built elsewhere (`doctor`'s) to standard output as it
/// is: `status` when it was written whole, else 2.
pub(crate) fn print_plain(text: &str, status: ExitStatus) -> ExitStatus {
    let mut out = stdout();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => status,
        Err(_) => ExitStatus::Error,
    }
}

/// `list` (SPEC §2.5), written as it is read: `{"result":"list","store":..,
/// "locks":[` then one [`ListEntry`] per lock, then `],"tombstones":N}`.
struct ListWriter<W: Write> {
    out: W,
    first: bool,
}

impl<W: Write> ListWriter<W> {
    fn start(mut out: W, store: &str) -> std::io::Result<Self> {
        out.write_all(br#"{"result":"list","store":"#)?;
        crate::visible::to_writer(&mut out, store)?;
        out.write_all(br#","locks":["#)?;
        Ok(Self { out, first: true })
    }

    /// Writes one judged lock.
    fn entry(&mut self, judged: Entry) -> std::io::Result<()> {
        let entry = ListEntry::from(judged);
        if !self.first {
            self.out.write_all(b",")?;
        }
        self.first = false;
        crate::visible::to_writer(&mut self.out, &entry)?;
        Ok(())
    }

    fn finish(mut self, tombstones: usize, legacy: &[ListEntry]) -> std::io::Result<W> {
        write!(self.out, r#"],"tombstones":{tombstones}"#)?;
        if !legacy.is_empty() {
            self.out.write_all(br#","legacy":"#)?;
            serde_json::to_writer(&mut self.out, legacy)?;
        }
        writeln!(self.out, "}}")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Counts the bytes that reached the writer, to know whether anything did.
struct Counted<W: Write> {
    inner: W,
    written: usize,
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The `list` object on stdout, written as the engine hands over each
/// lock (the command layer passes [`ListPrinter::entry`] to
/// [`engine::list`] as its sink), so the locks are never all in memory. A
/// result that could not be written in full (standard output closed, full
/// or a broken pipe) is a failure, said on stderr (SPEC §3).
pub(crate) struct ListPrinter {
    list: ListWriter<BufWriter<Counted<std::io::StdoutLock<'static>>>>,
    /// Why standard output failed under an entry.
    closed: Option<String>,
}

impl ListPrinter {
    /// Opens standard output and starts the object of the store described
    /// as `store`.
    ///
    /// # Errors
    /// The exit status when standard output cannot be written (said on
    /// stderr): the store is not read then.
    pub(crate) fn start(store: &str) -> Result<Self, ExitStatus> {
        let started = open_stdout().and_then(|out| {
            let counted = Counted {
                inner: out,
                written: 0,
            };
            ListWriter::start(BufWriter::with_capacity(64 * 1024, counted), store)
        });
        match started {
            Ok(list) => Ok(Self { list, closed: None }),
            Err(e) => {
                unwritten(&e, "");
                Err(ExitStatus::Error)
            }
        }
    }

    /// Writes one judged lock.
    ///
    /// # Errors
    /// Standard output failed: the store's visit stops there.
    pub(crate) fn entry(&mut self, judged: Entry) -> Result<(), Error> {
        self.list.entry(judged).map_err(|e| {
            self.closed = Some(e.to_string());
            Error::io("write", "standard output", e)
        })
    }

    /// Ends the object once the store's visit is over (`visited`: the
    /// tombstones it saw, or why it stopped), with the locks an older
    /// version left in working-tree layers (`legacy`), and returns the exit
    /// status.
    ///
    /// # Errors
    /// A store failure before any byte reached stdout (the caller prints the
    /// error object instead). A failure after that ends the broken line, puts
    /// the error object on stderr and returns [`ExitStatus::Error`].
    pub(crate) fn finish(
        self,
        visited: Result<usize, Error>,
        legacy: Vec<Entry>,
    ) -> Result<ExitStatus, Error> {
        let failed = |e: &dyn std::fmt::Display| {
            unwritten(e, "");
            Ok(ExitStatus::Error)
        };
        match visited {
            Ok(tombstones) => {
                let legacy: Vec<ListEntry> = legacy.into_iter().map(ListEntry::from).collect();
                match self.list.finish(tombstones, &legacy) {
                    Ok(_) => Ok(ExitStatus::Success),
                    Err(e) => failed(&e),
                }
            }
            Err(err) => {
                if let Some(why) = self.closed {
                    return failed(&why);
                }
                let (mut stdout, _unwritten) = self.list.out.into_parts();
                if stdout.written == 0 {
                    return Err(err);
                }
                let _ = stdout.write_all(b"\n");
                Ok(Report::error(&err, None).emit(Channel::Stderr))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn about() -> About {
        About {
            skill: "s".into(),
            repo: "o/r".into(),
            lock: "/p/run/locks/s@o__r.lock".into(),
            clock_skew: None,
        }
    }

    proptest! {
        /// A holder whose host and note carry any characters (every
        /// control, C1, bidi override, line separator) prints as one line
        /// that a terminal only displays, and reads back as stored.
        #[test]
        fn any_host_and_note_print_as_one_safe_line(
            host in "[\\x00-\\x{a0}\\x{2000}-\\x{206f}a-z]{0,24}",
            note in "\\PC{0,8}[\\x00-\\x{9f}\\x{202a}-\\x{202e}]{0,16}",
        ) {
            let mut record = crate::record::tests::sample(Some(note.clone()));
            record.holder.host = host.clone();
            let fence = Some(record.holder.fence);
            let report = Report::status(
                crate::engine::Status {
                    state: State::Held { holder: record.holder, expires_in: 5 },
                    fence,
                },
                about(),
            );
            let line = String::from_utf8(report.to_line()).unwrap();
            prop_assert!(line.ends_with('\n'));
            let body = &line[..line.len() - 1];
            prop_assert!(!body.chars().any(crate::visible::is_unsafe), "{:?}", body);
            let back: serde_json::Value = serde_json::from_str(body).unwrap();
            prop_assert_eq!(back["holder"]["host"].as_str(), Some(host.as_str()));
            prop_assert_eq!(back["holder"]["note"].as_str(), Some(note.as_str()));
        }
    }
}
