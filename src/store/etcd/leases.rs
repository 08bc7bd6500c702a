//! etcd leases: the lease a change is written on (a short one first for a
//! new acquisition, then its full ttl), and the clean-up of leases no key
//! uses any more.

use std::time::{Duration, Instant};

use super::client::{self, Client};
use super::connect::{CallError, Cluster};
use super::history::trim_history;
use super::proto::TxnRequest;
use crate::clock::Now;
use crate::record::{Holder, Timestamp};
use crate::store::Written;

/// An acquisition written on the short lease, to be moved onto a lease of
/// its full ttl once its answer is known.
pub(super) struct Extension {
    /// The short lease it is on.
    pub(super) lease: i64,
    /// The key's `mod_revision` after it was written (its fence).
    pub(super) revision: i64,
    /// The ttl asked for.
    pub(super) ttl: u64,
}

/// A lease the cluster granted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Granted {
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
pub(super) fn earliest_end(before: &Now, ttl: u64) -> Timestamp {
    let ttl_ms = i64::try_from(ttl.saturating_mul(1000)).unwrap_or(i64::MAX);
    Timestamp(before.wall_ms.saturating_add(ttl_ms).div_euclid(1000))
}

/// The short lease for a command deadline of `timeout`: the deadline in
/// whole seconds, rounded up, at least one.
pub(super) fn short_ttl(timeout: Duration) -> u64 {
    let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    ms.div_ceil(1000).max(1)
}

/// Asks the cluster for a lease of `ttl` seconds.
pub(super) async fn grant(c: &mut Client, ttl: u64) -> Result<Granted, CallError> {
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
    fn stamp<F>(&self, holder: &mut Holder<F>) {
        holder.ttl = self.ttl;
        holder.expires = self.expires;
        holder.deadline_boot_ms = None;
    }
}

/// The lease a change's record is written on.
pub(super) struct Leased {
    pub(super) id: i64,
    /// An acquisition on the short lease: the ttl it asked for.
    pub(super) extend: Option<u64>,
    /// The `expires` its events say: the lease asked for, from the grant's start.
    pub(super) shown: Timestamp,
}

/// Time for the clean-up after a committed change (old lease, history trim),
/// within what is left of the command's deadline.
pub(super) const CLEANUP: Duration = Duration::from_secs(1);

/// Grants the lease a record is written on, and stamps `holder` with it:
/// a new acquisition (`acquisition`) longer than the short lease (whole
/// seconds, the cluster's command deadline rounded up, [`short_ttl`]) is
/// written on the short lease first: an acquisition whose answer is lost is
/// written on it, so a lock whose token was never printed frees itself
/// within the command's time bound; the full ttl comes once the answer is
/// known ([`extend`]).
pub(super) async fn lease_for<F>(
    cluster: &Cluster,
    c: &mut Client,
    holder: &mut Holder<F>,
    acquisition: bool,
) -> Result<Leased, CallError> {
    let wanted = holder.ttl;
    let short = short_ttl(cluster.config.timeout);
    let extend = (acquisition && wanted > short).then_some(wanted);
    let granted = grant(c, extend.map_or(wanted, |_| short)).await?;
    granted.stamp(holder);
    let more = extend.map_or(0, |w| w.saturating_sub(granted.ttl));
    let shown = Timestamp(
        granted
            .expires
            .0
            .saturating_add(i64::try_from(more).unwrap_or(0)),
    );
    Ok(Leased {
        id: granted.id,
        extend,
        shown,
    })
}

/// Moves an acquisition from its short lease onto a lease of its full
/// ttl: one transaction guarded by the revision the acquisition wrote,
/// so it never touches a lock that changed since. What it wrote then,
/// or `None` when it stays on the short lease (the guard failed, or the
/// answer was lost: the holder is told the short lease, which it
/// certainly has).
pub(super) async fn extend(
    c: &mut Client,
    k: &str,
    written: &Written,
    ext: &Extension,
) -> Option<Written> {
    let full = grant(c, ext.ttl).await.ok()?;
    let mut new = written.record.clone();
    full.stamp(&mut new.holder);
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
            Some(Written {
                record: new,
                prior_fence: written.prior_fence,
            })
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

/// After a committed change: revoke the lease the lock no longer uses
/// and keep the history bounded, within their own short budget and the
/// command's deadline (the change is done; a failure here is harmless:
/// a lease with no key on it just runs out, the next change trims).
pub(super) async fn clean_up(c: &mut Client, prefix: &str, old_lease: i64, deadline: Instant) {
    let budget = CLEANUP.min(deadline.saturating_duration_since(Instant::now()));
    if budget.is_zero() {
        return;
    }
    let work = async {
        if old_lease != 0 {
            let _ = c.lease_revoke(old_lease).await;
        }
        trim_history(c, prefix).await;
    };
    let _ = tokio::time::timeout(budget, work).await;
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
