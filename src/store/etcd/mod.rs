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
use crate::store::{
    Change, Committed, Current, Decision, Identity, LeaseEnd, Listed, Seen, Store, Written,
};

/// Default time within which a command must get an answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// History events kept at least (the store trims back to this).
pub const HISTORY_KEEP: i64 = 10_000;
/// History events read in one request at most (a page of the longest
/// events this tool writes stays well under gRPC's 4 MiB message limit).
const HISTORY_PAGE: i64 = 500;

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
        // Variables that only make sense together: both, or neither.
        let pair = |a: &str, b: &str| match (env(a), env(b)) {
            (Some(x), Some(y)) => Ok(Some((x, y))),
            (None, None) => Ok(None),
            _ => Err(Error::Usage(format!("set both {a} and {b}, or neither"))),
        };
        let identity = pair("SKILL_LOCK_ETCD_CERT", "SKILL_LOCK_ETCD_KEY")?;
        let user = pair("SKILL_LOCK_ETCD_USER", "SKILL_LOCK_ETCD_PASSWORD")?;
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
    fn connect_budget(&self) -> Duration {
        (self.config.timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(1))
    }

    /// The time one request gets on a connection: two seconds at most, half
    /// the command's deadline at most.
    fn call_budget(&self) -> Duration {
        (self.config.timeout / 2).min(Duration::from_secs(2))
    }

    /// The lease an acquisition is first written on (whole seconds, the
    /// deadline rounded up): an acquisition whose answer is lost is written on
    /// it, so a lock whose token was never printed frees itself within the
    /// command's time bound; the full ttl comes once the answer is known.
    fn short_ttl(&self) -> u64 {
        short_ttl(self.config.timeout)
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

/// How a read is used (SPEC §7 time safety, §8 "a key whose etcd lease is
/// alive is held").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// Shown to a reader (status, check, list): `expires` is a lower bound
    /// of the lease's end (etcd truncates the remaining TTL to whole seconds;
    /// it is counted from before the request), so a holder is never told it
    /// has more time than it has.
    Reader,
    /// Decided on (acquire, renew, release): a key whose lease is alive is
    /// held, however little of it is left, so `expires` is past now. Only a
    /// key whose lease is gone is expired.
    Decision,
}

/// A lock key as read: state, revisions, lease and the stored bytes.
struct KeyState {
    current: Current,
    mod_revision: i64,
    create_revision: i64,
    lease: i64,
    value: Vec<u8>,
}

/// The lease end of a key whose lease has `ttl` whole seconds left as the
/// cluster counts them (-1: the lease is gone) of the `granted` it was given,
/// read between `before` and `after` on this host's clock.
///
/// A member whose lessor is not the primary (a demoted leader, a new leader
/// before it promotes its leases) answers a live lease's remaining time as
/// "never" (`i64::MAX` ns, about 292 years): more than was granted is no
/// reading at all. The lease is alive with an unknown remainder of at most
/// what was granted: a decision holds it that long, a reader is told none.
fn lease_end(ttl: i64, granted: i64, view: View, before: &Now, after: &Now) -> Timestamp {
    let unknown = granted > 0 && ttl > granted;
    let ttl = if unknown {
        match view {
            View::Reader => 0,
            View::Decision => granted,
        }
    } else {
        ttl
    };
    match view {
        _ if ttl < 0 => Timestamp(before.wall().0.saturating_sub(1)),
        View::Reader => Timestamp(before.wall().0.saturating_add(ttl)),
        // Truncated: up to a second more is left; and one more so that a
        // decision made just after this read sees it alive.
        View::Decision => Timestamp(after.wall().0.saturating_add(ttl).saturating_add(2)),
    }
}

