//! etcd store (SPEC §8): the same contract across hosts, on an etcd v3 cluster.
//!
//! Layout under the prefix (default `/skill-lock/`):
//!
//! ```text
//! <prefix>locks/<name>        the owner record (JSON), attached to its own etcd lease
//! <prefix>history/<ns>-<rand> one history event (JSON), written in the same transaction
//! ```
//!
//! Every change is one transaction that compares the lock key's revision
//! with the one its decision was based on (`create_revision == 0` to create,
//! `mod_revision == seen` to take over, renew or delete), so a decision can
//! never act on a lock that changed after it looked; a lost race re-reads and
//! decides again. Expiry is the etcd lease's, judged by the cluster: a read
//! asks the cluster for the lease's remaining TTL and shows it in the frame
//! of this host's clock. The fence of an acquisition is the key's
//! `mod_revision` after the winning transaction (kept in the record when a
//! renewal rewrites it). Endpoints are tried in order, within one deadline
//! (default 5 s): a dead endpoint never fails a command another one answers,
//! and a cluster that does not answer yields `store_unavailable`, never a
//! false `acquired`. The tokio runtime and the gRPC client exist only when an
//! `etcd://` store is chosen; the file store never builds them.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod client;
#[rustfmt::skip]
mod proto;

use client::{CallFailure, Client, Security, Tls};
use proto::range_request::{SortOrder, SortTarget};
use proto::{RangeRequest, TxnRequest};

use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;
use crate::lease::Now;
use crate::record::{OwnerRecord, Timestamp, random_suffix};
use crate::store::{Change, Committed, Current, Decision, Listed, Listing, Store};

/// Default time within which a command must get an answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// History events kept at least (the store trims back to this).
pub const HISTORY_KEEP: i64 = 10_000;

/// Connection settings of an etcd store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
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
}

impl EtcdConfig {
    /// Parses `etcd://host:port[,host:port...][/prefix]` (or `etcds://`),
    /// taking TLS, credentials and timeout from the environment.
    ///
    /// # Errors
    /// [`Error::Usage`] for a malformed URL or option.
    pub fn parse(url: &str) -> Result<Self> {
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
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let timeout = match env("SKILL_LOCK_ETCD_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some(t) => t
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0 && *s <= 600.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    Error::Usage(format!(
                        "SKILL_LOCK_ETCD_TIMEOUT={t:?}: give seconds, 0 < s <= 600"
                    ))
                })?,
        };
        let identity = match (env("SKILL_LOCK_ETCD_CERT"), env("SKILL_LOCK_ETCD_KEY")) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => {
                return Err(Error::Usage(
                    "set both SKILL_LOCK_ETCD_CERT and SKILL_LOCK_ETCD_KEY, or neither".into(),
                ));
            }
        };
        let user = match (env("SKILL_LOCK_ETCD_USER"), env("SKILL_LOCK_ETCD_PASSWORD")) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            _ => {
                return Err(Error::Usage(
                    "set both SKILL_LOCK_ETCD_USER and SKILL_LOCK_ETCD_PASSWORD, or neither".into(),
                ));
            }
        };
        Ok(Self {
            endpoints,
            prefix,
            tls,
            ca: env("SKILL_LOCK_ETCD_CA"),
            identity,
            user,
            timeout,
        })
    }
}

