//! Command line (SPEC §2): the clap definitions, and their validation into
//! [`Settings`] in one place ([`Cli::into_settings`]). [`run`] is the whole
//! program: parse, validate, act ([`crate::commands`]), print one object.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, Action, Environment, Settings};
use crate::engine::AcquireRequest;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease;
use crate::output::{Channel, ExitStatus, Report};

const AFTER_HELP: &str = "\
Every command prints one JSON object on one line (run: on stderr, as the last line).

Exit status:
  0  success: acquired, renewed, released or nothing to release, read, check holds
  2  error: bad arguments or input, unreadable store, I/O failure
  3  already_running: someone else holds the lock (not a failure of the sweep)
  4  not yours: renew/check/release with a token that is not the live holder's

Typical write phase of a skill (docs/write-lock.md; runs under set -euo pipefail):
  field() { printf '%s\\n' \"$2\" | sed -n \"s/.*\\\"$1\\\":\\\"\\{0,1\\}\\([^,}\\\"]*\\).*/\\1/p\"; }
  st=$(skill-lock status issue-triage --repo apache/airflow); fence=$(field fence \"$st\")
  # ... read and classify, posting nothing ...
  since=${fence/null/0}; rc=0
  out=$(skill-lock acquire issue-triage --repo apache/airflow --since $since --ttl 900) || rc=$?
  case $rc in 0) ;; 3) echo \"held, not posting: $out\"; exit 0 ;; *) echo \"$out\" >&2; exit 2 ;; esac
  token=$(field token \"$out\")
  # Read again before posting unless status said free and others_since is false (null: read again).
  if [ \"$(field state \"$st\")\" != free ] || [ \"$(field others_since \"$out\")\" != false ]; then echo \"read again\"; fi
  # Release with the token whenever the script ends (recap done, or stop-and-surface).
  trap 'SKILL_LOCK_TOKEN=$token skill-lock release issue-triage --repo apache/airflow || true' EXIT
  SKILL_LOCK_TOKEN=$token skill-lock renew issue-triage --repo apache/airflow >/dev/null || exit 4
  echo \"post 1\"   # each post: compose it, renew, then send it at once

The ttl must exceed the longest gap between two renewals, the whole post included;
without --ttl it is 7200 s, so a run killed without releasing blocks the next for 2 h.

Locks live in the personal layer of the project (e.g. .git/apache-magpie/run/locks/),
never in the working tree: one lock per clone, not per machine. To share locks between
clones or machines use --store git:origin or etcd (or set it for the repository in the
user's configuration file, ~/.config/apache-magpie/skill-lock.toml). See the README.";

const ACQUIRE_HELP: &str = "\
Results (one JSON object on stdout) and exit status:
  0  acquired         go on; keep `token` (printed only here), `fence`, `expires`;
                      read again before writing unless `status` said `free` and
                      `others_since` (with --since) is false (true or null: read again);
                      `took_over` is null or the stale holder that was replaced
  3  already_running  another run holds it: post nothing; `holder`, `expires_in`, and `hint`
                      (the release --force line an operator runs for a holder known dead)
  2  error            `error` and `message` (what to fix); nothing was taken

The block skills paste around it: docs/write-lock.md.";

const STATUS_HELP: &str = "\
Result (one JSON object on stdout, exit 0): `state` and `fence` (null: never acquired).
  free   nobody holds the lock
  held   another run holds a live lease (`holder`, `expires_in`); a run frozen whole keeps
         its lock past its lease: `expires_in` 0, `expires` in the past (it stops its
         command when it resumes)
  stale  its lease ran out (or its owner is gone) but nobody took it over: the next
         acquire does; its holder may still resume and post
Pass `fence` to acquire --since; read again after acquiring unless this said `free`.";

const CHECK_HELP: &str = "\
Results (one JSON object on stdout) and exit status:
  0  held        the token holds a live lease: `expires`, `expires_in`, `fence`
  4  not_owner   another run holds the lock now (`holder`), or its record is unreadable
  4  expired     the token's lease ran out
  4  not_held    no lock at all
  2  error       e.g. no token: --token T, or SKILL_LOCK_TOKEN (set but empty is an error)
Read-only. `renew --token T` checks the same and extends the lease: the block uses it before each post.";

/// skill-lock: a lease lock per (skill, repository) for the write phase of batch automation.
#[derive(Debug, Parser)]
#[command(name = "skill-lock", version, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    /// Project root (default: the nearest checkout of yours above the current directory; `skill-lock doctor` shows which and why).
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Lock store: git:REMOTE[#NAMESPACE] (e.g. git:origin), etcd://host:port[,host:port...][/prefix], etcds://..., or file:DIR (default: SKILL_LOCK_STORE, else ~/.config/apache-magpie/skill-lock.toml, else the personal layer).
    #[arg(long, global = true, value_name = "URL")]
    store: Option<OsString>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct LockArgs {
    /// Skill name: 1-64 of [A-Za-z0-9._-], starting with a letter or digit.
    skill: OsString,
    /// Repository as owner/name (compared case-insensitively).
    #[arg(long, value_name = "OWNER/NAME")]
    repo: OsString,
}

/// What `acquire` and `run` share: the lock and the lease asked for.
#[derive(Debug, Args)]
struct TakeArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Lease in seconds, 1..=2592000: longer than the longest gap between two renewals, the whole post included (run renews it every ttl/3 while CMD runs). The default, 7200, makes a run killed without releasing block the next for 2 hours.
    #[arg(
        long,
        allow_hyphen_values = true,
        value_name = "SECS",
        default_value = "7200"
    )]
    ttl: OsString,
    /// Free text kept in the record and shown to a run that finds the lock held: say which run this is (at most 1,000 bytes, no control characters but tab).
    #[arg(long, allow_hyphen_values = true, value_name = "TEXT")]
    note: Option<OsString>,
    /// Keep trying (jittered back-off) for up to SECS seconds before giving up.
    #[arg(long, allow_hyphen_values = true, value_name = "SECS")]
    wait: Option<OsString>,
    /// Pass the `fence` that `status` showed before the run read what it will act on (`null` or 0 when it showed none); the `acquired` result then says `others_since` (run: the `ran` result, and $SKILL_LOCK_OTHERS_SINCE for CMD): true when another run acquired the lock (or revived its lease) since, or the store cannot tell; null without --since. Read again before writing unless `status` said `free` and `others_since` is false.
    #[arg(long, allow_hyphen_values = true, value_name = "FENCE")]
    since: Option<OsString>,
}

#[derive(Debug, Args)]
struct AcquireArgs {
    #[command(flatten)]
    take: TakeArgs,
    /// A process on this host whose death makes the lock stale.
    #[arg(long, allow_hyphen_values = true, value_name = "PID")]
    owner_pid: Option<OsString>,
}

#[derive(Debug, Args)]
struct RenewArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// New lease in seconds (default: the ttl it was acquired with).
    #[arg(long, allow_hyphen_values = true, value_name = "SECS")]
    ttl: Option<OsString>,
    /// The token acquire printed (default: $SKILL_LOCK_TOKEN): renews only if it holds the lock. Required unless --force.
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    token: Option<OsString>,
    /// Operator's override: extend whoever holds the lock (no token; never in a skill).
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct ReleaseArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Release only if this token holds the lock (default: $SKILL_LOCK_TOKEN).
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    token: Option<OsString>,
    /// Operator's override: release even when --token does not match.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct CheckArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// The token from acquire (default: $SKILL_LOCK_TOKEN).
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    token: Option<OsString>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    take: TakeArgs,
    /// Exit N (0-255) instead of 3 when CMD was not run because the lock is held (flock's -E), so a CMD that itself exits 3 is told apart; pick an N that CMD never exits with.
    #[arg(long, allow_hyphen_values = true, value_name = "N")]
    conflict_exit_code: Option<OsString>,
    /// The command to run while holding the lock.
    #[arg(last = true, required = true, value_name = "CMD")]
    cmd: Vec<OsString>,
}

