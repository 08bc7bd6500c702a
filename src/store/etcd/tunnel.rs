//! The tunnel through an HTTP CONNECT proxy (SPEC §8): TCP to the proxy,
//! `CONNECT host:port HTTP/1.1` with `Host:` (and `Proxy-Authorization:
//! Basic` when the proxy URL carries credentials), the answer's status line
//! and headers read up to their blank line, bounded, one byte at a time (so
//! nothing the etcd member sends after them is taken from the stream), then
//! the stream handed to tonic, which speaks TLS (`etcds://`: names and
//! certificates checked against the endpoint, never the proxy) and HTTP/2
//! over it as over a direct connection. The caller bounds the time.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;

use super::proxy::Proxy;

/// The longest proxy answer (status line and headers) read.
const ANSWER_LIMIT: usize = 16 * 1024;

/// Why the tunnel could not be opened: names the proxy, never its credentials.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum TunnelFailure {
    /// The proxy could not be reached (or closed the connection).
    #[error("cannot reach the proxy {proxy} (from {var}): {why}")]
    Unreachable {
        proxy: String,
        var: &'static str,
        why: String,
    },
    /// The proxy answered, but not with a 2xx: it will not tunnel there.
    #[error("the proxy {proxy} (from {var}) refused CONNECT {target}: {status}")]
    Refused {
        proxy: String,
        var: &'static str,
        target: String,
        status: String,
    },
}

impl TunnelFailure {
    /// Is it worth trying again (the proxy may come back), or a definite no?
    #[must_use]
    pub(super) fn retryable(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// The `CONNECT` request for `target` (`host:port`).
fn request(proxy: &Proxy, target: &str) -> String {
    let auth = proxy
        .auth
        .as_ref()
        .map(|a| format!("Proxy-Authorization: Basic {a}\r\n"))
        .unwrap_or_default();
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n")
}

/// The status line of a proxy's answer, when it is a 2xx: `Ok`; otherwise
/// the line as printed in the error (printable, bounded).
fn judge_status(answer: &[u8]) -> Result<(), String> {
    let line = answer.split(|b| *b == b'\n').next().unwrap_or_default();
    let shown: String = String::from_utf8_lossy(line)
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    let mut words = shown.split_whitespace();
    match (words.next(), words.next()) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") && code.len() == 3 => {
            if code.starts_with('2') {
                Ok(())
            } else {
                Err(shown)
            }
        }
        _ => Err(format!("not an HTTP answer: {shown:?}")),
    }
}

/// Opens a tunnel to `target` through `proxy`.
pub(super) async fn open(proxy: &Proxy, target: &str) -> Result<TcpStream, TunnelFailure> {
    let unreachable = |why: String| TunnelFailure::Unreachable {
        proxy: proxy.shown.clone(),
        var: proxy.from,
        why,
    };
    let mut s = TcpStream::connect(&proxy.addr)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = s.set_nodelay(true);
    s.write_all(request(proxy, target).as_bytes())
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") && !answer.ends_with(b"\n\n") {
        if answer.len() >= ANSWER_LIMIT {
            return Err(unreachable(format!(
                "its answer to CONNECT has no end in {ANSWER_LIMIT} bytes"
            )));
        }
        let byte = s.read_u8().await.map_err(|e| {
            unreachable(format!(
                "it closed the connection before answering CONNECT ({e})"
            ))
        })?;
        answer.push(byte);
    }
    judge_status(&answer).map_err(|status| TunnelFailure::Refused {
        proxy: proxy.shown.clone(),
        var: proxy.from,
        target: target.to_owned(),
        status,
    })?;
    Ok(s)
}

/// A tonic connector that reaches one endpoint through the proxy.
#[derive(Clone)]
pub(super) struct Tunnel {
    pub(super) proxy: Arc<Proxy>,
    /// The endpoint, `host:port` as the store URL gives it.
    pub(super) target: String,
}

impl Service<Uri> for Tunnel {
    type Response = TokioIo<TcpStream>;
    type Error = TunnelFailure;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (proxy, target) = (self.proxy.clone(), self.target.clone());
        Box::pin(async move { open(&proxy, &target).await.map(TokioIo::new) })
    }
}

/// The tunnel failure somewhere in `e`'s chain of sources, if any.
pub(super) fn find(e: &(dyn std::error::Error + 'static)) -> Option<TunnelFailure> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<TunnelFailure>() {
            return Some(t.clone());
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_endpoint_and_carries_the_credentials() {
        let p = Proxy {
            addr: "p:3128".into(),
            auth: Some("dTpw".into()),
            shown: "http://p:3128".into(),
            from: "HTTPS_PROXY",
        };
        assert_eq!(
            request(&p, "[::1]:2379"),
            "CONNECT [::1]:2379 HTTP/1.1\r\nHost: [::1]:2379\r\nProxy-Authorization: Basic dTpw\r\n\r\n"
        );
    }

    #[test]
    fn only_a_2xx_answer_opens_the_tunnel() {
        assert!(judge_status(b"HTTP/1.1 200 Connection established\r\n\r\n").is_ok());
        assert!(judge_status(b"HTTP/1.0 204 OK\r\n\r\n").is_ok());
        assert_eq!(
            judge_status(b"HTTP/1.1 403 Forbidden\r\nX: y\r\n\r\n"),
            Err("HTTP/1.1 403 Forbidden".into())
        );
        assert!(judge_status(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(judge_status(b"HTTP/1.1 2000 x\r\n\r\n").is_err());
    }
}
