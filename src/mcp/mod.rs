//! `skill-lock mcp` (SPEC §2.9): the lock served to an agent session as
//! tools of the Model Context Protocol, over standard input and output,
//! with the official Rust SDK (`rmcp`).
//!
//! Each tool is the command of the same name: it builds the command's
//! [`Settings`] (the same root discovery and store selection), and
//! [`crate::commands::report`] answers the command's own object. What the
//! server adds is who may act:
//! - it keeps the token of each lock it acquired, keyed by (lock, fence);
//!   renew, check and release take the fence as the handle and act only on
//!   those, with the token, so never on another run's acquisition; no
//!   answer carries a token, and it never forces;
//! - the records name this process as owner (`owner_pid`), so a killed
//!   server's locks are `owner_dead` to the next acquire on this host;
//! - at end of input, or on SIGTERM, SIGINT or SIGHUP, it releases every
//!   lock it holds, then exits; it never renews on its own.
//!
//! Its tokio runtime is built here and only here: no other command pays
//! for it.

mod tools;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::config::{Action, Environment, Settings};
use crate::engine::AcquireRequest;
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::output::{ExitStatus, Report};
use crate::store::Store;
use tools::{Call, Name};

/// What the server tells a client about itself when it connects.
const INSTRUCTIONS: &str = "\
A lease lock per (skill, repository) for a skill's write phase, so that overlapping runs \
never post the same thing twice. In each run: status before reading (keep `fence`); acquire \
with `since` = that fence before the first write (read again unless status said free and \
others_since is false; already_running: post nothing); renew immediately before EACH post \
(anything but renewed: stop posting, release); release after the recap or on any stop. \
renew, check and release take the `fence` acquire answered: one run never acts on another's \
acquisition. Locks still held when the session ends are released.";

/// One acquisition this server made: what releasing it needs.
#[derive(Debug, Clone)]
struct Acquisition {
    key: LockKey,
    root: PathBuf,
    token: String,
}

/// The acquisitions this server holds, by (lock, fence).
#[derive(Debug, Default)]
struct Held {
    /// Set once the session ended: an acquire that completes after it gives
    /// its lock back at once.
    closing: bool,
    by_fence: HashMap<(String, u64), Acquisition>,
}

/// The server: the environment it was started in, and its acquisitions.
#[derive(Debug, Clone)]
struct LockServer {
    shared: Arc<Shared>,
}

/// What every tool call shares: the `--store` the server was started with,
/// its environment, and the acquisitions it holds.
#[derive(Debug)]
struct Shared {
    store: Option<OsString>,
    /// Behind a lock: the environment caches what it learns (not `Sync`);
    /// each call works on its own copy.
    env: Mutex<Environment>,
    held: Mutex<Held>,
}

impl Shared {
    fn held(&self) -> MutexGuard<'_, Held> {
        // A panic elsewhere never loses the tokens: release at the end still needs them.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The command's settings for `action` on the lock under `root`.
    fn settings(&self, action: Action, root: &std::path::Path) -> Result<Settings> {
        let env = self
            .env
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Settings::new(action, self.store.as_ref(), Some(root), env)
    }

    /// Answers one tool call: the command's object, its token taken out.
    fn answer(&self, name: &str, args: &rmcp::model::JsonObject) -> CallToolResult {
        let mut lock = None;
        let report = Name::parse(name)
            .and_then(|name| Call::new(name, args))
            .and_then(|call| {
                lock = call.lock_as_given();
                self.act(&call)
            })
            .unwrap_or_else(|err| Report::error(&err, lock));
        result_of(&report)
    }

    /// Validates the call as the command does (its arguments first, then
    /// the root and store), then does what the command does.
    fn act(&self, call: &Call<'_>) -> Result<Report> {
        let key = call.key()?;
        match call.name() {
            Name::Status => {
                let root = call.root()?;
                let settings = self.settings(Action::Status { key }, &root)?;
                crate::commands::report(&settings, &settings.store.open()?)
            }
            Name::Acquire => self.acquire(call, &key),
            Name::Renew | Name::Check | Name::Release => self.on_own(call, key),
        }
    }