#[derive(Debug, Args)]
struct HistoryArgs {
    /// Only this skill's events (needs --repo).
    #[arg(requires = "repo")]
    skill: Option<OsString>,
    /// Only this repository's events (needs a skill).
    #[arg(long, value_name = "OWNER/NAME", requires = "skill")]
    repo: Option<OsString>,
    /// How many of the newest events to print.
    #[arg(
        long,
        allow_hyphen_values = true,
        value_name = "N",
        default_value = "50"
    )]
    limit: OsString,
}

#[derive(Debug, Args)]
struct DoctorArgs {
    /// Also name this skill's lock (needs --repo).
    #[arg(requires = "repo")]
    skill: Option<OsString>,
    /// The repository of that lock (needs a skill).
    #[arg(long, value_name = "OWNER/NAME", requires = "skill")]
    repo: Option<OsString>,
    /// Print the report for a person instead of one JSON object.
    #[arg(long)]
    text: bool,
}

const DOCTOR_HELP: &str = "\
Read-only. Names the project root and the rule of SPEC §5 that chose it, the personal
layer, your configuration file, the store and where that choice came from (--store,
SKILL_LOCK_STORE, a line of the configuration file, or the default), whether the store
answers (with a lock named), and every refusal a command here would meet, with its fix.
Exit 0 when nothing is refused, else 2.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Take the lock when it is free or stale; prints the token.
    #[command(after_help = ACQUIRE_HELP)]
    Acquire(AcquireArgs),
    /// Extend your held lease to now + ttl (needs the token; renew right before each send).
    Renew(RenewArgs),
    /// Remove the lock (with --token: only if it is yours).
    Release(ReleaseArgs),
    /// Show whether a lock is held, stale or free, and its fence (read-only).
    #[command(after_help = STATUS_HELP)]
    Status(LockArgs),
    /// Show every lock in the store (read-only).
    List,
    /// Exit 0 only if the token holds a live lease (read-only).
    #[command(after_help = CHECK_HELP)]
    Check(CheckArgs),
    /// Run CMD while holding the lock (renewed, released at the end); JSON on stderr. Exit 3 (or --conflict-exit-code N) when held: CMD not run.
    Run(RunArgs),
    /// Show the newest lock events, oldest first (read-only).
    History(HistoryArgs),
    /// Serve the lock as MCP tools on stdin/stdout, for one agent session (SPEC §2.9).
    Mcp,
    /// Say where the root, the layer, the configuration and the store are, and why.
    #[command(after_help = DOCTOR_HELP)]
    Doctor(DoctorArgs),
    /// Print the completion script for SHELL on stdout.
    Completions {
        /// The shell.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

fn utf8(value: &OsString, what: &str) -> Result<String> {
    value
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Usage(format!("{what} is not valid UTF-8")))
}

