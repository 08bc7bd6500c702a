//! Validation of what was typed into [`Settings`], in one place
//! ([`Cli::into_settings`]), before any file is touched: bad input wins over
//! a missing root, and every refusal is a `usage` error naming the fix.

use std::ffi::OsString;
use std::time::Duration;

use super::args::{Cli, Command, HistoryArgs, LockArgs, TakeArgs};
use crate::config::{self, Action, Environment, Settings};
use crate::engine::AcquireRequest;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease;

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

pub(super) fn key_of(args: &LockArgs) -> Result<LockKey> {
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
    pub(super) fn into_settings(self, env: Environment) -> Result<Settings> {
        let action = self.command.into_action(env.token.as_ref())?;
        Settings::new(action, self.store.as_ref(), self.root.as_deref(), env)
    }
}
