//! Connections and deadlines: endpoints tried in order within one
//! command deadline, each with its own share of it, so a dead or hung
//! endpoint never fails a command another endpoint answers.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::client::{CallFailure, Client, Security};
use super::config::{EtcdConfig, security};
use crate::error::{Error, Result};

/// The cluster a store talks to: its configuration, the TLS material and
/// credentials (read once), the client runtime, and the connected client
/// with the index of its endpoint (connected lazily, on the first call).
#[derive(Clone)]
pub(super) struct Cluster {
    pub(super) config: EtcdConfig,
    security: Arc<Security>,
    runtime: Arc<tokio::runtime::Runtime>,
    client: Arc<Mutex<Option<(Client, usize)>>>,
}

/// The proxy refused to tunnel to every endpoint (SPEC §8: the sandbox's
/// proxy allows only the hosts it was told to).
fn proxy_refused(refused: &[Option<String>]) -> Error {
    let each: Vec<&str> = refused.iter().flatten().map(String::as_str).collect();
    Error::StoreUnavailable(format!(
        "{}; allow the etcd endpoints at the proxy (inside the agent's sandbox: its allowed \
         domains), or list them in NO_PROXY to reach them directly",
        each.join("; ")
    ))
}

pub(super) fn unavailable(what: impl std::fmt::Display) -> Error {
    Error::StoreUnavailable(format!(
        "etcd did not answer: {what}; check that the cluster is up and reachable, or raise SKILL_LOCK_ETCD_TIMEOUT"
    ))
}

impl Cluster {
    /// Reads the TLS files `config` names and starts the client runtime;
    /// connects nothing yet.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable TLS file; [`Error::Internal`] when no
    /// runtime can be built.
    pub(super) fn open(config: EtcdConfig) -> Result<Self> {
        let security = security(&config)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the etcd client runtime: {e}")))?;
        Ok(Self {
            config,
            security: Arc::new(security),
            runtime: Arc::new(runtime),
            client: Arc::new(Mutex::new(None)),
        })
    }

    /// Runs `work` to completion on the client runtime.
    pub(super) fn block_on<F: Future>(&self, work: F) -> F::Output {
        self.runtime.block_on(work)
    }

    /// The connected client, connecting to the first endpoint that answers
    /// (starting after `skip`, the one that just failed). An endpoint the
    /// proxy refused to tunnel to is a definite answer: not tried again in
    /// this command, and when the proxy refused every endpoint, the command
    /// fails at once.
    pub(super) async fn client(&self, deadline: Instant, skip: Option<usize>) -> Result<Client> {
        if skip.is_none()
            && let Ok(guard) = self.client.lock()
            && let Some((c, _)) = guard.as_ref()
        {
            return Ok(c.clone());
        }
        let n = self.config.endpoints.len();
        let start = skip.map_or(0, |i| i + 1);
        let mut last = String::from("no endpoint tried");
        let mut refused: Vec<Option<String>> = vec![None; n];
        for round in 0.. {
            for step in 0..n {
                let i = (start + step) % n;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    let also: Vec<&str> = refused.iter().flatten().map(String::as_str).collect();
                    return Err(unavailable(format!(
                        "{} (tried {})",
                        [vec![last.as_str()], also].concat().join("; "),
                        self.config.endpoints.join(", ")
                    )));
                }
                let ep = &self.config.endpoints[i];
                if refused[i].is_some() {
                    continue;
                }
                match self.connect_one(ep, left).await {
                    Ok(c) => {
                        if let Ok(mut g) = self.client.lock() {
                            *g = Some((c.clone(), i));
                        }
                        return Ok(c);
                    }
                    Err(Some(e @ CallFailure::Tunnel(_))) if !e.retryable() => {
                        refused[i] = Some(e.to_string());
                        if refused.iter().all(Option::is_some) {
                            return Err(proxy_refused(&refused));
                        }
                    }
                    Err(Some(e)) if !e.retryable() => {
                        return Err(Error::StoreUnavailable(format!(
                            "etcd at {} refused the connection: {e}; check the URL, TLS and credentials",
                            self.route(ep)
                        )));
                    }
                    Err(Some(e @ CallFailure::Tunnel(_))) => last = format!("{ep}: {e}"),
                    Err(Some(e)) => last = format!("{}: {e}", self.route(ep)),
                    Err(None) => last = format!("{}: timed out", self.route(ep)),
                }
            }
            // Every endpoint failed once; pause briefly (an election may be under way).
            let pause = Duration::from_millis(50 * (1 << round.min(4)));
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
        Err(unavailable(last))
    }