/// Reads one key; a leased record's expiry is the cluster's (see [`View`]).
async fn read_key(client: &mut Client, k: &str, view: View) -> Result<KeyState, CallError> {
    let before = Now::read();
    let resp = client.range(client::get(k)).await?;
    let revision = resp.header.map_or(0, |h| h.revision);
    let Some(kv) = resp.kvs.into_iter().next() else {
        return Ok(KeyState {
            current: Current::Free,
            mod_revision: 0,
            create_revision: 0,
            lease: 0,
            value: Vec::new(),
        });
    };
    let current = match OwnerRecord::parse(&kv.value) {
        Err(why) => Current::Corrupt(why),
        Ok(mut rec) => {
            if rec.holder.fence == 0 {
                rec.holder.fence = u64::try_from(kv.mod_revision).unwrap_or(0);
            }
            revisions_never_went_back(rec.holder.fence, revision)?;
            // A key with no lease (another tool, an older record) is judged
            // by its own `expires`, like any record.
            let lease_end = if kv.lease == 0 {
                LeaseEnd::Recorded
            } else {
                let (ttl, granted) = client.lease_ttl(kv.lease).await?;
                LeaseEnd::Wall(lease_end(ttl, granted, view, &before, &Now::read()))
            };
            Current::Held(Seen {
                record: rec,
                lease_end,
                identity: Identity::Comparable,
            })
        }
    };
    Ok(KeyState {
        current,
        mod_revision: kv.mod_revision,
        create_revision: kv.create_revision,
        lease: kv.lease,
        value: kv.value,
    })
}

/// A fence is a revision the cluster once had: a record whose fence is past
/// the cluster's current revision means the revisions went backwards (a
/// restore from a snapshot without `--bump-revision`), and fences handed out
/// from now on could repeat. Refuse rather than hand them out.
fn revisions_never_went_back(fence: u64, revision: i64) -> Result<(), CallError> {
    match u64::try_from(revision) {
        Ok(r) if r > 0 && fence > r => Err(CallError::Fatal(Error::StoreUnavailable(format!(
            "the etcd cluster's revision ({r}) is below a fence it handed out ({fence}): it was \
             restored from a snapshot without --bump-revision, so fences could repeat; restore \
             again with `etcdutl snapshot restore --bump-revision N --mark-compacted` (N above {fence})"
        )))),
        _ => Ok(()),
    }
}

fn history_key(prefix: &str, time: Timestamp) -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(i128::from(time.0) * 1_000_000_000, |d| {
            i128::try_from(d.as_nanos()).unwrap_or(0)
        });
    format!("{prefix}history/{ns:020}-{}", random_suffix())
}

/// What kind of change a transaction makes, as far as settling an unknown
/// outcome needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A new acquisition (create or takeover): recognised by its token hash.
    Acquisition,
    /// A renewal: recognised by its exact bytes.
    Rewrite,
    /// A release: recognised by the lock it saw being gone.
    Delete,
}

/// One decision turned into one transaction: pure, so it is unit-tested
/// without etcd.
#[derive(Debug)]
struct Plan {
    txn: TxnRequest,
    kind: Option<Kind>,
    /// The record's bytes as written (create, takeover, rewrite).
    bytes: Option<Vec<u8>>,
}

/// Plans the transaction for `change` on key `k` as seen at `seen_mod`
/// (0: absent): the guard (`create_revision == 0` to create, `mod_revision
/// == seen` for everything else), the put of `record` on `lease`, or the
/// delete, and the history events (`history`: key and JSON of each).
fn plan(
    k: &str,
    seen_mod: i64,
    change: &Change,
    record: Option<&OwnerRecord>,
    lease: i64,
    history: Vec<(String, Vec<u8>)>,
) -> Result<Plan> {
    let guard = match change {
        Change::Create(_) => client::created_at(k, 0),
        _ => client::modified_at(k, seen_mod),
    };
    let mut ops = Vec::new();
    let mut bytes = None;
    let kind = match (change, record) {
        (Change::Keep, _) => None,
        (Change::Delete, _) => {
            ops.push(client::delete(k));
            Some(Kind::Delete)
        }
        (Change::Create(_) | Change::Takeover(_) | Change::Rewrite(_), Some(rec)) => {
            let b = rec.to_bytes()?;
            ops.push(client::put(k, b.clone(), lease));
            bytes = Some(b);
            Some(if matches!(change, Change::Rewrite(_)) {
                Kind::Rewrite
            } else {
                Kind::Acquisition
            })
        }
        (_, None) => {
            return Err(Error::Internal(
                "a change that writes a record came without one".into(),
            ));
        }
    };
    ops.extend(
        history
            .into_iter()
            .map(|(key, line)| client::put(key, line, 0)),
    );
    Ok(Plan {
        txn: TxnRequest {
            compare: vec![guard],
            success: ops,
            failure: Vec::new(),
        },
        kind,
        bytes,
    })
}

/// A transaction whose outcome is not known (its answer was lost): settled
/// by the next read before anything is decided again.
struct Pending<T> {
    kind: Kind,
    value: T,
    record: Option<OwnerRecord>,
    bytes: Option<Vec<u8>>,
    /// The lease granted for it (0: none).
    lease: i64,
    /// The create revision of the lock it saw (for a release).
    seen_create_revision: i64,
    /// An acquisition written on the short lease: the ttl it asked for.
    extend: Option<u64>,
}

