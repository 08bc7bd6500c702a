//! The HTTP CONNECT proxy the etcd client goes through (SPEC §8), as gRPC
//! clients choose it: `HTTPS_PROXY`, else `https_proxy`, else `ALL_PROXY`,
//! else `all_proxy` names it (`http://[user:password@]host[:port][/]`, or
//! `host:port`; port 80 when none is given); `NO_PROXY` (else `no_proxy`)
//! lists the endpoints reached directly: `*`, host names (`example.org`
//! and `.example.org` both match the name and every name below it), either
//! with `:port`, IP addresses (with or without a port; IPv6 in brackets or
//! bare) and networks (`10.0.0.0/8`). Nothing is exempt implicitly, loopback
//! included: inside the agent's sandbox loopback is reached through the
//! proxy too.
//!
//! An endpoint in `NO_PROXY` is reached directly; only when no direct
//! connection can be opened at all is it tried through the proxy (inside
//! the agent's sandbox the runtime lists loopback and the private networks
//! in `NO_PROXY`, yet a command there has no network but the proxy).
//! Parsing is pure and reads no file; a proxy variable only endpoints in
//! `NO_PROXY` could fall back on never fails a command for being unusable. Invariant: the proxy's
//! credentials appear only in the `Proxy-Authorization` header, never in a
//! message, a `Debug` print or a result ([`Proxy::shown`] has none).

use std::net::{IpAddr, SocketAddr};

use crate::error::{Error, Result};
use crate::vars::{Vars, var};

/// An HTTP proxy the client tunnels through.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    /// `host:port` to open TCP to.
    pub(super) addr: String,
    /// `Basic` credentials (base64 of `user:password`), when the URL has them.
    pub(super) auth: Option<String>,
    /// The proxy as messages name it: `http://host:port`, never credentials.
    pub shown: String,
    /// The variable that named it.
    pub(super) from: &'static str,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("shown", &self.shown)
            .field("from", &self.from)
            .field("auth", &self.auth.as_ref().map(|_| "(set)"))
            .finish()
    }
}

/// The endpoints reached directly (`NO_PROXY`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NoProxy(Vec<Rule>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Rule {
    /// `*`: every endpoint.
    All,
    /// A name and every name below it, on `port` or any.
    Domain(String, Option<u16>),
    /// An address, on `port` or any.
    Ip(IpAddr, Option<u16>),
    /// A network: address and prefix length.
    Net(IpAddr, u8),
}

impl NoProxy {
    /// Parses a `NO_PROXY` value: entries separated by commas or spaces;
    /// one that is none of the forms above is ignored, as other clients do.
    #[must_use]
    pub fn parse(text: &str) -> Self {
        Self(
            text.split([',', ' ', '\t'])
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .filter_map(rule)
                .collect(),
        )
    }

    /// Is `endpoint` (`host:port` as the store URL gives it) reached directly?
    #[must_use]
    pub fn bypasses(&self, endpoint: &str) -> bool {
        let (host, port) = split_host_port(endpoint);
        let host = host.to_ascii_lowercase();
        let ip = host.parse::<IpAddr>().ok();
        self.0.iter().any(|r| match r {
            Rule::All => true,
            Rule::Domain(d, p) => {
                p.is_none_or(|p| Some(p) == port)
                    && (host == *d
                        || host
                            .strip_suffix(d.as_str())
                            .is_some_and(|h| h.ends_with('.')))
            }
            Rule::Ip(a, p) => p.is_none_or(|p| Some(p) == port) && ip == Some(*a),
            Rule::Net(net, bits) => ip.is_some_and(|a| in_network(a, *net, *bits)),
        })
    }
}

fn rule(entry: &str) -> Option<Rule> {
    let e = entry.to_ascii_lowercase();
    if e == "*" {
        return Some(Rule::All);
    }
    if let Ok(sa) = e.parse::<SocketAddr>() {
        return Some(Rule::Ip(sa.ip(), Some(sa.port())));
    }
    if let Ok(ip) = e
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Some(Rule::Ip(ip, None));
    }
    if let Some((net, bits)) = e.split_once('/') {
        let net = net.parse::<IpAddr>().ok()?;
        let bits = bits.parse::<u8>().ok()?;
        let most = if net.is_ipv4() { 32 } else { 128 };
        return (bits <= most).then_some(Rule::Net(net, bits));
    }
    let (host, port) = match e.rsplit_once(':') {
        Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
        None => (e.as_str(), None),
    };
    let domain = host.trim_start_matches("*.").trim_start_matches('.');
    (!domain.is_empty()).then(|| Rule::Domain(domain.to_owned(), port))
}

