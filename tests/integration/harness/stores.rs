//! The stores a conformance test runs on (SPEC §8: "the same behaviour as the
//! file store in every section"), and [`store_test!`], which writes a test
//! once and instantiates it for each (the ripgrep `rgtest!` way):
//! `conformance::the_whole_cycle::{file, git, git_daemon, etcd}`.
//!
//! The etcd instance runs when `SKILL_LOCK_TEST_ETCD` names a cluster
//! (`host:port[,host:port]`); without it the test says it skipped, and
//! `SKILL_LOCK_TEST_ETCD_REQUIRED=1` (set by CI) turns the skip into a failure.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::Lock;
use super::gitd::{Daemon, bare_repo};
use super::{Cmd, TestEnv};

/// One store under test, fresh for one test.
pub struct Store {
    /// Its `--store` URL.
    pub url: String,
    kind: &'static str,
    /// The git store's cache directory.
    git_cache: Option<PathBuf>,
    /// The git store's bare remote, for a test that plants or hooks into it.
    remote: Option<PathBuf>,
    /// `SKILL_LOCK_CLOCK_SKEW` on every run, when set.
    clock_skew: Option<&'static str>,
    /// The `git daemon` serving the git store, stopped when dropped.
    _daemon: Option<Daemon>,
}

impl Store {
    /// The store `kind` (`file`, `git`, `git_daemon` or `etcd`) in `env`;
    /// `None` when etcd is wanted and not configured (a visible skip). Every
    /// run of a conformance test is on one host: no clock-skew allowance.
    pub fn open(kind: &'static str, env: &TestEnv, test: &str) -> Option<Self> {
        let plain = |url: String| Self {
            url,
            kind,
            git_cache: None,
            remote: None,
            clock_skew: None,
            _daemon: None,
        };
        let one_host = |git: Self| Self {
            kind,
            clock_skew: Some("0"),
            ..git
        };
        Some(match kind {
            "file" => plain(format!("file:{}", env.path("store").display())),
            "git" => one_host(Self::git(env, None)),
            "git_daemon" => {
                let mut git = one_host(Self::git(env, Some((24450, &[]))));
                git.url.push_str("#conformance");
                git
            }
            "etcd" => {
                let eps = super::etcd_endpoints(test)?;
                let prefix = super::etcd_prefix(env, "conformance");
                plain(format!("etcd://{eps}{prefix}"))
            }
            other => panic!("no store kind {other}"),
        })
    }

    /// A git store on a fresh bare repository `served/locks.git` of `env`,
    /// through `file://`, or through a loopback `git daemon` (on a free port
    /// from `port`, with more options) when `daemon` says so; judged with
    /// the default clock-skew allowance, as the git store's own tests want.
    pub fn git(env: &TestEnv, daemon: Option<(u16, &[&str])>) -> Self {
        let served = env.dir("served");
        let remote = bare_repo(&served.join("locks.git"));
        let (url, daemon) = match daemon {
            None => (format!("git:file://{}", remote.display()), None),
            Some((port, extra)) => {
                let d = Daemon::start_with(&served, port, extra);
                (format!("git:{}", d.url("locks.git")), Some(d))
            }
        };
        Self {
            url,
            kind: "git",
            git_cache: Some(env.path("git-cache")),
            remote: Some(remote),
            clock_skew: None,
            _daemon: daemon,
        }
    }

    /// The git store's bare remote repository.
    #[track_caller]
    pub fn remote_dir(&self) -> &Path {
        self.remote.as_deref().expect("a git store")
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
        self.env()
            .into_iter()
            .fold(Lock::new(cwd, skill, repo), |l, (k, v)| l.with_env(k, v))
    }

    /// The lock (`skill`, `repo`) as machine `machine` sees it: a git
    /// cache of its own.
    pub fn lock_as(&self, machine: usize, cwd: &Path, skill: &str, repo: &str) -> Lock {
        let cache = self.git_cache.as_ref().expect("a git store");
        self.lock(cwd, skill, repo).with_env(
            "SKILL_LOCK_GIT_CACHE",
            cache.with_extension(machine.to_string()),
        )
    }

    /// The binary in `cwd`, on this store.
    pub fn cmd(&self, cwd: &Path) -> Cmd {
        self.env()
            .into_iter()
            .fold(Cmd::new(cwd), |c, (k, v)| c.env(k, v))
    }

    /// The environment every run on this store gets.
    fn env(&self) -> Vec<(&'static str, &OsStr)> {
        let mut env = vec![("SKILL_LOCK_STORE", OsStr::new(&self.url))];
        if let Some(cache) = &self.git_cache {
            env.push(("SKILL_LOCK_GIT_CACHE", cache.as_os_str()));
        }
        if let Some(skew) = self.clock_skew {
            env.push(("SKILL_LOCK_CLOCK_SKEW", OsStr::new(skew)));
        }
        env
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