impl<T> Pending<T> {
    /// Does `seen` show that the transaction took effect?
    fn landed(&self, seen: &KeyState) -> bool {
        match self.kind {
            Kind::Acquisition => match (seen.current.record(), &self.record) {
                (Some(now), Some(ours)) => now.token_sha256 == ours.token_sha256,
                _ => false,
            },
            Kind::Rewrite => self.bytes.as_deref() == Some(seen.value.as_slice()),
            Kind::Delete => {
                seen.current == Current::Free || seen.create_revision != self.seen_create_revision
            }
        }
    }

    /// The record as it landed: the one written (with the lease times this
    /// host computed, never the reader's view of them), its fence the key's
    /// revision when it was a new acquisition.
    fn written(&self, seen: &KeyState) -> Option<Written> {
        written(self.record.clone(), seen.mod_revision)
    }
}

/// What a change wrote: the record (with the lease times this host
/// computed from the grant), its fence the key's revision `revision` after
/// the change when it was a new acquisition.
fn written(record: Option<OwnerRecord>, revision: i64) -> Option<Written> {
    record.map(|mut r| {
        if r.holder.fence == 0 {
            r.holder.fence = u64::try_from(revision).unwrap_or(0);
        }
        Written::as_given(r)
    })
}

/// An acquisition written on the short lease, to be moved onto a lease of
/// its full ttl once its answer is known.
struct Extension {
    /// The short lease it is on.
    lease: i64,
    /// The key's `mod_revision` after it was written (its fence).
    revision: i64,
    /// The ttl asked for.
    ttl: u64,
}

/// What one read-decide-act round ended with.
// One per round, moved once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Round<T> {
    /// Committed (or nothing to do); `old_lease` is the lease to revoke now;
    /// an acquisition on the short lease carries its [`Extension`].
    Done(Committed<T>, i64, Option<Extension>),
    /// Lost a race: read and decide again.
    Again,
}

/// A lease the cluster granted.
#[derive(Debug, Clone, Copy)]
struct Granted {
    id: i64,
    /// The ttl granted (the cluster raises a short one to its minimum).
    ttl: u64,
    /// The earliest moment the lease can run out, to the second.
    expires: Timestamp,
}

/// The earliest end of a lease of `ttl` seconds asked for at `before`: the
/// cluster starts counting when it grants the lease, which is after the
/// request left this host, so this is rounded down, never up (SPEC §8: the
/// `expires` a holder is told is never later than the moment the cluster's
/// lease can run out).
fn earliest_end(before: &Now, ttl: u64) -> Timestamp {
    let ttl_ms = i64::try_from(ttl.saturating_mul(1000)).unwrap_or(i64::MAX);
    Timestamp(before.wall_ms.saturating_add(ttl_ms).div_euclid(1000))
}

/// The short lease for a command deadline of `timeout`: the deadline in
/// whole seconds, rounded up, at least one.
fn short_ttl(timeout: Duration) -> u64 {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    ms.div_ceil(1000).max(1)
}

/// Asks the cluster for a lease of `ttl` seconds.
async fn grant(c: &mut Client, ttl: u64) -> Result<Granted, CallError> {
    let before = Now::read();
    let resp = c
        .lease_grant(i64::try_from(ttl).unwrap_or(i64::MAX))
        .await?;
    let ttl = u64::try_from(resp.ttl)
        .ok()
        .filter(|t| *t > 0)
        .unwrap_or(ttl);
    Ok(Granted {
        id: resp.id,
        ttl,
        expires: earliest_end(&before, ttl),
    })
}

impl Granted {
    /// The record says the lease it is on: the ttl granted and its earliest end.
    fn stamp(&self, rec: &mut OwnerRecord) {
        rec.holder.ttl = self.ttl;
        rec.holder.expires = self.expires;
        rec.holder.deadline_boot_ms = None;
    }
}

/// The lease a change's record is written on, and the record stamped with it.
struct Leased {
    id: i64,
    record: OwnerRecord,
    /// An acquisition on the short lease: the ttl it asked for.
    extend: Option<u64>,
    /// The `expires` its events say: the lease asked for, from the grant's start.
    shown: Timestamp,
}