    fn acquire(&self, call: &Call<'_>, key: &LockKey) -> Result<Report> {
        let req = AcquireRequest {
            ttl: call.ttl()?.unwrap_or(crate::lease::DEFAULT_TTL),
            note: call.note()?,
            // This process is the owner, whatever launcher started it (SPEC §2.9).
            owner_pid: Some(std::process::id()),
            owner_pgid: None,
            since: call.since()?,
        };
        let root = call.root()?;
        let action = Action::Acquire {
            key: key.clone(),
            req,
            wait: None,
        };
        let settings = self.settings(action, &root)?;
        let store = settings.store.open()?;
        let report = crate::commands::report(&settings, &store)?;
        if let (Some(token), Some(fence)) = (report.token(), report.fence()) {
            let lock = store.location(key).lock;
            let mine = Acquisition {
                key: key.clone(),
                root,
                token: token.to_owned(),
            };
            let mut held = self.held();
            if held.closing {
                drop(held);
                give_back(&settings, &store, &mine);
                return Err(Error::Usage(
                    "the session is ending: the lock this acquire took was released again; \
                     start a new session to take it"
                        .into(),
                ));
            }
            held.by_fence.insert((lock, fence), mine);
        }
        Ok(report)
    }

    /// renew, check, release: of one of this server's acquisitions, by fence.
    fn on_own(&self, call: &Call<'_>, key: LockKey) -> Result<Report> {
        let ttl = match call.name() {
            Name::Renew => call.ttl()?,
            _ => None,
        };
        let fence = call.fence()?;
        let root = call.root()?;
        let mut settings = self.settings(Action::Status { key: key.clone() }, &root)?;
        let store = settings.store.open()?;
        let lock = store.location(&key).lock;
        let Some(mine) = self.held().by_fence.get(&(lock.clone(), fence)).cloned() else {
            return Err(Error::Usage(format!(
                "this server holds no acquisition of {lock} with fence {fence}: {} acts only on \
                 locks this server acquired, by the fence its acquire answered (or that a renew \
                 answered when it revived the lease); a lock released, or acquired in a shell or \
                 by another session, is not this server's to {}",
                call.name().as_str(),
                call.name().as_str(),
            )));
        };
        let token = mine.token.clone();
        settings.action = match call.name() {
            Name::Renew => Action::Renew {
                key,
                token: Some(token),
                ttl,
            },
            Name::Check => Action::Check { key, token },
            _ => Action::Release {
                key,
                token: Some(token),
                force: false,
            },
        };
        let report = crate::commands::report(&settings, &store)?;
        let mut held = self.held();
        match (call.name(), report.fence()) {
            // A revived lease is a new acquisition with a new fence (SPEC
            // §2.2): both name it from now on.
            (Name::Renew, Some(new)) if new != fence => {
                held.by_fence.insert((lock, new), mine);
            }
            // Released, already gone, or taken over: nothing of it is ours.
            (Name::Release, _) => held.by_fence.retain(|_, a| a.token != mine.token),
            _ => {}
        }
        Ok(report)
    }

    /// Ends the session: no acquire keeps a lock from now on, and every
    /// lock held is released with its token.
    fn release_all(&self) {
        let taken: Vec<Acquisition> = {
            let mut held = self.held();
            held.closing = true;
            let mut all: Vec<Acquisition> = held.by_fence.drain().map(|(_, a)| a).collect();
            all.sort_by(|a, b| a.token.cmp(&b.token));
            all.dedup_by(|a, b| a.token == b.token);
            all
        };
        for mine in taken {
            let action = Action::Status {
                key: mine.key.clone(),
            };
            match self
                .settings(action, &mine.root)
                .and_then(|s| Ok((s.store.open()?, s)))
            {
                Ok((store, settings)) => give_back(&settings, &store, &mine),
                Err(e) => eprintln!(
                    "skill-lock mcp: could not release {} on {} at the end of the session: {e}; \
                     it frees itself at the end of its lease",
                    mine.key.skill(),
                    mine.key.repo()
                ),
            }
        }
    }
}

