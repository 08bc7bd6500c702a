//! The etcd client through an HTTP CONNECT proxy (SPEC §8): `HTTPS_PROXY`
//! (`https_proxy`, `ALL_PROXY`, `all_proxy`), credentials in the proxy URL
//! as `Proxy-Authorization: Basic`, `NO_PROXY` in each of its forms, a
//! proxy that refuses (`store_unavailable` at once, naming the proxy and
//! never its password) or is not there (within the time bound), an
//! endpoint in `NO_PROXY` that cannot be reached directly (tried through
//! the proxy, as the sandbox needs), and TLS
//! through the tunnel with names checked against the etcd endpoint, never
//! the proxy. The proxy is this test's: a thread that accepts, reads the
//! `CONNECT`, counts it and pipes bytes both ways. Loopback endpoints go
//! through it too, as inside the agent's sandbox.
//!
//! Needs `SKILL_LOCK_TEST_ETCD=host:port` (plain text); the TLS half starts
//! its own node (etcd and openssl). Skipped visibly without them, a failure
//! under `SKILL_LOCK_TEST_ETCD_REQUIRED`.
//!
//! Covers: SPEC §8.

use crate::harness;

use harness::TestEnv;
use harness::chaos::{self, Tuning};
use harness::{Lock, Reply};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the test proxy answers a `CONNECT`.
#[derive(Clone)]
enum Answer {
    /// 200, when the request carries `Proxy-Authorization: Basic <this>`
    /// (None: whatever it carries); 407 otherwise.
    Tunnel(Option<String>),
    /// 403 Forbidden, always.
    Forbid,
}

/// An HTTP CONNECT proxy on loopback.
struct ConnectProxy {
    port: u16,
    /// CONNECTs it was sent.
    connects: Arc<AtomicUsize>,
    /// Their targets (`host:port`).
    targets: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    fn start(answer: Answer) -> Self {
        Self::start_to(answer, None)
    }