/// Time for the clean-up after a committed change (old lease, history trim),
/// within what is left of the command's deadline.
const CLEANUP: Duration = Duration::from_secs(1);

/// What is left of the time until `deadline`, halved: a transaction may
/// take no more, so that an answer lost with it leaves the other half to
/// read its outcome back (SPEC §8: the bound covers settling too).
fn half_left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()) / 2
}

impl EtcdStore {
    /// One read-decide-act round on one connection: settle the change
    /// whose answer was lost, decide, write.
    async fn round<T>(
        &self,
        c: &mut Client,
        k: &str,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
        pending: &mut Option<Pending<T>>,
        deadline: Instant,
    ) -> Result<Round<T>, CallError> {
        let seen = read_key(c, k, View::Decision).await?;
        if let Some(p) = pending.take() {
            if p.landed(&seen) {
                let extension = p.extend.map(|ttl| Extension {
                    lease: p.lease,
                    revision: seen.mod_revision,
                    ttl,
                });
                let committed = Committed {
                    written: p.written(&seen),
                    value: p.value,
                };
                return Ok(Round::Done(committed, 0, extension));
            }
            // It did not land: its lease can go, so that it never can.
            if p.lease != 0 {
                let _ = c.lease_revoke(p.lease).await;
            }
        }
        let decision = decide(&seen.current).map_err(CallError::Fatal)?;
        let leased = self.lease_for(c, &decision.change).await?;
        let mut events = decision.events(None);
        if let Some(l) = &leased {
            // The events say the lease asked for, from the same start.
            for ev in &mut events {
                ev.expires = Some(l.shown);
            }
        }
        let history = self.history_ops(&events)?;
        let record = leased.as_ref().map(|l| &l.record);
        let lease = leased.as_ref().map_or(0, |l| l.id);
        let plan = plan(
            k,
            seen.mod_revision,
            &decision.change,
            record,
            lease,
            history,
        )
        .map_err(CallError::Fatal)?;
        let Some(kind) = plan.kind else {
            return self
                .record_only(c, plan.txn, decision.value, deadline)
                .await;
        };
        // From here until its answer, the outcome is unknown (the answer may
        // be lost, or this future dropped at the deadline): settle it first.
        *pending = Some(Pending {
            kind,
            value: decision.value,
            extend: leased.as_ref().and_then(|l| l.extend),
            record: leased.map(|l| l.record),
            bytes: plan.bytes,
            lease,
            seen_create_revision: seen.create_revision,
        });
        self.commit(c, plan.txn, pending, seen.lease, deadline)
            .await
    }

    /// Sends the transaction of `pending` and reads its answer.
    async fn commit<T>(
        &self,
        c: &mut Client,
        txn: TxnRequest,
        pending: &mut Option<Pending<T>>,
        old_lease: i64,
        deadline: Instant,
    ) -> Result<Round<T>, CallError> {
        let resp = tokio::time::timeout(half_left(deadline), c.txn(txn))
            .await
            .map_err(|_| {
                CallError::Etcd(CallFailure::Status(tonic::Status::deadline_exceeded(
                    "the transaction's answer did not come in time",
                )))
            })??;
        let Some(attempt) = pending.take() else {
            return Err(CallError::Fatal(Error::Internal(
                "a transaction's attempt went missing".into(),
            )));
        };
        if !resp.succeeded {
            if attempt.lease != 0 {
                let _ = c.lease_revoke(attempt.lease).await;
            }
            return Ok(Round::Again);
        }
        let revision = resp.header.map_or(0, |h| h.revision);
        let extension = attempt.extend.map(|ttl| Extension {
            lease: attempt.lease,
            revision,
            ttl,
        });
        let committed = Committed {
            written: written(attempt.record, revision),
            value: attempt.value,
        };
        Ok(Round::Done(committed, old_lease, extension))
    }

    /// Nothing changes, but the decision may record events (a refusal):
    /// appended under the same guard; a failure to append never fails the
    /// operation itself (SPEC §2.8).
    async fn record_only<T>(
        &self,
        c: &mut Client,
        txn: TxnRequest,
        value: T,
        deadline: Instant,
    ) -> Result<Round<T>, CallError> {
        if !txn.success.is_empty() {
            match tokio::time::timeout(half_left(deadline), c.txn(txn)).await {
                Ok(Ok(resp)) if !resp.succeeded => return Ok(Round::Again),
                _ => {}
            }
        }
        let committed = Committed {
            value,
            written: None,
        };
        Ok(Round::Done(committed, 0, None))
    }

