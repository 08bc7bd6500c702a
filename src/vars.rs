//! The variables the stores read (SPEC §8), named once, and [`Vars`], their
//! values as [`crate::config::Environment`] read them at start-up. A leaf
//! module: the stores take their settings from here without reaching back
//! into `config`, which opens them.

/// The variables the stores read (SPEC §8), each named once.
pub(crate) mod var {
    /// Seconds one command's git work may take.
    pub(crate) const GIT_TIMEOUT: &str = "SKILL_LOCK_GIT_TIMEOUT";
    /// The clock-skew allowance of the git store, seconds.
    pub(crate) const CLOCK_SKEW: &str = "SKILL_LOCK_CLOCK_SKEW";
    /// Commits in a lock's chain before the git store starts a new root.
    pub(crate) const GIT_HISTORY_DEPTH: &str = "SKILL_LOCK_GIT_HISTORY_DEPTH";
    /// The git store's private cache repository.
    pub(crate) const GIT_CACHE: &str = "SKILL_LOCK_GIT_CACHE";
    /// Seconds one command's etcd work may take.
    pub(crate) const ETCD_TIMEOUT: &str = "SKILL_LOCK_ETCD_TIMEOUT";
    /// PEM file of the CA that signs the etcd servers' certificates.
    pub(crate) const ETCD_CA: &str = "SKILL_LOCK_ETCD_CA";
    /// PEM file of the etcd client certificate.
    pub(crate) const ETCD_CERT: &str = "SKILL_LOCK_ETCD_CERT";
    /// PEM file of the etcd client key.
    pub(crate) const ETCD_KEY: &str = "SKILL_LOCK_ETCD_KEY";
    /// The etcd user name.
    pub(crate) const ETCD_USER: &str = "SKILL_LOCK_ETCD_USER";
    /// The etcd user's password.
    pub(crate) const ETCD_PASSWORD: &str = "SKILL_LOCK_ETCD_PASSWORD";
    /// Where the user's caches go (the git store's default cache).
    pub(crate) const XDG_CACHE_HOME: &str = "XDG_CACHE_HOME";
    /// The user's home (the git store's default cache, without `XDG_CACHE_HOME`).
    pub(crate) const HOME: &str = "HOME";
    /// git's ssh command: when set, the git store leaves ssh to it.
    pub(crate) const GIT_SSH_COMMAND: &str = "GIT_SSH_COMMAND";
    /// git's older ssh program variable, read like `GIT_SSH_COMMAND`.
    pub(crate) const GIT_SSH: &str = "GIT_SSH";
    /// Configuration entries the user passes git (the git store's follow them).
    pub(crate) const GIT_CONFIG_COUNT: &str = "GIT_CONFIG_COUNT";
    /// The HTTP CONNECT proxy the etcd client goes through (as gRPC clients).
    pub(crate) const HTTPS_PROXY: &str = "HTTPS_PROXY";
    /// [`HTTPS_PROXY`], lowercase (read when the uppercase one is not set).
    pub(crate) const HTTPS_PROXY_LOWER: &str = "https_proxy";
    /// The proxy for every protocol: the etcd client's when no `HTTPS_PROXY`.
    pub(crate) const ALL_PROXY: &str = "ALL_PROXY";
    /// [`ALL_PROXY`], lowercase.
    pub(crate) const ALL_PROXY_LOWER: &str = "all_proxy";
    /// The hosts the etcd client reaches directly, not through the proxy.
    pub(crate) const NO_PROXY: &str = "NO_PROXY";
    /// [`NO_PROXY`], lowercase.
    pub(crate) const NO_PROXY_LOWER: &str = "no_proxy";

    /// Every variable above: what [`super::Vars`] holds.
    pub(crate) const ALL: [&str; 21] = [
        GIT_TIMEOUT,
        CLOCK_SKEW,
        GIT_HISTORY_DEPTH,
        GIT_CACHE,
        ETCD_TIMEOUT,
        ETCD_CA,
        ETCD_CERT,
        ETCD_KEY,
        ETCD_USER,
        ETCD_PASSWORD,
        XDG_CACHE_HOME,
        HOME,
        GIT_SSH_COMMAND,
        GIT_SSH,
        GIT_CONFIG_COUNT,
        HTTPS_PROXY,
        HTTPS_PROXY_LOWER,
        ALL_PROXY,
        ALL_PROXY_LOWER,
        NO_PROXY,
        NO_PROXY_LOWER,
    ];
}

/// The store variables of [`var::ALL`] that were set, not empty and UTF-8,
/// read once; stores ask this, never the process environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(Vec<(&'static str, String)>);

impl Vars {
    /// The value of `name` (one of [`var::ALL`]), when it was set.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `self` with `name` set to `value` (tests, and callers of the library).
    #[must_use]
    pub fn with(mut self, name: &'static str, value: &str) -> Self {
        self.0.retain(|(k, _)| *k != name);
        self.0.push((name, value.to_owned()));
        self
    }
}

impl FromIterator<(&'static str, String)> for Vars {
    fn from_iter<I: IntoIterator<Item = (&'static str, String)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}
