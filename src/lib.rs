//! # skill-lock
//!
//! A lease lock per (skill, repository) that batch automation takes before
//! its write phase, so two overlapping runs never post the same comment twice.
//! The contract is `docs/contract.md`; the argument for its safety is
//! `docs/safety.md`, and a tour of the code for those changing it `docs/code-tour.md`.
//!
//! - **Lease**: a lock carries an expiry; `renew` extends it; an expired lock
//!   is taken over by the next acquirer. An optional owner pid on the same
//!   host (and boot) also makes the lock stale when that process is gone.
//! - **Token**: `acquire` returns a random token, stored only as its SHA-256;
//!   renew, release and check with it act only on the acquisition it proves.
//! - **Guarantees**: mutual exclusion under any interleaving, atomic records,
//!   crash safety under SIGKILL, and bad input refused before anything changes.
//! - **Exit codes**: 0 success, 2 error, 3 already running, 4 not yours.
//!
//! Using the library from Rust:
//!
//! ```
//! use skill_lock::engine::{self, Acquire, AcquireRequest, Context, Release};
//! use skill_lock::key::LockKey;
//! use skill_lock::store::fs::FileStore;
//!
//! # fn main() -> Result<(), skill_lock::error::Error> {
//! let dir = std::env::temp_dir().join(format!("skill-lock-doc-{}", std::process::id()));
//! let store = FileStore::new(&dir);
//! let key = LockKey::new("issue-triage", "apache/airflow")?;
//! let req = AcquireRequest { ttl: 60, note: Some("doc test".into()), owner_pid: None, owner_pgid: None, since: None };
//! let Acquire::Acquired { token, holder, .. } = engine::acquire(&store, &key, &req, &Context::here())? else {
//!     panic!("a fresh store is free");
//! };
//! assert!(holder.fence >= 1);
//! // A second run finds it held.
//! let again = engine::acquire(&store, &key, &req, &Context::here())?;
//! assert!(matches!(again, Acquire::AlreadyRunning { .. }));
//! // The token releases it.
//! let done = engine::release(&store, &key, Some(&token), false, &Context::here())?;
//! assert!(matches!(done, Release::Released { forced: false, .. }));
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```

/// The one platform pattern (docs/code-tour.md "Platform code"): a concept's
/// logic is written once in its `mod.rs`, which reaches the system calls
/// as `sys`: `unix.rs` and `windows.rs` beside it, each implementing the
/// trait the `mod.rs` declares, so the compiler checks that every platform
/// has every function. A concept whose per-OS part is a few lines writes
/// the two `mod sys` inline instead.
macro_rules! per_os {
    ($($vis:tt)*) => {
        #[cfg(unix)]
        $($vis)* mod unix;
        #[cfg(unix)]
        use unix as sys;
        #[cfg(windows)]
        $($vis)* mod windows;
        #[cfg(windows)]
        use windows as sys;
    };
}

mod bounded;
pub mod cli;
pub mod clock;
mod commands;
mod config;
mod doctor;
pub mod engine;
pub mod error;
mod flock;
mod group;
mod hint;
pub mod history;
pub mod key;
mod layer;
pub mod lease;
mod liveness;
#[cfg(feature = "mcp")]
mod mcp;
mod output;
mod ownership;
pub mod record;
mod root;
mod run;
mod shell;
mod signals;
pub mod store;
mod user_config;
mod vars;
mod visible;
mod wait;

/// Internals the fuzz targets (`fuzz/`) drive directly; not part of the
/// library's API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::config::{NOTE_MAX, validate_note};
    pub use crate::visible::{is_unsafe, to_writer, visible};
}

/// The binary's whole body: `run`'s keeper when started as one, else the
/// command line handed to [`cli::run`]; its exit status.
#[must_use]
pub fn main() -> std::process::ExitCode {
    if let Some(keeper) = run::main_if_keeper() {
        // Typed by hand: the usual one JSON object, as for any bad argument.
        return keeper.unwrap_or_else(|err| cli::report_error(&err).into());
    }
    cli::run(std::env::args_os()).into()
}

pub use cli::run;