    /// Grants the lease a change that writes a record is written on: a new
    /// acquisition longer than the short lease is written on the short
    /// lease first (see `short_ttl`). `None` for a change that writes none.
    async fn lease_for(
        &self,
        c: &mut Client,
        change: &Change,
    ) -> Result<Option<Leased>, CallError> {
        let (mut record, acquisition) = match change {
            Change::Create(r) | Change::Takeover(r) => (r.clone(), true),
            Change::Rewrite(r) => (r.clone(), false),
            Change::Keep | Change::Delete => return Ok(None),
        };
        let wanted = record.holder.ttl;
        let short = self.short_ttl();
        let extend = (acquisition && wanted > short).then_some(wanted);
        let granted = grant(c, extend.map_or(wanted, |_| short)).await?;
        granted.stamp(&mut record);
        let more = extend.map_or(0, |w| w.saturating_sub(granted.ttl));
        let shown = Timestamp(
            granted
                .expires
                .0
                .saturating_add(i64::try_from(more).unwrap_or(0)),
        );
        if acquisition {
            record.holder.fence = 0; // the fence is the key's mod_revision
        }
        Ok(Some(Leased {
            id: granted.id,
            record,
            extend,
            shown,
        }))
    }

    /// Moves an acquisition from its short lease onto a lease of its full
    /// ttl: one transaction guarded by the revision the acquisition wrote,
    /// so it never touches a lock that changed since. The record as it is
    /// then, or `None` when it stays on the short lease (the guard failed,
    /// or the answer was lost: the holder is told the short lease, which it
    /// certainly has).
    async fn extend(
        &self,
        c: &mut Client,
        k: &str,
        rec: &OwnerRecord,
        ext: &Extension,
    ) -> Option<Written> {
        let full = grant(c, ext.ttl).await.ok()?;
        let mut new = rec.clone();
        full.stamp(&mut new);
        let Ok(bytes) = new.to_bytes() else {
            let _ = c.lease_revoke(full.id).await;
            return None;
        };
        let txn = TxnRequest {
            compare: vec![client::modified_at(k, ext.revision)],
            success: vec![client::put(k, bytes, full.id)],
            failure: Vec::new(),
        };
        match c.txn(txn).await {
            Ok(resp) if resp.succeeded => {
                let _ = c.lease_revoke(ext.lease).await;
                Some(Written::as_given(new))
            }
            Ok(_) => {
                let _ = c.lease_revoke(full.id).await;
                None
            }
            // Unknown: it may have moved; either lease it is on is the
            // holder's, and the short one is the one it surely has.
            Err(_) => None,
        }
    }

    /// The history events of a change as (key, JSON). The events of a new
    /// acquisition carry no fence: it is the transaction's revision, which
    /// [`EtcdStore::history`] tells from the key's create revision.
    fn history_ops(&self, events: &[Event]) -> Result<Vec<(String, Vec<u8>)>, CallError> {
        events
            .iter()
            .map(|ev| {
                let line = serde_json::to_vec(ev)
                    .map_err(|e| CallError::Fatal(Error::Internal(e.to_string())))?;
                Ok((history_key(&self.config.prefix, ev.time), line))
            })
            .collect()
    }

    /// After a committed change: revoke the lease the lock no longer uses
    /// and keep the history bounded, within their own short budget and the
    /// command's deadline (the change is done; a failure here is harmless:
    /// a lease with no key on it just runs out, the next change trims).
    async fn clean_up(&self, c: &mut Client, old_lease: i64, deadline: Instant) {
        let budget = CLEANUP.min(deadline.saturating_duration_since(Instant::now()));
        if budget.is_zero() {
            return;
        }
        let work = async {
            if old_lease != 0 {
                let _ = c.lease_revoke(old_lease).await;
            }
            trim_history(c, &self.config.prefix).await;
        };
        let _ = tokio::time::timeout(budget, work).await;
    }

