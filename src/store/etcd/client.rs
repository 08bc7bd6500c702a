//! A small etcd v3 client: one gRPC channel to one endpoint, the handful of
//! calls the store makes, and the request builders it needs.
//!
//! The protocol code (`proto.rs`) is generated ahead of time from
//! `proto/etcd.proto` (see `tests/integration/generated.rs`), so building needs no protoc.
//! tonic carries the calls (HTTP/2, TLS by rustls); this module adds what
//! etcd expects on top: the `token` header after `Authenticate` when a user
//! is configured, and `hasleader` so that a member cut off from its cluster
//! refuses at once instead of hanging. Endpoint choice, retries and the
//! command's deadline belong to the store (`super`).

use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::proto::{
    self, AuthenticateRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseGrantResponse,
    LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest, RangeResponse, RequestOp,
    TxnRequest, TxnResponse, auth_client::AuthClient, kv_client::KvClient,
    lease_client::LeaseClient,
};
use super::proxy::Proxy;
use super::tunnel::{self, Tunnel, TunnelFailure};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum CallFailure {
    /// The server (or tonic on its behalf) answered with a gRPC status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// No connection could be made or kept.
    #[error("{}", chain(.0))]
    Transport(#[from] tonic::transport::Error),
    /// The proxy could not be reached, or refused to tunnel to the endpoint.
    #[error("{0}")]
    Tunnel(TunnelFailure),
    /// An endpoint in `NO_PROXY` could be reached neither directly nor
    /// through the proxy.
    #[error("{direct}; through the proxy: {proxied}")]
    Fallback {
        /// Why the direct connection failed.
        direct: String,
        /// Why the one through the proxy failed.
        proxied: String,
    },
}

/// An error and its sources, one after the other ("transport error: tcp
/// connect error: Connection refused").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let part = s.to_string();
        if !text.ends_with(&part) {
            text = format!("{text}: {part}");
        }
        cur = s.source();
    }
    text
}

impl CallFailure {
    /// Is this worth trying on another endpoint? Everything but an answer
    /// that another member would give just the same (bad request, denied).
    #[must_use]
    pub(super) fn retryable(&self) -> bool {
        use tonic::Code;
        match self {
            // tonic reports its own request timeout as Cancelled.
            Self::Status(s) => matches!(
                s.code(),
                Code::Unknown
                    | Code::Cancelled
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::Unavailable
            ),
            Self::Transport(_) | Self::Fallback { .. } => true,
            Self::Tunnel(t) => t.retryable(),
        }
    }
}

/// TLS material and credentials, read once per process.
#[derive(Debug, Clone, Default)]
pub(super) struct Security {
    /// TLS on (`etcds://`), with an optional CA and client identity (PEM).
    pub tls: Option<Tls>,
    /// User and password for etcd's `Authenticate`.
    pub user: Option<(String, String)>,
}