    /// One endpoint's connection: TCP (through the proxy, if it goes
    /// through one), the TLS handshake and authentication, all within one
    /// endpoint's share of the deadline, so an endpoint (or proxy) that
    /// accepts and then never answers is skipped. `Err(None)`: timed out.
    async fn connect_one(&self, ep: &str, left: Duration) -> Result<Client, Option<CallFailure>> {
        let budget = left.min(self.connect_budget());
        self.connect_within(ep, budget, self.call_budget()).await
    }

    /// [`Self::connect_one`] within `budget`, each request on the
    /// connection within `call`. An endpoint in `NO_PROXY` is reached
    /// directly; only when no direct connection can be opened at all
    /// (refused, no route: as inside the agent's sandbox, whose runtime
    /// lists loopback and the private networks in `NO_PROXY` while giving
    /// commands no network but its proxy) is it tried through the proxy,
    /// within what is left of `budget`.
    pub(super) async fn connect_within(
        &self,
        ep: &str,
        budget: Duration,
        call: Duration,
    ) -> Result<Client, Option<CallFailure>> {
        let began = Instant::now();
        let attempt = |proxy, budget| async move {
            let connect = Client::connect(ep, &self.security, proxy, budget, call);
            match tokio::time::timeout(budget, connect).await {
                Ok(r) => r.map_err(Some),
                Err(_) => Err(None),
            }
        };
        let first = attempt(self.config.proxy_for(ep), budget).await;
        match (first, self.config.fallback_for(ep)) {
            (Err(Some(CallFailure::Transport(direct))), Some(proxy)) => {
                let left = budget.saturating_sub(began.elapsed());
                attempt(Some(proxy), left).await.map_err(|second| {
                    Some(CallFailure::Fallback {
                        direct: CallFailure::Transport(direct).to_string(),
                        proxied: second.map_or_else(|| "timed out".into(), |e| e.to_string()),
                    })
                })
            }
            (first, _) => first,
        }
    }

    /// `ep`, and the proxy it is reached through, for messages.
    pub(super) fn route(&self, ep: &str) -> String {
        match self.config.proxy_for(ep) {
            Some(p) => format!("{ep} (through the proxy {})", p.shown),
            None => ep.to_owned(),
        }
    }

    /// The time one endpoint gets to connect: a second at most, and at
    /// most a quarter of the command's deadline (a quarter of a second at
    /// least), so a hung endpoint leaves time for the next one.
    pub(super) fn connect_budget(&self) -> Duration {
        (self.config.timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(1))
    }

    /// The time one request gets on a connection: two seconds at most, half
    /// the command's deadline at most.
    pub(super) fn call_budget(&self) -> Duration {
        (self.config.timeout / 2).min(Duration::from_secs(2))
    }

    pub(super) fn drop_client(&self) -> Option<usize> {
        self.client
            .lock()
            .ok()
            .and_then(|mut g| g.take().map(|(_, i)| i))
    }

    /// Runs `op` with a client, moving to the next endpoint on a retryable
    /// failure, until the deadline.
    pub(super) fn call<R, F, Fut>(&self, mut op: F) -> Result<R>
    where
        F: FnMut(Client, Instant) -> Fut,
        Fut: Future<Output = Result<R, CallError>>,
    {
        let deadline = Instant::now() + self.config.timeout;
        self.runtime.block_on(async {
            let mut skip = None;
            loop {
                let client = self.client(deadline, skip).await?;
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, op(client, deadline)).await {
                    Ok(Ok(r)) => return Ok(r),
                    Ok(Err(CallError::Fatal(e))) => return Err(e),
                    Ok(Err(CallError::Etcd(e))) if !e.retryable() => {
                        return Err(Error::StoreUnavailable(format!(
                            "etcd refused the request: {e}"
                        )));
                    }
                    Ok(Err(CallError::Etcd(_))) | Err(_) => {
                        if Instant::now() >= deadline {
                            return Err(unavailable(format!(
                                "none of {} answered in time",
                                self.config.endpoints.join(", ")
                            )));
                        }
                        skip = self.drop_client();
                    }
                }
            }
        })
    }
}

/// Why one attempt of a call failed.
pub(super) enum CallError {
    /// An etcd error: retried on another endpoint when retryable.
    Etcd(CallFailure),
    /// A definite failure (e.g. the decision's own error): returned as is.
    Fatal(Error),
}

impl From<CallFailure> for CallError {
    fn from(e: CallFailure) -> Self {
        Self::Etcd(e)
    }
}

/// What is left of the time until `deadline`, halved: a transaction may
/// take no more, so that an answer lost with it leaves the other half to
/// read its outcome back (SPEC §8: the bound covers settling too).
pub(super) fn half_left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()) / 2
}