    /// The cluster stopped answering with an acquisition's outcome unknown:
    /// revoke its lease on any member that answers before the deadline, so
    /// that a lock whose token was never printed is gone at once. When none
    /// does, the acquisition was written on the short lease (`short_ttl`),
    /// so such a lock frees itself within the command's time bound.
    async fn abandon<T>(
        &self,
        pending: Option<Pending<T>>,
        err: Error,
        deadline: Instant,
    ) -> Error {
        let Some(p) = pending else { return err };
        if p.kind != Kind::Acquisition || p.lease == 0 {
            return Error::StoreUnavailable(format!(
                "{err}; the outcome of this change is unknown: run `status` to see the lock"
            ));
        }
        for ep in &self.config.endpoints {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let budget = left.min(self.connect_budget());
            let attempt = async {
                let mut c = Client::connect(ep, &self.security, budget, budget).await?;
                c.lease_revoke(p.lease).await
            };
            if let Ok(Ok(())) = tokio::time::timeout(budget, attempt).await {
                return Error::StoreUnavailable(format!(
                    "{err}; nothing was taken (the attempt's lease was revoked)"
                ));
            }
        }
        Error::StoreUnavailable(format!(
            "{err}; the outcome is unknown: if the lock was taken, nobody holds its token and it \
             frees itself when its lease of {}s ends (it was written on a short lease)",
            p.record.map_or(0, |r| r.holder.ttl)
        ))
    }
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
            async move { read_key(&mut c, &k, View::Reader).await.map(|s| s.current) }
        })
    }

    fn update<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        let k = self.lock_key(key);
        // One deadline for the whole command, settling included (SPEC §8).
        let deadline = Instant::now() + self.config.timeout;
        self.runtime.block_on(async {
            let mut pending = None;
            let mut skip = None;
            loop {
                let mut c = match self.client(deadline, skip).await {
                    Ok(c) => c,
                    Err(e) => return Err(self.abandon(pending, e, deadline).await),
                };
                let left = deadline.saturating_duration_since(Instant::now());
                let round = self.round(&mut c, &k, decide, &mut pending, deadline);
                match tokio::time::timeout(left, round).await {
                    Ok(Ok(Round::Done(mut committed, old_lease, extension))) => {
                        // The acquisition is known to have landed: move it
                        // onto its full ttl, if the deadline allows.
                        if let (Some(ext), Some(w)) = (extension, committed.written.as_ref()) {
                            let left = deadline.saturating_duration_since(Instant::now());
                            let moved = tokio::time::timeout(
                                left,
                                self.extend(&mut c, &k, &w.record, &ext),
                            );
                            if let Ok(Some(w)) = moved.await {
                                committed.written = Some(w);
                            }
                        }
                        self.clean_up(&mut c, old_lease, deadline).await;
                        return Ok(committed);
                    }
                    Ok(Ok(Round::Again)) => {}
                    Ok(Err(CallError::Fatal(e))) => return Err(e),
                    Ok(Err(CallError::Etcd(e))) if !e.retryable() => {
                        let e = Error::StoreUnavailable(format!("etcd refused the request: {e}"));
                        return Err(self.abandon(pending, e, deadline).await);
                    }
                    Ok(Err(CallError::Etcd(_))) | Err(_) => {
                        // Another endpoint next; an answer that was lost is
                        // read back there before anything is decided again.
                        skip = self.drop_client();
                        if Instant::now() >= deadline {
                            let e = unavailable(format!(
                                "none of {} answered in time",
                                self.config.endpoints.join(", ")
                            ));
                            return Err(self.abandon(pending, e, deadline).await);
                        }
                    }
                }
            }
        })
    }

    /// Reads every lock key in one range request (and each one's lease),
    /// then hands them over in order.
    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        let prefix = format!("{}locks/", self.config.prefix);
        let locks = self.call(|mut c, _| {
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
                    let seen = read_key(&mut c, full, View::Reader).await?;
                    if seen.current == Current::Free {
                        continue;
                    }
                    locks.push(Listed::new(key, full.to_owned(), seen.current));
                }
                Ok(locks)
            }
        })?;
        crate::store::visit_in_order(locks, visit)?;
        Ok(0)
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let prefix = format!("{}history/", self.config.prefix);
        let name = key.map(LockKey::name);
        self.call(|mut c, _| {
            let prefix = prefix.clone();
            let name = name.clone();
            async move {
                let mut out = Vec::new();
                // Newest first, a page at a time (SPEC §8: the history is
                // read in pages, so its size never fails the read): each
                // page ends at the create revision below the last one seen.
                let mut below = 0;
                // Keys already read at revision `below`: one transaction
                // writes up to three events, and a page may end among them.
                let mut at_below: std::collections::HashSet<Vec<u8>> =
                    std::collections::HashSet::new();
                let mut page = HISTORY_PAGE;
                while out.len() < limit {
                    let req = RangeRequest {
                        sort_target: SortTarget::Create.into(),
                        sort_order: SortOrder::Descend.into(),
                        limit: page,
                        max_create_revision: below,
                        ..client::get_prefix(&prefix)
                    };
                    let mut resp = match c.range(req).await {
                        Ok(r) => r,
                        // A page past the message limit (events written by
                        // another tool can be of any size): a smaller page.
                        Err(CallFailure::Status(s))
                            if s.code() == tonic::Code::OutOfRange && page > 1 =>
                        {
                            page /= 2;
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    };
                    // The events of one transaction share a revision: their
                    // keys (named by time) order them.
                    resp.kvs.sort_by(|a, b| {
                        (b.create_revision, &b.key).cmp(&(a.create_revision, &a.key))
                    });
                    let fresh: Vec<_> = resp
                        .kvs
                        .iter()
                        .filter(|kv| kv.create_revision != below || !at_below.contains(&kv.key))
                        .collect();
                    for kv in &fresh {
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
                    let Some(last) = resp.kvs.last() else { break };
                    if !resp.more {
                        break;
                    }
                    if fresh.is_empty() {
                        // A page of nothing new (pages smaller than one
                        // transaction's events): step past that revision.
                        below = last.create_revision - 1;
                        at_below.clear();
                    } else {
                        if last.create_revision != below {
                            at_below.clear();
                        }
                        below = last.create_revision;
                        at_below.extend(
                            resp.kvs
                                .iter()
                                .filter(|kv| kv.create_revision == below)
                                .map(|kv| kv.key.clone()),
                        );
                    }
                    if below < 1 {
                        break;
                    }
                }
                out.reverse();
                Ok(out)
            }
        })
    }
}

