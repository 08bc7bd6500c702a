//! Command line (SPEC §2): clap definitions, validation into settings, and the
//! one place where outcomes become reports and exit statuses.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use crate::config::{self, StoreChoice, StoreSource};
use crate::engine::{self, Acquire, AcquireRequest, Check, Context, Release, Renew, State};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease;
use crate::output::{ListEntry, Report, TookOverJson};
use crate::store::Store;

const AFTER_HELP: &str = "\
Every command prints one JSON object on one line (run: on stderr, as the last line).

Exit status:
  0  success: acquired, renewed, released or nothing to release, read, check holds
  2  error: bad arguments or input, unreadable store, I/O failure
  3  already_running: someone else holds the lock (not a failure of the sweep)
  4  not yours: renew/check/release with a token that is not the live holder's

Typical write phase of a skill:
  out=$(skill-lock acquire issue-triage --repo apache/airflow --note \"run 42\")
  case $? in 0) ;; 3) echo \"held: $out\"; exit 0 ;; *) echo \"$out\" >&2; exit 2 ;; esac
  token=$(printf '%s' \"$out\" | jq -r .token)
  skill-lock check issue-triage --repo apache/airflow --token \"$token\" || exit 0   # before each post
  skill-lock release issue-triage --repo apache/airflow --token \"$token\"

Locks live in the personal layer of the project (e.g. .git/apache-magpie/run/locks/),
never in the working tree. See the README for the full contract.";

/// skill-lock: a lease lock per (skill, repository) for the write phase of batch automation.
#[derive(Debug, Parser)]
#[command(name = "skill-lock", version, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    /// Project root (default: nearest ancestor holding .git, .svn or .apache-magpie.lock).
    #[arg(long, global = true, value_name = "DIR")]
    root: Option<PathBuf>,
    /// Lock store: etcd://host:port[,host:port...][/prefix], etcds://..., or file:DIR (default: the personal layer).
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
    /// Lease in seconds, 1..=2592000 (run renews it every ttl/3 while CMD runs).
    #[arg(
        long,
        allow_hyphen_values = true,
        value_name = "SECS",
        default_value = "7200"
    )]
    ttl: OsString,
    /// Free text kept in the record (at most 1,000 bytes, no control characters but tab).
    #[arg(long, allow_hyphen_values = true, value_name = "TEXT")]
    note: Option<OsString>,
    /// Keep trying (jittered back-off) for up to SECS seconds before giving up.
    #[arg(long, allow_hyphen_values = true, value_name = "SECS")]
    wait: Option<OsString>,
}

impl TakeArgs {
    /// Validates the lock, ttl, note and wait; `owner_pid` as given.
    fn validate(
        &self,
        owner_pid: Option<u32>,
    ) -> Result<(LockKey, AcquireRequest, Option<Duration>)> {
        let key = key_of(&self.lock)?;
        let req = AcquireRequest {
            ttl: ttl_of(&self.ttl)?,
            note: self.note.as_ref().map(config::validate_note).transpose()?,
            owner_pid,
        };
        Ok((key, req, self.wait.as_ref().map(wait_of).transpose()?))
    }
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
    /// Renew only if this token holds the lock.
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    token: Option<OsString>,
}

#[derive(Debug, Args)]
struct ReleaseArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Release only if this token holds the lock.
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
    /// The token from acquire.
    #[arg(long, allow_hyphen_values = true, value_name = "T")]
    token: OsString,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    take: TakeArgs,
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

#[derive(Debug, Subcommand)]
enum Command {
    /// Take the lock when it is free or stale; prints the token.
    Acquire(AcquireArgs),
    /// Extend a held lease to now + ttl.
    Renew(RenewArgs),
    /// Remove the lock (with --token: only if it is yours).
    Release(ReleaseArgs),
    /// Show whether a lock is held, stale or free (read-only).
    Status(LockArgs),
    /// Show every lock in the store (read-only).
    List,
    /// Exit 0 only if the token holds a live lease (read-only); call before each post.
    Check(CheckArgs),
    /// Run CMD while holding the lock (renewed, released at the end); JSON on stderr.
    Run(RunArgs),
    /// Show the newest lock events, oldest first (read-only).
    History(HistoryArgs),
}

