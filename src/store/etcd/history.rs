//! The history: one key per event, written in the transaction of its
//! change, read newest first in pages, and trimmed back to a bound.

use std::collections::HashSet;

use super::client::{self, CallFailure, Client};
use super::connect::{CallError, Cluster};
use super::proto::range_request::{SortOrder, SortTarget};
use super::proto::{KeyValue, RangeRequest, TxnRequest};
use crate::error::{Error, Result};
use crate::history::Event;
use crate::record::{Timestamp, random_suffix};

/// History events kept at least (the store trims back to this).
pub const HISTORY_KEEP: i64 = 10_000;

/// History events read in one request at most (a page of the longest
/// events this tool writes stays well under gRPC's 4 MiB message limit).
const HISTORY_PAGE: i64 = 500;

/// A history key that sorts by when it was written: the wall clock's
/// nanoseconds (finer than the event's own seconds), then a random suffix.
#[allow(
    clippy::disallowed_methods,
    reason = "a key's sort order, not a lease decision: the event carries the decision's time"
)]
pub(super) fn history_key(prefix: &str, time: Timestamp) -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(i128::from(time.0) * 1_000_000_000, |d| {
            i128::try_from(d.as_nanos()).unwrap_or(0)
        });
    format!("{prefix}history/{ns:020}-{}", random_suffix())
}

/// The newest `limit` events under `prefix` (`<prefix>history/`), oldest
/// first, of the lock `name` or of all.
pub(super) fn read_history(
    cluster: &Cluster,
    prefix: &str,
    name: Option<&str>,
    limit: usize,
) -> Result<Vec<Event>> {
    cluster.call(|mut c, _| {
        let prefix = prefix.to_owned();
        let name = name.map(str::to_owned);
        async move { newest_events(&mut c, &prefix, name.as_deref(), limit).await }
    })
}

/// The history events of a change as (key under the store's `prefix`,
/// JSON). The events of a new acquisition carry no fence
/// ([`crate::store::EventFence::AtCommit`]): it is the transaction's
/// revision, which a read tells from the key's create revision.
pub(super) fn history_ops(
    prefix: &str,
    events: &[Event],
) -> Result<Vec<(String, Vec<u8>)>, CallError> {
    events
        .iter()
        .map(|ev| {
            let line = serde_json::to_vec(ev)
                .map_err(|e| CallError::Fatal(Error::Internal(e.to_string())))?;
            Ok((history_key(prefix, ev.time), line))
        })
        .collect()
}

/// Keeps the history bounded: after every change, count the events; past
/// twice [`HISTORY_KEEP`], delete the oldest down to [`HISTORY_KEEP`], a
/// page of [`HISTORY_PAGE`] keys at a time (the caller bounds the time).
/// Failures are harmless (the next change trims).
pub(super) async fn trim_history(c: &mut Client, prefix: &str) {
    let hist = format!("{prefix}history/");
    let count_only = RangeRequest {
        count_only: true,
        ..client::get_prefix(&hist, 1)
    };
    let Ok(count) = c.range(count_only).await else {
        return;
    };
    let mut excess = count.count - HISTORY_KEEP;
    if count.count <= 2 * HISTORY_KEEP {
        return;
    }
    while excess > 0 {
        let oldest = RangeRequest {
            keys_only: true,
            sort_target: SortTarget::Create.into(),
            sort_order: SortOrder::Ascend.into(),
            ..client::get_prefix(&hist, excess.min(HISTORY_PAGE))
        };
        let Ok(old) = c.range(oldest).await else {
            return;
        };
        if old.kvs.is_empty() {
            return;
        }
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
        excess -= i64::try_from(old.kvs.len()).unwrap_or(excess);
    }
}

/// Where the next page of the history ends (SPEC §8: the history is read in
/// pages, so its size never fails the read): at the create revision of the
/// last page's oldest event, leaving out the keys of that revision already
/// read (one transaction writes up to three events, and a page may end
/// among them).
#[derive(Default)]
struct Cursor {
    below: i64,
    at_below: HashSet<Vec<u8>>,
}

impl Cursor {
    /// Not read yet.
    fn is_fresh(&self, kv: &KeyValue) -> bool {
        kv.create_revision != self.below || !self.at_below.contains(&kv.key)
    }

    /// Moves past a page of `kvs` (`fresh`: whether it held anything new);
    /// false when no older event can be left.
    fn advance(&mut self, kvs: &[KeyValue], fresh: bool) -> bool {
        let Some(last) = kvs.last() else { return false };
        if fresh {
            if last.create_revision != self.below {
                self.at_below.clear();
            }
            self.below = last.create_revision;
            let below = self.below;
            self.at_below.extend(
                kvs.iter()
                    .filter(|kv| kv.create_revision == below)
                    .map(|kv| kv.key.clone()),
            );
        } else {
            // A page of nothing new (pages smaller than one transaction's
            // events): step past that revision.
            self.below = last.create_revision - 1;
            self.at_below.clear();
        }
        self.below >= 1
    }
}

/// The event a history key holds, when it is one of lock `name`'s (or any
/// lock's): an event written without a fence was written in the acquiring
/// transaction, whose revision is the fence.
fn event_of(kv: &KeyValue, name: Option<&str>) -> Option<Event> {
    let mut ev = serde_json::from_slice::<Event>(&kv.value).ok()?;
    if name.is_some_and(|n| n != ev.lock) {
        return None;
    }
    if ev.fence.is_none() {
        ev.fence = u64::try_from(kv.create_revision).ok();
    }
    Some(ev)
}

/// Reads the history newest first, a page at a time, until `limit` events
/// of lock `name` (or of all) are read; returns them oldest first.
async fn newest_events(
    c: &mut Client,
    prefix: &str,
    name: Option<&str>,
    limit: usize,
) -> Result<Vec<Event>, CallError> {
    let mut out = Vec::new();
    let mut cursor = Cursor::default();
    let mut page = HISTORY_PAGE;
    while out.len() < limit {
        let req = RangeRequest {
            sort_target: SortTarget::Create.into(),
            sort_order: SortOrder::Descend.into(),
            max_create_revision: cursor.below,
            ..client::get_prefix(prefix, page)
        };
        let mut resp = match c.range(req).await {
            Ok(r) => r,
            // A page past the message limit (events written by another
            // tool can be of any size): a smaller page.
            Err(CallFailure::Status(s)) if s.code() == tonic::Code::OutOfRange && page > 1 => {
                page /= 2;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        // The events of one transaction share a revision: their keys
        // (named by time) order them.
        resp.kvs
            .sort_by(|a, b| (b.create_revision, &b.key).cmp(&(a.create_revision, &a.key)));
        let fresh: Vec<&KeyValue> = resp.kvs.iter().filter(|kv| cursor.is_fresh(kv)).collect();
        let any_fresh = !fresh.is_empty();
        let room = limit - out.len();
        out.extend(
            fresh
                .into_iter()
                .filter_map(|kv| event_of(kv, name))
                .take(room),
        );
        if !resp.more || !cursor.advance(&resp.kvs, any_fresh) {
            break;
        }
    }
    out.reverse();
    Ok(out)
}