fn in_network(a: IpAddr, net: IpAddr, bits: u8) -> bool {
    let mask = |width: u32| {
        let bits = u32::from(bits);
        if bits == 0 {
            0
        } else {
            u128::MAX << (width - bits.min(width))
        }
    };
    match (a, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let m = mask(32) & u128::from(u32::MAX);
            u128::from(u32::from(a)) & m == u128::from(u32::from(n)) & m
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let m = mask(128);
            u128::from(a) & m == u128::from(n) & m
        }
        _ => false,
    }
}

/// `host` and `port` of `host:port` (`[v6]:port` too); no port: `None`.
fn split_host_port(s: &str) -> (&str, Option<u16>) {
    if let Some(rest) = s.strip_prefix('[')
        && let Some((host, tail)) = rest.split_once(']')
    {
        return (host, tail.strip_prefix(':').and_then(|p| p.parse().ok()));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p.parse().ok()),
        _ => (s, None),
    }
}

/// The proxy settings of an etcd store whose endpoints are `endpoints`:
/// the proxy, when one is named, and `NO_PROXY`. A proxy URL this client
/// cannot use is an error only when some endpoint is not in `NO_PROXY`
/// (when all are, it is only a fallback: none).
///
/// # Errors
/// [`Error::Usage`] for a proxy URL this client cannot use, naming its
/// variable (never its credentials).
pub(super) fn from_vars(vars: &Vars, endpoints: &[String]) -> Result<(Option<Proxy>, NoProxy)> {
    let no_proxy = [var::NO_PROXY, var::NO_PROXY_LOWER]
        .iter()
        .find_map(|k| vars.get(k))
        .map(NoProxy::parse)
        .unwrap_or_default();
    let named = [
        var::HTTPS_PROXY,
        var::HTTPS_PROXY_LOWER,
        var::ALL_PROXY,
        var::ALL_PROXY_LOWER,
    ]
    .into_iter()
    .find_map(|k| vars.get(k).map(|v| (k, v)));
    let Some((from, url)) = named else {
        return Ok((None, no_proxy));
    };
    match parse_proxy(from, url) {
        Ok(p) => Ok((Some(p), no_proxy)),
        Err(_) if endpoints.iter().all(|e| no_proxy.bypasses(e)) => Ok((None, no_proxy)),
        Err(e) => Err(e),
    }
}

/// Parses the proxy URL `url` that variable `from` holds.
fn parse_proxy(from: &'static str, url: &str) -> Result<Proxy> {
    let bad = |why: &str| {
        Error::Usage(format!(
            "{from} names a proxy the etcd client cannot use: {why}; give an HTTP proxy as \
             http://[user:password@]host:port, or list the etcd hosts in NO_PROXY"
        ))
    };
    let rest = match url.split_once("://") {
        None => url,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "its scheme is {scheme:?} (only http:// CONNECT proxies are supported)"
            )));
        }
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, port) = split_host_port(hostport);
    let has_port = hostport.ends_with(']') || !hostport.contains(':') || port.is_some();
    if host.is_empty() || !has_port {
        return Err(bad("it has no host, or a bad port"));
    }
    let port = port.unwrap_or(80);
    let addr = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let auth = userinfo.map(|u| {
        let (user, password) = u.split_once(':').unwrap_or((u, ""));
        let plain = format!("{}:{}", percent_decode(user), percent_decode(password));
        base64(plain.as_bytes())
    });
    Ok(Proxy {
        shown: format!("http://{addr}"),
        addr,
        auth,
        from,
    })
}

