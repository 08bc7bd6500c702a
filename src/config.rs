//! Validated settings and store selection (SPEC §5, §8).
//!
//! [`Settings`] are built once, from the parsed command line and one
//! [`Environment`] snapshot, before any file is touched: names, ttl, note and
//! pid are checked first (into one [`Action`]), then the root, the personal
//! layer and the store are resolved. Store precedence: `--store URL`, then
//! `SKILL_LOCK_STORE`, then `store = "URL"` in `P/skill-lock.toml`, then the
//! file store in the personal layer.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::engine::{AcquireRequest, Clock};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::layer;
use crate::root;
use crate::store::AnyStore;
use crate::store::fs::FileStore;
use crate::store::fs::dir::Location;
use crate::store::git::{GitConfig, GitStore};

/// The store setting in the personal layer (SPEC §8).
pub(crate) const CONFIG_FILE: &str = "skill-lock.toml";

pub(crate) use crate::vars::{Vars, var};

/// What the process was started with, read once: everything else gets it
/// passed down and never reads the environment itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct Environment {
    /// The current directory.
    pub cwd: PathBuf,
    /// `SKILL_LOCK_STORE`, when set and not empty.
    pub store: Option<OsString>,
    /// `SKILL_LOCK_LAUNCHER`, when set and not empty: how the user starts this program.
    pub launcher: Option<OsString>,
    /// `PATH`.
    pub path: Option<OsString>,
    /// `SKILL_LOCK_TOKEN`, when set (empty too: that is a `usage` error
    /// where a token is read, never "no token", SPEC §2): the token renew,
    /// release and check use when no `--token` is given (`run` sets it for CMD).
    pub token: Option<OsString>,
    /// This program, when the OS says where it is.
    pub exe: Option<PathBuf>,
    /// Started by uv (`uvx`, `uv run`, `uv tool run` set `UV`): uv then put
    /// its tool environment's `bin/` first on `PATH`, for this process only.
    pub under_uv: bool,
    /// The variables the stores read.
    pub vars: Vars,
}

impl Environment {
    /// Reads the process environment.
    ///
    /// # Errors
    /// [`Error::Io`] when the current directory cannot be read.
    #[allow(
        clippy::disallowed_methods,
        reason = "the one place that reads the environment"
    )]
    pub(crate) fn read() -> Result<Self> {
        let cwd =
            std::env::current_dir().map_err(|e| Error::io("read", "the current directory", e))?;
        let get = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        Ok(Self {
            cwd,
            store: get("SKILL_LOCK_STORE"),
            launcher: get("SKILL_LOCK_LAUNCHER"),
            path: get("PATH"),
            token: std::env::var_os("SKILL_LOCK_TOKEN"),
            exe: std::env::current_exe().ok(),
            under_uv: get("UV").is_some(),
            vars: var::ALL
                .iter()
                .filter_map(|&k| Some((k, get(k)?.into_string().ok()?)))
                .collect(),
        })
    }
}

/// One command, its arguments validated.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// `acquire` (SPEC §2.1).
    Acquire {
        /// The lock.
        key: LockKey,
        /// Lease, note, owner pid.
        req: AcquireRequest,
        /// `--wait`.
        wait: Option<Duration>,
    },
    /// `run` (SPEC §2.7).
    Run {
        /// The lock.
        key: LockKey,
        /// Lease, note; the owner is this process.
        req: AcquireRequest,
        /// `--wait`.
        wait: Option<Duration>,
        /// CMD and its arguments.
        cmd: Vec<OsString>,
        /// `--conflict-exit-code N`: the exit status when CMD was not run
        /// because the lock is held (3 without it).
        conflict_exit_code: Option<u8>,
    },
    /// `renew` (SPEC §2.2).
    Renew {
        /// The lock.
        key: LockKey,
        /// `--token` (or `SKILL_LOCK_TOKEN`); `None` only with `--force`.
        token: Option<String>,
        /// `--ttl`.
        ttl: Option<u64>,
    },
    /// `release` (SPEC §2.3).
    Release {
        /// The lock.
        key: LockKey,
        /// `--token`.
        token: Option<String>,
        /// `--force`.
        force: bool,
    },
    /// `status` (SPEC §2.4).
    Status {
        /// The lock.
        key: LockKey,
    },
    /// `list` (SPEC §2.5).
    List,
    /// `check` (SPEC §2.6).
    Check {
        /// The lock.
        key: LockKey,
        /// `--token`.
        token: String,
    },
    /// `history` (SPEC §2.8).
    History {
        /// One lock, or all.
        key: Option<LockKey>,
        /// `--limit`.
        limit: usize,
    },
}

