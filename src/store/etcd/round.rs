//! The read-decide-act round: read the lock key (and its lease), let the
//! engine decide, write the change in one transaction guarded by the
//! revision read, and settle a change whose answer was lost before anything
//! is decided again.

use std::time::Instant;

use super::client::{self, CallFailure, Client};
use super::connect::{CallError, Cluster, half_left, unavailable};
use super::history::history_ops;
use super::leases::{Extension, clean_up, extend, lease_for};
use super::proto::TxnRequest;
use super::read::{KeyState, View, read_key};
use crate::error::{Error, Result};
use crate::record::{NewRecord, OwnerRecord};
use crate::store::{Acquisition, Committed, Current, Decision, EventFence, Stamp, Written};

/// The `mod_revision` of a lock's fence marker ([`Marker`]); 0 when absent.
pub(super) async fn read_marker(client: &mut Client, mk: &str) -> Result<i64, CallError> {
    let resp = client.range(client::get(mk)).await?;
    Ok(resp.kvs.first().map_or(0, |kv| kv.mod_revision))
}

/// A lock's fence marker, `<prefix>fences/<name>`: every acquisition (create
/// or takeover) puts it, with no lease, in its own transaction, so its
/// `mod_revision` is the fence of the lock's latest acquisition, across
/// releases and expiries (SPEC §2.4, `--since` of §2.1).
#[derive(Debug, Clone, Copy)]
pub(super) struct Marker<'a> {
    /// The marker's key.
    pub(super) key: &'a str,
    /// Its `mod_revision` as read for the decision (0: absent).
    pub(super) seen_mod: i64,
}

/// The fence of the acquisition before the one about to be made on `seen`:
/// the marker's revision, or for a lock acquired before markers existed
/// the record's fence (a corrupt record: its key's revision, which is no
/// older than its acquisition). The greatest of them, so an acquisition
/// the marker missed is never taken for no acquisition at all.
pub(super) fn prior_fence(marker_mod: i64, seen: &KeyState) -> Option<u64> {
    let marker = u64::try_from(marker_mod).unwrap_or(0);
    let lock = match seen.current.record() {
        Some(rec) => rec.holder.fence,
        None => u64::try_from(seen.mod_revision).unwrap_or(0),
    };
    Some(marker.max(lock)).filter(|f| *f > 0)
}

/// What a transaction does to the lock key: one decision, as far as etcd
/// needs to know.
#[derive(Debug, Clone, Copy)]
pub(super) enum Op<'a> {
    /// Nothing (it may record events: a refusal).
    Nothing,
    /// Create it, absent, with these bytes, and put the fence marker.
    Create(&'a [u8], Marker<'a>),
    /// Replace it (stale or corrupt) with these bytes, and put the marker.
    Takeover(&'a [u8], Marker<'a>),
    /// Rewrite it (renewal).
    Rewrite(&'a [u8]),
    /// Delete it.
    Delete,
}

/// Plans the transaction for `op` on key `k` as seen at `seen_mod` (0:
/// absent): the guard (`create_revision == 0` to create, `mod_revision ==
/// seen` for everything else), the put of the record on `lease`, or the
/// delete, and the history events (`history`: key and JSON of each). An
/// acquisition also puts its marker, guarded on the revision read of it, so
/// the fence it reports to follow is the one before it. Pure: unit-tested
/// without etcd.
pub(super) fn plan(
    k: &str,
    seen_mod: i64,
    op: Op,
    lease: i64,
    history: Vec<(String, Vec<u8>)>,
) -> TxnRequest {
    let mut guard = vec![match op {
        Op::Create(..) => client::created_at(k, 0),
        _ => client::modified_at(k, seen_mod),
    }];
    let mut ops = Vec::new();
    match op {
        Op::Nothing => {}
        Op::Delete => ops.push(client::delete(k)),
        Op::Rewrite(bytes) => ops.push(client::put(k, bytes.to_vec(), lease)),
        Op::Create(bytes, marker) | Op::Takeover(bytes, marker) => {
            ops.push(client::put(k, bytes.to_vec(), lease));
            ops.push(client::put(marker.key, k.as_bytes().to_vec(), 0));
            guard.push(client::modified_at(marker.key, marker.seen_mod));
        }
    }
    ops.extend(
        history
            .into_iter()
            .map(|(key, line)| client::put(key, line, 0)),
    );
    TxnRequest {
        compare: guard,
        success: ops,
        failure: Vec::new(),
    }
}