/// TLS settings of a connection.
#[derive(Debug, Clone, Default)]
pub(super) struct Tls {
    /// PEM CA bundle that signed the members' certificates.
    pub ca: Option<Vec<u8>>,
    /// PEM client certificate and key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Adds etcd's headers to every request.
#[derive(Clone)]
pub(super) struct Headers {
    token: Option<AsciiMetadataValue>,
}

impl Interceptor for Headers {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let md = req.metadata_mut();
        md.insert("hasleader", MetadataValue::from_static("true"));
        if let Some(t) = &self.token {
            md.insert("token", t.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Headers>;

/// A connection to one etcd member.
#[derive(Clone)]
pub(super) struct Client {
    kv: KvClient<Svc>,
    lease: LeaseClient<Svc>,
}

impl Client {
    /// Connects to `host:port` (through `proxy`, when given: SPEC §8) and
    /// authenticates when a user is configured. `call_timeout` bounds each
    /// request on this connection.
    ///
    /// # Errors
    /// The connection or authentication failed.
    pub(super) async fn connect(
        host_port: &str,
        security: &Security,
        proxy: Option<&Proxy>,
        connect_timeout: Duration,
        call_timeout: Duration,
    ) -> Result<Self, CallFailure> {
        let scheme = if security.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{host_port}"))?
            .connect_timeout(connect_timeout)
            .timeout(call_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = &security.tls {
            let mut cfg = ClientTlsConfig::new();
            if let Some(ca) = &tls.ca {
                cfg = cfg.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &tls.identity {
                cfg = cfg.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(cfg)?;
        }
        let channel = match proxy {
            None => endpoint.connect().await?,
            Some(p) => {
                let tunnel = Tunnel {
                    proxy: Arc::new(p.clone()),
                    target: host_port.to_owned(),
                };
                endpoint.connect_with_connector(tunnel).await.map_err(|e| {
                    match tunnel::find(&e) {
                        Some(t) => CallFailure::Tunnel(t),
                        None => CallFailure::Transport(e),
                    }
                })?
            }
        };
        let token = match &security.user {
            None => None,
            Some((name, password)) => {
                let resp = AuthClient::new(channel.clone())
                    .authenticate(AuthenticateRequest {
                        name: name.clone(),
                        password: password.clone(),
                    })
                    .await?
                    .into_inner();
                Some(resp.token.parse::<AsciiMetadataValue>().map_err(|_| {
                    tonic::Status::unauthenticated("etcd returned an unusable auth token")
                })?)
            }
        };
        let headers = Headers { token };
        Ok(Self {
            kv: KvClient::with_interceptor(channel.clone(), headers.clone()),
            lease: LeaseClient::with_interceptor(channel, headers),
        })
    }

    /// `Range`: reads keys.
    ///
    /// # Errors
    /// The call failed.
    pub(super) async fn range(&mut self, req: RangeRequest) -> Result<RangeResponse, CallFailure> {
        Ok(self.kv.range(req).await?.into_inner())
    }

    /// `Txn`: compares, then applies `success` or `failure` ops atomically.
    ///
    /// # Errors
    /// The call failed (its outcome is then unknown).
    pub(super) async fn txn(&mut self, req: TxnRequest) -> Result<TxnResponse, CallFailure> {
        Ok(self.kv.txn(req).await?.into_inner())
    }

    /// `LeaseGrant` of `ttl` seconds (the cluster may raise it to its minimum).
    ///
    /// # Errors
    /// The call failed.
    pub(super) async fn lease_grant(
        &mut self,
        ttl: i64,
    ) -> Result<LeaseGrantResponse, CallFailure> {
        Ok(self
            .lease
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .await?
            .into_inner())
    }

    /// `LeaseRevoke`: ends a lease and deletes the keys attached to it.
    ///
    /// # Errors
    /// The call failed.
    pub(super) async fn lease_revoke(&mut self, id: i64) -> Result<(), CallFailure> {
        self.lease.lease_revoke(LeaseRevokeRequest { id }).await?;
        Ok(())
    }

    /// `LeaseTimeToLive`: the lease's remaining seconds as the cluster
    /// counts them (truncated to a whole second; -1 when it is gone), and the
    /// TTL it was granted with.
    ///
    /// # Errors
    /// The call failed.
    pub(super) async fn lease_ttl(&mut self, id: i64) -> Result<(i64, i64), CallFailure> {
        let r = self
            .lease
            .lease_time_to_live(LeaseTimeToLiveRequest { id, keys: false })
            .await?
            .into_inner();
        Ok((r.ttl, r.granted_ttl))
    }
}

/// The first key past every key that starts with `prefix`.
#[must_use]
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// A read of one key (every range request carries a limit: no answer
/// can grow with the store, SPEC §8).
#[must_use]
pub(super) fn get(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec(),
        limit: 1,
        ..RangeRequest::default()
    }
}

/// A read of the first `limit` keys under `prefix` (a page: `limit` is at
/// least 1, so no answer can grow with the store).
#[must_use]
pub(super) fn get_prefix(prefix: &str, limit: i64) -> RangeRequest {
    RangeRequest {
        key: prefix.as_bytes().to_vec(),
        range_end: prefix_end(prefix.as_bytes()),
        limit: limit.max(1),
        ..RangeRequest::default()
    }
}

/// `key`'s `target` equals `value`.
fn equal(
    key: &str,
    target: proto::compare::CompareTarget,
    value: proto::compare::TargetUnion,
) -> Compare {
    Compare {
        result: proto::compare::CompareResult::Equal.into(),
        target: target.into(),
        key: key.as_bytes().to_vec(),
        target_union: Some(value),
        range_end: Vec::new(),
    }
}

/// Compares the key's create revision (0: the key does not exist).
#[must_use]
pub(super) fn created_at(key: &str, revision: i64) -> Compare {
    use proto::compare::{CompareTarget, TargetUnion};
    equal(
        key,
        CompareTarget::Create,
        TargetUnion::CreateRevision(revision),
    )
}

/// Compares the key's last modification revision.
#[must_use]
pub(super) fn modified_at(key: &str, revision: i64) -> Compare {
    use proto::compare::{CompareTarget, TargetUnion};
    equal(key, CompareTarget::Mod, TargetUnion::ModRevision(revision))
}

/// A put inside a transaction (`lease` 0: none).
#[must_use]
pub(super) fn put(key: impl Into<Vec<u8>>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(proto::request_op::Request::RequestPut(PutRequest {
            key: key.into(),
            value,
            lease,
            prev_kv: false,
        })),
    }
}

/// A delete of one key inside a transaction.
#[must_use]
pub(super) fn delete(key: impl Into<Vec<u8>>) -> RequestOp {
    RequestOp {
        request: Some(proto::request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.into(),
                range_end: Vec::new(),
                prev_kv: false,
            },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_read_carries_a_limit() {
        assert_eq!(get("/p/locks/a").limit, 1);
        assert_eq!(get_prefix("/p/", 100).limit, 100);
        assert_eq!(get_prefix("/p/", 0).limit, 1, "never unlimited");
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn timeouts_and_unavailability_are_retried_denials_are_not() {
        for code in [
            tonic::Code::Cancelled,
            tonic::Code::DeadlineExceeded,
            tonic::Code::Unavailable,
        ] {
            assert!(CallFailure::Status(tonic::Status::new(code, "x")).retryable());
        }
        for code in [
            tonic::Code::PermissionDenied,
            tonic::Code::InvalidArgument,
            tonic::Code::Unauthenticated,
        ] {
            assert!(!CallFailure::Status(tonic::Status::new(code, "x")).retryable());
        }
    }
}