/// Everything one invocation needs, validated: what to do, where, and when.
#[derive(Debug)]
pub(crate) struct Settings {
    /// The command.
    pub action: Action,
    /// The store, chosen once.
    pub store: StoreChoice,
    /// The clock every decision reads.
    pub clock: Clock,
    /// The environment snapshot (for the `already_running` hint).
    pub env: Environment,
}

impl Settings {
    /// Chooses the store for a validated `action`.
    ///
    /// # Errors
    /// As [`choose_store`].
    pub(crate) fn new(
        action: Action,
        store: Option<&OsString>,
        root: Option<&Path>,
        env: Environment,
    ) -> Result<Self> {
        let store = choose_store(store, root, &env)?;
        Ok(Self {
            action,
            store,
            clock: Clock::System,
            env,
        })
    }
}

/// Longest note, bytes of UTF-8.
pub const NOTE_MAX: usize = 1000;

/// Checks a `--note`: UTF-8, at most 1,000 bytes, no control characters but tab.
///
/// # Errors
/// [`Error::InvalidNote`].
pub fn validate_note(note: &OsString) -> Result<String> {
    let Some(text) = note.to_str() else {
        return Err(Error::InvalidNote("it is not valid UTF-8".into()));
    };
    if text.len() > NOTE_MAX {
        return Err(Error::InvalidNote(format!(
            "it is {} bytes; keep it to at most {NOTE_MAX} bytes",
            text.len()
        )));
    }
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return Err(Error::InvalidNote(
            "it holds control characters (newlines included); only tab is allowed".into(),
        ));
    }
    Ok(text.to_owned())
}

/// Checks `--owner-pid`: a process that exists on this host now.
///
/// # Errors
/// [`Error::InvalidPid`].
pub(crate) fn validate_pid(pid: &OsString) -> Result<u32> {
    let text = pid.to_string_lossy().into_owned();
    let Ok(n) = text.parse::<u32>() else {
        return Err(Error::InvalidPid {
            pid: text,
            why: "give a positive process id".into(),
        });
    };
    if n == 0 || i32::try_from(n).is_err() {
        return Err(Error::InvalidPid {
            pid: text,
            why: "give a positive process id".into(),
        });
    }
    if crate::liveness::pid_exists(n) == Some(false) {
        return Err(Error::InvalidPid {
            pid: text,
            why: "no such process on this host; pass the pid of the process that owns the run"
                .into(),
        });
    }
    Ok(n)
}

/// Where the store choice came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreSource {
    /// `--store`.
    Flag,
    /// `SKILL_LOCK_STORE`.
    Env,
    /// `P/skill-lock.toml`.
    ConfigFile,
    /// The personal layer's file store.
    Default,
}

/// A store as named, parsed and checked but not opened (SPEC §8): choosing
/// one runs no program, reads no key file and connects nowhere.
#[derive(Debug, Clone)]
pub(crate) enum StoreSpec {
    /// The file store of a personal layer, or at `file:DIR`.
    File(Location),
    /// A git store.
    Git(GitConfig),
    /// An etcd store (its TLS files are read when it is opened).
    #[cfg(feature = "etcd")]
    Etcd(crate::store::etcd::EtcdConfig),
}

/// The chosen store and what the hint needs to name it again.
#[derive(Debug, Clone)]
pub(crate) struct StoreChoice {
    /// The store to open.
    pub spec: StoreSpec,
    /// Where the choice came from.
    pub source: StoreSource,
    /// The URL as given (flag, env or config file).
    pub url: Option<String>,
    /// The project root, when one was resolved.
    pub root: Option<PathBuf>,
    /// File-store layers where an older version kept this project's locks
    /// (see [`layer::Layer::working`]); `acquire` and `run` refuse while a
    /// lock there is held, and `list` shows them.
    pub legacy: Vec<Location>,
}

