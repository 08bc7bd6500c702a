//! Validated settings and store selection (SPEC §5, §8).
//!
//! [`Settings`] are built once, from the parsed command line and one
//! [`Environment`] snapshot, before any file is touched: names, ttl, note and
//! pid are checked first (into one [`Action`]), then the root, the personal
//! layer and the store are resolved. Store precedence: `--store URL`, then
//! `SKILL_LOCK_STORE`, then the user's configuration file
//! ([`crate::user_config`]), then the file store in the personal layer.

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
use crate::store::fs::Location;
use crate::store::git::{GitConfig, GitStore};
use crate::user_config::UserConfig;

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
    /// The invoking user (SPEC §5: whose directories and markers count).
    pub user: crate::ownership::User,
    /// What locates the user's configuration file (SPEC §8).
    pub config: crate::user_config::Inputs,
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
        let sudo_uid = get("SUDO_UID").and_then(|v| v.into_string().ok());
        let sudo_group = get("SUDO_GID").and_then(|v| v.into_string().ok());
        crate::ownership::note_sudo(sudo_uid.as_deref(), sudo_group.as_deref());
        Ok(Self {
            user: crate::ownership::User::new(sudo_uid.as_deref()),
            config: crate::user_config::Inputs {
                explicit: get("SKILL_LOCK_CONFIG").map(PathBuf::from),
                xdg_config_home: get("XDG_CONFIG_HOME").map(PathBuf::from),
                home: get("HOME").map(PathBuf::from),
                appdata: get("APPDATA").map(PathBuf::from),
            },
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

impl Action {
    /// The repository the action names, which the user's configuration
    /// file maps to a store; `None` for `list` and `history` of every lock.
    pub(crate) fn repo(&self) -> Option<&str> {
        match self {
            Self::Acquire { key, .. }
            | Self::Run { key, .. }
            | Self::Renew { key, .. }
            | Self::Release { key, .. }
            | Self::Status { key }
            | Self::Check { key, .. } => Some(key.repo()),
            Self::History { key, .. } => key.as_ref().map(LockKey::repo),
            Self::List => None,
        }
    }

    /// Does the action look for the original tool's locks (SPEC §5
    /// "Upgrading")? Only `acquire`, `run` and `list` do: no other command
    /// pays for the walk.
    pub(crate) fn reads_legacy(&self) -> bool {
        matches!(self, Self::Acquire { .. } | Self::Run { .. } | Self::List)
    }
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
        let store = choose_store(store, root, &env, action.repo(), action.reads_legacy())?;
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

/// The fence of `--since` (and of the MCP tool's `since`): a whole number,
/// `null` standing for 0 (what `status` shows when it knows no fence).
pub(crate) fn parse_since(text: &str) -> Result<u64> {
    if text == "null" {
        return Ok(0);
    }
    text.parse::<u64>().map_err(|_| {
        Error::Usage(format!(
            "--since {text:?}: give the fence that status showed (a whole number; null or 0 when it showed none)"
        ))
    })
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
    /// The user's configuration file (SPEC §8).
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
    /// Where the original tool kept this project's locks (SPEC §5
    /// "Upgrading from the original tool"): `acquire` and `run` honour a
    /// live record of the same lock there, and `list` shows them.
    pub legacy: Vec<Location>,
    /// The configuration file's line that chose the store, in words.
    pub origin: Option<String>,
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

/// The store a URL names, checked alike wherever the URL came from (flag,
/// environment, configuration file); no message ever carries its
/// credentials. A git remote *name* is resolved in the checkout's verified
/// git directory (SPEC §8), so only then is the root looked for.
fn from_url(
    url: &str,
    cwd: &Path,
    source: StoreSource,
    root_flag: Option<&Path>,
    env: &Environment,
) -> Result<StoreChoice> {
    use crate::store::git::{has_secret, redact};
    if source == StoreSource::Flag && has_secret(url) {
        return Err(Error::Usage(format!(
            "--store {:?} carries credentials, which every local user can read in the process list; \
             put the URL in SKILL_LOCK_STORE or in your configuration file, or leave them to git's credential helper",
            redact(url)
        )));
    }
    let mut spec = parse_url(url, cwd, source, &env.vars).map_err(redacted)?;
    let mut root = None;
    if let StoreSpec::Git(config) = &mut spec
        && config.names_a_remote()
    {
        // No checkout of layer rule 1 here: the name resolves nowhere, and
        // opening the store says so (`usage`), never trying it as a path.
        if let Ok(found) = root::discover(root_flag, cwd, &env.user)
            && let Ok(layer) = layer::resolve(&found.dir)
        {
            config.git_dir = layer.git_dir;
            config.checkout.clone_from(&found.dir);
            root = Some(found.dir);
        }
    }
    Ok(StoreChoice {
        spec,
        source,
        url: Some(url.to_owned()),
        root,
        legacy: Vec::new(),
        origin: None,
    })
}

/// Parses a store URL (SPEC §8). A relative `file:` directory or git path
/// is taken against `cwd`, and only from `--store`: in the variable or the
/// configuration file, which any directory reads alike, it is refused.
fn parse_url(url: &str, cwd: &Path, source: StoreSource, vars: &Vars) -> Result<StoreSpec> {
    let relative_refused = |what: &str| {
        Error::Usage(format!(
            "store {url:?}: a relative {what} is accepted only from --store (it would mean \
             another place in every directory); write it absolute"
        ))
    };
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
            let config = GitConfig::parse(url, cwd, vars)?;
            if source != StoreSource::Flag && config.names_a_relative_path() {
                return Err(relative_refused("path"));
            }
            return Ok(StoreSpec::Git(config));
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
    if source == StoreSource::ConfigFile && Path::new(dir).is_relative() {
        return Err(relative_refused("directory"));
    }
    Ok(StoreSpec::File(Location::new(&cwd.join(dir), &[])))
}

/// Resolves the store for this invocation (SPEC §8): the user's choice
/// (`--store`, `SKILL_LOCK_STORE`, the user's configuration file for
/// `repo`), else the file store of the personal layer. Nothing in a tree
/// chooses it (SPEC §5 "Nothing a tree carries configures the tool").
///
/// # Errors
/// [`Error::NoRoot`] when the personal layer is needed and no root is found;
/// [`Error::Usage`] for an unknown URL, a configuration file that fails its
/// checks, or a `skill-lock.toml` found in the tree when nothing the user
/// set chooses the store.
pub(crate) fn choose_store(
    flag: Option<&OsString>,
    root_flag: Option<&Path>,
    env: &Environment,
    repo: Option<&str>,
    reads_legacy: bool,
) -> Result<StoreChoice> {
    let text = |s: &OsString, what: &str| {
        s.to_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Usage(format!("{what} is not valid UTF-8")))
    };
    let cwd = &env.cwd;
    let user = &env.user;
    let chosen = if let Some(url) = flag {
        Some((text(url, "--store")?, StoreSource::Flag, None))
    } else if let Some(url) = &env.store {
        Some((text(url, "SKILL_LOCK_STORE")?, StoreSource::Env, None))
    } else {
        match user_config(env)? {
            Some(cfg) => cfg.entry_for(repo).map(|e| {
                (
                    e.url.clone(),
                    StoreSource::ConfigFile,
                    Some(cfg.describe(e)),
                )
            }),
            None => None,
        }
    };
    // `store = "file"` in the configuration file: the personal layer's file
    // store, chosen by the user (so a tree's skill-lock.toml is ignored).
    let (chosen, file_line) = match chosen {
        Some((url, StoreSource::ConfigFile, line)) if url == "file" => (None, Some(line)),
        other => (other, None),
    };
    if let Some((url, source, line)) = chosen {
        let mut choice = from_url(&url, cwd, source, root_flag, env).map_err(|e| match &line {
            Some(line) => match e {
                Error::Usage(m) => Error::Usage(format!("{m} (set in {line})")),
                other => other,
            },
            None => e,
        })?;
        choice.origin = line;
        if reads_legacy {
            choice.legacy = legacy_layer(root::discover(root_flag, cwd, user).ok().as_ref());
        }
        return Ok(choice);
    }
    let root = root::discover(root_flag, cwd, user)?;
    let layer = layer::resolve(&root.dir)?;
    if file_line.is_none()
        && let Some(found) = layer.planted_config(root.original.as_deref())
    {
        return Err(planted_config(&found, env));
    }
    let location = Location::new(&layer.anchor, layer.below);
    let legacy = if reads_legacy {
        legacy_layer(Some(&root))
    } else {
        Vec::new()
    };
    Ok(StoreChoice {
        spec: StoreSpec::File(location),
        source: if file_line.is_some() {
            StoreSource::ConfigFile
        } else {
            StoreSource::Default
        },
        url: None,
        root: Some(root.dir),
        legacy,
        origin: file_line.flatten(),
    })
}

/// The user's configuration file, read and checked, when there is one.
///
/// # Errors
/// As [`UserConfig::read`].
pub(crate) fn user_config(env: &Environment) -> Result<Option<UserConfig>> {
    match crate::user_config::locate(&env.config, &env.user) {
        Some(place) => UserConfig::read(place, &env.user),
        None => Ok(None),
    }
}

/// A `skill-lock.toml` in the tree, where earlier versions read one: never
/// used, and refused when nothing the user set chooses the store, so a user
/// who had configured a shared store there is never silently moved to a
/// local one (SPEC §5). Only its presence was looked at.
fn planted_config(found: &Path, env: &Environment) -> Error {
    let file = crate::user_config::locate(&env.config, &env.user).map_or_else(
        || "your configuration file (set SKILL_LOCK_CONFIG)".to_owned(),
        |p| p.path.display().to_string(),
    );
    Error::Usage(format!(
        "{} is not used: a tree (a clone, an svn working copy, an archive) can carry it, and \
         nothing a tree carries configures skill-lock; choose the store yourself in {file} \
         (store = \"URL\", or a [repos] entry), with --store URL or with SKILL_LOCK_STORE, \
         then delete {} (`skill-lock doctor` says more)",
        found.display(),
        found.display()
    ))
}

/// Where the original tool would have kept this project's locks, from the
/// same start (SPEC §5 "Upgrading from the original tool"): the
/// `.apache-magpie-local/` of the nearest directory holding any marker,
/// when it has a `run` there. Read only by `acquire`, `run` and `list`.
fn legacy_layer(root: Option<&root::Root>) -> Vec<Location> {
    let Some(root) = root else {
        return Vec::new();
    };
    // Where R has no version control, the original's folder is P itself
    // (layer rule 4): this tool's own locks, not a legacy.
    let is_p = |o: &PathBuf| {
        *o == root.dir
            && ![root::GIT, root::SVN]
                .iter()
                .any(|m| std::fs::symlink_metadata(o.join(m)).is_ok())
    };
    root.original
        .clone()
        .filter(|o| !is_p(o))
        .filter(|o| std::fs::symlink_metadata(o.join(layer::LOCAL_DIR).join("run")).is_ok())
        .map(|o| Location::new(&o, &[layer::LOCAL_DIR]))
        .into_iter()
        .collect()
}