/// Keeps the history bounded: after every change, count the events; past
/// twice [`HISTORY_KEEP`], delete the oldest down to [`HISTORY_KEEP`].
/// Failures are harmless (the next change trims).
async fn trim_history(c: &mut Client, prefix: &str) {
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

    fn target(c: &proto::Compare) -> Option<proto::compare::TargetUnion> {
        c.target_union.clone()
    }

    fn seen(current: Current, create_revision: i64, value: Vec<u8>) -> KeyState {
        KeyState {
            current,
            mod_revision: 9,
            create_revision,
            lease: 0,
            value,
        }
    }

    fn held(rec: &OwnerRecord) -> Current {
        Current::Held(Seen::recorded(rec.clone()))
    }

    #[test]
    fn a_fence_past_the_clusters_revision_is_refused() {
        assert!(revisions_never_went_back(10, 12).is_ok());
        assert!(revisions_never_went_back(12, 12).is_ok());
        assert!(matches!(
            revisions_never_went_back(13, 12),
            Err(CallError::Fatal(Error::StoreUnavailable(_)))
        ));
    }

    #[test]
    fn plans_guard_each_change_on_the_revision_it_saw() {
        use proto::compare::TargetUnion::{CreateRevision, ModRevision};
        use proto::request_op::Request;
        let rec = crate::record::tests::sample(None);
        let history = vec![("/p/history/1".to_owned(), b"{}".to_vec())];
        let create = plan(
            "/p/locks/k",
            0,
            &Change::Create(rec.clone()),
            Some(&rec),
            77,
            history.clone(),
        )
        .unwrap();
        assert_eq!(target(&create.txn.compare[0]), Some(CreateRevision(0)));
        assert_eq!(create.kind, Some(Kind::Acquisition));
        assert_eq!(create.txn.success.len(), 2, "the record and one event");
        let Some(Request::RequestPut(put)) = &create.txn.success[0].request else {
            panic!("the first op puts the record");
        };
        assert_eq!(
            (put.lease, put.value.as_slice()),
            (77, rec.to_bytes().unwrap().as_slice())
        );
        let Some(Request::RequestPut(ev)) = &create.txn.success[1].request else {
            panic!("the second op puts the event");
        };
        assert_eq!(
            (ev.key.as_slice(), ev.lease),
            (b"/p/history/1".as_slice(), 0)
        );

        let take = plan(
            "/p/locks/k",
            41,
            &Change::Takeover(rec.clone()),
            Some(&rec),
            78,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(target(&take.txn.compare[0]), Some(ModRevision(41)));
        assert_eq!(take.kind, Some(Kind::Acquisition));
        let renew = plan(
            "/p/locks/k",
            42,
            &Change::Rewrite(rec.clone()),
            Some(&rec),
            79,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(renew.kind, Some(Kind::Rewrite));
        assert_eq!(renew.bytes, Some(rec.to_bytes().unwrap()));
        let delete = plan("/p/locks/k", 43, &Change::Delete, None, 0, Vec::new()).unwrap();
        assert_eq!(target(&delete.txn.compare[0]), Some(ModRevision(43)));
        assert!(matches!(
            delete.txn.success[0].request,
            Some(Request::RequestDeleteRange(_))
        ));
        let keep = plan("/p/locks/k", 43, &Change::Keep, None, 0, Vec::new()).unwrap();
        assert_eq!((keep.kind, keep.txn.success.len()), (None, 0));
        assert!(
            plan(
                "/p/locks/k",
                0,
                &Change::Create(rec.clone()),
                None,
                0,
                Vec::new()
            )
            .is_err()
        );
    }

    #[test]
    fn an_unknown_outcome_is_recognised_only_by_its_own_effect() {
        let ours = crate::record::tests::sample(None);
        let mut theirs = ours.clone();
        theirs.token_sha256 = crate::record::hash_token("someone else");
        let pending = |kind, bytes: Option<Vec<u8>>| Pending {
            kind,
            value: (),
            record: Some(ours.clone()),
            bytes,
            lease: 5,
            seen_create_revision: 3,
            extend: None,
        };
        let acq = pending(Kind::Acquisition, None);
        assert!(acq.landed(&seen(held(&ours), 3, Vec::new())));
        assert!(!acq.landed(&seen(held(&theirs), 3, Vec::new())));
        assert!(!acq.landed(&seen(Current::Free, 0, Vec::new())));
        let bytes = ours.to_bytes().unwrap();
        let rw = pending(Kind::Rewrite, Some(bytes.clone()));
        assert!(rw.landed(&seen(held(&ours), 3, bytes)));
        assert!(!rw.landed(&seen(held(&ours), 3, b"older".to_vec())));
        let del = pending(Kind::Delete, None);
        assert!(del.landed(&seen(Current::Free, 0, Vec::new())));
        assert!(
            del.landed(&seen(held(&theirs), 8, Vec::new())),
            "re-created since"
        );
        assert!(
            !del.landed(&seen(held(&ours), 3, Vec::new())),
            "the same lock is still there"
        );
    }

    #[test]
    fn a_live_lease_is_never_read_as_expired_by_a_decision_nor_overstated_to_a_reader() {
        let before = Now {
            wall_ms: 1_000_000_500,
            boot: None,
        };
        let after = Now {
            wall_ms: 1_000_001_700,
            boot: None,
        };
        // 0 s left (truncated): alive, so a decision made after the read sees it held.
        let end = lease_end(0, 2, View::Decision, &before, &after);
        assert!(end.0 * 1000 > after.wall_ms + 500);
        // A reader is told no more than the truncated TTL, counted from before the request.
        assert_eq!(
            lease_end(4, 5, View::Reader, &before, &after).0,
            1_000_000 + 4
        );
        // A lease that is gone is expired for both.
        for view in [View::Reader, View::Decision] {
            assert!(lease_end(-1, 5, view, &before, &after).0 * 1000 < before.wall_ms);
        }
        // "Never" from a member whose lessor is not the primary (ETCD-1 of
        // the nemesis test): alive, for no more than was granted.
        let never = 9_223_372_036;
        let held = lease_end(never, 2, View::Decision, &before, &after);
        assert!(held.0 * 1000 > after.wall_ms && held.0 <= after.wall().0 + 2 + 2);
        assert!(
            lease_end(never, 2, View::Reader, &before, &after).0 * 1000 <= before.wall_ms + 1000
        );
    }

    #[test]
    fn the_expires_told_is_the_earliest_end_of_the_lease_granted() {
        let before = Now {
            wall_ms: 1_000_000_050,
            boot: None,
        };
        // Just after a whole second: rounded down, never up (the cluster
        // starts the lease after the request left).
        assert_eq!(earliest_end(&before, 3).0, 1_000_003);
        let before = Now {
            wall_ms: 1_000_000_999,
            boot: None,
        };
        assert_eq!(earliest_end(&before, 2).0, 1_000_002);
    }

    #[test]
    fn the_short_lease_covers_the_whole_deadline() {
        for (t, short) in [(5.0, 5), (1.0, 1), (0.2, 1), (2.5, 3), (600.0, 600)] {
            assert_eq!(short_ttl(Duration::from_secs_f64(t)), short, "{t}");
        }
    }

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