    /// A proxy that tunnels every CONNECT to `to` when given, whatever its
    /// target (an endpoint only the proxy can reach, as inside the sandbox).
    fn start_to(answer: Answer, to: Option<String>) -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let connects = Arc::new(AtomicUsize::new(0));
        let targets = Arc::new(Mutex::new(Vec::new()));
        let (n, t) = (connects.clone(), targets.clone());
        std::thread::spawn(move || {
            for client in l.incoming().flatten() {
                let (n, t, answer, to) = (n.clone(), t.clone(), answer.clone(), to.clone());
                std::thread::spawn(move || serve(client, &answer, to.as_deref(), &n, &t));
            }
        });
        Self {
            port,
            connects,
            targets,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn count(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

/// One client of the proxy: its request head, the answer, then the pipe.
fn serve(
    mut client: TcpStream,
    answer: &Answer,
    to: Option<&str>,
    n: &AtomicUsize,
    t: &Mutex<Vec<String>>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
        if client.read_exact(&mut byte).is_err() {
            return;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let (Some("CONNECT"), Some(target)) = (first.next(), first.next()) else {
        let _ = client.write_all(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n");
        return;
    };
    n.fetch_add(1, Ordering::SeqCst);
    t.lock().unwrap().push(target.to_owned());
    let host_ok = lines.clone().any(|l| l == format!("Host: {target}"));
    let auth = lines.find_map(|l| l.strip_prefix("Proxy-Authorization: Basic "));
    let refusal: Option<&[u8]> = match answer {
        Answer::Forbid => Some(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"),
        Answer::Tunnel(want) if want.is_some() && auth != want.as_deref() => {
            Some(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
        }
        Answer::Tunnel(_) if !host_ok => Some(b"HTTP/1.1 400 No Host\r\n\r\n"),
        Answer::Tunnel(_) => None,
    };
    if let Some(r) = refusal {
        let _ = client.write_all(r);
        return;
    }
    let Ok(server) = TcpStream::connect(to.unwrap_or(target)) else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
        return;
    };
    let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\nVia: test\r\n\r\n");
    let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut s2);
        let _ = s2.shutdown(Shutdown::Write);
    });
    let (mut server, mut client) = (server, client);
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(Shutdown::Write);
}

/// The lock `skill --repo o/r` in `url`, from `cwd`, every command run with `env`.
fn lock_with(cwd: &Path, skill: &str, url: &str, env: &[(&str, &str)]) -> Lock {
    let lock = Lock::new(cwd, skill, "o/r").in_store(url);
    env.iter().fold(lock, |l, (k, v)| l.with_env(k, v))
}

#[test]
fn every_command_works_through_a_connect_proxy_with_credentials() {
    let test = "every_command_works_through_a_connect_proxy_with_credentials";
    let Some(ep) = harness::etcd_endpoint(test) else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    // "user:p@ss w" as Basic credentials.
    let proxy = ConnectProxy::start(Answer::Tunnel(Some("dXNlcjpwQHNzIHc=".into())));
    let via = format!("http://user:p%40ss%20w@127.0.0.1:{}/", proxy.port);
    let url = format!("etcd://{ep}{}", harness::etcd_prefix(&env, "proxy"));
    let at = |env: &[(&str, &str)]| lock_with(&cwd, "tunnel", &url, env);
    let lock = at(&[("HTTPS_PROXY", via.as_str())]);
    let token = lock
        .op("acquire")
        .note("via proxy")
        .reply()
        .token()
        .to_owned();
    assert!(matches!(lock.status(), Reply::Status { state, .. } if state == "held"));
    assert!(matches!(lock.check(&token), Reply::Held { .. }));
    assert!(matches!(lock.renew(&token), Reply::Renewed { .. }));
    let listed = lock.list();
    assert!(
        matches!(&listed, Reply::List { locks, .. } if locks.len() == 1),
        "{listed:?}"
    );
    let history = lock.store_history();
    assert!(matches!(&history, Reply::History { events, .. } if !events.is_empty()));
    let before = proxy.count();
    assert!(
        before >= 6,
        "the proxy saw {before} CONNECTs for six commands"
    );
    // The other variables name it just the same.
    let plain = proxy_without_credentials();
    for var in ["https_proxy", "ALL_PROXY", "all_proxy"] {
        let seen = plain.count();
        let r = at(&[(var, &plain.url())]).status();
        assert!(matches!(r, Reply::Status { .. }), "{var}: {r:?}");
        assert_eq!(plain.count(), seen + 1, "{var} was not used");
    }
    assert!(matches!(lock.release(&token), Reply::Released { .. }));
    let targets = proxy.targets.lock().unwrap().clone();
    assert!(
        targets.iter().all(|t| *t == ep),
        "CONNECT targets: {targets:?}"
    );
    // Without the credentials the proxy says 407: the command fails, naming it.
    let no_auth = at(&[("HTTPS_PROXY", &proxy.url())]).status();
    let Reply::Error { error, message, .. } = no_auth else {
        panic!("{no_auth:?}")
    };
    assert_eq!(error, "store_unavailable");
    assert!(
        message.contains("407") && message.contains(&proxy.url()),
        "{message}"
    );
}

fn proxy_without_credentials() -> ConnectProxy {
    ConnectProxy::start(Answer::Tunnel(None))
}

#[test]
fn no_proxy_forms_reach_the_endpoint_directly() {
    let Some(ep) = harness::etcd_endpoint("no_proxy_forms_reach_the_endpoint_directly") else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let proxy = proxy_without_credentials();
    let prefix = harness::etcd_prefix(&env, "proxy");
    let port = ep.rsplit_once(':').unwrap().1.to_owned();
    let by_ip = format!("etcd://127.0.0.1:{port}{prefix}");
    let by_name = format!("etcd://localhost:{port}{prefix}");
    let port_rule = format!("127.0.0.1:{port}");
    for (url, no_proxy, direct) in [
        (&by_ip, "*", true),
        (&by_ip, "127.0.0.1", true),
        (&by_ip, port_rule.as_str(), true),
        (&by_ip, "example.org, 127.0.0.0/8", true),
        (&by_name, "localhost", true),
        (&by_name, ".localhost", true),
        (&by_name, "example.org,LOCALHOST", true),
        (&by_ip, "127.0.0.2,example.org,127.0.0.1:1", false),
        (&by_name, "127.0.0.1", false),
        (&by_ip, "", false),
    ] {
        let seen = proxy.count();
        for var in ["NO_PROXY", "no_proxy"] {
            let env = [("HTTPS_PROXY", proxy.url()), (var, no_proxy.to_owned())];
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let r = lock_with(&cwd, "direct", url, &env).status();
            assert!(
                matches!(r, Reply::Status { .. }),
                "{url} {var}={no_proxy:?}: {r:?}"
            );
        }
        let through = proxy.count() - seen;
        assert_eq!(
            through,
            if direct { 0 } else { 2 },
            "{url} with NO_PROXY={no_proxy:?}"
        );
    }
}

/// An endpoint in `NO_PROXY` that cannot be reached directly (nothing
/// listens there, as for loopback inside the sandbox, whose runtime lists
/// loopback in `NO_PROXY`) is tried through the proxy.
#[test]
fn a_no_proxy_endpoint_unreachable_directly_is_tried_through_the_proxy() {
    let test = "a_no_proxy_endpoint_unreachable_directly_is_tried_through_the_proxy";
    let Some(ep) = harness::etcd_endpoint(test) else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let nothing_here = closed.local_addr().unwrap().to_string();
    drop(closed);
    let proxy = ConnectProxy::start_to(Answer::Tunnel(None), Some(ep));
    let url = format!(
        "etcd://{nothing_here}{}",
        harness::etcd_prefix(&env, "proxy")
    );
    let via = proxy.url();
    let e = [
        ("HTTPS_PROXY", via.as_str()),
        ("NO_PROXY", "localhost,127.0.0.1,::1,10.0.0.0/8"),
    ];
    let lock = lock_with(&cwd, "fallback", &url, &e);
    let token = lock.acquire().token().to_owned();
    assert!(matches!(lock.release(&token), Reply::Released { .. }));
    assert_eq!(proxy.count(), 2, "one tunnel per command");
    let targets = proxy.targets.lock().unwrap().clone();
    assert!(targets.iter().all(|t| *t == nothing_here), "{targets:?}");
}

#[test]
fn a_proxy_that_refuses_or_is_not_there_is_store_unavailable_naming_it() {
    let test = "a_proxy_that_refuses_or_is_not_there_is_store_unavailable_naming_it";
    let Some(ep) = harness::etcd_endpoint(test) else {
        return;
    };
    let env = TestEnv::new();
    let cwd = env.git_repo("repo");
    let url = format!("etcd://{ep}{}", harness::etcd_prefix(&env, "proxy"));
    let at = |env: &[(&str, &str)]| lock_with(&cwd, "refused", &url, env);
    let forbid = ConnectProxy::start(Answer::Forbid);
    let with_secret = format!("http://me:hunter2@127.0.0.1:{}", forbid.port);
    // Refused: a definite answer, at once (the timeout is 5 s).
    let began = Instant::now();
    let r = at(&[("HTTPS_PROXY", &with_secret)]).acquire();
    let took = began.elapsed();
    let Reply::Error { error, message, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(error, "store_unavailable", "{message}");
    assert!(took < Duration::from_secs(2), "a refusal took {took:?}");
    assert!(
        message.contains(&forbid.url()) && message.contains("403") && message.contains("NO_PROXY"),
        "{message}"
    );
    assert!(
        !message.contains("hunter2"),
        "the password leaked: {message}"
    );
    assert!(forbid.count() >= 1);
    // Not there: within the time bound, naming it.
    let gone = TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere = format!("http://127.0.0.1:{}", gone.local_addr().unwrap().port());
    drop(gone);
    let began = Instant::now();
    let r = at(&[("HTTPS_PROXY", &nowhere), ("SKILL_LOCK_ETCD_TIMEOUT", "2")]).status();
    let took = began.elapsed();
    let Reply::Error { error, message, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(error, "store_unavailable", "{message}");
    assert!(message.contains(&nowhere), "{message}");
    assert!(
        took < Duration::from_secs(4),
        "an absent proxy took {took:?}"
    );
    // A proxy URL this client cannot use is a usage error naming its variable.
    let r = at(&[("ALL_PROXY", "socks5://me:hunter2@h:1")]).status();
    let Reply::Error { error, message, .. } = r else {
        panic!("{r:?}")
    };
    assert_eq!(error, "usage", "{message}");
    assert!(
        message.contains("ALL_PROXY") && !message.contains("hunter2"),
        "{message}"
    );
}

#[test]
fn tls_through_the_proxy_checks_the_endpoints_name_not_the_proxys() {
    let test = "tls_through_the_proxy_checks_the_endpoints_name_not_the_proxys";
    if !harness::have_programs(test, &[("etcd", "--version"), ("openssl", "version")]) {
        return;
    }
    let env = TestEnv::new();
    let pki = env.dir("pki");
    crate::etcd_tls::make_pki(&pki);
    let p = |f: &str| pki.join(f).display().to_string();
    let tuning = Tuning {
        heartbeat_ms: 10,
        election_ms: 100,
    };
    let base = chaos::free_block(33600, &[1, 11]);
    let endpoint = format!("127.0.0.1:{}", base + 1);
    let mut etcd = chaos::member(
        &env.path("data"),
        0,
        &[format!("https://{endpoint}")],
        &[base + 11],
        tuning,
    )
    .args([
        "--cert-file",
        &p("server.pem"),
        "--key-file",
        &p("server.key"),
    ])
    .spawn()
    .unwrap();
    let cwd = env.dir("w");
    let proxy = proxy_without_credentials();
    let (via, ca) = (proxy.url(), p("ca.pem"));
    let e = [
        ("HTTPS_PROXY", via.as_str()),
        ("SKILL_LOCK_ETCD_CA", ca.as_str()),
        ("SKILL_LOCK_ETCD_TIMEOUT", "3"),
    ];
    let lock = lock_with(&cwd, "tls", &format!("etcds://{endpoint}"), &e);
    let start = Instant::now();
    let token = loop {
        match lock.acquire() {
            r @ Reply::Acquired { .. } => break r.token().to_owned(),
            r => assert!(
                start.elapsed() < Duration::from_secs(20),
                "TLS through the proxy never worked: {r:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(matches!(lock.check(&token), Reply::Held { .. }));
    let targets = proxy.targets.lock().unwrap().clone();
    assert!(
        targets.iter().all(|t| *t == endpoint),
        "CONNECT targets: {targets:?}"
    );
    // The certificate names 127.0.0.1 (the proxy's address too), not
    // localhost: reached as localhost the endpoint is refused, so the name
    // checked is the endpoint's, never the proxy's.
    let by_name = lock_with(&cwd, "tls", &format!("etcds://localhost:{}", base + 1), &e);
    let seen = proxy.count();
    let r = by_name.status();
    assert!(
        matches!(&r, Reply::Error { error, .. } if error == "store_unavailable"),
        "{r:?}"
    );
    assert!(
        proxy.count() > seen,
        "the refused attempt did go through the proxy"
    );
    assert!(matches!(lock.release(&token), Reply::Released { .. }));
    let _ = etcd.kill();
    let _ = etcd.wait();
}