impl StoreChoice {
    /// Opens the store: a git remote name is resolved in its checkout, an
    /// etcd store reads its TLS files and starts its client runtime (it
    /// connects on its first operation); a file store opens nothing yet.
    ///
    /// # Errors
    /// [`Error::Usage`] for a git remote that names nothing or an etcd
    /// setting that is wrong; [`Error::StoreUnavailable`], [`Error::Internal`]
    /// as the store says. No message carries the URL's credentials.
    pub(crate) fn open(&self) -> Result<AnyStore> {
        let opened = match &self.spec {
            StoreSpec::File(location) => Ok(AnyStore::File(FileStore::at(location.clone()))),
            StoreSpec::Git(config) => GitStore::open(config.clone()).map(AnyStore::Git),
            #[cfg(feature = "etcd")]
            StoreSpec::Etcd(config) => {
                crate::store::etcd::EtcdStore::open(config.clone()).map(AnyStore::Etcd)
            }
        };
        opened.map_err(redacted)
    }
}

/// `e` without the credentials of any URL it names.
fn redacted(e: Error) -> Error {
    use crate::store::git::redact;
    match e {
        Error::Usage(m) => Error::Usage(redact(&m)),
        Error::StoreUnavailable(m) => Error::StoreUnavailable(redact(&m)),
        other => other,
    }
}

#[derive(serde::Deserialize)]
struct ConfigFile {
    store: Option<String>,
}

/// The store a URL names, checked alike wherever the URL came from (flag,
/// environment, config file); no message ever carries its credentials.
fn from_url(
    url: &str,
    cwd: &Path,
    source: StoreSource,
    root: Option<PathBuf>,
    vars: &Vars,
) -> Result<StoreChoice> {
    use crate::store::git::{has_secret, redact};
    if source == StoreSource::Flag && has_secret(url) {
        return Err(Error::Usage(format!(
            "--store {:?} carries credentials, which every local user can read in the process list; \
             put the URL in SKILL_LOCK_STORE or in skill-lock.toml, or leave them to git's credential helper",
            redact(url)
        )));
    }
    let spec = parse_url(url, cwd, vars).map_err(redacted)?;
    Ok(StoreChoice {
        spec,
        source,
        url: Some(url.to_owned()),
        root,
        legacy: Vec::new(),
    })
}

/// Parses a store URL (SPEC §8), relative `file:` directories and git
/// paths against `cwd`.
fn parse_url(url: &str, cwd: &Path, vars: &Vars) -> Result<StoreSpec> {
    let Some(dir) = url.strip_prefix("file:") else {
        if url.starts_with("etcd://") || url.starts_with("etcds://") {
            #[cfg(feature = "etcd")]
            return crate::store::etcd::EtcdConfig::parse(url, vars).map(StoreSpec::Etcd);
            #[cfg(not(feature = "etcd"))]
            return Err(Error::StoreUnavailable(format!(
                "store {url:?}: this build has no etcd store (feature \"etcd\"); use file:DIR or the default"
            )));
        }
        if url.starts_with("git:") {
            return GitConfig::parse(url, cwd, vars).map(StoreSpec::Git);
        }
        return Err(Error::Usage(format!(
            "unknown store {url:?}: use git:REMOTE[#NAMESPACE], etcd://host:port[,host:port...][/prefix], etcds://..., or file:DIR"
        )));
    };
    if dir.is_empty() {
        return Err(Error::Usage(
            "store file: needs a directory, e.g. file:/var/tmp/locks".into(),
        ));
    }
    Ok(StoreSpec::File(Location::new(&cwd.join(dir), &[])))
}