/// The token of renew, release and check: `--token`, else
/// `SKILL_LOCK_TOKEN`; either one empty is a `usage` error, the same for
/// both (SPEC §2): an agent's shell that lost its token (a failed `jq`
/// leaves the variable empty) must never act as if it had passed none,
/// which for `release` would remove whoever's lock is there.
fn token_of(flag: Option<&OsString>, env_token: Option<&OsString>) -> Result<Option<String>> {
    let (token, what) = match (flag, env_token) {
        (Some(t), _) => (t, "--token"),
        (None, Some(t)) => (t, "SKILL_LOCK_TOKEN"),
        (None, None) => return Ok(None),
    };
    if token.is_empty() {
        return Err(Error::Usage(format!(
            "{what} is empty (was the token lost?), so nothing was done: pass the token \
             acquire printed (SKILL_LOCK_TOKEN=T or --token T, from the same shell that ran \
             acquire); if it is lost, post nothing more: the lock ends with its lease"
        )));
    }
    utf8(token, what).map(Some)
}

/// The token of `renew` (SPEC §2.2): required, unless `--force` (the
/// operator's override, which takes none): a run that dropped its token by
/// mistake must never go on posting under another run's lease.
fn renew_token(token: Option<String>, force: bool) -> Result<Option<String>> {
    match (token, force) {
        (Some(t), false) => Ok(Some(t)),
        (None, true) => Ok(None),
        (None, false) => Err(Error::Usage(
            "renew needs the token acquire printed, so nothing was done: run \
             SKILL_LOCK_TOKEN=$token skill-lock renew ... (or --token T); an operator who means \
             to extend whoever holds the lock passes --force instead"
                .into(),
        )),
        (Some(_), true) => Err(Error::Usage(
            "renew --force extends whoever holds the lock and takes no token, so nothing was \
             done: to renew your own lease drop --force; as an operator drop --token and unset \
             SKILL_LOCK_TOKEN"
                .into(),
        )),
    }
}

