//! What `run` reports (SPEC §2.7), the same on every platform: how CMD
//! ended, and what the invocation came to.

use crate::engine::Acquire;

/// How a wrapped command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The status `run` exits with: CMD's code, or 128+signal.
    pub exit_status: u8,
    /// The signal (on Windows: the console event) that ended CMD, if any.
    pub signal: Option<i32>,
    /// The lease was lost or about to run out unconfirmed: what CMD started
    /// (its process group; on Windows its Job Object) was stopped.
    pub lost: bool,
    /// Successful renewals.
    pub renewals: u64,
    /// The lock was released at the end (false when it had been lost).
    pub released: bool,
}

/// What a `run` invocation came to.
// One value per command: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Outcome {
    /// The lock was not acquired (`already_running`): CMD did not run.
    NotAcquired(Acquire),
    /// A signal (console event) came before CMD started: nothing acquired
    /// (or what was acquired is released again), nothing run.
    Interrupted(libc::c_int),
    /// CMD ran under the lock with this fence.
    Ran {
        /// Fencing number of the acquisition.
        fence: u64,
        /// The acquisition's answer to `--since` (None without it).
        others_since: Option<bool>,
        /// How it ended.
        ran: Completion,
    },
}

/// Puts what CMD is told of its lease into its environment (SPEC §2.7):
/// `SKILL_LOCK_TOKEN`, `SKILL_LOCK_FENCE`, and with `--since`
/// `SKILL_LOCK_OTHERS_SINCE` (`true` or `false`: re-read before writing
/// when it is `true`). Without `--since` that variable is removed, so a
/// value inherited from an outer `run` is never taken for this one's.
pub(crate) fn lease_env(
    command: &mut std::process::Command,
    token: &str,
    fence: u64,
    others_since: Option<bool>,
) {
    command
        .env("SKILL_LOCK_TOKEN", token)
        .env("SKILL_LOCK_FENCE", fence.to_string());
    match others_since {
        Some(b) => command.env(OTHERS_SINCE_VAR, if b { "true" } else { "false" }),
        None => command.env_remove(OTHERS_SINCE_VAR),
    };
}

/// The variable that tells CMD `run --since`'s answer.
pub(crate) const OTHERS_SINCE_VAR: &str = "SKILL_LOCK_OTHERS_SINCE";