/// Resolves the store for this invocation (SPEC §8).
///
/// # Errors
/// [`Error::NoRoot`] when the personal layer is needed and no root is found;
/// [`Error::Usage`] for an unknown URL or an unreadable config file.
pub(crate) fn choose_store(
    flag: Option<&OsString>,
    root_flag: Option<&Path>,
    env: &Environment,
) -> Result<StoreChoice> {
    let text = |s: &OsString, what: &str| {
        s.to_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Usage(format!("{what} is not valid UTF-8")))
    };
    let cwd = &env.cwd;
    if let Some(url) = flag {
        return from_url(
            &text(url, "--store")?,
            cwd,
            StoreSource::Flag,
            None,
            &env.vars,
        );
    }
    if let Some(url) = &env.store {
        return from_url(
            &text(url, "SKILL_LOCK_STORE")?,
            cwd,
            StoreSource::Env,
            None,
            &env.vars,
        );
    }
    let root = root::discover(root_flag, cwd)?;
    let layer = layer::resolve(&root)?;
    refuse_planted_config(&layer)?;
    let location = Location::new(&layer.anchor, layer.below);
    let legacy = legacy_layers(&layer);
    if let Some(url) = read_config(&layer, &location)? {
        let mut choice = from_url(
            &url,
            &root.clone(),
            StoreSource::ConfigFile,
            Some(root),
            &env.vars,
        )?;
        choice.legacy = legacy;
        return Ok(choice);
    }
    Ok(StoreChoice {
        spec: StoreSpec::File(location),
        source: StoreSource::Default,
        url: None,
        root: Some(root),
        legacy,
    })
}

/// A `skill-lock.toml` in a working tree's `.apache-magpie-local/` (where
/// earlier versions read it, and where any repository can commit one) is
/// never used: finding one, with no `--store` and no `SKILL_LOCK_STORE`, is
/// a `usage` error naming it and the place to use instead (SPEC §5).
/// Only its presence is looked at (no link followed, nothing read).
fn refuse_planted_config(layer: &layer::Layer) -> Result<()> {
    let Some(found) = layer
        .working
        .iter()
        .map(|d| d.join(CONFIG_FILE))
        .find(|f| std::fs::symlink_metadata(f).is_ok())
    else {
        return Ok(());
    };
    let instead = if layer.config_allowed {
        format!(
            "put the store setting in {} (a place no clone can write), or",
            layer.dir.join(CONFIG_FILE).display()
        )
    } else {
        "here no configuration file is read:".to_owned()
    };
    Err(Error::Usage(format!(
        "{} is not used: a repository can commit it, and nothing a repository carries \
         configures skill-lock; {instead} pass --store URL or set SKILL_LOCK_STORE; \
         then delete {}",
        found.display(),
        found.display()
    )))
}

/// The store URL of `P/skill-lock.toml`, read only where the layer may hold
/// the configuration (SPEC §5): through the layer handle (no link followed,
/// no FIFO waited on, at most 64 KiB), from a P that is the user's own.
fn read_config(layer: &layer::Layer, location: &Location) -> Result<Option<String>> {
    if !layer.config_allowed {
        return Ok(None);
    }
    let cfg = layer.dir.join(CONFIG_FILE);
    let Some(body) = (match location.open_p(false)? {
        Some(p) => p.read_small(CONFIG_FILE)?,
        None => None,
    }) else {
        return Ok(None);
    };
    let body = String::from_utf8(body)
        .map_err(|_| Error::Usage(format!("{} is not UTF-8; fix or remove it", cfg.display())))?;
    let parsed: ConfigFile = toml::from_str(&body).map_err(|e| {
        Error::Usage(format!(
            "{} is not valid: {e}; fix or remove it",
            cfg.display()
        ))
    })?;
    Ok(parsed.store)
}

/// The file-store layers where earlier versions kept this checkout's locks
/// (`.apache-magpie-local/` of its working trees), other than P itself:
/// a lock an older version still holds there must not be ignored.
fn legacy_layers(layer: &layer::Layer) -> Vec<Location> {
    layer
        .working
        .iter()
        .filter(|d| **d != layer.dir)
        .filter(|d| std::fs::symlink_metadata(d.join("run")).is_ok())
        .filter_map(|d| Some(Location::new(d.parent()?, &[layer::LOCAL_DIR])))
        .collect()
}
