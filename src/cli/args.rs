//! The clap definition of the command line (SPEC §2): the global options,
//! one argument struct per command, and the help texts `--help` prints
//! after them. Only the shapes live here; `validate.rs` turns what was
//! typed into [`crate::config::Settings`].

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
pub(super) struct Cli {
    /// Project root (default: the nearest checkout of yours above the current directory; `skill-lock doctor` shows which and why).
    #[arg(long, global = true, value_name = "DIR")]
    pub(super) root: Option<PathBuf>,
    /// Lock store: git:REMOTE[#NAMESPACE] (e.g. git:origin), etcd://host:port[,host:port...][/prefix], etcds://..., or file:DIR (default: SKILL_LOCK_STORE, else ~/.config/apache-magpie/skill-lock.toml, else the personal layer).
    #[arg(long, global = true, value_name = "URL")]
    pub(super) store: Option<OsString>,
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Args)]
pub(super) struct LockArgs {
    /// Skill name: 1-64 of [A-Za-z0-9._-], starting with a letter or digit.
    pub(super) skill: OsString,
    /// Repository as owner/name (compared case-insensitively).
    #[arg(long, value_name = "OWNER/NAME")]
    pub(super) repo: OsString,
}

/// What `acquire` and `run` share: the lock and the lease asked for.
#[derive(Debug, Args)]
pub(super) struct TakeArgs {
    #[command(flatten)]
    pub(super) lock: LockArgs,
    /// Lease in seconds, 1..=2592000: longer than the longest gap between two renewals, the whole post included (run renews it every ttl/3 while CMD runs). The default, 7200, makes a run killed without releasing block the next for 2 hours.
    #[arg(
        long,
        allow_hyphen_values = true,
        value_name = "SECS",
        default_value = "7200"
    )]
    pub(super) ttl: OsString,
    /// Free text kept in the record and shown to a run that finds the lock held: say which run this is (at most 1,000 bytes, no control characters but tab).
    #[arg(long, allow_hyphen_values = true, value_name = "TEXT")]
    pub(super) note: Option<OsString>,
    /// Keep trying (jittered back-off) for up to SECS seconds before giving up.
    #[arg(long, allow_hyphen_values = true, value_name = "SECS")]
    pub(super) wait: Option<OsString>,
    /// Pass the `fence` that `status` showed before the run read what it will act on (`null` or 0 when it showed none); the `acquired` result then says `others_since` (run: the `ran` result, and $SKILL_LOCK_OTHERS_SINCE for CMD): true when another run acquired the lock (or revived its lease) since, or the store cannot tell; null without --since. Read again before writing unless `status` said `free` and `others_since` is false.
    #[arg(long, allow_hyphen_values = true, value_name = "FENCE")]
    pub(super) since: Option<OsString>,
}

#[derive(Debug, Args)]
pub(super) struct AcquireArgs {
    #[command(flatten)]
    pub(super) take: TakeArgs,
    /// A process on this host whose death makes the lock stale.
    #[arg(long, allow_hyphen_values = true, value_name = "PID")]
    pub(super) owner_pid: Option<OsString>,
}

#[derive(Debug, Args)]
pub(super) struct RenewArgs {
    #[command(flatten)]
    pub(super) lock: LockArgs,
    /// New lease in seconds (default: the ttl it was acquired with).
    #[arg(long, allow_hyphen_values = true, value_name = "SECS")]
    pub(super) ttl: Option<OsString>,
    /// The token acquire printed (default: $SKILL_LOCK_TOKEN): renews only if it holds the lock. Required unless --force.
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    pub(super) token: Option<OsString>,
    /// Operator's override: extend whoever holds the lock (no token; never in a skill).
    #[arg(long)]
    pub(super) force: bool,
}

#[derive(Debug, Args)]
pub(super) struct ReleaseArgs {
    #[command(flatten)]
    pub(super) lock: LockArgs,
    /// Release only if this token holds the lock (default: $SKILL_LOCK_TOKEN).
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    pub(super) token: Option<OsString>,
    /// Operator's override: release even when --token does not match.
    #[arg(long)]
    pub(super) force: bool,
}

#[derive(Debug, Args)]
pub(super) struct CheckArgs {
    #[command(flatten)]
    pub(super) lock: LockArgs,
    /// The token from acquire (default: $SKILL_LOCK_TOKEN).
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    pub(super) token: Option<OsString>,
}

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    #[command(flatten)]
    pub(super) take: TakeArgs,
    /// Exit N (0-255) instead of 3 when CMD was not run because the lock is held (flock's -E), so a CMD that itself exits 3 is told apart; pick an N that CMD never exits with.
    #[arg(long, allow_hyphen_values = true, value_name = "N")]
    pub(super) conflict_exit_code: Option<OsString>,
    /// The command to run while holding the lock.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(super) cmd: Vec<OsString>,
}

#[derive(Debug, Args)]
pub(super) struct HistoryArgs {
    /// Only this skill's events (needs --repo).
    #[arg(requires = "repo")]
    pub(super) skill: Option<OsString>,
    /// Only this repository's events (needs a skill).
    #[arg(long, value_name = "OWNER/NAME", requires = "skill")]
    pub(super) repo: Option<OsString>,
    /// How many of the newest events to print.
    #[arg(
        long,
        allow_hyphen_values = true,
        value_name = "N",
        default_value = "50"
    )]
    pub(super) limit: OsString,
}

#[derive(Debug, Args)]
pub(super) struct DoctorArgs {
    /// Also name this skill's lock (needs --repo).
    #[arg(requires = "repo")]
    pub(super) skill: Option<OsString>,
    /// The repository of that lock (needs a skill).
    #[arg(long, value_name = "OWNER/NAME", requires = "skill")]
    pub(super) repo: Option<OsString>,
    /// Print the report for a person instead of one JSON object.
    #[arg(long)]
    pub(super) text: bool,
}

const DOCTOR_HELP: &str = "\
Read-only. Names the project root and the rule of SPEC §5 that chose it, the personal
layer, your configuration file, the store and where that choice came from (--store,
SKILL_LOCK_STORE, a line of the configuration file, or the default), whether the store
answers (with a lock named), and every refusal a command here would meet, with its fix.
Exit 0 when nothing is refused, else 2.";

#[derive(Debug, Subcommand)]
pub(super) enum Command {
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

impl Command {
    /// The lock named on the command line, as typed (for error objects).
    pub(super) fn lock_as_given(&self) -> Option<(String, String)> {
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