fn key_of(args: &LockArgs) -> Result<LockKey> {
    let skill = args.skill.to_str().ok_or_else(|| Error::InvalidSkill {
        skill: args.skill.to_string_lossy().into_owned(),
        why: "it is not valid UTF-8".into(),
    })?;
    let repo = args.repo.to_str().ok_or_else(|| Error::InvalidRepo {
        repo: args.repo.to_string_lossy().into_owned(),
        why: "it is not valid UTF-8".into(),
    })?;
    LockKey::new(skill, repo)
}

fn ttl_of(v: &OsString) -> Result<u64> {
    lease::parse_ttl(&v.to_string_lossy())
}

fn wait_of(w: &OsString) -> Result<Duration> {
    let text = w.to_string_lossy();
    text.parse::<u64>()
        .ok()
        .filter(|&s| s <= lease::MAX_TTL)
        .map(Duration::from_secs)
        .ok_or_else(|| Error::Usage(format!("--wait {text:?}: give whole seconds, 0 to 2592000")))
}

/// Parses `run --conflict-exit-code N`: an exit status, 0 to 255.
fn conflict_exit_code_of(v: &OsString) -> Result<u8> {
    let text = v.to_string_lossy();
    text.parse::<u8>().map_err(|_| {
        Error::Usage(format!(
            "--conflict-exit-code {text:?}: give a whole number 0 to 255 (an exit status is one \
             byte), one the command never exits with itself, e.g. 75"
        ))
    })
}

fn since_of(v: &OsString) -> Result<u64> {
    config::parse_since(&v.to_string_lossy())
}

impl TakeArgs {
    /// Validates the lock, ttl, note, wait and since; `owner_pid` as given.
    fn validate(
        &self,
        owner_pid: Option<u32>,
    ) -> Result<(LockKey, AcquireRequest, Option<Duration>)> {
        let key = key_of(&self.lock)?;
        let req = AcquireRequest {
            ttl: ttl_of(&self.ttl)?,
            note: self.note.as_ref().map(config::validate_note).transpose()?,
            owner_pid,
            owner_pgid: None,
            since: self.since.as_ref().map(since_of).transpose()?,
        };
        Ok((key, req, self.wait.as_ref().map(wait_of).transpose()?))
    }
}

impl HistoryArgs {
    #[allow(
        clippy::unnecessary_debug_formatting,
        reason = "the limit is shown quoted, as typed"
    )]
    fn validate(&self) -> Result<(Option<LockKey>, usize)> {
        let key = match (&self.skill, &self.repo) {
            (Some(skill), Some(repo)) => Some(key_of(&LockArgs {
                skill: skill.clone(),
                repo: repo.clone(),
            })?),
            _ => None,
        };
        let limit =
            self.limit.to_string_lossy().parse::<usize>().map_err(|_| {
                Error::Usage(format!("--limit {:?}: give a whole number", self.limit))
            })?;
        Ok((key, limit))
    }
}

impl Command {
    /// The lock named on the command line, as typed (for error objects).
    fn lock_as_given(&self) -> Option<(String, String)> {
        let lock = match self {
            Self::Run(a) => &a.take.lock,
            Self::Acquire(a) => &a.take.lock,
            Self::Renew(a) => &a.lock,
            Self::Release(a) => &a.lock,
            Self::Status(a) => a,
            Self::Check(a) => &a.lock,
            Self::List
            | Self::History(_)
            | Self::Mcp
            | Self::Doctor(_)
            | Self::Completions { .. } => {
                return None;
            }
        };
        Some((
            lock.skill.to_string_lossy().into_owned(),
            lock.repo.to_string_lossy().into_owned(),
        ))
    }