fn utf8(value: &OsString, what: &str) -> Result<String> {
    value
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::Usage(format!("{what} is not valid UTF-8")))
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

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./@:=+,".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The exact `release --force` command line for a holder known to be dead.
fn hint(key: &LockKey, choice: &StoreChoice) -> String {
    let mut line = format!(
        "skill-lock release {} --repo {} --force",
        shell_quote(key.skill()),
        shell_quote(key.repo())
    );
    match (choice.source, &choice.url, &choice.root) {
        (StoreSource::Flag | StoreSource::Env, Some(url), _) => {
            line.push_str(&format!(" --store {}", shell_quote(url)));
        }
        (_, _, Some(root)) => {
            line.push_str(&format!(
                " --root {}",
                shell_quote(&root.display().to_string())
            ));
        }
        _ => {}
    }
    line
}

fn about(key: &LockKey, store: &impl Store) -> Report {
    Report {
        skill: Some(key.skill().to_owned()),
        repo: Some(key.repo().to_owned()),
        lock: Some(store.location(key)),
        clock_skew: store.clock_skew(),
        ..Report::default()
    }
}

fn with(result: &'static str, exit: u8, base: Report) -> Report {
    Report {
        result,
        exit,
        ..base
    }
}

/// Sleeps between attempts of `--wait`: doubling from 10 ms to 250 ms, each
/// drawn at random from its upper half, and never past the moment the holder's lease runs out.
fn backoff(attempt: u32, lease_left_ms: Option<i64>, deadline: Instant) -> Duration {
    let base = 10u64.saturating_mul(1 << attempt.min(5)).min(250);
    let mut r = [0u8; 2];
    let jitter = if getrandom::fill(&mut r).is_ok() {
        u64::from(u16::from_le_bytes(r)) % (base / 2 + 1)
    } else {
        base / 4
    };
    let mut ms = base / 2 + jitter;
    if let Some(left) = lease_left_ms {
        ms = ms.min(u64::try_from(left.max(0)).unwrap_or(0) + 1);
    }
    let until_deadline = deadline.saturating_duration_since(Instant::now());
    Duration::from_millis(ms).min(until_deadline)
}

/// Acquires, retrying until `wait` has passed (SPEC §2.1 `--wait`).
fn acquire_waiting(
    store: &impl Store,
    key: &LockKey,
    req: &AcquireRequest,
    wait: Option<Duration>,
) -> Result<Acquire> {
    let start = Instant::now();
    let deadline = start + wait.unwrap_or_default();
    let mut attempt = 0;
    loop {
        let ctx = Context::here();
        let outcome = engine::acquire(store, key, req, &ctx)?;
        let Acquire::AlreadyRunning { holder, .. } = &outcome else {
            return Ok(outcome);
        };
        if Instant::now() >= deadline {
            return Ok(outcome);
        }
        let left = lease::remaining_ms(holder, &ctx.now);
        std::thread::sleep(backoff(attempt, Some(left), deadline));
        attempt += 1;
    }
}

fn acquire_report(outcome: Acquire, key: &LockKey, choice: &StoreChoice) -> Report {
    let base = about(key, &choice.store);
    match outcome {
        Acquire::Acquired {
            token,
            holder,
            took_over,
        } => Report {
            token: Some(token),
            started: Some(holder.started),
            expires: Some(holder.expires),
            ttl: Some(holder.ttl),
            note: Some(holder.note.clone()),
            owner_pid: Some(holder.owner_pid),
            fence: Some(holder.fence),
            took_over: Some(took_over.as_ref().map(TookOverJson::from)),
            ..with("acquired", 0, base)
        },
        Acquire::AlreadyRunning { holder, expires_in } => Report {
            holder: Some(Some(holder)),
            expires_in: Some(Some(expires_in)),
            hint: Some(hint(key, choice)),
            ..with("already_running", 3, base)
        },
    }
}

fn holder_state(state: &State) -> (&'static str, Option<&'static str>) {
    match state {
        State::Held { .. } => ("held", None),
        State::Stale { reason, .. } => ("stale", Some(reason.as_str())),
        State::Free => ("free", None),
    }
}

