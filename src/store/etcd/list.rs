//! `list`: every lock key under the prefix, each judged as a reader sees it.
//!
//! Read in pages (SPEC §8: `list` never fails because the store is large):
//! each range request carries a limit and starts just past the last key of
//! the page before, so no response comes near gRPC's 4 MiB message limit
//! however many locks there are; a page of values too large for one
//! message (another tool's) is halved until it fits, and a single value too
//! large for any message is listed as the corrupt lock it is. The leases of
//! a page are looked up together, concurrently, on the one connection, so a
//! large store costs a round trip per page, not per lock. Memory holds one
//! page of values at a time, and the judged locks (records are bounded),
//! which the caller sorts into `list`'s order.

use std::collections::BTreeMap;

use super::client::{self, CallFailure, Client};
use super::connect::{CallError, Cluster};
use super::proto::{KeyValue, RangeRequest};
use super::read::{Lookup, View, judge, lookup, read_key};
use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::store::{Current, Listed};

/// Lock keys read in one request at most: a page of records this tool
/// writes (at most a few KiB each) stays far below gRPC's 4 MiB.
pub(super) const LIST_PAGE: i64 = 100;

/// Every lock under `prefix` (`<store prefix>locks/`), read a page at a
/// time (and each page's leases).
pub(super) fn list_locks(cluster: &Cluster, prefix: &str) -> Result<Vec<Listed>> {
    cluster.call(|mut c, _| {
        let prefix = prefix.to_owned();
        async move { list_pages(&mut c, &prefix).await }
    })
}

/// The range request of one page: keys from `from` to the end of `prefix`.
pub(super) fn page_request(from: &[u8], prefix: &str, limit: i64) -> RangeRequest {
    RangeRequest {
        key: from.to_vec(),
        ..client::get_prefix(prefix, limit)
    }
}

/// The first key after `key`.
fn after(key: &[u8]) -> Vec<u8> {
    let mut next = key.to_vec();
    next.push(0);
    next
}

/// Reads the locks under `prefix` page by page.
async fn list_pages(c: &mut Client, prefix: &str) -> Result<Vec<Listed>, CallError> {
    let mut locks = Vec::new();
    let mut from = prefix.as_bytes().to_vec();
    let mut page = LIST_PAGE;
    loop {
        let resp = match c.range(page_request(&from, prefix, page)).await {
            Ok(r) => r,
            Err(CallFailure::Status(s)) if s.code() == tonic::Code::OutOfRange => {
                if page > 1 {
                    page /= 2;
                    continue;
                }
                // One value larger than any message: no record can be.
                match too_large(c, &from, prefix).await? {
                    Some((key, listed)) => {
                        locks.extend(listed);
                        from = after(&key);
                        continue;
                    }
                    None => break,
                }
            }
            Err(e) => return Err(e.into()),
        };
        let revision = resp.header.map_or(0, |h| h.revision);
        let Some(last) = resp.kvs.last().map(|kv| kv.key.clone()) else {
            break;
        };
        let more = resp.more;
        let leases = lookups(c, &resp.kvs).await?;
        for kv in resp.kvs {
            if let Some(l) = listed(c, prefix, kv, revision, &leases).await? {
                locks.push(l);
            }
        }
        if !more {
            break;
        }
        from = after(&last);
        page = LIST_PAGE;
    }
    Ok(locks)
}

/// The leases of a page, each looked up once, all at the same time.
async fn lookups(c: &Client, kvs: &[KeyValue]) -> Result<BTreeMap<i64, Lookup>, CallError> {
    let mut ids: Vec<i64> = kvs.iter().map(|kv| kv.lease).filter(|l| *l != 0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let mut c = c.clone();
        tasks.spawn(async move { (id, lookup(&mut c, id).await) });
    }
    let mut found = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let (id, l) = done.map_err(|e| {
            CallError::Fatal(Error::Internal(format!("an etcd lease lookup failed: {e}")))
        })?;
        found.insert(id, l?);
    }
    Ok(found)
}

/// One key of a page as `list` shows it: `None` for a key that is not a
/// lock's name, or a lock that turned out free.
async fn listed(
    c: &mut Client,
    prefix: &str,
    kv: KeyValue,
    revision: i64,
    leases: &BTreeMap<i64, Lookup>,
) -> Result<Option<Listed>, CallError> {
    let Some(key) = lock_of(prefix, &kv.key) else {
        return Ok(None);
    };
    let full = String::from_utf8_lossy(&kv.key).into_owned();
    let found = leases.get(&kv.lease);
    let state = match judge(kv, revision, View::Reader, found, false)? {
        Some(state) => state,
        // Its lease lookup contradicts the record (it raced a revoke):
        // the key, read again.
        None => read_key(c, &full, View::Reader).await?,
    };
    if state.current == Current::Free {
        return Ok(None);
    }
    Ok(Some(Listed::new(key, full, state.current)))
}

/// The lock a key under `prefix` names, if it names one.
fn lock_of(prefix: &str, key: &[u8]) -> Option<LockKey> {
    let name = std::str::from_utf8(key).ok()?.strip_prefix(prefix)?;
    LockKey::from_name(name)
}

/// The first key from `from` on, whose value alone is larger than a gRPC
/// message: its name (to go on past it), and the corrupt lock it is.
async fn too_large(
    c: &mut Client,
    from: &[u8],
    prefix: &str,
) -> Result<Option<(Vec<u8>, Option<Listed>)>, CallError> {
    let req = RangeRequest {
        keys_only: true,
        ..page_request(from, prefix, 1)
    };
    let Some(kv) = c.range(req).await?.kvs.into_iter().next() else {
        return Ok(None);
    };
    let listed = lock_of(prefix, &kv.key).map(|key| {
        let why = "its value is larger than a gRPC message (4 MiB), more than any record can be";
        let full = String::from_utf8_lossy(&kv.key).into_owned();
        Listed::new(key, full, Current::Corrupt(why.into()))
    });
    Ok(Some((kv.key, listed)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_carry_a_limit_and_go_on_past_the_last_key() {
        let req = page_request(b"/p/locks/a@o__r\0", "/p/locks/", LIST_PAGE);
        assert_eq!(req.limit, LIST_PAGE);
        assert_eq!(req.range_end, b"/p/locks0");
        assert_eq!(after(b"/p/locks/a"), b"/p/locks/a\0");
        assert!(lock_of("/p/locks/", b"/p/locks/s@o__r").is_some());
        assert!(lock_of("/p/locks/", b"/p/locks/not a lock").is_none());
    }
}
