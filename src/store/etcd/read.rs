//! Reading a lock key and judging its lease (SPEC §8).
//!
//! A read is two requests: the key (`Range`), then the lease it is attached
//! to (`LeaseTimeToLive`). A release (or a renewal's clean-up) can revoke
//! that lease between the two: the lookup then says the lease is gone,
//! although the lock was held when the key was read and is free (or held
//! anew) now; it was never stale. So a lookup that says the lease is gone,
//! or that would make it end more than a second before the `expires` its
//! holder was told, is never believed on its own: the key is read again. A
//! revoke deletes the keys attached to the lease in the same raft entry, and
//! the second read starts after the lookup answered, so it shows the key
//! gone (free) or replaced (judged afresh). Only a key still there, unchanged,
//! whose lease is gone is expired: its lease really ended (etcd deletes it
//! in a moment). Invariant: a reader never calls a live lease expired more
//! than one second before the `expires` its holder was told, and a lease
//! that a release revoked under it reads as held or free, never stale.

use super::client::{self, Client};
use super::connect::CallError;
use super::proto::KeyValue;
use crate::clock::Now;
use crate::error::Error;
use crate::record::{OwnerRecord, Timestamp};
use crate::store::{Current, Identity, LeaseEnd, Seen};

/// The lease end of a key whose lease has `ttl` whole seconds left as the
/// cluster counts them (-1: the lease is gone) of the `granted` it was given,
/// read between `before` and `after` on this host's clock; `told` is the
/// `expires` its record says, the one its holder was told.
///
/// A member whose lessor is not the primary (a demoted leader, a new leader
/// before it promotes its leases) answers a live lease's remaining time as
/// "never" (`i64::MAX` ns, about 292 years): more than was granted is no
/// reading at all. The lease is alive with an unknown remainder of at most
/// what was granted: a decision holds it that long.
///
/// A reader is shown a lower bound of the lease's end: `ttl` from before
/// the request (the count is truncated), raised to `told` where the cluster
/// allows it (never past `ttl` plus the truncated second from after the
/// answer, nor `granted` for an unknown remainder). `told` is the grant's
/// earliest end, so it is a lower bound too; without it a reader whose
/// request straddles a second could call a live lease expired up to two
/// seconds before its holder's `expires`.
pub(super) fn lease_end(
    ttl: i64,
    granted: i64,
    view: View,
    before: &Now,
    after: &Now,
    told: Timestamp,
) -> Timestamp {
    if ttl < 0 {
        return Timestamp(before.wall().0.saturating_sub(1));
    }
    let unknown = granted > 0 && ttl > granted;
    match view {
        View::Reader => {
            let (least, most) = if unknown { (0, granted) } else { (ttl, ttl) };
            let lo = before.wall().0.saturating_add(least);
            let hi = after.wall().0.saturating_add(most).saturating_add(1);
            Timestamp(lo.max(told.0.min(hi)))
        }
        // Truncated: up to a second more is left; and one more so that a
        // decision made just after this read sees it alive.
        View::Decision => {
            let ttl = if unknown { granted } else { ttl };
            Timestamp(after.wall().0.saturating_add(ttl).saturating_add(2))
        }
    }
}

/// Reads of one key at most, the first included: a lease lookup that
/// contradicts the record is checked by reading the key again, and a key
/// that keeps changing under the reader (each read replaced by a newer
/// holder) is judged as last read.
const READS: usize = 3;

/// How a read is used (SPEC §7 time safety, §8 "a key whose etcd lease is
/// alive is held").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum View {
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
pub(super) struct KeyState {
    pub(super) current: Current,
    pub(super) mod_revision: i64,
    pub(super) create_revision: i64,
    pub(super) lease: i64,
    pub(super) value: Vec<u8>,
}

impl KeyState {
    /// No key.
    fn free() -> Self {
        Self {
            current: Current::Free,
            mod_revision: 0,
            create_revision: 0,
            lease: 0,
            value: Vec::new(),
        }
    }
}

/// A lease lookup: the remaining `ttl` and the `granted` TTL the cluster
/// answered, asked between `before` and `after` on this host's clock.
pub(super) struct Lookup {
    ttl: i64,
    granted: i64,
    before: Now,
    after: Now,
}

/// Asks the cluster how long `lease` has left.
pub(super) async fn lookup(client: &mut Client, lease: i64) -> Result<Lookup, CallError> {
    let before = Now::read();
    let (ttl, granted) = client.lease_ttl(lease).await?;
    Ok(Lookup {
        ttl,
        granted,
        before,
        after: Now::read(),
    })
}

/// Reads one key; a leased record's expiry is the cluster's (see [`View`]
/// and the module's invariant).
pub(super) async fn read_key(
    client: &mut Client,
    k: &str,
    view: View,
) -> Result<KeyState, CallError> {
    let mut doubted: Option<i64> = None;
    for read in 1..=READS {
        let resp = client.range(client::get(k)).await?;
        let revision = resp.header.map_or(0, |h| h.revision);
        let Some(kv) = resp.kvs.into_iter().next() else {
            return Ok(KeyState::free());
        };
        let found = match kv.lease {
            0 => None,
            lease => Some(lookup(client, lease).await?),
        };
        // The same key as the read that was doubted: its lease is gone.
        let believe = read == READS || doubted == Some(kv.mod_revision);
        let mod_revision = kv.mod_revision;
        match judge(kv, revision, view, found.as_ref(), believe)? {
            Some(state) => return Ok(state),
            None => doubted = Some(mod_revision),
        }
    }
    Err(CallError::Fatal(Error::Internal(
        "a doubted etcd read was never settled".into(),
    )))
}

