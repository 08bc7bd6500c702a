//! Connections and deadlines: endpoints tried in order within one
//! command deadline, each with its own share of it, so a dead or hung
//! endpoint never fails a command another endpoint answers.

use std::future::Future;
use std::time::{Duration, Instant};

use super::EtcdStore;
use super::client::{CallFailure, Client};
use crate::error::{Error, Result};

pub(super) fn unavailable(what: impl std::fmt::Display) -> Error {
    Error::StoreUnavailable(format!(
        "etcd did not answer: {what}; check that the cluster is up and reachable, or raise SKILL_LOCK_ETCD_TIMEOUT"
    ))
}

impl EtcdStore {
    /// The connected client, connecting to the first endpoint that answers
    /// (starting after `skip`, the one that just failed).
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
        for round in 0.. {
            for step in 0..n {
                let i = (start + step) % n;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(unavailable(format!(
                        "{last} (tried {})",
                        self.config.endpoints.join(", ")
                    )));
                }
                let ep = &self.config.endpoints[i];
                // The whole connection (TCP, the TLS handshake, authentication)
                // has one endpoint's share of the deadline: an endpoint that
                // accepts and then never answers, in any of them, is skipped.
                let budget = left.min(self.connect_budget());
                let connect = Client::connect(ep, &self.security, budget, self.call_budget());
                match tokio::time::timeout(budget, connect).await {
                    Ok(Ok(c)) => {
                        if let Ok(mut g) = self.client.lock() {
                            *g = Some((c.clone(), i));
                        }
                        return Ok(c);
                    }
                    Ok(Err(e)) if !e.retryable() => {
                        return Err(Error::StoreUnavailable(format!(
                            "etcd at {ep} refused the connection: {e}; check the URL, TLS and credentials"
                        )));
                    }
                    Ok(Err(e)) => last = format!("{ep}: {e}"),
                    Err(_) => last = format!("{ep}: timed out"),
                }
            }
            // Every endpoint failed once; pause briefly (an election may be under way).
            let pause = Duration::from_millis(50 * (1 << round.min(4)));
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
        Err(unavailable(last))
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
