//! etcd store (SPEC §8): the same contract across hosts, on an etcd v3 cluster.
//!
//! Layout under the prefix (default `/skill-lock/`):
//!
//! ```text
//! <prefix>locks/<name>        the owner record (JSON), attached to its own etcd lease
//! <prefix>fences/<name>       the fence marker: put (no lease) by every acquisition in
//!                             its transaction; its mod_revision is the latest fence
//! <prefix>history/<ns>-<rand> one history event (JSON), written in the same transaction
//! ```
//!
//! Every change is one transaction that compares the lock key's revision
//! with the one its decision was based on (`create_revision == 0` to create,
//! `mod_revision == seen` to take over, renew or delete), so a decision can
//! never act on a lock that changed after it looked; a lost race re-reads and
//! decides again. Expiry is the etcd lease's, judged by the cluster: a read
//! asks the cluster for the lease's remaining TTL and shows the engine the
//! record as stored, with that lease's end in the frame of this host's clock
//! (`LeaseEnd::Wall`); a change reports the lease the cluster granted. The fence of an acquisition is the key's
//! `mod_revision` after the winning transaction (kept in the record when a
//! renewal rewrites it). Endpoints are tried in order, within one deadline
//! (default 5 s): a dead endpoint never fails a command another one answers,
//! and a cluster that does not answer yields `store_unavailable`, never a
//! false `acquired`. The tokio runtime and the gRPC client exist only when an
//! `etcd://` store is chosen; the file store never builds them.
//!
//! The files: `config` (the URL and its variables), `connect` (endpoints
//! and deadlines), `read` (a key and its lease, judged; a lookup that
//! raced a revoke is read again), `round` (read-decide-act and settling a
//! lost answer),
//! `leases` (lease ends, grants, the short lease), `history`, `list`,
//! `client` (the gRPC calls) and the generated `proto`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

mod client;
mod config;
mod connect;
mod history;
mod leases;
mod list;
#[rustfmt::skip]
mod proto;
mod proxy;
mod read;
mod round;
mod tunnel;

use client::{Client, Security};
pub use config::EtcdConfig;
use config::security;
use read::{View, read_key};
use round::read_marker;

use crate::error::{Error, Result};
use crate::history::Event;
use crate::key::LockKey;
use crate::store::{Committed, Current, Decision, Listed, Location, Store};

/// Default time within which a command must get an answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// History events kept at least (the store trims back to this).
pub const HISTORY_KEEP: i64 = 10_000;

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

impl EtcdStore {
    /// Opens the store `config` names: reads its TLS files and starts the
    /// client runtime; connects lazily, on the first operation.
    ///
    /// # Errors
    /// [`Error::Io`] for an unreadable TLS file; [`Error::Internal`] when no
    /// runtime can be built.
    pub fn open(config: EtcdConfig) -> Result<Self> {
        let url = config.url.clone();
        let security = security(&config)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the etcd client runtime: {e}")))?;
        Ok(Self {
            config,
            url,
            security: Arc::new(security),
            runtime: Arc::new(runtime),
            client: Arc::new(Mutex::new(None)),
        })
    }

    fn lock_key(&self, key: &LockKey) -> String {
        format!("{}locks/{}", self.config.prefix, key.name())
    }

    /// The lock's fence marker (outside `locks/` and `history/`, so `list`
    /// and `history` never see it).
    fn fence_key(&self, key: &LockKey) -> String {
        format!("{}fences/{}", self.config.prefix, key.name())
    }
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn location(&self, key: &LockKey) -> Location {
        Location::at(self.lock_key(key))
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let k = self.lock_key(key);
        self.call(|mut c, _| {
            let k = k.clone();
            async move { read_key(&mut c, &k, View::Reader).await.map(|s| s.current) }
        })
    }

    /// The marker's `mod_revision`: the revision of the transaction of the
    /// latest acquisition, which wrote the lock key in the same step, so it
    /// names no acquisition that a later read of the lock does not show.
    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        let mk = self.fence_key(key);
        let revision = self.call(|mut c, _| {
            let mk = mk.clone();
            async move { read_marker(&mut c, &mk).await }
        })?;
        Ok(u64::try_from(revision).ok().filter(|f| *f > 0))
    }

    fn update<K, W>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
    ) -> Result<Committed<K, W>> {
        self.update_key(key, decide)
    }

    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        crate::store::visit_in_order(self.list_locks()?, visit)?;
        Ok(0)
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        self.read_history(key.map(LockKey::name).as_deref(), limit)
    }
}
