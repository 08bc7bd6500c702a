//! What `run` reports (SPEC §2.7), the same on every platform: how CMD
//! ended, and what the invocation came to.

use crate::engine::Acquire;

/// How a wrapped command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
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
pub enum Outcome {
    /// The lock was not acquired (`already_running`): CMD did not run.
    NotAcquired(Acquire),
    /// A signal (console event) came before CMD started: nothing acquired
    /// (or what was acquired is released again), nothing run.
    Interrupted(libc::c_int),
    /// CMD ran under the lock with this fence.
    Ran {
        /// Fencing number of the acquisition.
        fence: u64,
        /// How it ended.
        ran: Ran,
    },
}