/// Judges one key as read at `revision` (the response's), with the lookup
/// of its lease (`None` for a key with none): `None` when the lookup
/// contradicts the record (see the module) and `believe` is false: the
/// caller reads the key again.
pub(super) fn judge(
    kv: KeyValue,
    revision: i64,
    view: View,
    found: Option<&Lookup>,
    believe: bool,
) -> Result<Option<KeyState>, CallError> {
    let current = match OwnerRecord::parse(&kv.value) {
        Err(why) => Current::Corrupt(why),
        Ok(mut rec) => {
            // Stored with fence 0: an acquisition, whose fence is the
            // revision of its own transaction (`round::acquisition`); a
            // renewal or extension writes it out.
            if rec.holder.fence == 0 {
                rec.holder.fence = u64::try_from(kv.mod_revision).unwrap_or(0);
            }
            revisions_never_went_back(rec.holder.fence, revision)?;
            // A key with no lease (another tool, an older record) is judged
            // by its own `expires`, like any record.
            let lease_end = match (kv.lease, found) {
                (0, _) => LeaseEnd::Recorded,
                (_, Some(l)) => {
                    let told = rec.holder.expires;
                    let end = lease_end(l.ttl, l.granted, view, &l.before, &l.after, told);
                    if !believe && too_early(end, told) {
                        return Ok(None);
                    }
                    LeaseEnd::Wall(end)
                }
                (_, None) => {
                    return Err(CallError::Fatal(Error::Internal(
                        "a leased etcd key was judged without its lease".into(),
                    )));
                }
            };
            Current::Held(Seen {
                record: rec,
                lease_end,
                identity: Identity::Comparable,
            })
        }
    };
    Ok(Some(KeyState {
        current,
        mod_revision: kv.mod_revision,
        create_revision: kv.create_revision,
        lease: kv.lease,
        value: kv.value,
    }))
}

/// Would `end` make the lease end more than one second before the
/// `expires` its holder was told? (etcd truncates the remaining time to a
/// whole second; anything earlier is a lease that is gone, or a lookup
/// that raced a revoke.)
fn too_early(end: Timestamp, told: Timestamp) -> bool {
    end.0 < told.0.saturating_sub(1)
}

/// A fence is a revision the cluster once had: a record whose fence is past
/// the cluster's current revision means the revisions went backwards (a
/// restore from a snapshot without `--bump-revision`), and fences handed out
/// from now on could repeat. Refuse rather than hand them out.
pub(super) fn revisions_never_went_back(fence: u64, revision: i64) -> Result<(), CallError> {
    match u64::try_from(revision) {
        Ok(r) if r > 0 && fence > r => Err(CallError::Fatal(Error::StoreUnavailable(format!(
            "the etcd cluster's revision ({r}) is below a fence it handed out ({fence}): it was \
             restored from a snapshot without --bump-revision, so fences could repeat; restore \
             again with `etcdutl snapshot restore --bump-revision N --mark-compacted` (N above {fence})"
        )))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let long_ago = Timestamp(0);
        // 0 s left (truncated): alive, so a decision made after the read sees it held.
        let end = lease_end(0, 2, View::Decision, &before, &after, long_ago);
        assert!(end.0 * 1000 > after.wall_ms + 500);
        // A reader is told no more than the truncated TTL, counted from before the request...
        assert_eq!(
            lease_end(4, 5, View::Reader, &before, &after, long_ago).0,
            1_000_000 + 4
        );
        // ...raised to the expires its holder was told, within what the cluster allows.
        let told = Timestamp(1_000_005);
        assert_eq!(lease_end(4, 5, View::Reader, &before, &after, told), told);
        let far = Timestamp(1_000_100);
        assert_eq!(
            lease_end(4, 5, View::Reader, &before, &after, far).0,
            1_000_001 + 4 + 1
        );
        // A lease that is gone is expired for both.
        for view in [View::Reader, View::Decision] {
            assert!(lease_end(-1, 5, view, &before, &after, told).0 * 1000 < before.wall_ms);
        }
        // "Never" from a member whose lessor is not the primary (ETCD-1 of
        // the nemesis test): alive, for no more than was granted.
        let never = 9_223_372_036;
        let held = lease_end(never, 2, View::Decision, &before, &after, long_ago);
        assert!(held.0 * 1000 > after.wall_ms && held.0 <= after.wall().0 + 2 + 2);
        let read = |told| lease_end(never, 2, View::Reader, &before, &after, told);
        assert!(read(long_ago).0 * 1000 <= before.wall_ms + 1000);
        assert_eq!(read(Timestamp(1_000_002)), Timestamp(1_000_002));
        assert_eq!(read(far), Timestamp(1_000_001 + 2 + 1));
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
    fn a_lease_ending_more_than_a_second_before_the_told_expires_is_doubted() {
        let told = Timestamp(1_000);
        assert!(!too_early(Timestamp(1_000), told));
        assert!(
            !too_early(Timestamp(999), told),
            "truncation costs a second"
        );
        assert!(too_early(Timestamp(998), told));
        assert!(too_early(Timestamp(i64::MIN), Timestamp(i64::MIN + 2)));
        assert!(!too_early(Timestamp(i64::MIN), Timestamp(i64::MIN)));
    }
}
