//! The read-decide-act round: read the lock key (and its lease), let the
//! engine decide, write the change in one transaction guarded by the
//! revision read, and settle a change whose answer was lost before anything
//! is decided again.

use std::time::Instant;

use super::EtcdStore;
use super::client::{self, CallFailure, Client};
use super::connect::{CallError, half_left, unavailable};
use super::leases::Extension;
use super::proto::TxnRequest;
use super::read::{KeyState, View, read_key};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::record::OwnerRecord;
use crate::store::{Change, Committed, Current, Decision, Written};

/// The `mod_revision` of a lock's fence marker ([`Marker`]); 0 when absent.
pub(super) async fn read_marker(client: &mut Client, mk: &str) -> Result<i64, CallError> {
    let resp = client.range(client::get(mk)).await?;
    Ok(resp.kvs.first().map_or(0, |kv| kv.mod_revision))
}

/// What kind of change a transaction makes, as far as settling an unknown
/// outcome needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
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
pub(super) struct Plan {
    pub(super) txn: TxnRequest,
    pub(super) kind: Option<Kind>,
    /// The record's bytes as written (create, takeover, rewrite).
    pub(super) bytes: Option<Vec<u8>>,
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

/// Plans the transaction for `change` on key `k` as seen at `seen_mod`
/// (0: absent): the guard (`create_revision == 0` to create, `mod_revision
/// == seen` for everything else), the put of `record` on `lease`, or the
/// delete, and the history events (`history`: key and JSON of each). An
/// acquisition also puts its `marker`, guarded on the revision read of it,
/// so the fence it reports to follow is the one before it.
pub(super) fn plan(
    k: &str,
    seen_mod: i64,
    change: &Change,
    (record, lease): (Option<&OwnerRecord>, i64),
    marker: Option<Marker>,
    history: Vec<(String, Vec<u8>)>,
) -> Result<Plan> {
    let mut guard = vec![match change {
        Change::Create(_) => client::created_at(k, 0),
        _ => client::modified_at(k, seen_mod),
    }];
    let mut ops = Vec::new();
    let mut bytes = None;
    let kind = match (change, record) {
        (Change::Keep, _) => None,
        (Change::Delete, _) => {
            ops.push(client::delete(k));
            Some(Kind::Delete)
        }
        (Change::Rewrite(_), Some(rec)) => {
            let b = rec.to_bytes()?;
            ops.push(client::put(k, b.clone(), lease));
            bytes = Some(b);
            Some(Kind::Rewrite)
        }
        (Change::Create(_) | Change::Takeover(_), Some(rec)) => {
            let Some(marker) = marker else {
                return Err(Error::Internal(
                    "an acquisition came without its fence marker".into(),
                ));
            };
            let b = rec.to_bytes()?;
            ops.push(client::put(k, b.clone(), lease));
            ops.push(client::put(marker.key, k.as_bytes().to_vec(), 0));
            guard.push(client::modified_at(marker.key, marker.seen_mod));
            bytes = Some(b);
            Some(Kind::Acquisition)
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
            compare: guard,
            success: ops,
            failure: Vec::new(),
        },
        kind,
        bytes,
    })
}

/// A transaction whose outcome is not known (its answer was lost): settled
/// by the next read before anything is decided again.
pub(super) struct Pending<T> {
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
    /// An acquisition: the fence it follows (see [`prior_fence`]).
    prior: Option<u64>,
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
        written(self.record.clone(), seen.mod_revision).map(|w| w.with_prior(self.prior))
    }
}

/// What a change wrote: the record (with the lease times this host
/// computed from the grant), its fence the key's revision `revision` after
/// the change when it was a new acquisition.
pub(super) fn written(record: Option<OwnerRecord>, revision: i64) -> Option<Written> {
    record.map(|mut r| {
        if r.holder.fence == 0 {
            r.holder.fence = u64::try_from(revision).unwrap_or(0);
        }
        Written::as_given(r)
    })
}

/// What one read-decide-act round ended with.
// One per round, moved once: boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Round<T> {
    /// Committed (or nothing to do); `old_lease` is the lease to revoke now;
    /// an acquisition on the short lease carries its [`Extension`].
    Done(Committed<T>, i64, Option<Extension>),
    /// Lost a race: read and decide again.
    Again,
}