/// The etcd store.
#[derive(Clone)]
pub struct EtcdStore {
    config: EtcdConfig,
    url: String,
    /// TLS material and credentials, read once.
    security: Arc<Security>,
    runtime: Arc<tokio::runtime::Runtime>,
    /// The connected client and the index of its endpoint.
    client: Arc<Mutex<Option<(Client, usize)>>>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn unavailable(what: impl std::fmt::Display) -> Error {
    Error::StoreUnavailable(format!(
        "etcd did not answer: {what}; check that the cluster is up and reachable, or raise SKILL_LOCK_ETCD_TIMEOUT"
    ))
}

/// Reads the TLS files and credentials of `config` once.
fn security(config: &EtcdConfig) -> Result<Security> {
    let read = |path: &String| std::fs::read(path).map_err(|e| Error::io("read", path, e));
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

impl EtcdStore {
    /// A store for `url`; connects lazily, on the first operation.
    ///
    /// # Errors
    /// [`Error::Usage`] for a malformed URL; [`Error::Internal`] when no runtime can be built.
    pub fn new(url: &str) -> Result<Self> {
        let config = EtcdConfig::parse(url)?;
        let security = security(&config)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the etcd client runtime: {e}")))?;
        Ok(Self {
            config,
            url: url.to_owned(),
            security: Arc::new(security),
            runtime: Arc::new(runtime),
            client: Arc::new(Mutex::new(None)),
        })
    }

    fn lock_key(&self, key: &LockKey) -> String {
        format!("{}locks/{}", self.config.prefix, key.name())
    }

    /// The connected client, connecting to the first endpoint that answers
    /// (starting after `skip`, the one that just failed).
    async fn client(&self, deadline: Instant, skip: Option<usize>) -> Result<Client> {
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
                let connect = Client::connect(
                    ep,
                    &self.security,
                    left.min(Duration::from_secs(1)),
                    self.config.timeout.min(Duration::from_secs(2)),
                );
                match tokio::time::timeout(left, connect).await {
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

    fn drop_client(&self) -> Option<usize> {
        self.client
            .lock()
            .ok()
            .and_then(|mut g| g.take().map(|(_, i)| i))
    }

    /// Runs `op` with a client, moving to the next endpoint on a retryable
    /// failure, until the deadline.
    fn call<R, F, Fut>(&self, mut op: F) -> Result<R>
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
enum CallError {
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

/// A lock key as read: state, revision and lease.
struct Seen {
    current: Current,
    mod_revision: i64,
    lease: i64,
}

/// Reads one key and translates the cluster's lease TTL into this host's clock.
async fn read_key(client: &mut Client, k: &str) -> Result<Seen, CallError> {
    let resp = client.range(client::get(k)).await?;
    let Some(kv) = resp.kvs.first() else {
        return Ok(Seen {
            current: Current::Free,
            mod_revision: 0,
            lease: 0,
        });
    };
    let (mod_revision, lease) = (kv.mod_revision, kv.lease);
    let current = match OwnerRecord::parse(&kv.value) {
        Err(why) => Current::Corrupt(why),
        Ok(mut rec) => {
            if rec.holder.fence == 0 {
                rec.holder.fence = u64::try_from(mod_revision).unwrap_or(0);
            }
            // The cluster's remaining TTL, shown in this host's wall clock;
            // zero or less (expired, revoke pending) reads as expired now.
            let ttl = if lease == 0 {
                -1
            } else {
                client.lease_ttl(lease).await?
            };
            rec.holder.expires = Timestamp(Now::read().wall().0 + ttl.max(0));
            rec.holder.deadline_boot_ms = None;
            Current::Held(rec)
        }
    };
    Ok(Seen {
        current,
        mod_revision,
        lease,
    })
}

fn history_key(prefix: &str, time: Timestamp) -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(i128::from(time.0) * 1_000_000_000, |d| {
            i128::try_from(d.as_nanos()).unwrap_or(0)
        });
    format!("{prefix}history/{ns:020}-{}", random_suffix())
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn location(&self, key: &LockKey) -> String {
        self.lock_key(key)
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let k = self.lock_key(key);
        self.call(|mut c, _| {
            let k = k.clone();
            async move { read_key(&mut c, &k).await.map(|s| s.current) }
        })
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        let k = self.lock_key(key);
        let prefix = self.config.prefix.clone();
        // A put whose answer was lost may have committed: recognise our own
        // record on the next read instead of deciding again.
        let decide = std::cell::RefCell::new(decide);
        let in_flight_cell = std::cell::RefCell::new(None::<(String, Option<T>)>);
        self.call(|mut c, _deadline| {
            let k = k.clone();
            let prefix = prefix.clone();
            let decide = &decide;
            let in_flight = &in_flight_cell;
            async move {
                loop {
                    let seen = read_key(&mut c, &k).await?;
                    if let Current::Held(rec) = &seen.current {
                        let mut slot = in_flight.borrow_mut();
                        if let Some((hash, value)) = slot.as_mut()
                            && *hash == rec.token_sha256
                            && let Some(v) = value.take()
                        {
                            return Ok(Committed {
                                value: v,
                                written: Some(rec.clone()),
                            });
                        }
                        *slot = None;
                    }
                    let Decision {
                        change,
                        mut events,
                        value,
                    } = (decide.borrow_mut())(&seen.current).map_err(CallError::Fatal)?;
                    let mut record = match &change {
                        Change::Create(r) | Change::Takeover(r) | Change::Rewrite(r) => {
                            Some(r.clone())
                        }
                        Change::Keep | Change::Delete => None,
                    };
                    // The lease: granted by the cluster (it may raise a short TTL).
                    let mut new_lease = 0;
                    if let Some(rec) = record.as_mut() {
                        let ttl = i64::try_from(rec.holder.ttl).unwrap_or(i64::MAX);
                        let granted = c.lease_grant(ttl).await?;
                        new_lease = granted.id;
                        let granted_ttl = u64::try_from(granted.ttl).unwrap_or(rec.holder.ttl);
                        if granted_ttl != rec.holder.ttl {
                            let now = Now::read();
                            rec.holder.ttl = granted_ttl;
                            rec.holder.expires = crate::lease::term(&now, granted_ttl).expires;
                            for ev in &mut events {
                                ev.expires = Some(rec.holder.expires);
                            }
                        }
                        rec.holder.deadline_boot_ms = None;
                        if !matches!(change, Change::Rewrite(_)) {
                            rec.holder.fence = 0; // the fence is the key's mod_revision
                        }
                    }
                    let guard = match (&change, &seen.current) {
                        (Change::Create(_), _) => client::created_at(&k, 0),
                        _ => client::modified_at(&k, seen.mod_revision),
                    };
                    let mut ops = Vec::new();
                    match (&change, &record) {
                        (Change::Keep, _) => {}
                        (Change::Delete, _) => ops.push(client::delete(k.as_str())),
                        (_, Some(rec)) => {
                            let bytes = rec.to_bytes().map_err(CallError::Fatal)?;
                            ops.push(client::put(k.as_str(), bytes, new_lease));
                        }
                        (_, None) => {}
                    }
                    for ev in &mut events {
                        if ev.fence.is_none()
                            && let Some(r) = &record
                            && r.holder.fence != 0
                        {
                            ev.fence = Some(r.holder.fence);
                        }
                        let line = serde_json::to_vec(ev)
                            .map_err(|e| CallError::Fatal(Error::Internal(e.to_string())))?;
                        ops.push(client::put(history_key(&prefix, ev.time), line, 0));
                    }
                    if ops.is_empty() {
                        return Ok(Committed {
                            value,
                            written: None,
                        });
                    }
                    // Only a new acquisition has a token no earlier record had.
                    if let (Some(rec), Change::Create(_) | Change::Takeover(_)) = (&record, &change)
                    {
                        *in_flight.borrow_mut() = Some((rec.token_sha256.clone(), None));
                    }
                    let txn = TxnRequest {
                        compare: vec![guard],
                        success: ops,
                        failure: Vec::new(),
                    };
                    let resp = match c.txn(txn).await {
                        Ok(r) => r,
                        Err(e) => {
                            // Unknown outcome: keep the value to return if our record shows up.
                            if let Some(slot) = in_flight.borrow_mut().as_mut() {
                                slot.1 = Some(value);
                            }
                            return Err(CallError::Etcd(e));
                        }
                    };
                    *in_flight.borrow_mut() = None;
                    if !resp.succeeded {
                        if new_lease != 0 {
                            let _ = c.lease_revoke(new_lease).await;
                        }
                        continue; // lost the race: read and decide again
                    }
                    if seen.lease != 0 && !matches!(change, Change::Keep) {
                        let _ = c.lease_revoke(seen.lease).await;
                    }
                    let revision = resp.header.map_or(0, |h| h.revision);
                    let written = record.map(|mut r| {
                        if r.holder.fence == 0 {
                            r.holder.fence = u64::try_from(revision).unwrap_or(0);
                        }
                        r
                    });
                    trim_history(&mut c, &prefix).await;
                    return Ok(Committed { value, written });
                }
            }
        })
    }

    fn list(&self) -> Result<Listing> {
        let prefix = format!("{}locks/", self.config.prefix);
        self.call(|mut c, _| {
            let prefix = prefix.clone();
            async move {
                let resp = c.range(client::get_prefix(&prefix)).await?;
                let mut locks = Vec::new();
                for kv in &resp.kvs {
                    let Ok(full) = std::str::from_utf8(&kv.key) else {
                        continue;
                    };
                    let Some(name) = full.strip_prefix(&prefix) else {
                        continue;
                    };
                    let Some(key) = LockKey::from_name(name) else {
                        continue;
                    };
                    let seen = read_key(&mut c, full).await?;
                    if seen.current == Current::Free {
                        continue;
                    }
                    locks.push(Listed::new(key, full.to_owned(), seen.current));
                }
                Ok(Listing {
                    locks,
                    tombstones: 0,
                })
            }
        })
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let prefix = format!("{}history/", self.config.prefix);
        let name = key.map(LockKey::name);
        self.call(|mut c, _| {
            let prefix = prefix.clone();
            let name = name.clone();
            async move {
                let resp = c
                    .range(RangeRequest {
                        sort_target: SortTarget::Create.into(),
                        sort_order: SortOrder::Descend.into(),
                        ..client::get_prefix(&prefix)
                    })
                    .await?;
                let mut out = Vec::new();
                for kv in &resp.kvs {
                    if out.len() >= limit {
                        break;
                    }
                    let Ok(mut ev) = serde_json::from_slice::<Event>(&kv.value) else {
                        continue;
                    };
                    if name.as_ref().is_some_and(|n| *n != ev.lock) {
                        continue;
                    }
                    if ev.fence.is_none() {
                        // Written in the acquiring transaction: its revision is the fence.
                        ev.fence = u64::try_from(kv.create_revision).ok();
                    }
                    out.push(ev);
                }
                out.reverse();
                Ok(out)
            }
        })
    }
}

/// Keeps the history bounded: now and then, delete the oldest events beyond
/// twice [`HISTORY_KEEP`], down to [`HISTORY_KEEP`]. Failures are harmless.
async fn trim_history(c: &mut Client, prefix: &str) {
    if random_suffix()
        .as_bytes()
        .first()
        .is_none_or(|b| *b != b'0')
    {
        return; // about one change in sixteen looks
    }
    let hist = format!("{prefix}history/");
    let count_only = RangeRequest {
        count_only: true,
        ..client::get_prefix(&hist)
    };
    let Ok(count) = c.range(count_only).await else {
        return;
    };
    let excess = count.count - HISTORY_KEEP;
    if count.count <= 2 * HISTORY_KEEP || excess <= 0 {
        return;
    }
    let oldest = RangeRequest {
        keys_only: true,
        sort_target: SortTarget::Create.into(),
        sort_order: SortOrder::Ascend.into(),
        limit: excess,
        ..client::get_prefix(&hist)
    };
    let Ok(old) = c.range(oldest).await else {
        return;
    };
    for chunk in old.kvs.chunks(100) {
        let txn = TxnRequest {
            compare: Vec::new(),
            success: chunk
                .iter()
                .map(|kv| client::delete(kv.key.clone()))
                .collect(),
            failure: Vec::new(),
        };
        if c.txn(txn).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = EtcdConfig::parse("etcd://127.0.0.1:2379,h2:23791/team/locks").unwrap();
        assert_eq!(c.endpoints, ["127.0.0.1:2379", "h2:23791"]);
        assert_eq!(c.prefix, "/team/locks/");
        assert!(!c.tls);
        let c = EtcdConfig::parse("etcds://h:1").unwrap();
        assert_eq!((c.prefix.as_str(), c.tls), ("/skill-lock/", true));
        for bad in [
            "etcd://",
            "etcd://h",
            "etcd://h:x",
            "etcd://:1",
            "http://h:1",
        ] {
            assert!(EtcdConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