    /// Validates everything the user typed, before any file is touched.
    /// `--token` wins over `SKILL_LOCK_TOKEN` (`env_token`), which never
    /// shows in another user's process list as an argument does.
    fn into_action(self, env_token: Option<&OsString>) -> Result<Action> {
        let token = |flag: Option<&OsString>| token_of(flag, env_token);
        Ok(match self {
            Self::Acquire(a) => {
                // Checked before the rest so that a bad name wins over a bad pid.
                key_of(&a.take.lock)?;
                let pid = a.owner_pid.as_ref().map(config::validate_pid).transpose()?;
                let (key, req, wait) = a.take.validate(pid)?;
                Action::Acquire { key, req, wait }
            }
            Self::Run(a) => {
                // No pid makes a `run` lock stale: its owner is everything
                // CMD starts (SPEC §2.7), which no one pid stands for once
                // the keeper may be killed; the platform's `run` names what
                // it can (the keeper's group; on Windows the wrapper).
                let (key, req, wait) = a.take.validate(None)?;
                let conflict_exit_code = a
                    .conflict_exit_code
                    .as_ref()
                    .map(conflict_exit_code_of)
                    .transpose()?;
                Action::Run {
                    key,
                    req,
                    wait,
                    cmd: a.cmd,
                    conflict_exit_code,
                }
            }
            Self::Renew(a) => Action::Renew {
                key: key_of(&a.lock)?,
                ttl: a.ttl.as_ref().map(ttl_of).transpose()?,
                token: renew_token(token(a.token.as_ref())?, a.force)?,
            },
            Self::Release(a) => Action::Release {
                key: key_of(&a.lock)?,
                token: token(a.token.as_ref())?,
                force: a.force,
            },
            Self::Status(a) => Action::Status { key: key_of(&a)? },
            Self::List => Action::List,
            Self::Check(a) => Action::Check {
                key: key_of(&a.lock)?,
                token: token(a.token.as_ref())?.ok_or_else(|| {
                    Error::Usage(
                        "check needs a token: --token T, or SKILL_LOCK_TOKEN in the environment"
                            .into(),
                    )
                })?,
            },
            Self::History(a) => {
                let (key, limit) = a.validate()?;
                Action::History { key, limit }
            }
            Self::Completions { .. } | Self::Mcp | Self::Doctor(_) => {
                return Err(Error::Internal("not a lock command".into()));
            }
        })
    }
}

impl Cli {
    /// The one place where arguments become validated settings: the action
    /// first (bad input wins over a missing root), then the store.
    fn into_settings(self, env: Environment) -> Result<Settings> {
        let action = self.command.into_action(env.token.as_ref())?;
        Settings::new(action, self.store.as_ref(), self.root.as_deref(), env)
    }
}

/// The clap definition of the command line, for generating completions and
/// the man page (`cargo run --example gen-docs`).
#[must_use]
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

/// clap's complaint on one line, without its usage block, with clap's
/// suggestions ("did you mean 'acquire'?"), the fix for the most common
/// mistake of `run` (CMD without `--`), and the help of the subcommand.
fn usage_message(e: &clap::Error, args: &[OsString]) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let text = e.render().to_string();
    let body: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("tip:") && !l.starts_with("For more information")
        })
        .collect();
    let mut parts = vec![body.join(" ").trim_start_matches("error: ").to_owned()];
    for kind in [
        ContextKind::SuggestedSubcommand,
        ContextKind::SuggestedArg,
        ContextKind::SuggestedValue,
    ] {
        let names = match e.get(kind) {
            Some(ContextValue::String(one)) => vec![one.clone()],
            Some(ContextValue::Strings(many)) => many.clone(),
            _ => continue,
        };
        let names: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
        if !names.is_empty() {
            parts.push(format!("did you mean {}?", names.join(" or ")));
        }
    }
    let word = command_word(args).filter(|w| command().find_subcommand(w).is_some());
    let stray = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => !arg.starts_with('-'),
        _ => false,
    };
    if word == Some("run") && e.kind() == ErrorKind::UnknownArgument && stray {
        parts.push(
            "put -- before the command to run: skill-lock run SKILL --repo OWNER/NAME -- CMD [ARGS...]"
                .to_owned(),
        );
    }
    let help = word.map_or_else(
        || "skill-lock --help".to_owned(),
        |w| format!("skill-lock {w} --help"),
    );
    format!("{}; run '{help}' for usage", parts.join("; "))
}

