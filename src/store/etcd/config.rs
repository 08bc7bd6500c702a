//! The connection settings of an etcd store: its URL, and the TLS,
//! credential and timeout variables from the start-up snapshot
//! ([`Vars`]); parsing reads no file and connects nowhere.

use std::path::Path;
use std::time::Duration;

use super::client::{Security, Tls};
use super::proxy::{self, NoProxy, Proxy};
use crate::error::{Error, Result};
use crate::vars::{Vars, var};

/// Default time within which a command must get an answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Connection settings of an etcd store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// The URL as given, for `list` and messages.
    pub url: String,
    /// `host:port` of each member, tried in order.
    pub endpoints: Vec<String>,
    /// Key prefix, starting and ending with `/`.
    pub prefix: String,
    /// TLS (`etcds://`).
    pub tls: bool,
    /// PEM CA file (`SKILL_LOCK_ETCD_CA`).
    pub ca: Option<String>,
    /// PEM client certificate and key (`SKILL_LOCK_ETCD_CERT`, `SKILL_LOCK_ETCD_KEY`).
    pub identity: Option<(String, String)>,
    /// User and password (`SKILL_LOCK_ETCD_USER`, `SKILL_LOCK_ETCD_PASSWORD`).
    pub user: Option<(String, String)>,
    /// Deadline of one command (`SKILL_LOCK_ETCD_TIMEOUT`, seconds).
    pub timeout: Duration,
    /// The HTTP CONNECT proxy (`HTTPS_PROXY`...), when one is named (and
    /// usable: a proxy variable no endpoint needs is never an error).
    pub proxy: Option<Proxy>,
    /// The endpoints reached directly (`NO_PROXY`).
    pub no_proxy: NoProxy,
}

impl EtcdConfig {
    /// Parses `etcd://host:port[,host:port...][/prefix]` (or `etcds://`),
    /// with TLS files, credentials and timeout from `vars`. Pure: the TLS
    /// files are read when the store is opened.
    ///
    /// # Errors
    /// [`Error::Usage`] for a malformed URL or setting.
    pub fn parse(url: &str, vars: &Vars) -> Result<Self> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else {
            return Err(Error::Usage(format!(
                "{url:?} is not an etcd:// or etcds:// URL"
            )));
        };
        let (hosts, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/skill-lock/"),
        };
        let endpoints: Vec<String> = hosts.split(',').map(str::trim).map(str::to_owned).collect();
        if endpoints.iter().any(|e| {
            e.rsplit_once(':')
                .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        }) {
            return Err(Error::Usage(format!(
                "store {url:?}: give endpoints as host:port[,host:port...], e.g. etcd://127.0.0.1:2379"
            )));
        }
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let env = |k: &str| vars.get(k).map(str::to_owned);
        let timeout = match env(var::ETCD_TIMEOUT) {
            None => DEFAULT_TIMEOUT,
            Some(t) => t
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s <= 600.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "{}={t:?}: give seconds, 0 < s <= 600",
                        var::ETCD_TIMEOUT
                    ))
                })?,
        };
        // Variables that only make sense together: both, or neither.
        let pair = |a: &str, b: &str| match (env(a), env(b)) {
            (Some(x), Some(y)) => Ok(Some((x, y))),
            (None, None) => Ok(None),
            _ => Err(Error::Usage(format!("set both {a} and {b}, or neither"))),
        };
        let identity = pair(var::ETCD_CERT, var::ETCD_KEY)?;
        let user = pair(var::ETCD_USER, var::ETCD_PASSWORD)?;
        let (proxy, no_proxy) = proxy::from_vars(vars, &endpoints)?;
        Ok(Self {
            url: url.to_owned(),
            endpoints,
            prefix,
            tls,
            ca: env(var::ETCD_CA),
            identity,
            user,
            timeout,
            proxy,
            no_proxy,
        })
    }

    /// The proxy `endpoint` is reached through, if any (SPEC §8).
    #[must_use]
    pub fn proxy_for(&self, endpoint: &str) -> Option<&Proxy> {
        self.proxy
            .as_ref()
            .filter(|_| !self.no_proxy.bypasses(endpoint))
    }

    /// The proxy an endpoint in `NO_PROXY` is tried through when it cannot
    /// be reached directly at all.
    #[must_use]
    pub fn fallback_for(&self, endpoint: &str) -> Option<&Proxy> {
        self.proxy
            .as_ref()
            .filter(|_| self.no_proxy.bypasses(endpoint))
    }
}

/// Reads the TLS files and credentials of `config` once.
/// The largest CA bundle, certificate or key read (a system CA bundle is
/// about 200 KiB).
const TLS_FILE_LIMIT: usize = 4 << 20;

pub(super) fn security(config: &EtcdConfig) -> Result<Security> {
    // Regular files only, bounded: a FIFO named by a variable never hangs
    // a command, `/dev/zero` never fills memory (SPEC §8).
    let read = |path: &String| crate::bounded::read_regular(Path::new(path), TLS_FILE_LIMIT);
    let tls = if config.tls {
        Some(Tls {
            ca: config.ca.as_ref().map(read).transpose()?,
            identity: match &config.identity {
                Some((cert, key)) => Some((read(cert)?, read(key)?)),
                None => None,
            },
        })
    } else {
        None
    };
    Ok(Security {
        tls,
        user: config.user.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = EtcdConfig::parse(
            "etcd://127.0.0.1:2379,h2:23791/team/locks",
            &Vars::default(),
        )
        .unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:2379", "h2:23791"]);
        assert_eq!(c.prefix, "/team/locks/");
        assert!(!c.tls);
        let c = EtcdConfig::parse("etcds://h:1", &Vars::default()).unwrap();
        assert_eq!((c.prefix.as_str(), c.tls), ("/skill-lock/", true));
        for bad in [
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://:1",
            "http://h:1",
        ] {
            assert!(EtcdConfig::parse(bad, &Vars::default()).is_err(), "{bad}");
        }
    }
}