fn execute(cli: Cli, cwd: &Path) -> Result<Report> {
    // Validate everything the user typed before touching any file.
    match &cli.command {
        Command::Acquire(a) => {
            // Checked before the rest so that a bad name wins over a bad pid.
            key_of(&a.take.lock)?;
            let pid = a.owner_pid.as_ref().map(config::validate_pid).transpose()?;
            let (key, req, wait) = a.take.validate(pid)?;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            Ok(acquire_report(
                acquire_waiting(&choice.store, &key, &req, wait)?,
                &key,
                &choice,
            ))
        }
        Command::Run(a) => {
            let (key, req, wait) = a.take.validate(Some(std::process::id()))?;
            let ttl = req.ttl;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let outcome = acquire_waiting(store, &key, &req, wait)?;
            let Acquire::Acquired { token, holder, .. } = &outcome else {
                return Ok(acquire_report(outcome, &key, &choice));
            };
            let ran = crate::run::supervise(store, &key, token, holder.fence, ttl, &a.cmd)?;
            Ok(Report {
                fence: Some(holder.fence),
                exit_status: Some(ran.exit_status),
                signal: Some(ran.signal),
                lost: Some(ran.lost),
                renewals: Some(ran.renewals),
                released: Some(ran.released),
                ..with("ran", ran.exit_status, about(&key, store))
            })
        }
        Command::Renew(a) => {
            let key = key_of(&a.lock)?;
            let ttl = a.ttl.as_ref().map(ttl_of).transpose()?;
            let token = a.token.as_ref().map(|t| utf8(t, "--token")).transpose()?;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let base = about(&key, store);
            let ctx = Context::here();
            Ok(
                match engine::renew(store, &key, token.as_deref(), ttl, &ctx)? {
                    Renew::Renewed {
                        holder,
                        was_expired,
                    } => Report {
                        expires: Some(holder.expires),
                        renewed: holder.renewed,
                        ttl: Some(holder.ttl),
                        fence: Some(holder.fence),
                        was_expired: Some(was_expired),
                        expires_in: Some(Some(lease::expires_in(&holder, &ctx.now))),
                        ..with("renewed", 0, base)
                    },
                    Renew::NotOwner { holder } => Report {
                        expires_in: Some(Some(lease::expires_in(&holder, &ctx.now))),
                        holder: Some(Some(holder)),
                        ..with("not_owner", 4, base)
                    },
                    Renew::NotHeld { corrupt } => Report {
                        stale_reason: corrupt.then_some("corrupt"),
                        ..with("not_held", 4, base)
                    },
                },
            )
        }
        Command::Release(a) => {
            let key = key_of(&a.lock)?;
            let token = a.token.as_ref().map(|t| utf8(t, "--token")).transpose()?;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let base = about(&key, store);
            let ctx = Context::here();
            Ok(
                match engine::release(store, &key, token.as_deref(), a.force, &ctx)? {
                    Release::Released { holder, forced } => Report {
                        holder: Some(holder),
                        forced: Some(forced),
                        ..with("released", 0, base)
                    },
                    Release::NotHeld => with("not_held", 0, base),
                    Release::Refused { holder } => Report {
                        holder: Some(holder),
                        ..with("refused", 4, base)
                    },
                },
            )
        }
        Command::Status(a) => {
            let key = key_of(a)?;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let base = about(&key, store);
            let state = engine::status(store, &key, &Context::here())?;
            let (name, reason) = holder_state(&state);
            let (holder, expires_in) = match state {
                State::Held { holder, expires_in } => (Some(Some(holder)), Some(Some(expires_in))),
                State::Stale {
                    holder, expires_in, ..
                } => (Some(holder), Some(expires_in)),
                State::Free => (None, None),
            };
            Ok(Report {
                state: Some(name),
                stale_reason: reason,
                fence: holder.as_ref().and_then(|h| h.as_ref().map(|h| h.fence)),
                holder,
                expires_in,
                ..with("status", 0, base)
            })
        }
        Command::List => {
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let ctx = Context::here();
            let listing = store.list()?;
            let mut locks: Vec<ListEntry> = listing
                .locks
                .into_iter()
                .filter_map(|l| {
                    let state = engine::judge(&l.current, &ctx);
                    let (name, reason) = holder_state(&state);
                    let (holder, expires_in) = match state {
                        State::Held { holder, expires_in } => (Some(holder), Some(expires_in)),
                        State::Stale {
                            holder, expires_in, ..
                        } => (holder, expires_in),
                        State::Free => return None,
                    };
                    Some(ListEntry {
                        skill: l.key.skill().to_owned(),
                        repo: l.key.repo().to_owned(),
                        state: name,
                        stale_reason: reason,
                        holder,
                        expires_in,
                        lock: l.location,
                    })
                })
                .collect();
            locks.sort_by(|a, b| {
                (&a.skill, a.repo.to_ascii_lowercase())
                    .cmp(&(&b.skill, b.repo.to_ascii_lowercase()))
            });
            Ok(Report {
                store: Some(store.describe()),
                locks: Some(locks),
                tombstones: Some(listing.tombstones),
                ..Report::new("list", 0)
            })
        }
        Command::Check(a) => {
            let key = key_of(&a.lock)?;
            let token = utf8(&a.token, "--token")?;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let base = about(&key, store);
            Ok(
                match engine::check(store, &key, &token, &Context::here())? {
                    Check::Held { holder, expires_in } => Report {
                        fence: Some(holder.fence),
                        expires: Some(holder.expires),
                        expires_in: Some(Some(expires_in)),
                        ..with("held", 0, base)
                    },
                    Check::NotOwner { holder } => Report {
                        holder: Some(holder),
                        ..with("not_owner", 4, base)
                    },
                    Check::NotHeld => with("not_held", 4, base),
                    Check::Expired { reason, holder } => Report {
                        stale_reason: Some(reason.as_str()),
                        fence: Some(holder.fence),
                        expires: Some(holder.expires),
                        ..with("expired", 4, base)
                    },
                },
            )
        }
        Command::History(a) => {
            let key = match (&a.skill, &a.repo) {
                (Some(skill), Some(repo)) => Some(key_of(&LockArgs {
                    skill: skill.clone(),
                    repo: repo.clone(),
                })?),
                _ => None,
            };
            let limit =
                a.limit.to_string_lossy().parse::<usize>().map_err(|_| {
                    Error::Usage(format!("--limit {:?}: give a whole number", a.limit))
                })?;
            let choice = config::choose_store(cli.store.as_ref(), cli.root.as_deref(), cwd)?;
            let store = &choice.store;
            let base = match &key {
                Some(k) => about(k, store),
                None => Report {
                    store: Some(store.describe()),
                    ..Report::default()
                },
            };
            Ok(Report {
                events: Some(store.history(key.as_ref(), limit)?),
                ..with("history", 0, base)
            })
        }
    }
}