/// The command word of an argument list that clap refused (skipping the
/// global options and their values), to route `run`'s error to stderr.
fn command_word(args: &[OsString]) -> Option<&str> {
    let mut it = args.iter().skip(1).filter_map(|a| a.to_str());
    while let Some(a) = it.next() {
        match a {
            "--root" | "--store" => {
                it.next();
            }
            _ if a.starts_with('-') => {}
            word => return Some(word),
        }
    }
    None
}

/// Prints the error object of an invocation that reached no command (on
/// standard output) and returns its exit status.
#[must_use = "the exit status is the process's"]
pub fn report_error(err: &Error) -> ExitStatus {
    Report::error(err, None).emit(Channel::Stdout)
}

/// Runs one invocation: parses `args` (program name first), acts, prints
/// exactly one JSON object (or help/version text) and returns the exit status.
pub fn run<I, T>(args: I) -> ExitStatus
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let channel = Channel::of_command(command_word(&args));
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitStatus::Success;
            }
            let report = Report::error(&Error::Usage(usage_message(&e, &args)), None);
            return report.emit(channel);
        }
    };
    if let Command::Completions { shell } = cli.command {
        return crate::output::print_completions(&mut command(), shell);
    }
    let env = match Environment::read() {
        Ok(env) => env,
        Err(err) => return Report::error(&err, None).emit(channel),
    };
    if let Command::Mcp = cli.command {
        return mcp(cli.store, cli.root.as_deref(), env, channel);
    }
    if let Command::Doctor(a) = cli.command {
        let key = match (a.skill, a.repo) {
            (Some(skill), Some(repo)) => match key_of(&LockArgs { skill, repo }) {
                Ok(key) => Some(key),
                Err(err) => return Report::error(&err, None).emit(channel),
            },
            _ => None,
        };
        let req = crate::doctor::Request {
            key,
            root: cli.root,
            store: cli.store,
            text: a.text,
        };
        return crate::doctor::run(&req, &env);
    }
    if matches!(cli.command, Command::Run(_)) {
        crate::run::prepare();
    }
    let lock = cli.command.lock_as_given();
    cli.into_settings(env)
        .and_then(|settings| crate::commands::execute(&settings, channel))
        .unwrap_or_else(|err| Report::error(&err, lock).emit(channel))
}
/// `skill-lock mcp`: serves until the session ends (SPEC §2.9). Each tool
/// call names its own root, so `--root` is refused here; `--store` holds
/// for every call, as for any command.
#[cfg(feature = "mcp")]
fn mcp(
    store: Option<OsString>,
    root: Option<&std::path::Path>,
    env: Environment,
    channel: Channel,
) -> ExitStatus {
    if root.is_some() {
        let err = Error::Usage(
            "mcp takes no --root: each tool call names its checkout in its `root` argument".into(),
        );
        return Report::error(&err, None).emit(channel);
    }
    crate::mcp::serve(store, env)
}

/// `skill-lock mcp` in a build without the server: a usage error that says
/// which build has it.
#[cfg(not(feature = "mcp"))]
fn mcp(
    _store: Option<OsString>,
    _root: Option<&std::path::Path>,
    _env: Environment,
    channel: Channel,
) -> ExitStatus {
    let err = Error::Usage(
        "this build has no MCP server (cargo feature \"mcp\"): install the bundle or the wheel, \
         or build with the default features"
            .into(),
    );
    Report::error(&err, None).emit(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
