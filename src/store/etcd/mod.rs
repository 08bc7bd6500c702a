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
//! The files, each using only those after it (no module calls back up):
//! this one holds [`EtcdStore`] and its [`Store`] methods, which call
//! `round` (read-decide-act and settling a lost answer), `list` and
//! `history`; then `leases` (the lease a change is written on, the short
//! lease, clean-up), `history` (event keys, paged reads, trimming), `read`
//! (a key and its lease, judged; a lookup that raced a revoke is read
//! again), `connect` (the `Cluster`: endpoints and deadlines), `config`
//! (the URL and its variables), `client` (the gRPC calls), `tunnel`,
//! `proxy` and the generated `proto`.

mod client;
mod config;
mod connect;
mod history;
mod leases;
mod list;
#[rustfmt::skip]
// Generated (tests/integration/generated.rs checks it is what proto/ generates).
#[allow(unreachable_pub)]
mod proto;
mod proxy;
mod read;
mod round;
mod tunnel;

pub use config::{DEFAULT_TIMEOUT, EtcdConfig};
use connect::Cluster;
pub use history::HISTORY_KEEP;
use read::{View, read_key};
use round::read_marker;

use crate::error::Result;
use crate::history::Event;
use crate::key::LockKey;
use crate::store::{Committed, Current, Decision, Listed, Place, Store};

/// The etcd store.
#[derive(Clone)]
pub struct EtcdStore {
    cluster: Cluster,
    url: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("config", &self.cluster.config)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Opens the store `config` names: reads its TLS files and starts the
    /// client runtime; connects lazily, on the first operation.
    ///
    /// # Errors
    /// [`crate::error::Error::Io`] for an unreadable TLS file; [`crate::error::Error::Internal`] when no
    /// runtime can be built.
    pub fn open(config: EtcdConfig) -> Result<Self> {
        let url = config.url.clone();
        Ok(Self {
            cluster: Cluster::open(config)?,
            url,
        })
    }

    fn prefix(&self) -> &str {
        &self.cluster.config.prefix
    }

    fn lock_key(&self, key: &LockKey) -> String {
        format!("{}locks/{}", self.prefix(), key.name())
    }

    /// The lock's fence marker (outside `locks/` and `history/`, so `list`
    /// and `history` never see it).
    fn fence_key(&self, key: &LockKey) -> String {
        format!("{}fences/{}", self.prefix(), key.name())
    }
}

impl Store for EtcdStore {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn location(&self, key: &LockKey) -> Place {
        Place::at(self.lock_key(key))
    }

    fn read(&self, key: &LockKey) -> Result<Current> {
        let k = self.lock_key(key);
        self.cluster.call(|mut c, _| {
            let k = k.clone();
            async move { read_key(&mut c, &k, View::Reader).await.map(|s| s.current) }
        })
    }

    /// The marker's `mod_revision`: the revision of the transaction of the
    /// latest acquisition, which wrote the lock key in the same step, so it
    /// names no acquisition that a later read of the lock does not show.
    fn last_fence(&self, key: &LockKey) -> Result<Option<u64>> {
        let mk = self.fence_key(key);
        let revision = self.cluster.call(|mut c, _| {
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
        round::update(
            &self.cluster,
            (&self.lock_key(key), &self.fence_key(key)),
            decide,
        )
    }

    fn visit_locks(&self, visit: &mut dyn FnMut(Listed) -> Result<()>) -> Result<usize> {
        let locks = list::list_locks(&self.cluster, &format!("{}locks/", self.prefix()))?;
        crate::store::visit_in_order(locks, visit)?;
        Ok(0)
    }

    fn history(&self, key: Option<&LockKey>, limit: usize) -> Result<Vec<Event>> {
        let prefix = format!("{}history/", self.prefix());
        let name = key.map(LockKey::name);
        history::read_history(&self.cluster, &prefix, name.as_deref(), limit)
    }
}