/// `%XX` escapes decoded (user names and passwords in URLs carry them).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Standard base64, padded (RFC 4648), for `Proxy-Authorization: Basic`.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&'static str, &str)]) -> Vars {
        pairs
            .iter()
            .fold(Vars::default(), |v, (k, val)| v.with(k, val))
    }

    #[test]
    fn base64_is_rfc_4648() {
        for (plain, coded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("user:p@ss", "dXNlcjpwQHNz"),
        ] {
            assert_eq!(base64(plain.as_bytes()), coded, "{plain}");
        }
    }

    #[test]
    fn proxy_urls() {
        let p = parse_proxy(var::HTTPS_PROXY, "http://u%40x:p%3Aw@proxy.corp:3128/").unwrap();
        assert_eq!(p.addr, "proxy.corp:3128");
        assert_eq!(p.shown, "http://proxy.corp:3128");
        assert_eq!(p.auth.as_deref(), Some(base64(b"u@x:p:w").as_str()));
        assert!(!format!("{p:?}").contains(&base64(b"u@x:p:w")));
        let p = parse_proxy(var::HTTPS_PROXY, "localhost:8080").unwrap();
        assert_eq!((p.addr.as_str(), p.auth), ("localhost:8080", None));
        assert_eq!(
            parse_proxy(var::HTTPS_PROXY, "http://h").unwrap().addr,
            "h:80"
        );
        assert_eq!(
            parse_proxy(var::HTTPS_PROXY, "http://[::1]:3128")
                .unwrap()
                .addr,
            "[::1]:3128"
        );
        for bad in [
            "socks5://h:1080",
            "https://h:443",
            "http://:80",
            "http://h:x",
        ] {
            let e = parse_proxy(var::ALL_PROXY, bad).unwrap_err();
            assert!(
                matches!(&e, Error::Usage(m) if m.contains("ALL_PROXY")),
                "{bad}: {e:?}"
            );
        }
        let e = parse_proxy(var::HTTPS_PROXY, "socks5://user:secret@h:1").unwrap_err();
        assert!(!e.to_string().contains("secret"));
    }

    #[test]
    fn no_proxy_forms() {
        let n = NoProxy::parse(
            "etcd.example.org, .corp.net,other.org:2379 10.1.2.3,[::1]:2379,192.168.0.0/16,::2,bad/x",
        );
        for (ep, direct) in [
            ("etcd.example.org:2379", true),
            ("a.etcd.example.org:2379", true),
            ("xetcd.example.org:2379", false),
            ("corp.net:1", true),
            ("db.corp.net:1", true),
            ("other.org:2379", true),
            ("other.org:2380", false),
            ("10.1.2.3:2379", true),
            ("10.1.2.4:2379", false),
            ("[::1]:2379", true),
            ("[::1]:2380", false),
            ("[::2]:1", true),
            ("192.168.7.7:2379", true),
            ("127.0.0.1:2379", false),
            ("localhost:2379", false),
        ] {
            assert_eq!(n.bypasses(ep), direct, "{ep}");
        }
        assert!(NoProxy::parse("*").bypasses("anything:1"));
        assert!(NoProxy::parse("EXAMPLE.org").bypasses("Etcd.Example.ORG:1"));
        assert!(
            !NoProxy::default().bypasses("127.0.0.1:2379"),
            "loopback is proxied"
        );
    }

    #[test]
    fn the_variables_in_order_and_no_proxy_for_every_endpoint() {
        let eps = vec!["127.0.0.1:2379".to_owned()];
        let (p, _) = from_vars(
            &vars(&[
                (var::ALL_PROXY, "http://all:1"),
                (var::HTTPS_PROXY_LOWER, "http://lower:1"),
            ]),
            &eps,
        )
        .unwrap();
        assert_eq!(p.unwrap().shown, "http://lower:1");
        let (p, _) = from_vars(&vars(&[(var::ALL_PROXY_LOWER, "all:2")]), &eps).unwrap();
        assert_eq!(p.unwrap().from, var::ALL_PROXY_LOWER);
        // Every endpoint reached directly: a proxy this client cannot use is no error.
        let (p, _) = from_vars(
            &vars(&[
                (var::HTTPS_PROXY, "socks5://x:1"),
                (var::NO_PROXY_LOWER, "127.0.0.1"),
            ]),
            &eps,
        )
        .unwrap();
        assert!(p.is_none());
        assert!(from_vars(&vars(&[(var::HTTPS_PROXY, "socks5://x:1")]), &eps).is_err());
        assert_eq!(from_vars(&Vars::default(), &eps).unwrap().0, None);
    }
}