impl EtcdStore {
    /// Runs read-decide-act rounds until one commits, within one deadline
    /// for the whole command, settling included (SPEC §8).
    pub(super) fn update_key<T>(
        &self,
        key: &LockKey,
        decide: &mut dyn FnMut(&Current) -> Result<Decision<T>>,
    ) -> Result<Committed<T>> {
        let k = self.lock_key(key);
        let mk = self.fence_key(key);
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
                let round = self.round(&mut c, (&k, &mk), decide, &mut pending, deadline);
                match tokio::time::timeout(left, round).await {
                    Ok(Ok(Round::Done(mut committed, old_lease, extension))) => {
                        // The acquisition is known to have landed: move it
                        // onto its full ttl, if the deadline allows.
                        if let (Some(ext), Some(w)) = (extension, committed.written.as_ref()) {
                            let left = deadline.saturating_duration_since(Instant::now());
                            let prior = w.prior_fence;
                            let moved = tokio::time::timeout(
                                left,
                                self.extend(&mut c, &k, &w.record, &ext),
                            );
                            if let Ok(Some(w)) = moved.await {
                                committed.written = Some(w.with_prior(prior));
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

    /// One read-decide-act round on one connection: settle the change
    /// whose answer was lost, decide, write. `k` is the lock's key, `mk`
    /// its fence marker's ([`Marker`]), read only for an acquisition.
    pub(super) async fn round<T>(
        &self,
        c: &mut Client,
        (k, mk): (&str, &str),
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
        let marker = match decision.change {
            Change::Create(_) | Change::Takeover(_) => Some(Marker {
                key: mk,
                seen_mod: read_marker(c, mk).await?,
            }),
            _ => None,
        };
        let prior = marker.and_then(|m| prior_fence(m.seen_mod, &seen));
        let plan = plan(
            k,
            seen.mod_revision,
            &decision.change,
            (record, lease),
            marker,
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
            prior,
        });
        self.commit(c, plan.txn, pending, seen.lease, deadline)
            .await
    }

    /// Sends the transaction of `pending` and reads its answer.
    pub(super) async fn commit<T>(
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
            written: written(attempt.record, revision).map(|w| w.with_prior(attempt.prior)),
            value: attempt.value,
        };
        Ok(Round::Done(committed, old_lease, extension))
    }

    /// Nothing changes, but the decision may record events (a refusal):
    /// appended under the same guard; a failure to append never fails the
    /// operation itself (SPEC §2.8).
    pub(super) async fn record_only<T>(
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

    /// The cluster stopped answering with an acquisition's outcome unknown:
    /// revoke its lease on any member that answers before the deadline, so
    /// that a lock whose token was never printed is gone at once. When none
    /// does, the acquisition was written on the short lease (`short_ttl`),
    /// so such a lock frees itself within the command's time bound.
    pub(super) async fn abandon<T>(
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
                let Ok(mut c) = self.connect_within(ep, budget, budget).await else {
                    return Ok(false);
                };
                c.lease_revoke(p.lease).await.map(|()| true)
            };
            if let Ok(Ok::<_, CallFailure>(true)) = tokio::time::timeout(budget, attempt).await {
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
        let history = vec![("/p/history/1".to_owned(), b"{}".to_vec())];
        let marker = |seen_mod| {
            Some(Marker {
                key: "/p/fences/k",
                seen_mod,
            })
        };
        let create = plan(
            "/p/locks/k",
            0,
            &Change::Create(rec.clone()),
            (Some(&rec), 77),
            marker(0),
            history.clone(),
        )
        .unwrap();
        assert_eq!(target(&create.txn.compare[0]), Some(CreateRevision(0)));
        assert_eq!(
            (
                create.txn.compare[1].key.as_slice(),
                target(&create.txn.compare[1])
            ),
            (b"/p/fences/k".as_slice(), Some(ModRevision(0))),
            "the marker as read (absent)"
        );
        assert_eq!(create.kind, Some(Kind::Acquisition));
        assert_eq!(
            create.txn.success.len(),
            3,
            "the record, the marker and one event"
        );
        let Some(Request::RequestPut(put)) = &create.txn.success[0].request else {
            panic!("the first op puts the record");
        };
        assert_eq!(
            (put.lease, put.value.as_slice()),
            (77, rec.to_bytes().unwrap().as_slice())
        );
        let Some(Request::RequestPut(m)) = &create.txn.success[1].request else {
            panic!("the second op puts the marker");
        };
        assert_eq!((m.key.as_slice(), m.lease), (b"/p/fences/k".as_slice(), 0));
        let Some(Request::RequestPut(ev)) = &create.txn.success[2].request else {
            panic!("the third op puts the event");
        };
        assert_eq!(
            (ev.key.as_slice(), ev.lease),
            (b"/p/history/1".as_slice(), 0)
        );

        let take = plan(
            "/p/locks/k",
            41,
            &Change::Takeover(rec.clone()),
            (Some(&rec), 78),
            marker(40),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(target(&take.txn.compare[0]), Some(ModRevision(41)));
        assert_eq!(target(&take.txn.compare[1]), Some(ModRevision(40)));
        assert_eq!(take.kind, Some(Kind::Acquisition));
        assert!(
            plan(
                "/p/locks/k",
                41,
                &Change::Takeover(rec.clone()),
                (Some(&rec), 78),
                None,
                Vec::new(),
            )
            .is_err(),
            "an acquisition never goes without its marker"
        );
        let renew = plan(
            "/p/locks/k",
            42,
            &Change::Rewrite(rec.clone()),
            (Some(&rec), 79),
            None,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(renew.kind, Some(Kind::Rewrite));
        assert_eq!(
            (renew.txn.compare.len(), renew.txn.success.len()),
            (1, 1),
            "a renewal leaves the marker alone"
        );
        assert_eq!(renew.bytes, Some(rec.to_bytes().unwrap()));
        let delete = plan(
            "/p/locks/k",
            43,
            &Change::Delete,
            (None, 0),
            None,
            Vec::new(),
        )
        .unwrap();
        assert_eq!(target(&delete.txn.compare[0]), Some(ModRevision(43)));
        assert!(matches!(
            delete.txn.success[0].request,
            Some(Request::RequestDeleteRange(_))
        ));
        let keep = plan("/p/locks/k", 43, &Change::Keep, (None, 0), None, Vec::new()).unwrap();
        assert_eq!((keep.kind, keep.txn.success.len()), (None, 0));
        assert!(
            plan(
                "/p/locks/k",
                0,
                &Change::Create(rec.clone()),
                (None, 0),
                marker(0),
                Vec::new()
            )
            .is_err()
        );
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
        let pending = |kind, bytes: Option<Vec<u8>>| Pending {
            kind,
            value: (),
            record: Some(ours.clone()),
            bytes,
            lease: 5,
            seen_create_revision: 3,
            extend: None,
            prior: None,
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
}