/// A change sent whose effect is not known yet: how it is recognised, and
/// what it comes to once it landed.
pub(super) enum Landing<K, W> {
    /// A new acquisition, recognised by its token hash. Its fence is the
    /// key's revision after it.
    Acquisition {
        /// The record as written (on the lease granted).
        record: NewRecord,
        /// The fence it follows (see [`prior_fence`]).
        prior: Option<u64>,
        /// Written on the short lease: the ttl it asked for.
        extend: Option<u64>,
        /// A revival (SPEC §2.2): the fence of the lease it replaces, which
        /// has the same token.
        revives: Option<u64>,
        then: W,
    },
    /// A renewal, recognised by its exact bytes.
    Rewrite {
        record: OwnerRecord,
        bytes: Vec<u8>,
        then: W,
    },
    /// A release, recognised by the lock it saw being gone.
    Delete {
        /// The create revision of the lock it saw.
        seen_create_revision: i64,
        outcome: K,
    },
}

/// A transaction whose outcome is not known (its answer was lost): settled
/// by the next read before anything is decided again.
pub(super) struct Pending<K, W> {
    landing: Landing<K, W>,
    /// The lease granted for it (0: none).
    lease: i64,
}

impl<K, W> Pending<K, W> {
    /// Does `seen` show that the transaction took effect?
    fn landed(&self, seen: &KeyState) -> bool {
        match &self.landing {
            // A revival's token is the lease's it revived: landed once
            // the record has another fence (it is stored with none, which
            // a read takes for the key's revision).
            Landing::Acquisition {
                record, revives, ..
            } => seen.current.record().is_some_and(|now| {
                now.token_sha256 == record.token_sha256 && Some(now.holder.fence) != *revives
            }),
            Landing::Rewrite { bytes, .. } => *bytes == seen.value,
            Landing::Delete {
                seen_create_revision,
                ..
            } => seen.current == Current::Free || seen.create_revision != *seen_create_revision,
        }
    }

    /// What it came to, landed at `revision` (the key's revision after it):
    /// the record as written (with the lease times this host computed, never
    /// a reader's view of them), a new acquisition's fence that revision;
    /// and for an acquisition on the short lease, its [`Extension`].
    fn committed(self, revision: i64) -> (Committed<K, W>, Option<Extension>) {
        match self.landing {
            Landing::Acquisition {
                record,
                prior,
                extend,
                then,
                ..
            } => {
                let fence = u64::try_from(revision).unwrap_or(0);
                let extension = extend.map(|ttl| Extension {
                    lease: self.lease,
                    revision,
                    ttl,
                });
                let written = Written::acquired(record, fence, prior);
                (Committed::Wrote(then, written), extension)
            }
            Landing::Rewrite { record, then, .. } => {
                (Committed::Wrote(then, Written::renewed(record)), None)
            }
            Landing::Delete { outcome, .. } => (Committed::Done(outcome), None),
        }
    }

    /// A new acquisition's lease, which is gone with it when revoked.
    fn acquisition_lease(&self) -> Option<(i64, u64)> {
        match &self.landing {
            Landing::Acquisition { record, .. } if self.lease != 0 => {
                Some((self.lease, record.holder.ttl))
            }
            _ => None,
        }
    }
}

/// What one read-decide-act round ended with.
// One per round, moved once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Round<K, W> {
    /// Committed (or nothing to do); `old_lease` is the lease to revoke now;
    /// an acquisition on the short lease carries its [`Extension`].
    Done(Committed<K, W>, i64, Option<Extension>),
    /// Lost a race: read and decide again.
    Again,
}