/// The clap definition of the command line, for generating completions and
/// the man page (`cargo run --example gen-docs`).
#[must_use]
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command()
}

/// clap's complaint on one line, without its usage block.
fn usage_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let body: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let body = body.join(" ");
    let body = body.trim_start_matches("error: ");
    format!("{body}; run 'skill-lock --help' for usage")
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

/// Runs one invocation: parses `args` (program name first), acts, prints
/// exactly one JSON object (or help/version text) and returns the exit status.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return 0;
            }
            let report = Report::error(&Error::Usage(usage_message(&e)));
            report.emit(command_word(&args) == Some("run"));
            return report.exit;
        }
    };
    let cwd = match std::env::current_dir() {
        Ok(d) => d,
        Err(e) => {
            let report = Report::error(&Error::io("read", "the current directory", e));
            report.emit(false);
            return report.exit;
        }
    };
    let to_stderr = matches!(cli.command, Command::Run(_));
    if to_stderr {
        crate::run::prepare();
    }
    let skill_repo = match &cli.command {
        Command::Run(a) => Some(&a.take.lock),
        Command::Acquire(a) => Some(&a.take.lock),
        Command::Renew(a) => Some(&a.lock),
        Command::Release(a) => Some(&a.lock),
        Command::Status(a) => Some(a),
        Command::Check(a) => Some(&a.lock),
        Command::List | Command::History(_) => None,
    }
    .map(|l| {
        (
            l.skill.to_string_lossy().into_owned(),
            l.repo.to_string_lossy().into_owned(),
        )
    });
    let report = match execute(cli, &cwd) {
        Ok(r) => r,
        Err(err) => {
            let mut r = Report::error(&err);
            if let Some((skill, repo)) = skill_repo {
                r.skill = Some(skill);
                r.repo = Some(repo);
            }
            r
        }
    };
    report.emit(to_stderr);
    report.exit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_backoff() {
        assert_eq!(shell_quote("apache/airflow"), "apache/airflow");
        assert_eq!(shell_quote("/a b/c'd"), r"'/a b/c'\''d'");
        let far = Instant::now() + Duration::from_secs(60);
        for attempt in 0..20 {
            let d = backoff(attempt, None, far);
            assert!(
                d >= Duration::from_millis(5) && d <= Duration::from_millis(250),
                "{d:?}"
            );
        }
        assert!(backoff(9, Some(3), far) <= Duration::from_millis(4));
        assert_eq!(backoff(9, None, Instant::now()), Duration::ZERO);
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