/// Releases `mine` with its token (never anyone else's), saying on
/// standard error (the server's log) when that failed.
fn give_back(settings: &Settings, store: &crate::store::AnyStore, mine: &Acquisition) {
    let ctx = crate::engine::Context::with_clock(settings.clock.clone());
    if let Err(e) = crate::engine::release(store, &mine.key, Some(&mine.token), false, &ctx) {
        eprintln!(
            "skill-lock mcp: could not release {} on {}: {e}; it frees itself at the end of its lease",
            mine.key.skill(),
            mine.key.repo()
        );
    }
}

/// The tool result of a command's object: its fields as structured
/// content (never a token), the same JSON as text, `isError` for `error`.
fn result_of(report: &Report) -> CallToolResult {
    let mut value = serde_json::to_value(report).unwrap_or_else(|e| {
        serde_json::json!({
            "result": "error",
            "error": "internal",
            "message": format!("internal error: cannot serialize the result: {e}; please report it"),
        })
    });
    if let Value::Object(fields) = &mut value {
        fields.remove("token");
    }
    let mut result = if matches!(report, Report::Error(_)) {
        CallToolResult::structured_error(value.clone())
    } else {
        CallToolResult::structured(value.clone())
    };
    // The text copy escaped as the commands' output is (SPEC §3): a
    // holder's note or host never carries a control character to whoever
    // shows the text.
    let mut text = Vec::new();
    if crate::visible::to_writer(&mut text, &value).is_ok() {
        result.content = vec![rmcp::model::ContentBlock::text(
            String::from_utf8_lossy(&text).into_owned(),
        )];
    }
    result
}

impl ServerHandler for LockServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("skill-lock", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            Name::ALL.into_iter().map(tools::definition).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let shared = Arc::clone(&self.shared);
        let args = request.arguments.unwrap_or_default();
        let name = request.name.into_owned();
        // The stores block (files, git, their own etcd runtime): off the
        // protocol's thread, so the session keeps being answered.
        tokio::task::spawn_blocking(move || shared.answer(&name, &args))
            .await
            .map(CallToolResponse::from)
            .map_err(|e| ErrorData::internal_error(format!("the tool call failed: {e}"), None))
    }
}

/// How the session ended.
enum End {
    /// Standard input closed (the harness ended the session).
    Input,
    /// A termination signal arrived.
    Signal,
    /// The protocol could not start.
    Failed(String),
}

/// Runs the server until its input ends or a termination signal arrives,
/// then releases every lock it holds; the process's exit status.
///
/// `store` is the global `--store`, used for every call (as by every command).
#[must_use]
pub(crate) fn serve(store: Option<OsString>, env: Environment) -> ExitStatus {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skill-lock mcp: cannot start the server's runtime: {e}");
            return ExitStatus::Error;
        }
    };
    let shared = Arc::new(Shared {
        store,
        env: Mutex::new(env),
        held: Mutex::new(Held::default()),
    });
    let server = LockServer {
        shared: Arc::clone(&shared),
    };
    let end = runtime.block_on(async move {
        let signal = ending_signal();
        tokio::pin!(signal);
        let running = tokio::select! {
            running = server.serve(rmcp::transport::stdio()) => running,
            () = &mut signal => return End::Signal,
        };
        let running = match running {
            Ok(running) => running,
            Err(e) => return End::Failed(e.to_string()),
        };
        tokio::select! {
            _ = running.waiting() => End::Input,
            () = &mut signal => End::Signal,
        }
    });
    shared.release_all();
    // A read of standard input may still be pending (it cannot be
    // cancelled): the runtime is left behind, not waited for.
    runtime.shutdown_background();
    match end {
        End::Input | End::Signal => ExitStatus::Success,
        End::Failed(why) => {
            eprintln!("skill-lock mcp: the session could not start: {why}");
            ExitStatus::Error
        }
    }
}

/// Resolves when SIGTERM, SIGINT or SIGHUP arrives (Windows: Ctrl-C or
/// Ctrl-Break); never when the handlers cannot be installed.
async fn ending_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            return std::future::pending::<()>().await;
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
            _ = hup.recv() => {},
        }
    }
    #[cfg(windows)]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