/// Runs read-decide-act rounds until one commits, within one deadline
/// for the whole command, settling included (SPEC §8).
pub(super) fn update<K, W>(
    cluster: &Cluster,
    (k, mk): (&str, &str),
    decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
) -> Result<Committed<K, W>> {
    // One deadline for the whole command, settling included (SPEC §8).
    let deadline = Instant::now() + cluster.config.timeout;
    cluster.block_on(async {
        let mut pending = None;
        let mut skip = None;
        loop {
            let mut c = match cluster.client(deadline, skip).await {
                Ok(c) => c,
                Err(e) => return Err(abandon(cluster, pending, e, deadline).await),
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let round = round(cluster, &mut c, (k, mk), decide, &mut pending, deadline);
            match tokio::time::timeout(left, round).await {
                Ok(Ok(Round::Done(mut committed, old_lease, extension))) => {
                    // The acquisition is known to have landed: move it
                    // onto its full ttl, if the deadline allows.
                    if let (Some(ext), Committed::Wrote(_, w)) = (extension, &mut committed) {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let moved = tokio::time::timeout(left, extend(&mut c, k, w, &ext));
                        if let Ok(Some(moved)) = moved.await {
                            *w = moved;
                        }
                    }
                    clean_up(&mut c, &cluster.config.prefix, old_lease, deadline).await;
                    return Ok(committed);
                }
                Ok(Ok(Round::Again)) => {}
                Ok(Err(CallError::Fatal(e))) => return Err(e),
                Ok(Err(CallError::Etcd(e))) if !e.retryable() => {
                    let e = Error::StoreUnavailable(format!("etcd refused the request: {e}"));
                    return Err(abandon(cluster, pending, e, deadline).await);
                }
                Ok(Err(CallError::Etcd(_))) | Err(_) => {
                    // Another endpoint next; an answer that was lost is
                    // read back there before anything is decided again.
                    skip = cluster.drop_client();
                    if Instant::now() >= deadline {
                        let e = unavailable(format!(
                            "none of {} answered in time",
                            cluster.config.endpoints.join(", ")
                        ));
                        return Err(abandon(cluster, pending, e, deadline).await);
                    }
                }
            }
        }
    })
}

/// One read-decide-act round on one connection: settle the change
/// whose answer was lost, decide, write. `k` is the lock's key, `mk`
/// its fence marker's ([`Marker`]), read only for an acquisition.
pub(super) async fn round<K, W>(
    cluster: &Cluster,
    c: &mut Client,
    (k, mk): (&str, &str),
    decide: &mut dyn FnMut(&Current) -> Result<Decision<K, W>>,
    pending: &mut Option<Pending<K, W>>,
    deadline: Instant,
) -> Result<Round<K, W>, CallError> {
    let seen = read_key(c, k, View::Decision).await?;
    if let Some(p) = pending.take() {
        if p.landed(&seen) {
            let (committed, extension) = p.committed(seen.mod_revision);
            return Ok(Round::Done(committed, 0, extension));
        }
        // It did not land: its lease can go, so that it never can.
        if p.lease != 0 {
            let _ = c.lease_revoke(p.lease).await;
        }
    }
    let (txn, attempt) = match decide(&seen.current).map_err(CallError::Fatal)? {
        Decision::Keep(outcome, events) => {
            let txn = plan(
                k,
                seen.mod_revision,
                Op::Nothing,
                0,
                history_ops(&cluster.config.prefix, &events)?,
            );
            return record_only(c, txn, outcome, deadline).await;
        }
        Decision::Delete(outcome, event) => {
            let history = history_ops(&cluster.config.prefix, &[event])?;
            let landing = Landing::Delete {
                seen_create_revision: seen.create_revision,
                outcome,
            };
            let txn = plan(k, seen.mod_revision, Op::Delete, 0, history);
            (txn, Pending { landing, lease: 0 })
        }
        Decision::Acquire(acq) => acquisition(cluster, c, (k, mk), &seen, acq).await?,
        Decision::Renew(renewal) => {
            let mut record = renewal.record().clone();
            let leased = lease_for(cluster, c, &mut record.holder, false).await?;
            let stamp = Stamp {
                fence: EventFence::Known(record.holder.fence),
                lease_end: Some(leased.shown),
            };
            let history = history_ops(&cluster.config.prefix, &renewal.events(&stamp))?;
            let bytes = record.to_bytes().map_err(CallError::Fatal)?;
            let txn = plan(
                k,
                seen.mod_revision,
                Op::Rewrite(&bytes),
                leased.id,
                history,
            );
            let landing = Landing::Rewrite {
                record,
                bytes,
                then: renewal.then,
            };
            (
                txn,
                Pending {
                    landing,
                    lease: leased.id,
                },
            )
        }
    };
    // From here until its answer, the outcome is unknown (the answer may
    // be lost, or this future dropped at the deadline): settle it first.
    *pending = Some(attempt);
    commit(c, txn, pending, seen.lease, deadline).await
}

/// The transaction of a new acquisition on `seen`: on its lease (the
/// short one first, see `short_ttl`), with its fence marker. Its record
/// is stored with fence 0, which a read takes for the key's revision:
/// the fence is the transaction's own revision, known once it commits
/// ([`EventFence::AtCommit`]).
async fn acquisition<K, W>(
    cluster: &Cluster,
    c: &mut Client,
    (k, mk): (&str, &str),
    seen: &KeyState,
    acq: Acquisition<W>,
) -> Result<(TxnRequest, Pending<K, W>), CallError> {
    let mut record = acq.record.clone();
    let leased = lease_for(cluster, c, &mut record.holder, true).await?;
    let stamp = Stamp {
        fence: EventFence::AtCommit,
        lease_end: Some(leased.shown),
    };
    let history = history_ops(&cluster.config.prefix, &acq.events(&stamp))?;
    let marker = Marker {
        key: mk,
        seen_mod: read_marker(c, mk).await?,
    };
    let bytes = record
        .clone()
        .fenced(0)
        .to_bytes()
        .map_err(CallError::Fatal)?;
    let op = if acq.takes_over() {
        Op::Takeover(&bytes, marker)
    } else {
        Op::Create(&bytes, marker)
    };
    let txn = plan(k, seen.mod_revision, op, leased.id, history);
    let landing = Landing::Acquisition {
        record,
        prior: prior_fence(marker.seen_mod, seen),
        extend: leased.extend,
        revives: acq.revives(),
        then: acq.then,
    };
    Ok((
        txn,
        Pending {
            landing,
            lease: leased.id,
        },
    ))
}

/// Sends the transaction of `pending` and reads its answer.
pub(super) async fn commit<K, W>(
    c: &mut Client,
    txn: TxnRequest,
    pending: &mut Option<Pending<K, W>>,
    old_lease: i64,
    deadline: Instant,
) -> Result<Round<K, W>, CallError> {
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
    let (committed, extension) = attempt.committed(revision);
    Ok(Round::Done(committed, old_lease, extension))
}

/// Nothing changes, but the decision may record events (a refusal):
/// appended under the same guard; a failure to append never fails the
/// operation itself (SPEC §2.8).
pub(super) async fn record_only<K, W>(
    c: &mut Client,
    txn: TxnRequest,
    outcome: K,
    deadline: Instant,
) -> Result<Round<K, W>, CallError> {
    if !txn.success.is_empty() {
        match tokio::time::timeout(half_left(deadline), c.txn(txn)).await {
            Ok(Ok(resp)) if !resp.succeeded => return Ok(Round::Again),
            _ => {}
        }
    }
    Ok(Round::Done(Committed::Done(outcome), 0, None))
}

/// The cluster stopped answering with an acquisition's outcome unknown:
/// revoke its lease on any member that answers before the deadline, so
/// that a lock whose token was never printed is gone at once. When none
/// does, the acquisition was written on the short lease (`short_ttl`),
/// so such a lock frees itself within the command's time bound.
pub(super) async fn abandon<K, W>(
    cluster: &Cluster,
    pending: Option<Pending<K, W>>,
    err: Error,
    deadline: Instant,
) -> Error {
    let Some(p) = pending else { return err };
    let Some((lease, ttl)) = p.acquisition_lease() else {
        return Error::StoreUnavailable(format!(
            "{err}; the outcome of this change is unknown: run `status` to see the lock"
        ));
    };
    for ep in &cluster.config.endpoints {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let budget = left.min(cluster.connect_budget());
        let attempt = async {
            let Ok(mut c) = cluster.connect_within(ep, budget, budget).await else {
                return Ok(false);
            };
            c.lease_revoke(lease).await.map(|()| true)
        };
        if let Ok(Ok::<_, CallFailure>(true)) = tokio::time::timeout(budget, attempt).await {
            return Error::StoreUnavailable(format!(
                "{err}; nothing was taken (the attempt's lease was revoked)"
            ));
        }
    }
    Error::StoreUnavailable(format!(
        "{err}; the outcome is unknown: if the lock was taken, nobody holds its token and it \
             frees itself when its lease of {ttl}s ends (it was written on a short lease)"
    ))
}

#[cfg(test)]
mod tests {
    use super::super::proto;
    use super::*;
    use crate::store::Seen;

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
    #[allow(clippy::too_many_lines, reason = "one test, every plan it checks")]
    fn plans_guard_each_change_on_the_revision_it_saw() {
        use proto::compare::TargetUnion::{CreateRevision, ModRevision};
        use proto::request_op::Request;
        let rec = crate::record::tests::sample(None);
        let bytes = rec.to_bytes().unwrap();
        let history = vec![("/p/history/1".to_owned(), b"{}".to_vec())];
        let marker = |seen_mod| Marker {
            key: "/p/fences/k",
            seen_mod,
        };
        let create = plan(
            "/p/locks/k",
            0,
            Op::Create(&bytes, marker(0)),
            77,
            history.clone(),
        );
        assert_eq!(target(&create.compare[0]), Some(CreateRevision(0)));
        assert_eq!(
            (create.compare[1].key.as_slice(), target(&create.compare[1])),
            (b"/p/fences/k".as_slice(), Some(ModRevision(0))),
            "the marker as read (absent)"
        );
        assert_eq!(
            create.success.len(),
            3,
            "the record, the marker and one event"
        );
        let Some(Request::RequestPut(put)) = &create.success[0].request else {
            panic!("the first op puts the record");
        };
        assert_eq!((put.lease, put.value.as_slice()), (77, bytes.as_slice()));
        let Some(Request::RequestPut(m)) = &create.success[1].request else {
            panic!("the second op puts the marker");
        };
        assert_eq!((m.key.as_slice(), m.lease), (b"/p/fences/k".as_slice(), 0));
        let Some(Request::RequestPut(ev)) = &create.success[2].request else {
            panic!("the third op puts the event");
        };
        assert_eq!(
            (ev.key.as_slice(), ev.lease),
            (b"/p/history/1".as_slice(), 0)
        );

        let take = plan(
            "/p/locks/k",
            41,
            Op::Takeover(&bytes, marker(40)),
            78,
            Vec::new(),
        );
        assert_eq!(target(&take.compare[0]), Some(ModRevision(41)));
        assert_eq!(target(&take.compare[1]), Some(ModRevision(40)));
        let renew = plan("/p/locks/k", 42, Op::Rewrite(&bytes), 79, Vec::new());
        assert_eq!(
            (renew.compare.len(), renew.success.len()),
            (1, 1),
            "a renewal leaves the marker alone"
        );
        let delete = plan("/p/locks/k", 43, Op::Delete, 0, Vec::new());
        assert_eq!(target(&delete.compare[0]), Some(ModRevision(43)));
        assert!(matches!(
            delete.success[0].request,
            Some(Request::RequestDeleteRange(_))
        ));
        let keep = plan("/p/locks/k", 43, Op::Nothing, 0, Vec::new());
        assert_eq!(keep.success.len(), 0);
    }

    #[test]
    fn the_prior_fence_is_the_markers_or_an_older_records() {
        let mut rec = crate::record::tests::sample(None);
        rec.holder.fence = 30;
        let free = KeyState {
            mod_revision: 0,
            ..seen(Current::Free, 0, Vec::new())
        };
        assert_eq!(prior_fence(0, &free), None, "never acquired");
        assert_eq!(prior_fence(25, &free), Some(25), "released since");
        let stale = seen(held(&rec), 30, Vec::new());
        assert_eq!(prior_fence(30, &stale), Some(30), "the stale lock's own");
        assert_eq!(
            prior_fence(0, &stale),
            Some(30),
            "a record from before markers"
        );
        assert_eq!(prior_fence(12, &stale), Some(30), "the marker missed one");
        let corrupt = seen(Current::Corrupt("x".into()), 9, Vec::new());
        assert_eq!(
            prior_fence(0, &corrupt),
            Some(9),
            "an unreadable record's key"
        );
    }

    #[test]
    fn an_unknown_outcome_is_recognised_only_by_its_own_effect() {
        let ours = crate::record::tests::sample(None);
        let mut theirs = ours.clone();
        theirs.token_sha256 = crate::record::hash_token("someone else");
        let pending = |landing| Pending::<(), ()> { landing, lease: 5 };
        let acq = pending(Landing::Acquisition {
            record: crate::record::tests::sample_new(None),
            prior: None,
            extend: None,
            revives: None,
            then: (),
        });
        assert!(acq.landed(&seen(held(&ours), 3, Vec::new())));
        assert!(!acq.landed(&seen(held(&theirs), 3, Vec::new())));
        assert!(!acq.landed(&seen(Current::Free, 0, Vec::new())));
        // A revival has the token of the lease it replaces: only another
        // fence shows that it landed.
        let revival = pending(Landing::Acquisition {
            record: crate::record::tests::sample_new(None),
            prior: None,
            extend: None,
            revives: Some(ours.holder.fence),
            then: (),
        });
        assert!(!revival.landed(&seen(held(&ours), 3, Vec::new())));
        let mut revived = ours.clone();
        revived.holder.fence += 1;
        assert!(revival.landed(&seen(held(&revived), 3, Vec::new())));
        let bytes = ours.to_bytes().unwrap();
        let rw = pending(Landing::Rewrite {
            record: ours.clone(),
            bytes: bytes.clone(),
            then: (),
        });
        assert!(rw.landed(&seen(held(&ours), 3, bytes)));
        assert!(!rw.landed(&seen(held(&ours), 3, b"older".to_vec())));
        let del = pending(Landing::Delete {
            seen_create_revision: 3,
            outcome: (),
        });
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
}
