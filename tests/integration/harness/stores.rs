//! The stores a conformance test runs on (SPEC §8: "the same behaviour as the
//! file store in every section"), and [`store_test!`], which writes a test
//! once and instantiates it for each (the ripgrep `rgtest!` way):
//! `conformance::the_whole_cycle::{file, git, git_daemon, etcd}`.
//!
//! The etcd instance runs when `SKILL_LOCK_TEST_ETCD` names a cluster
//! (`host:port[,host:port]`); without it the test says it skipped, and
//! `SKILL_LOCK_TEST_ETCD_REQUIRED=1` (set by CI) turns the skip into a failure.

use std::path::{Path, PathBuf};

use super::gitd::{Daemon, bare_repo};
use super::verbs::Lock;
use super::{Cmd, TestEnv};

/// One store under test, fresh for one test.
pub struct Store {
    /// Its `--store` URL.
    pub url: String,
    kind: &'static str,
    /// The git store's cache directory.
    git_cache: Option<PathBuf>,
    /// The `git daemon` serving the git store, stopped when dropped.
    _daemon: Option<Daemon>,
}

impl Store {
    /// The store `kind` (`file`, `git`, `git_daemon` or `etcd`) in `env`;
    /// `None` when etcd is wanted and not configured (a visible skip).
    pub fn open(kind: &'static str, env: &TestEnv, test: &str) -> Option<Self> {
        let git = |url: String, daemon| Self {
            url,
            kind,
            git_cache: Some(env.path("git-cache")),
            _daemon: daemon,
        };
        let served = || {
            let served = env.dir("served");
            bare_repo(&served.join("locks.git"));
            served
        };
        Some(match kind {
            "file" => Self {
                url: format!("file:{}", env.path("store").display()),
                kind,
                git_cache: None,
                _daemon: None,
            },
            "git" => git(
                format!("git:file://{}", served().join("locks.git").display()),
                None,
            ),
            "git_daemon" => {
                let daemon = Daemon::start(&served(), 24450);
                git(
                    format!("git:{}#conformance", daemon.url("locks.git")),
                    Some(daemon),
                )
            }
            "etcd" => {
                let eps = super::etcd_endpoints(test)?;
                let prefix = super::etcd_prefix(env, "conformance");
                Self {
                    url: format!("etcd://{eps}{prefix}"),
                    kind,
                    git_cache: None,
                    _daemon: None,
                }
            }
            other => panic!("no store kind {other}"),
        })
    }

    /// Is it the etcd store (whose expired keys vanish on their own)?
    pub fn is_etcd(&self) -> bool {
        self.kind == "etcd"
    }

    /// Is it the file store?
    pub fn is_file(&self) -> bool {
        self.kind == "file"
    }

    /// The shortest ttl every store grants exactly (etcd's minimum is 2 s).
    pub fn short_ttl(&self) -> u64 {
        2
    }

    /// The lock (`skill`, `repo`) in this store, seen from `cwd`.
    pub fn lock(&self, cwd: &Path, skill: &str, repo: &str) -> Lock {
        let lock = Lock::new(cwd, skill, repo).with_env("SKILL_LOCK_STORE", &self.url);
        match &self.git_cache {
            // Every run here is on one host: no clock-skew allowance.
            Some(cache) => lock
                .with_env("SKILL_LOCK_GIT_CACHE", cache)
                .with_env("SKILL_LOCK_CLOCK_SKEW", "0"),
            None => lock,
        }
    }

    /// The binary in `cwd`, on this store.
    pub fn cmd(&self, cwd: &Path) -> Cmd {
        let cmd = Cmd::new(cwd).env("SKILL_LOCK_STORE", &self.url);
        match &self.git_cache {
            Some(cache) => cmd
                .env("SKILL_LOCK_GIT_CACHE", cache)
                .env("SKILL_LOCK_CLOCK_SKEW", "0"),
            None => cmd,
        }
    }
}

/// A test written once and run on every store: `store_test!(fn name(store,
/// env) { ... })` makes the module `name` with one `#[test]` per store
/// (`file`, `git` on a `file://` bare remote, `git_daemon` on a loopback
/// `git daemon`, `etcd`); `store_test!(fn name(store, env) on [file, git]
/// { ... })` only on those named. The body gets `store: &Store` and
/// `env: &TestEnv`.
macro_rules! store_test {
    ($(#[$m:meta])* fn $name:ident($store:ident, $env:ident) $body:block) => {
        store_test!($(#[$m])* fn $name($store, $env) on [file, git, git_daemon, etcd] $body);
    };
    ($(#[$m:meta])* fn $name:ident($store:ident, $env:ident) on [$($kind:ident),+] $body:block) => {
        $(#[$m])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[allow(unused_variables)]
            fn body(
                $store: &$crate::harness::stores::Store,
                $env: &$crate::harness::TestEnv,
            ) $body

            $(
                #[test]
                fn $kind() {
                    let env = $crate::harness::TestEnv::new();
                    let test = concat!(module_path!(), "::", stringify!($kind));
                    if let Some(store) =
                        $crate::harness::stores::Store::open(stringify!($kind), &env, test)
                    {
                        body(&store, &env);
                    }
                }
            )+
        }
    };
}
